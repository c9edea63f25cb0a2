"""reViT's comparison baselines: the same recurrent block with its FFN routed by content, by token,
as an output mixture, or adapted per step by layer-wise LoRA.

Paper: "One Block, Multiple Depths: Recurrent Vision Transformers with Depth-Programmed Experts"
(Bulat, Ouali, Tzimiropoulos, arXiv 2610.12448), section 4.3 and Table 3 (which MoE formulation suits
one recurrent block?), appendix B (MoE baseline adaptations) and B.1 (layer-wise LoRA).

Idea. reViT (revit.py) merges E expert FFNs by the step's normalized depth t. The paper compares
that depth program with content-routed MoE families on the same recurrent backbone and loss, at
the arithmetic of ONE dense FFN per token and step (U = 1; appendix B: matching U matches neither
parameters, total FLOPs nor latency), and with a per-step LoRA. `ReViTMoE(routing=, lora_rank=)`
takes revit.ReViT's keyword arguments: embedding, shared attention and norms, head, elastic depth
and loss are reViT's (the class derives from revit.ReViT, so that this file holds only what differs);
only the FFN bank and its router change. Per step, s is the state entering the step (= the state
leaving step k-1), x = s + attn(norm1(s)), h = norm2(x) the FFN input, mean() the token mean
(class token included; our choice), W_r a bias-free Linear(D, E) router:
  depth    (3.1)  W = sum_e g_e(t) W_e, g = softmax(MLP(t)): exactly revit.ReViT (the default)
  smear    (B)    g = softmax(W_r mean(h)) per image and step; one FFN merged per image (SMEAR)
  lory     (B)    g = softmax(W_r mean(norm1(s))): the previous step's output routes this step's
                  merge, before this step's attention runs (Lory's causal segment routing, over depth)
  token    (B)    y = FFN_0(h) + p_i FFN_i(h), i = argmax_e p_e, p = softmax(W_r h) per token: one
                  shared + one of E routed experts, all of hidden H/2 (DeepSeek-V3 / Qwen3 at U = 1),
                  dropless (every token runs its expert; no capacity)
  mixture  (B)    y = sum_e p_e FFN_e(h), p = softmax(W_r h) per token: every expert on every token
                  (ReMoE-like output mixture). Its compute grows with E: E dense FFNs per token.
  lora_rank=r (B.1, E = 1)  step k uses W + B_k A_k for qkv, proj, fc1, fc2 (base weights shared)
Under recurrence "the state entering step k" IS "the state leaving step k-1", so SMEAR routes on its
FFN's own input (after this step's attention, as SMEAR routes on its layer's input) and Lory on the
step's input: the one difference is whether the step's attention is seen by the router.

Measured: on CIFAR-100 at CPU scale only (docs/models.md, "The paper's comparisons"); no ImageNet run yet.
The paper's U = 1 ImageNet-1k S/16 numbers (Table 3 and Table 10): reViT 78.2, Lory 77.9, SMEAR 77.7,
layer-wise LoRA 77.6.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import revit
from revit import classification_loss, drop_path, ffn, sample_keep, step_coords, to_device

ROUTINGS = ("depth", "smear", "lory", "token", "mixture")


def per_image_ffn(mlp, x, g):
    """SMEAR/Lory: image b runs ONE FFN whose weights and biases are sum_e g[b, e] (expert e's).
    mlp: revit.ExpertMlp; x (B, N, D), g (B, E) -> (B, N, D)."""
    w1, b1, w2, b2 = mlp.merge(g)  # (B, H, D), (B, H), (B, D, H), (B, D)
    h = F.gelu(torch.baddbmm(b1[:, None], x, w1.mT))  # (B, N, H)
    return torch.baddbmm(b2[:, None], h, w2.mT)  # (B, N, D)


def token_choice(mlp, shared, h, p):
    """Dropless token-choice top-1 with a shared expert (B): token m runs the shared expert and
    routed expert i = argmax p[m], weighted by p[m, i]. h (B, N, D), p (B, N, E) -> (B, N, D).
    Our choice: the gate is the softmax probability itself (Switch's top-1 gate). DeepSeek-V3 and
    Qwen3 renormalize the top-K weights; at K = 1 that makes the gate 1 and leaves the router no
    gradient from the task. Every expert runs on its (possibly empty) set of tokens, so an expert
    that gets no token still gets a (zero) gradient, as DDP needs."""
    x, p = h.flatten(0, 1), p.flatten(0, 1)  # (M, D), (M, E) with M = B*N
    top = p.argmax(-1)  # (M,)
    order = top.argsort()
    # expert e's tokens; their number is data, so on CUDA this reads it back: one sync per step
    chunks = x[order].split(torch.bincount(top, minlength=p.shape[1]).tolist())
    y = torch.cat([ffn(c, *(w[e] for w in mlp.tensors())) for e, c in enumerate(chunks)])[order.argsort()]
    y = ffn(x, *(w[0] for w in shared.tensors())) + p.gather(1, top[:, None]) * y  # (M, D)
    return y.view_as(h)


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

    Call as ReViT: `logits, loss = model(x, targets=None, depth=None, keep=None)`. Elastic depth is
    reViT's for every routing (a dropped step is the identity for that image). For E > 1 the loss
    adds A.2's three terms with reViT's weights (our choice: one loss for the whole comparison; the
    DeepSeek-V3 sequence-level balance loss is omitted, as in appendix B), over every router call
    of the forward (images for smear/lory, tokens for token/mixture), p the softmax of the logits:
        L_bal = E * sum_e f_e P_e, P_e = mean p_e; f_e = P_e for the soft routings (reViT's
                definition), the fraction of tokens whose top-1 is e for token (Switch, Qwen3)
        L_z   = mean logsumexp(logits)^2 (ST-MoE);  L_div = reViT's expert cosine similarity.
    LoRA (B.1): `lora_rank=r > 0` needs experts=1 and routing="depth" (the paper's recurrent ViT-S
    with one tied block; our rule). Adapter k has A_k (r, in) ~ U(+-1/sqrt(in)) (peft's kaiming
    init) and B_k = 0 (Hu et al. 2021), scale 1, so at init the model is the tied block. Another
    depth (or an elastic step at coordinate t) uses the adapter of the nearest trained step,
    round(t * (depth - 1)) (`adapter_index`; B.1 leaves "selecting or interpolating" open).
    Content gates depend on the image: `gates()` and `materialize()` exist for routing="depth"
    without LoRA only; `log_extras()` gives the last forward's mean gate per step.
    `self.config` keeps revit.ReViT's keyword arguments; routing and lora_rank are attributes.
    """

    def __init__(self, *, routing="depth", lora_rank=0, **kw):
        if routing not in ROUTINGS:
            raise ValueError(f"routing={routing!r} is not one of {ROUTINGS}")
        experts = kw.get("experts", 4)  # revit.ReViT's default
        if lora_rank < 0 or (lora_rank and (routing != "depth" or experts != 1)):
            raise ValueError(f"lora_rank={lora_rank} needs lora_rank >= 0, and for lora_rank > 0 experts=1 "
                             f"and routing='depth' (got experts={experts}, routing={routing!r})")
        super().__init__(**kw)  # reViT, built and initialized exactly as revit.ReViT(**kw)
        self.routing, self.lora_rank = routing, lora_rank
        self._last_logits = []
        D, E, blk = self.embed_dim, self.experts, self.blocks[0]
        H = int(D * self.mlp_ratio)
        if routing != "depth":
            if routing == "token":  # B: 1 shared + E routed experts of hidden H/2 (ratio 2 for ratio 4)
                blk.mlp, blk.shared_mlp = revit.ExpertMlp(D, H // 2, E), revit.ExpertMlp(D, H // 2, 1)
                for p in (*blk.mlp.tensors(), *blk.shared_mlp.tensors()):  # the dense FFN init (A.1)
                    nn.init.trunc_normal_(p, std=0.02) if p.ndim == 3 else nn.init.zeros_(p)
            self.router = nn.Linear(D, E, bias=False) if E > 1 else None
            if self.router is not None and routing == "token":  # distinct top-1 choices from the start
                nn.init.trunc_normal_(self.router.weight, std=0.02)
            elif self.router is not None:  # A.1's choice for soft gates: uniform 1/E at init
                nn.init.zeros_(self.router.weight)
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

    def adapter_index(self, t):
        """LoRA adapter of the step at normalized depth t: the nearest trained step, round(t (L - 1))
        with L the trained depth (torch.round: ties to even). t (...) float -> (...) long."""
        return (t * (self.depth - 1)).round().long()

    def _route(self, inp):
        """Router logits in fp32: (..., D) -> (..., E); zeros (gate 1) for a single expert."""
        if self.router is None:
            return inp.new_zeros(*inp.shape[:-1], 1, dtype=torch.float32)
        return self.router(inp).float()

    def _attend(self, a, lora=None):
        return self.blocks[0].attn(a) if lora is None else lora_attention(self.blocks[0].attn, a, lora)

    def _step_fn(self, z, adapters=None):
        """One recurrent step: z (B, N, D) -> (z, router logits (B, E) or (B, N, E), or None);
        adapters (B,) long: each image's LoRA adapter (lora_rank > 0)."""
        blk, routing = self.blocks[0], self.routing
        lora = None if adapters is None else {  # each image's (A, B) of its step: (B, r, in), (B, out, r)
            n: (blk.lora[n + "_A"][adapters], blk.lora[n + "_B"][adapters]) for n in ("qkv", "proj", "fc1", "fc2")}
        a, dp = blk.norm1(z), self.training and blk.stochastic
        x = z + drop_path(blk.ls1(self._attend(a, lora)), blk.drop_prob, dp)
        h, logits = blk.norm2(x), None
        if routing == "smear":  # B: SMEAR routes on the mean of its own input, recomputed every step
            logits = self._route(h.mean(1))  # (B, E)
            y = per_image_ffn(blk.mlp, h, logits.softmax(-1))
        elif routing == "lory":  # B: the state leaving step k-1, before step k's attention, routes step k
            logits = self._route(a.mean(1))  # (B, E)
            y = per_image_ffn(blk.mlp, h, logits.softmax(-1))
        elif routing == "token":  # B: DeepSeek-V3 / Qwen3 at U = 1
            logits = self._route(h)  # (B, N, E)
            y = token_choice(blk.mlp, blk.shared_mlp, h, logits.softmax(-1))
        elif routing == "mixture":  # B: ReMoE-like dense output mixture, E FFN evaluations per token
            logits = self._route(h)  # (B, N, E)
            p = logits.softmax(-1)
            y = sum(p[..., e, None] * ffn(h, *(w[e] for w in blk.mlp.tensors())) for e in range(p.shape[-1]))
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
        self._last_logits = [None if lg is None else lg.detach() for lg in logits]  # for log_extras
        out = self.classify(z)
        if targets is None:
            return out, None
        loss = classification_loss(out, targets, self.loss)
        self.aux = {f"{self.loss}_loss": loss.detach()}
        if self.experts > 1:
            reg = self.content_regularizers([lg for lg in logits if lg is not None])
            loss = loss + sum(lam * reg[k] for lam, k in zip(self.lambdas, ("bal", "z", "div")))
            self.aux.update({f"{k}_loss": v.detach() for k, v in reg.items()})
        return out, loss

    def content_regularizers(self, logits):
        """The class docstring's L_bal, L_z, L_div over the router logits of every step: dict of scalars."""
        lg = torch.cat([l.reshape(-1, l.shape[-1]) for l in logits])  # (M, E): every router call
        p, E = lg.softmax(-1), lg.shape[1]
        f = F.one_hot(lg.argmax(-1), E).float().mean(0) if self.routing == "token" else p.mean(0)
        theta = torch.cat([w.flatten(1) for w in self.blocks[0].mlp.tensors()], dim=1)  # (E, P)
        with torch.autocast(theta.device.type, enabled=False):  # a fp32 Gram matrix, as reViT
            theta = F.normalize(theta.float(), dim=1)
            cos = theta @ theta.T  # (E, E)
        return {"bal": E * (f * p.mean(0)).sum(), "z": torch.logsumexp(lg, -1).pow(2).mean(),
                "div": (cos.sum() - cos.diagonal().sum()) / (E * (E - 1))}

    def compile_regions(self, **kwargs):
        """reViT's regional compilation for the default; otherwise the step function is compiled once
        (fullgraph) and reused for every step and depth, except for token routing, whose dispatch has
        data-dependent sizes: there only the attention half is compiled. Call before DDP."""
        if self.default:
            return super().compile_regions(**kwargs)
        if self.routing == "token":
            self._attend = torch.compile(self._attend, fullgraph=True, **kwargs)
        else:
            self._step_fn = torch.compile(self._step_fn, fullgraph=True, **kwargs)
        return self

    def trains_as_one_graph(self):
        """As ReViT for the default (depth routing, no LoRA); the baselines train with compiled
        regions only (token routing's dispatch sizes are data; the others are not measured whole)."""
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
        counts them (embedding, shared attention, head, and per step the FFN work below; a router only
        for E > 1; torch's FlopCounterMode agrees, tested).
            depth:   one dense FFN, 2TDH (the depth router runs once per batch, not counted)
            smear, lory: 2TDH + the image's merge E(2DH + H + D) + the router DE
            token:   shared + one routed expert of hidden H/2 (= 2TDH) + the router TDE
            mixture: E x 2TDH + the router TDE: grows with E
            LoRA:    + Tr(8D + 2H), the online adapters of qkv, proj, fc1, fc2 (folded: 0)"""
        if self.default:
            return super().flops_per_image(depth)
        depth = depth or self.depth
        D, p, E, r = self.embed_dim, self.patch_size, self.experts, self.routing
        N = (self.img_size // p) ** 2
        T = N + int(self.cls_token is not None)
        H = int(D * self.mlp_ratio)
        router = 0 if E == 1 else (D * E if r in ("smear", "lory") else T * D * E)
        mlp = {"depth": 2 * T * D * H, "smear": 2 * T * D * H + E * (2 * D * H + H + D),
               "lory": 2 * T * D * H + E * (2 * D * H + H + D), "token": 2 * T * D * 2 * (H // 2),
               "mixture": E * 2 * T * D * H}[r] + router + T * self.lora_rank * (8 * D + 2 * H)
        per_step = 4 * T * D * D + 2 * T * T * D + mlp
        return 2 * (N * D * self.in_chans * p * p + depth * per_step + D * self.num_classes)

    @torch.no_grad()
    def log_extras(self):
        """For log.jsonl. Default: reViT's gate table. Content routings: "gates", the mean gate per
        step (L, E) of the last forward (in train.py: the last validation batch, at the training
        depth; null for a step no image kept), and for token routing
        "expert_load", the fraction of tokens per routed expert. LoRA: "lora_norms", per step
        sqrt(sum over qkv, proj, fc1, fc2 of ||B_k A_k||_F^2)."""
        if self.default:
            return super().log_extras()
        if self.lora_rank:
            lo = self.blocks[0].lora
            norms = sum((lo[n + "_B"] @ lo[n + "_A"]).pow(2).sum((1, 2)) for n in ("qkv", "proj", "fc1", "fc2"))
            return {"lora_norms": [round(v, 6) for v in norms.sqrt().tolist()]}
        rows = [None if lg is None else lg.reshape(-1, lg.shape[-1]) for lg in self._last_logits]
        out = {"gates": [None if lg is None else [round(v, 4) for v in lg.softmax(-1).mean(0).tolist()]
                         for lg in rows]}
        if self.routing == "token":
            out["expert_load"] = [None if lg is None else [round(v, 4) for v in
                                  F.one_hot(lg.argmax(-1), lg.shape[1]).float().mean(0).tolist()] for lg in rows]
        return out
