"""reViT's comparison baselines: the same recurrent block with its FFN chosen by content (Table 3's
MoE families at U = 1, as appendix B adapts them), or adapted per step by layer-wise LoRA.

Paper: "One Block, Multiple Depths: Recurrent Vision Transformers with Depth-Programmed Experts"
(Bulat, Ouali, Tzimiropoulos, arXiv 2610.12448), section 4.3 and Table 3 (which MoE formulation suits
one recurrent block?), appendix B (MoE baseline adaptations, Table 8) and B.1 (layer-wise LoRA).

Idea. reViT (revit.py) merges E expert FFNs by the step's normalized depth t. The paper compares
that depth program with content-routed MoE families on the same recurrent backbone and task loss,
at the arithmetic of ONE dense FFN per step (U = 1; appendix B: matching U matches neither
parameters, total FLOPs nor latency), and with a per-step LoRA. `ReViTMoE(routing=, lora_rank=)`
takes revit.ReViT's keyword arguments: embedding, shared attention and norms, head and elastic
depth are reViT's (the class derives from revit.ReViT, so that this file holds only what differs);
only the FFN bank, its router and the auxiliary losses change.

Per step, s (B, T, D) is the state entering the step (= the state leaving step k-1; T = N patch
tokens + the class token), x = s + attn(norm1(s)), h = norm2(x) the FFN input, mean() the token mean
(class token included; our choice), W_r a bias-free Linear(D, E) router, H = mlp_ratio D the dense
FFN's hidden width (ehr 4 in the paper's units: expert hidden width / model width), FFN_e expert e
of the bank, K = 1 routed expert per token. U is appendix B's nominal expert-FFN arithmetic per step
relative to one dense FFN; "params" the stored expert-FFN parameters at the paper's S width (D = 384,
E = 4, Table 8; `expert_params()`):
  depth   (3.1)  reViT: W = sum_e g_e(t) W_e, g = softmax(MLP(t)): exactly revit.ReViT (the default)
                 U = 1, 4.7 M.
  lory    (B; Zhong et al. 2024, arXiv 2405.03133) g = softmax(W_r mean(norm1(s))) per image: the
                 pooled state leaving step k-1 selects step k's merged FFN, before step k's attention
                 runs (Lory's causal segment routing, over depth instead of token segments; no
                 similarity-based batching). U = 1, 4.7 M.
  smear   (B; Muqeeth et al. 2024, "Soft Merging of Experts with Adaptive Routing") g = softmax(W_r
                 mean(h)) per image, recomputed every step: one FFN merged per image. U = 1, 4.7 M.
  deepseek (B; DeepSeek-V3, arXiv 2412.19437, sec. 2.1.2, eqs. 12-16; Wang et al. 2024, arXiv
                 2408.15664) affinities s = sigmoid(W_r h) per token; expert i = argmax_e (s_e + b_e)
                 of E routed experts plus one always-active shared expert, all of hidden H/2 (ehr 2):
                 y = FFN_sh(h) + g_i FFN_i(h), g_i = s_i / sum_{chosen} s_j (eq. 13: exactly 1 at
                 K = 1). The bias b (buffer `expert_bias`, checkpointed) enters the selection only,
                 never the gate; `after_step()` updates it (the auxiliary-loss-free balancer). No
                 sequence-level balance loss and no leading dense layers (appendix B). U = (1 + 1)
                 2/4 = 1, 3.0 M (5 experts at ehr 2).
  qwen3   (B; Qwen3, arXiv 2505.09388) p = softmax(W_r h) per token, expert i = argmax p, gate
                 p_i / sum_{chosen} p_j (top-K renormalized: exactly 1 at K = 1), no shared expert,
                 experts of hidden H. U = 1, 4.7 M.
  moeut   (B; MoEUT, Csordas et al. 2024, arXiv 2405.16039, sec. 2.1: sigma-MoE, Csordas et al.
                 2023) scores sigmoid(W_r h) per token, expert i = the top-1 score, gate sigmoid(l_i)
                 with no renormalization, experts of hidden H; dense attention (no SwitchHead, no
                 peri-LayerNorm). U = 1, 4.7 M.
  remoe   (B; ReMoE, Wang, Zhu, Chen, ICLR 2025, arXiv 2412.14711, sec. 3) gates g = relu(W_r h) per
                 token; all E experts of hidden H/4 (ehr 1) evaluated on every token, y = sum_e g_e
                 FFN_e(h) (an output mixture); its L1 regularizer with the adaptive coefficient
                 (buffer `l1_lambda`, updated by `after_step()`). U = E 1/4 = 1 at E = 4, 1.2 M.
  softmoe (B; Soft-MoE, Puigcerver et al., ICLR 2024, arXiv 2308.00951, sec. 2) S = N slots (the
                 patch count, appendix B) split evenly over the E experts of hidden H (N/E slots
                 each; N % E must be 0); logits = scale * normalize(h) normalize(Phi)^T (l2 over D,
                 Phi (S, D) the slot parameters = `router.weight`, `slot_scale` a learned scalar,
                 initialized to 1: Soft-MoE's normalization); dispatch = softmax over the T tokens
                 per slot, combine = softmax over the S slots per token. Our choice: the class
                 token is dispatched and combined like a patch token (the readout needs it to get
                 an FFN too), while the slot count stays the patch count N. U = (N/N) 4/4 = 1, 4.7 M
                 (slot parameters excluded, as Table 8).
  lora_rank=r (B.1, E = 1)  step k uses W + B_k A_k for qkv, proj, fc1, fc2 (base weights shared).
Under recurrence "the state entering step k" IS "the state leaving step k-1", so SMEAR routes on its
FFN's own input (after this step's attention, as SMEAR routes on its layer's input) and Lory on the
step's input: the one difference is whether the step's attention is seen by the router.

Auxiliary losses (appendix B; `aux_losses`): SMEAR none; DeepSeek-V3 none (its bias balancer is no
loss); ReMoE its own; Qwen3 none at U = 1 (appendix B gives its global-batch balance loss, 1e-3, to the
higher-budget settings only); MoEUT none (our choice: appendix B names no regularizer for it, and
sigma-MoE's entropy regularizer is not retained); Lory reViT's eq. 6, 8 and 9 with reViT's lambdas (our
choice: appendix B keeps Lory's routing and merge "unchanged" and is silent on its losses; Lory is
reViT's weight-merge sibling, and eq. 6 is written for exactly such a soft merge). A consequence of
the papers' own gate rules at K = 1, stated here because it is easy to miss: the renormalized top-1
gate of Qwen3 and DeepSeek-V3 is exactly 1, so the task gives their routers no gradient (computed
exactly 0 here, not rounding noise); Qwen3's token-to-expert assignment is therefore the one its
router draws at initialization, and DeepSeek-V3's moves only through its bias.

Measured: on CIFAR-100 at CPU scale only (docs/models.md, "The paper's comparisons"); no ImageNet run yet.
The paper's U = 1 ImageNet-1k S/16 numbers (Table 3 and Table 10): reViT 78.2, Lory 77.9, SMEAR 77.7,
DeepSeek-V3 70.6, Qwen3 68.6, MoEUT 67.8, ReMoE 70.1, Soft-MoE 69.2, layer-wise LoRA 77.6.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import revit
from revit import classification_loss, drop_path, ffn, sample_keep, step_coords, to_device

ROUTINGS = ("depth", "lory", "smear", "deepseek", "qwen3", "moeut", "remoe", "softmoe")
MERGE = ("lory", "smear")  # one FFN merged per image (weight merge)
DISPATCH = ("deepseek", "qwen3", "moeut")  # each token runs its top-1 routed expert (token dispatch)
TOKEN_LEVEL = (*DISPATCH, "remoe", "softmoe")  # a router per token (or slot): needs E >= 2
# ReMoE (appendix B; ReMoE sec. 3.3): lambda_0 and alpha of the controller; the target sparsity is 1 - K/E
# with K = 1 active expert's worth of gates (0.75 at E = 4)
REMOE_LAMBDA0, REMOE_ALPHA = 1e-8, 1.2


def per_image_ffn(mlp, x, g):
    """SMEAR/Lory: image b runs ONE FFN whose weights and biases are sum_e g[b, e] (expert e's).
    mlp: revit.ExpertMlp; x (B, N, D), g (B, E) -> (B, N, D)."""
    w1, b1, w2, b2 = mlp.merge(g)  # (B, H, D), (B, H), (B, D, H), (B, D)
    h = F.gelu(torch.baddbmm(b1[:, None], x, w1.mT))  # (B, N, H)
    return torch.baddbmm(b2[:, None], h, w2.mT)  # (B, N, D)


def dispatch(mlp, h, top, gate):
    """Dropless token dispatch (B): token m runs expert top[m] of `mlp`, weighted by gate[m] (no
    capacity, no dropped token). h (B, N, D), top (B, N) long, gate (B, N) -> (B, N, D). Every expert
    runs on its (possibly empty) set of tokens, so an expert that gets no token still gets a (zero)
    gradient, as DDP needs; how many tokens each expert gets is data, so on CUDA this reads it back
    (one sync per step)."""
    x, top = h.flatten(0, 1), top.flatten()  # (M, D), (M,) with M = B*N
    order = top.argsort()
    chunks = x[order].split(torch.bincount(top, minlength=mlp.fc1.weight.shape[0]).tolist())
    y = torch.cat([ffn(c, *(w[e] for w in mlp.tensors())) for e, c in enumerate(chunks)])[order.argsort()]
    return gate[..., None] * y.view_as(h)


def output_mixture(mlp, h, g):
    """ReMoE's output mixture (B): every expert on every token, y = sum_e g_e FFN_e(h).
    h (B, N, D), g (B, N, E) -> (B, N, D)."""
    return sum(g[..., e, None] * ffn(h, *(w[e] for w in mlp.tensors())) for e in range(g.shape[-1]))


def soft_moe(mlp, h, logits):
    """Soft-MoE (Puigcerver et al. 2024, sec. 2.1), its S slots split evenly over the E experts of
    `mlp` (slot j belongs to expert j // (S/E)): h (B, T, D), logits (B, T, S) -> (B, T, D).
    dispatch = softmax over the tokens (each slot's input is a convex mix of the tokens), combine =
    softmax over the slots (each token's output is a convex mix of the slots' outputs)."""
    w1, b1, w2, b2 = mlp.tensors()  # (E, Hs, D), (E, Hs), (E, D, Hs), (E, D)
    slots = logits.softmax(1).mT @ h  # (B, S, D): dispatch
    slots = slots.unflatten(1, (w1.shape[0], -1))  # (B, E, S/E, D): expert e's slots
    a = F.gelu(slots @ w1.mT + b1[:, None])  # (B, E, S/E, Hs)
    y = (a @ w2.mT + b2[:, None]).flatten(1, 2)  # (B, S, D): each slot through its expert
    return logits.softmax(2) @ y  # (B, T, D): combine


def lora_linear(x, w, b, ab=None):
    """x W^T + b, plus the per-image low-rank update (x A^T) B^T when ab = (A (B, r, in), B (B, out, r))."""
    y = F.linear(x, w, b)
    return y if ab is None else y + (x @ ab[0].mT) @ ab[1].mT  # (B, N, r) -> (B, N, out)


def lora_attention(attn, x, lora):
    """revit.Attention.forward with LoRA updates on qkv and proj: (B, N, D) -> (B, N, D)."""
    B, N, D = x.shape
    qkv = lora_linear(x, attn.qkv.weight, attn.qkv.bias, lora["qkv"])
    q, k, v = qkv.view(B, N, 3, attn.num_heads, D // attn.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
    x = F.scaled_dot_product_attention(q, k, v)  # (B, h, N, D/h)
    return lora_linear(x.transpose(1, 2).reshape(B, N, D), attn.proj.weight, attn.proj.bias, lora["proj"])


class ReViTMoE(revit.ReViT):
    """revit.ReViT with `routing` in ROUTINGS (module docstring) and an optional layer-wise LoRA.

    Call as ReViT: `logits = model(x, depth=None, keep=None)`, `logits, loss = model(x, targets, ...)`.
    Elastic depth is reViT's for every routing (a dropped step is the identity for that image). loss = the task loss
    + `aux_losses` (module docstring: Lory reViT's three terms, ReMoE its L1, the others none).
    `model.U`: appendix B's U of the configuration; `expert_params()`: its stored expert-FFN
    parameters (Table 8). After each optimizer step call `after_step()` (train.py does): it moves
    DeepSeek-V3's bias and ReMoE's lambda from the training forwards since the previous call.
    Initialization: the banks as reViT's (A.1's dense FFN init); the soft merges' routers at zero
    (every image's gate exactly 1/E at the start, as reViT's); every token-level router (and Soft-
    MoE's slots) trunc-normal(0.02), timm's Linear init, so that the tokens' choices differ from the
    start (a zero router would send every token to expert 0, and ReMoE's ReLU gates would all be 0).
    The token-level routings need experts >= 2 (a router over one expert routes nothing).
    LoRA (B.1): `lora_rank=r > 0` needs experts=1 and routing="depth" (the paper's recurrent ViT-S
    with one tied block; our rule). Adapter k has A_k (r, in) ~ U(+-1/sqrt(in)) (peft's kaiming
    init) and B_k = 0 (Hu et al. 2021), scale 1, so at init the model is the tied block. Another
    depth (or an elastic step at coordinate t) uses the adapter of the nearest trained step,
    round(t * (depth - 1)) (`adapter_index`; B.1 leaves "selecting or interpolating" open).
    Content gates depend on the image: `gates()` and `materialize()` exist for routing="depth"
    without LoRA only; `log_extras()` gives the last forward's mean gate per step.
    `self.config` keeps revit.ReViT's keyword arguments; routing and lora_rank are attributes.
    """

    bias_speed = 1e-3  # DeepSeek-V3's gamma, the bias update speed (its sec. 4.2: 0.001); ours at every scale

    def __init__(self, *, routing="depth", lora_rank=0, **kw):
        if routing not in ROUTINGS:
            raise ValueError(f"routing={routing!r} is not one of {ROUTINGS}")
        experts = kw.get("experts", 4)  # revit.ReViT's default
        if lora_rank < 0 or (lora_rank and (routing != "depth" or experts != 1)):
            raise ValueError(f"lora_rank={lora_rank} needs lora_rank >= 0, and for lora_rank > 0 experts=1 "
                             f"and routing='depth' (got experts={experts}, routing={routing!r})")
        if kw.get("block_fn") is not None and (routing != "depth" or lora_rank):
            raise ValueError(f"block_fn: routing={routing!r} with lora_rank={lora_rank} runs its own step on the "
                             "block's parts (norm1, attn, ls1, norm2, mlp, ls2), not the block's forward; give "
                             "block_fn with routing='depth' and lora_rank=0 only")
        if routing in TOKEN_LEVEL and experts < 2:
            raise ValueError(f"routing={routing!r} routes tokens among experts: it needs experts >= 2, got "
                             f"experts={experts}")
        super().__init__(**kw)  # reViT, built and initialized exactly as revit.ReViT(**kw)
        self.routing, self.lora_rank = routing, lora_rank
        self._last_gates, self._stats = [], None
        D, E, blk = self.embed_dim, self.experts, self.blocks[0]
        H, N = int(D * self.mlp_ratio), (self.img_size // self.patch_size) ** 2  # dense hidden, patch tokens
        narrower = {"deepseek": 2, "remoe": 4}.get(routing, 1)  # B: ehr 2 (DeepSeek-V3), 1 (ReMoE), else 4
        hidden = H // narrower
        if hidden < 1:  # (H >= 1: revit.ReViT checked it)
            raise ValueError(f"routing={routing!r}: its experts' width int(embed_dim x mlp_ratio) // {narrower} = "
                             f"{H} // {narrower} = {hidden}: every width must be >= 1")
        if hidden != H:  # narrower experts (and DeepSeek-V3's shared one), with the dense FFN init (A.1)
            blk.mlp = revit.ExpertMlp(D, hidden, E)
            if routing == "deepseek":
                blk.shared_mlp = revit.ExpertMlp(D, hidden, 1)
            for p in (*blk.mlp.tensors(), *(blk.shared_mlp.tensors() if routing == "deepseek" else ())):
                nn.init.trunc_normal_(p, std=0.02) if p.ndim == 3 else nn.init.zeros_(p)
        if routing == "softmoe" and N % E:
            raise ValueError(f"routing='softmoe' splits the {N} patch tokens' slots evenly over the experts: "
                             f"experts={E} must divide {N}")
        if routing != "depth":  # (routing="depth" keeps reViT's depth router)
            self.router = nn.Linear(D, N if routing == "softmoe" else E, bias=False) if E > 1 else None
            if routing in MERGE and self.router is not None:
                nn.init.zeros_(self.router.weight)
            elif self.router is not None:
                nn.init.trunc_normal_(self.router.weight, std=0.02)
        if routing == "softmoe":
            self.slot_scale = nn.Parameter(torch.ones(()))  # Soft-MoE's learned scale of the normalized logits
        if routing == "deepseek":
            self.register_buffer("expert_bias", torch.zeros(E))
        if routing == "remoe":
            # float64: lambda moves by alpha^(+-1) per step and falls far below 1e-8 while the gates are
            # sparser than the target; in float32 it would stop at the smallest subnormal (2.8e-45, where
            # x 1.2 rounds back to itself) and the controller would never act again
            self.register_buffer("l1_lambda", torch.tensor(REMOE_LAMBDA0, dtype=torch.float64))
        # appendix B's U, K = 1: token dispatch (K + K_sh) ehr / 4, output mixture E ehr / 4, Soft-MoE
        # (N_slots / T_p) ehr / 4 with N_slots = T_p = N here, weight merge ehr / 4 (ehr / 4 = hidden / H)
        self.U = hidden / H * {"deepseek": 1 + 1, "remoe": E}.get(routing, 1)
        if lora_rank:
            blk.lora = nn.ParameterDict()
            for name, (o, i) in {"qkv": (3 * D, D), "proj": (D, D), "fc1": (H, D), "fc2": (D, H)}.items():
                A = torch.empty(self.depth, lora_rank, i).uniform_(-i ** -0.5, i ** -0.5)  # (L, r, in)
                blk.lora[name + "_A"], blk.lora[name + "_B"] = nn.Parameter(A), nn.Parameter(
                    torch.zeros(self.depth, o, lora_rank))  # (L, out, r): zero, so W_k = W at init

    @property
    def default(self):
        """True for reViT itself (routing="depth", no LoRA): every method is revit.ReViT's."""
        return self.routing == "depth" and not self.lora_rank

    def expert_params(self):
        """Stored expert-FFN parameters (appendix B, Table 8): both projections and biases of every
        stored expert, shared ones included; no backbone, router, slot parameters or LoRA adapters."""
        blk = self.blocks[0]
        return sum(p.numel() for m in (blk.mlp, getattr(blk, "shared_mlp", None)) if m is not None
                   for p in m.parameters())

    def adapter_index(self, t):
        """LoRA adapter of the step at normalized depth t: the nearest trained step, round(t (L - 1))
        with L the trained depth (torch.round: ties to even). t (...) float -> (...) long."""
        return (t * (self.depth - 1)).round().long()

    def _route(self, inp):
        """Router logits in fp32: (..., D) -> (..., E); zeros (gate 1) for a single expert (merges)."""
        if self.router is None:
            return inp.new_zeros(*inp.shape[:-1], 1, dtype=torch.float32)
        return self.router(inp).float()

    def _select(self, logits):
        """Token dispatch at K = 1: each token's expert and gate. logits (..., E) fp32 -> top (...) long,
        gate (...). The renormalized top-K gate is a softmax over the chosen experts' log-scores:
          qwen3:    p_i / sum_chosen p_j = softmax(chosen logits)
          deepseek: s_i / sum_chosen s_j = softmax(logsigmoid(chosen logits)) (eq. 13), the expert
                    chosen by s + b (eq. 16): the bias moves the selection, never the gate
          moeut:    sigmoid(l_i), sigma-MoE's gate, not renormalized
        At K = 1 the first two are exactly 1, and softmax's backward makes their gradient exactly 0."""
        if self.routing == "deepseek":
            top = (logits.sigmoid() + self.expert_bias).argmax(-1, keepdim=True)
            gate = F.logsigmoid(logits).gather(-1, top).softmax(-1)
        else:
            top = logits.argmax(-1, keepdim=True)  # sigmoid is monotone: the top score is the top logit
            gate = logits.gather(-1, top)
            gate = gate.softmax(-1) if self.routing == "qwen3" else gate.sigmoid()
        return top.squeeze(-1), gate.squeeze(-1)

    def _gate_values(self, logits):
        """Each image's (merges) or token's weight per expert from one step's router logits, (..., E):
        the softmax (lory, smear), the chosen expert's gate and 0 elsewhere (token dispatch), the ReLU
        gates (remoe), each expert's share of the token's combine weights (softmoe: logits (..., S))."""
        if self.routing in MERGE:
            return logits.softmax(-1)
        if self.routing in DISPATCH:
            top, gate = self._select(logits)
            return torch.zeros_like(logits).scatter(-1, top[..., None], gate[..., None])
        if self.routing == "remoe":
            return logits.relu()
        return logits.softmax(-1).unflatten(-1, (self.experts, -1)).sum(-1)

    def _attend(self, a, lora=None):
        return self.blocks[0].attn(a) if lora is None else lora_attention(self.blocks[0].attn, a, lora)

    def _step_fn(self, z, adapters=None):
        """One recurrent step: z (B, T, D) -> (z, router logits (B, E), (B, T, E) or, softmoe, (B, T, S);
        None for LoRA); adapters (B,) long: each image's LoRA adapter (lora_rank > 0)."""
        blk, routing = self.blocks[0], self.routing
        lora = None if adapters is None else {  # each image's (A, B) of its step: (B, r, in), (B, out, r)
            n: (blk.lora[n + "_A"][adapters], blk.lora[n + "_B"][adapters]) for n in ("qkv", "proj", "fc1", "fc2")}
        a, dp = blk.norm1(z), self.training and blk.stochastic
        x = z + drop_path(blk.ls1(self._attend(a, lora)), blk.drop_prob, dp)
        h, logits = blk.norm2(x), None
        if routing in MERGE:  # smear: the mean of its own input; lory: the state leaving step k-1
            logits = self._route((h if routing == "smear" else a).mean(1))  # (B, E)
            y = per_image_ffn(blk.mlp, h, logits.softmax(-1))
        elif routing in DISPATCH:
            logits = self.router(h).float()  # (B, T, E)
            y = dispatch(blk.mlp, h, *self._select(logits))
            if routing == "deepseek":  # + the always-active shared expert
                y = y + ffn(h, *(w[0] for w in blk.shared_mlp.tensors()))
        elif routing == "remoe":
            logits = self.router(h).float()  # (B, T, E)
            y = output_mixture(blk.mlp, h, logits.relu())
        elif routing == "softmoe":  # l2-normalized tokens and slot parameters, a learned scale
            logits = (self.slot_scale * F.linear(F.normalize(h, dim=-1), F.normalize(self.router.weight, dim=-1))
                      ).float()  # (B, T, S)
            y = soft_moe(blk.mlp, h, logits)
        else:  # "depth" with LoRA (E = 1): the tied FFN with step k's adapters on fc1 and fc2 (B.1)
            w1, b1, w2, b2 = (w[0] for w in blk.mlp.tensors())
            y = lora_linear(F.gelu(lora_linear(h, w1, b1, lora["fc1"])), w2, b2, lora["fc2"])
        return x + drop_path(blk.ls2(y), blk.drop_prob, dp), logits

    def step(self, z, k, depth=None, weights=None):
        """Step k (0-based) of a `depth`-step run: revit.ReViT's anytime interface, with the routed step."""
        if self.default:
            return super().step(z, k, depth, weights)
        depth = depth or self.depth
        ad = self.adapter_index(self.grid(depth).expand(z.shape[0], depth))[:, k] if self.lora_rank else None
        return self._step(self._step_fn, z, ad)[0]

    def forward(self, x, targets=None, depth=None, keep=None):
        if self.default:
            return super().forward(x, targets, depth, keep)
        depth = self.depth if depth is None else depth
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        z = self.embed(x)
        B = z.shape[0]
        if keep is None and self.training and self.depth_dropout > 0:
            keep = sample_keep(B, depth, self.depth_dropout)  # on the CPU, as reViT: no device sync
        if keep is not None:
            keep = keep.cpu()  # the rows of each step are host data (a given CUDA mask: one copy)
            if keep.shape != (B, depth) or not keep.any(1).all():
                raise ValueError(f"keep must be ({B}, {depth}) bool with a step kept per image")
        # each image's coordinate of each step (3.2): the grid, or its retained steps renumbered
        t = self.grid(depth).expand(B, depth) if keep is None else to_device(step_coords(keep), z.device)  # (B, L)
        adapters = self.adapter_index(t) if self.lora_rank else None  # (B, L) long
        logits = []
        for k in range(depth):
            ad = None if adapters is None else adapters[:, k]
            if keep is None:
                z, lg = self._step(self._step_fn, z, ad)
            else:  # elastic depth: only the images that keep step k run it
                rows = keep[:, k].nonzero().squeeze(1)  # (B_k,), CPU
                if not len(rows):
                    logits.append(None)
                    continue
                rows = to_device(rows, z.device)
                zk, lg = self._step(self._step_fn, z[rows], None if ad is None else ad[rows])
                z = z.index_copy(0, rows, zk)
            logits.append(lg)
        with torch.no_grad():  # for log_extras, analyze.py and after_step
            self._last_gates = [None if lg is None else self._gate_values(lg.detach()) for lg in logits]
        if self.training and torch.is_grad_enabled():
            self._count(self._last_gates)
        out = self.classify(z)
        if targets is None:
            return out
        loss = classification_loss(out, targets, self.loss)
        self.aux = {f"{self.loss}_loss": loss.detach()}
        for name, (lam, term) in self.aux_losses([lg for lg in logits if lg is not None]).items():
            loss = loss + lam * term
            self.aux[f"{name}_loss"] = term.detach()
        return out, loss

    def forward_intermediates(self, x, indices=None, return_prefix_tokens=False, norm=False, stop_early=False,
                              output_fmt="NCHW", intermediates_only=False, output_dict=False, *, depth=None):
        """revit.ReViT.forward_intermediates (timm's) with the routed step (each image's own FFN; no depth dropout);
        it records the gates (`_last_gates`) of the steps run, as forward does."""
        if self.default:
            return super().forward_intermediates(x, indices, return_prefix_tokens, norm, stop_early, output_fmt,
                                                 intermediates_only, output_dict, depth=depth)
        depth = self.depth if depth is None else depth
        take, z, states, logits = revit.take_indices(depth, indices), self.begin(x), [], []
        adapters = self.adapter_index(self.grid(depth).expand(z.shape[0], depth)) if self.lora_rank else None
        for k in range(max(take) + 1 if stop_early and take else depth):
            z, lg = self._step(self._step_fn, z, None if adapters is None else adapters[:, k])
            logits.append(lg)
            if k in take:
                states.append(self.norm(z) if norm else z)
        with torch.no_grad():  # for log_extras and analyze.py, as forward
            self._last_gates = [None if lg is None else self._gate_values(lg.detach()) for lg in logits]
        return revit.timm_outputs(self, x, self.norm(z), states, return_prefix_tokens, output_fmt, intermediates_only,
                                  output_dict)

    def aux_losses(self, logits):
        """The auxiliary losses (module docstring) from the router logits of the steps that ran:
        name -> (weight, term), scalars.
          lory (E > 1): reViT's eq. 6, 8, 9 (revit.router_losses, one gate per image and step) with
                        lambda_bal, lambda_z, lambda_div (eq. 7's 1e-2, 1e-3, 1e-3)
          remoe:        ReMoE's L1 of the ReLU gates with its load balancing (sec. 3.3-3.4), mean over
                        the steps of mean_tokens sum_e f_e g_e, f_e = (E / K) x the fraction of the
                        step's tokens for which g_e > 0 (detached; 1 for every expert when balanced at
                        the target), weighted by the controller's lambda (`l1_lambda`)
          the others:   none (appendix B)."""
        if self.routing == "lory" and self.experts > 1:
            reg = revit.router_losses(torch.cat(logits), self.blocks[0].mlp)  # logits (B, E) per step
            return {k: (lam, reg[k]) for lam, k in zip(self.lambdas, ("bal", "z", "div"))}
        if self.routing == "remoe":
            l1 = []
            for lg in logits:
                g = lg.relu().flatten(0, -2)  # (M, E): the step's tokens
                f = g.detach().gt(0).float().mean(0) * self.experts  # E / K with K = 1
                l1.append((g * f).sum(-1).mean())
            return {"l1": (self.l1_lambda.float(), torch.stack(l1).mean())}  # (below 1e-45: 0)
        return {}

    def _count(self, gates):
        """What after_step's balancers need, summed over the training forwards since its last call:
        deepseek: the tokens that chose each expert over every step, (E,); remoe: the zero and
        nonzero ReLU gates, (2,). Device tensors only (no value read back to the host)."""
        if self.routing not in ("deepseek", "remoe"):
            return
        g = torch.cat([v.reshape(-1, v.shape[-1]) for v in gates if v is not None])  # (M, E)
        s = g.ne(0).sum(0) if self.routing == "deepseek" else torch.stack([g.eq(0).sum(), g.ne(0).sum()])
        s = s.float()
        self._stats = s if self._stats is None else self._stats + s

    @torch.no_grad()
    def after_step(self):
        """The balancers that act between optimizer steps, from the training forwards since the last
        call (all micro-batches of the step); a no-op for the other routings. Call it after each
        optimizer step (train.py does), not between a forward and its backward.
          deepseek: b_e += gamma sign(mean_e' load_e' - load_e), load_e the tokens that chose expert
                    e (DeepSeek-V3 sec. 2.1.2: "At the end of each step, we will decrease the bias
                    term by gamma if its corresponding expert is overloaded, and increase it by gamma
                    if its corresponding expert is underloaded"); gamma = `bias_speed`
          remoe:    lambda <- lambda alpha^sign(target - S), S the fraction of zero gates, target
                    1 - K/E = 1 - 1/E (0.75 at E = 4), alpha 1.2 (ReMoE sec. 3.3; appendix B): raised
                    while the gates are too dense, lowered while too sparse
        Under torch.distributed the counts are all-reduced first, so the load and sparsity are the
        global batch's and every process keeps the same buffers (DDP would also broadcast rank 0's
        buffers at the next forward, which then changes nothing)."""
        if self.routing not in ("deepseek", "remoe"):
            return
        s = self._stats if self._stats is not None else torch.zeros(
            self.experts if self.routing == "deepseek" else 2, device=self.pos_embed.device)
        self._stats = None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(s)
        if self.routing == "deepseek":
            self.expert_bias += self.bias_speed * torch.sign(s.mean() - s)
        else:
            sparsity = s[0] / s.sum().clamp(min=1)
            self.l1_lambda *= REMOE_ALPHA ** (torch.sign(1 - 1 / self.experts - sparsity) * (s.sum() > 0)).double()

    def compile_regions(self, **kwargs):
        """reViT's regional compilation for the default; otherwise the step function is compiled once
        (fullgraph) and reused for every step and depth, except for the token-dispatch routings,
        whose dispatch has data-dependent sizes: there only the attention half is compiled. Call
        before DDP."""
        if self.default:
            return super().compile_regions(**kwargs)
        if self.routing in DISPATCH:
            self._attend = torch.compile(self._attend, fullgraph=True, **kwargs)
        else:
            self._step_fn = torch.compile(self._step_fn, fullgraph=True, **kwargs)
        return self

    def trains_as_one_graph(self):
        """As ReViT for the default (depth routing, no LoRA); the baselines train with compiled
        regions only (token dispatch sizes are data; the others are not measured whole)."""
        return self.default and super().trains_as_one_graph()

    def gates(self, depth=None):
        if self.routing != "depth":
            raise ValueError(f"routing={self.routing!r}: the gates depend on the image, there is no depth "
                             "table; log_extras() has the last forward's mean gate per step")
        return super().gates(depth)

    def materialize(self, depth=None):
        if not self.default:
            raise ValueError(f"only routing='depth' without LoRA materializes (3.1); routing={self.routing!r}, "
                             f"lora_rank={self.lora_rank} need their router or adapters at run time")
        return super().materialize(depth)

    def flops_per_image(self, depth=None):
        """Forward FLOPs per image of what the routing runs: 2 x the matmuls' multiply-adds, as revit
        counts them (embedding, shared attention, head, and per step the FFN work below, Hs the
        experts' hidden width, S = N the Soft-MoE slots; torch's FlopCounterMode agrees, tested).
            depth:   one dense FFN, 2TDH (the depth router runs once per batch, not counted)
            lory, smear: 2TDH + the image's merge E(2DH + H + D) + its router DE (E > 1)
            deepseek: the shared + one routed expert, 2 x 2TD Hs (= 2TDH), + the router TDE
            qwen3, moeut: one routed expert, 2TDH, + the router TDE
            remoe:   E experts on every token, E x 2TD Hs (= 2TDH at E = 4), + the router TDE
            softmoe: logits, dispatch and combine 3TDS, the slots' FFNs 2SDH
            LoRA:    2TDH + Tr(8D + 2H), the online adapters of qkv, proj, fc1, fc2 (folded: 0)"""
        if self.default:
            return super().flops_per_image(depth)
        depth = depth or self.depth
        D, p, E, r = self.embed_dim, self.patch_size, self.experts, self.routing
        N = (self.img_size // p) ** 2
        T = N + int(self.cls_token is not None)
        H, Hs = int(D * self.mlp_ratio), self.blocks[0].mlp.fc1.weight.shape[1]
        if r in MERGE:
            mlp = 2 * T * D * H + E * (2 * D * H + H + D) + (D * E if E > 1 else 0)
        elif r in DISPATCH or r == "remoe":
            mlp = {"deepseek": 2, "remoe": E}.get(r, 1) * 2 * T * D * Hs + T * D * E
        elif r == "softmoe":
            mlp = 3 * T * D * N + 2 * N * D * H
        else:
            mlp = 2 * T * D * H + T * self.lora_rank * (8 * D + 2 * H)
        per_step = 4 * T * D * D + 2 * T * T * D + mlp
        return 2 * (N * D * self.in_chans * p * p + depth * per_step + D * self.num_classes)

    @torch.no_grad()
    def log_extras(self):
        """For log.jsonl. Default: reViT's gate table. Routings: "gates", the mean of `_gate_values`
        per step (L, E) of the last forward (in train.py: the last training batch of the epoch; null
        for a step no image kept): the mean gate (lory, smear, remoe), each expert's token share
        (deepseek, qwen3: their gate is 1), its mean gate over all tokens (moeut), its share of the
        combine weights (softmoe); deepseek also "expert_bias", remoe "l1_lambda" and "sparsity"
        (per step, the fraction of zero gates). LoRA: "lora_norms", per step sqrt(sum over qkv,
        proj, fc1, fc2 of ||B_k A_k||_F^2)."""
        if self.default:
            return super().log_extras()
        if self.lora_rank:
            lo = self.blocks[0].lora
            norms = sum((lo[n + "_B"] @ lo[n + "_A"]).pow(2).sum((1, 2)) for n in ("qkv", "proj", "fc1", "fc2"))
            return {"lora_norms": [round(v, 6) for v in norms.sqrt().tolist()]}
        rows = [None if g is None else g.reshape(-1, g.shape[-1]) for g in self._last_gates]
        out = {"gates": [None if g is None else [round(v, 4) for v in g.mean(0).tolist()] for g in rows]}
        if self.routing == "deepseek":
            out["expert_bias"] = [round(v, 6) for v in self.expert_bias.tolist()]
        if self.routing == "remoe":
            out["l1_lambda"] = float(self.l1_lambda)
            out["sparsity"] = [None if g is None else round(g.eq(0).float().mean().item(), 4) for g in rows]
        return out
