"""SR-ViT: Soft Mixture-of-Recursions, a ViT whose layer stack runs R times and whose output mixes,
token by token, the states after every recursion. Paper: "Soft Mixture-of-Recursions: Going Deeper
with Recursive Vision Transformers" (SoftMoR, Lee & Park, arXiv 2607.00774; abstract only).

Idea. Recursive transformers usually share weights to save parameters; SoftMoR shares them to get
depth. A stack of `depth` untied layers f (DeiT's blocks) is applied `recursions` = R times, and a
router gives every token a softmax weight over the R recursion outputs, so the intermediate
representations are used. R = 1 is exactly the plain ViT; the router is the only new module.

Equations. The abstract gives none: the lines marked OUR READING are our formulation of it.
    h_0 = [cls; patch_embed(x)] + pos_embed                    (B, T, D), T = N (+1 class token)
    h_r = f(h_{r-1}),  f = blocks[depth-1] o ... o blocks[0],  r = 1..R   (weights shared over r)
    s_{r,i} = w_r . LN_r(h_{r,i})                              one score per token   [OUR READING]
    a_{i,r} = softmax_r(s_{i,r}),  o_i = sum_r a_{i,r} h_{r,i}                       [OUR READING]
    logits = head(norm(o)[:, 0])  with a class token;  logits = head(fc_norm(mean(o)))  without
w_r = 0 at init, so the mixture starts uniform. The sum over r is accumulated online (running max
and running sums, as in a streaming softmax): without autograd, memory does not grow with R.
Block as in bvit.py: ls1, ls2 are LayerScale (a learned per-channel scale of each residual branch,
the identity unless `layer_scale` is given); without a class token the readout is global average
pooling (GAP: the mean over the tokens), normalized by `fc_norm` (timm's name). Optional machinery,
after the model: the attention inits (`init=` on the base `init_base=`, as in bvit.py) and `resample_pos_embed`.

Paper (ImageNet-1k): SR-ViT-S 79.83% at R=1 -> 82.48% at R=4 with ~1.7M more parameters. Our per-token
mixing module (Router) adds 3*D*R parameters at R > 1: 4,608 for S (D=384) at R=4, none at R=1, about 370x
fewer; the paper's module is larger, and its form is not known (the abstract gives only the count).
presets.py's in1k-srvit-* train with the DeiT recipe: our reading of the R=1 number (DeiT-S: 79.8).
Measured: see README.md "Results" (commands and hardware there).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


# ----------------------------------------------------------------------------- building blocks
# Copied from bvit.py on purpose (each model file stands alone): a diff shows only SoftMoR.
def drop_path(x, p, training: bool):
    """Stochastic depth (Huang et al. 2016): x (B, ...), each sample's branch zeroed with probability p (float
    or 0-d tensor), the rest x 1/(1-p). Draws whenever `training`, even at p = 0 (blocks pass `stochastic`)."""
    if not training:
        return x
    keep = torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), device=x.device) >= p
    return x * keep.to(x.dtype) / (1.0 - p)


def shared_drop_rate(rate, steps, total):
    """Drop-path rate of a block applied at `steps` (0-based) of `total` block applications: the mean over them of
    DeiT/timm's untied schedule rate * k / (total - 1) (our rule for shared blocks; docs/models.md)."""
    return rate * sum(steps) / len(steps) / max(1, total - 1)


class LayerScale(nn.Module):
    """LayerScale (CaiT, Touvron et al. 2021; DeiT III): gamma * x, gamma (D,) starting at `init`."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.gamma = nn.Parameter(init * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class Attention(nn.Module):
    """Multi-head self-attention on (B, N, D) using scaled_dot_product_attention."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, D = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.num_heads, D // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, h, N, D/h)
        x = F.scaled_dot_product_attention(q, k, v)  # (B, h, N, D/h)
        return self.proj(x.transpose(1, 2).reshape(B, N, D))


class Mlp(nn.Module):
    """Linear(D, r*D) -> GELU -> Linear(r*D, D)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm block F: (B, N, D) -> (B, N, D) (ViT, arXiv 2010.11929; timm's names). `stochastic`: drop path
    on (default: drop_path > 0); a model passes one flag to all blocks, so a rate-0 block runs the same ops."""

    def __init__(self, dim, num_heads, mlp_ratio=4.0, layer_scale=None, drop_path=0.0, stochastic=None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.ls1 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        # the rate as a tensor: blocks of different rates share one compiled graph (compile_regions)
        self.register_buffer("drop_prob", torch.tensor(float(drop_path)), persistent=False)
        self.stochastic = drop_path > 0 if stochastic is None else stochastic

    def forward(self, x):
        dp = self.training and self.stochastic
        x = x + drop_path(self.ls1(self.attn(self.norm1(x))), self.drop_prob, dp)
        return x + drop_path(self.ls2(self.mlp(self.norm2(x))), self.drop_prob, dp)


def classification_loss(logits, targets, kind="ce"):
    """Cross-entropy ("ce") or DeiT III's binary cross-entropy ("bce": mean over B x classes, class
    indices made one-hot), in fp32. logits (B, classes); targets (B,) indices or (B, classes) probs."""
    if kind == "ce":
        return F.cross_entropy(logits.float(), targets)
    t = F.one_hot(targets, logits.shape[1]) if targets.ndim == 1 else targets
    return F.binary_cross_entropy_with_logits(logits.float(), t.float())


# ----------------------------------------------------------------------------- the soft mixture
def mix_add(m, den, num, h, s):
    """One online-softmax update of the running (max m, den, num) with recursion output h (B, T, D) and
    score s (B, T, 1); (None, None, None) before the first recursion, whose weight exp(s - m) is 1 exactly."""
    if m is None:
        return s, torch.ones_like(s), h
    mx = torch.maximum(m, s)
    old, new = torch.exp(m - mx), torch.exp(s - mx)
    return mx, den * old + new, num * old + h * new


class StreamingMixture:
    """o = sum_r softmax_r(s_r) * h_r, accumulated one recursion at a time.   [OUR READING]
    add(h (B, T, D), s (B, T, 1)) keeps the running max m, den = sum_r exp(s_r - m) and
    num = sum_r exp(s_r - m) h_r, both rescaled by exp(m_old - m_new) when the max grows (online
    softmax): one state is held whatever R. result() -> (B, T, D); weights() -> (B, T, R), detached.
    """

    def __init__(self):
        self.m = self.den = self.num = None
        self.scores = []  # (B, T, 1) each, detached: 1/D of a state per recursion

    def add(self, h, s):
        self.scores.append(s.detach())
        self.m, self.den, self.num = mix_add(self.m, self.den, self.num, h, s)

    def result(self):
        return self.num / self.den

    def weights(self):
        return torch.cat(self.scores, dim=-1).softmax(dim=-1)


class Router(nn.Module):
    """Scores of recursion r: s = w_r . LN_r(h), (B, T, D) -> (B, T, 1) float32.   [OUR READING]
    One LayerNorm and one vector per recursion: 3*D*R parameters. w starts at zero (uniform)."""

    def __init__(self, dim: int, recursions: int):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(dim, eps=1e-6) for _ in range(recursions))
        self.weight = nn.Parameter(torch.zeros(recursions, dim))

    def forward(self, h, r):
        r = min(r, len(self.norms) - 1)  # past the trained R: reuse the last router (our choice)
        return F.linear(self.norms[r](h), self.weight[r:r + 1]).float()  # (B, T, 1)


# ----------------------------------------------------------------------------- the model
class SRViT(nn.Module):
    """Soft Recursive ViT: `depth` untied blocks applied `recursions` times, outputs mixed per token.

    Call: `logits = model(x, depth=None)`, `logits, loss = model(x, targets)` (training), x (B, C, H, W); targets
    (B,) int64 or (B, num_classes) probabilities; logits (B, num_classes); loss the cross-entropy
    (`loss="ce"`) or DeiT III's binary cross-entropy (`loss="bce"`).
    The call-time `depth` is the number of RECURSIONS (our choice: the constructor's `depth` counts
    the body's untied layers, which cannot change); past the trained R the last router is reused.
    `model.mix_weights`: the (B, T, R) mixture weights of the last call (detached). recursions=1
    has no router (a softmax over one output is constant, and a router without gradient would
    break DDP): it is the plain ViT, state dict included. Bad sizes raise ValueError.
    As timm: without a class token the token mean goes through `fc_norm` (LayerNorm after pooling,
    `norm` the identity); `dynamic_img_size=True` takes any H, W divisible by patch_size, resampling
    pos_embed (`resample_pos_embed`); `set_grad_checkpointing()` recomputes each layer application
    of each recursion in the backward pass (training only).
    Stochastic depth (`drop_path_rate`; the abstract is silent): a forward applies depth x R blocks, layer i
    at applications i, depth + i, ..., so layer i gets the mean over those of the untied schedule
    linspace(0, drop_path_rate, depth x R) (`shared_drop_rate`, the rule of every model file): R = 1 is
    DeiT/timm's schedule; the mean over the applications is rate / 2 at any R. Fixed at construction.
    Init: `init` (INITS) the attention's, `init_base` (INIT_BASES) every other layer's; the router's
    vector starts at zero on either base. `block_fn` (timm's name; default Block): each layer of the body,
    as bvit.BViT's block_fn.
    """

    def __init__(self, *, img_size=224, patch_size=16, in_chans=3, num_classes=1000,
                 embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0, recursions=4,
                 class_token=True, layer_scale=None, drop_path_rate=0.0, init=None, init_base="timm",
                 loss="ce", dynamic_img_size=False, block_fn=None):
        super().__init__()
        dims = dict(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
                    num_heads=num_heads, **{"int(embed_dim x mlp_ratio)": int(embed_dim * mlp_ratio)})  # (MLP width)
        if min(dims.values()) < 1:  # (first: the checks below divide by these; a width of 0 computes nothing)
            raise ValueError(", ".join(f"{k}={v}" for k, v in dims.items() if v < 1) + ": every width must be >= 1")
        if img_size % patch_size:
            raise ValueError(f"img_size {img_size} is not divisible by patch_size {patch_size}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if depth < 1 or recursions < 1:
            raise ValueError(f"need depth >= 1 and recursions >= 1, got {depth}, {recursions}")
        if init_base not in ("timm", "pytorch") or loss not in ("ce", "bce") or not (init is None or callable(init)):
            raise ValueError(f"need init_base 'timm' or 'pytorch', loss 'ce' or 'bce' and init None or a function "
                             f"model -> None (inits.py: inits.structured), got {init_base!r}, {loss!r}, {init!r}")
        self.depth, self.recursions, self.num_classes, self.loss = depth, recursions, num_classes, loss
        self.img_size, self.patch_size, self.in_chans = img_size, patch_size, in_chans
        self.embed_dim, self.num_heads, self.mlp_ratio = embed_dim, num_heads, mlp_ratio
        self.dynamic_img_size, self.grad_checkpointing = dynamic_img_size, False
        self.aux = {}  # train.py logs it and adds its own terms (distillation, Stage 2) to it
        num_patches = (img_size // patch_size) ** 2

        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + int(class_token), embed_dim))
        # Stochastic depth: layer i serves applications i, depth + i, ... of the depth x R in a forward, and
        # gets the untied schedule's mean over them (shared_drop_rate).
        n = depth * recursions
        rates = [shared_drop_rate(drop_path_rate, range(i, n, depth), n) for i in range(depth)]
        block_fn = block_fn or Block  # timm's block_fn: each layer of the body, built with Block's arguments
        self.blocks = nn.ModuleList(block_fn(dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio,
                                             layer_scale=layer_scale, drop_path=r, stochastic=drop_path_rate > 0)
                                    for r in rates)
        self.router = Router(embed_dim, recursions) if recursions > 1 else None
        # timm: a class token is read after `norm`; the token mean (global_pool="avg") after `fc_norm`.
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6) if class_token else nn.Identity()
        self.fc_norm = nn.Identity() if class_token else nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()  # timm: 0 = features
        self.num_features = self.head_hidden_size = embed_dim  # timm's names; global_pool: the readout's
        self.global_pool, self.feature_info = "token" if class_token else "avg", [
            dict(num_chs=embed_dim, reduction=patch_size, module=f"blocks.{depth - 1}") for k in range(recursions)]
        self.pretrained_cfg = self.default_cfg = dict(  # timm's; ImageNet's mean, std (a run's: its data's)
            input_size=(in_chans, img_size, img_size), num_classes=num_classes, mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225), fixed_input_size=not dynamic_img_size, first_conv="patch_embed.proj")
        self.mix_weights = None
        self._init_weights(init_base)
        if init is not None:  # e.g. inits.structured: the attention init, on the base
            init(self)

    def forward(self, x, targets=None, depth=None):
        recursions = self.recursions if depth is None else depth
        if recursions < 1:
            raise ValueError(f"depth (the number of recursions) must be >= 1, got {depth}")
        h, mix = self.embed(x), StreamingMixture()
        for r in range(recursions):
            h, s = self.recursion(h, r)
            mix.add(h, s)  # only the running sums are kept, not h_1..h_R
        # Read before the next call: compiled whole with CUDA graphs (kernels.py), this lives in the
        # graph's memory and the next replay overwrites it (train.py reads it after each epoch's last step).
        self.mix_weights = mix.weights()
        logits = self.classify(mix.result().to(h.dtype))  # (the mixture sums in fp32: back to the model's dtype)
        if targets is None:
            return logits
        return logits, classification_loss(logits, targets, self.loss)

    def recursion(self, h, r):
        """Recursion r: the body f (the untied stack) on h (B, T, D), and the router's scores of its output
        (B, T, 1) (zeros, a uniform mixture, without a router): (h_r, s_r)."""
        for blk in self.blocks:
            h = self._step(blk, h)
        return h, self.router(h, r) if self.router is not None else h.new_zeros(h.shape[:-1] + (1,))

    # ----------------------------------------------------- anytime (docs/models.md): begin, step(k, depth), readout
    # A step is one recursion; its state (h, m, den, num) holds the running mixture (mix_add), and readout
    # mixes the recursions so far: forward(x, depth=R) is begin, step r = 0..R-1, readout, bit for bit.
    @property
    def blocks_per_step(self):  # block applications per step: the body's layers
        return len(self.blocks)

    def begin(self, x):
        """The state before recursion 0: (tokens (B, T, D), None, None, None)."""
        return self.embed(x), None, None, None

    def step(self, state, k, depth=None):
        """Recursion k (0-based; any k, past the trained R the last router, as forward): the state
        (h, m, den, num) -> the next. `depth` is not read: recursion k does not depend on R."""
        h, s = self.recursion(state[0], k)
        return (h, *mix_add(*state[1:], h, s))

    def readout(self, state):
        """Logits (B, classes) of the mixture of the recursions so far (forward's at this depth)."""
        return self.classify((state[3] / state[2]).to(state[0].dtype))

    def embed(self, x):
        """(B, C, H, W) -> tokens (B, N(+1), D) with class token and position embedding; another
        H x W only with dynamic_img_size (pos_embed resampled to the (H/p, W/p) grid, as timm)."""
        if x.ndim != 4 or x.shape[1] != self.in_chans:  # (an unbatched image would fail deep inside, misleadingly)
            raise ValueError(f"expected a batch of images (B, {self.in_chans}, H, W), got shape {tuple(x.shape)}"
                             + ("; add the batch dimension: x[None]" if x.ndim == 3 else ""))
        (H, W), p, pos = x.shape[-2:], self.patch_size, self.pos_embed
        if (H, W) != (self.img_size, self.img_size):
            if not self.dynamic_img_size:
                raise ValueError(f"expected {self.img_size}x{self.img_size} images, got {(H, W)}; build the "
                                 "model with dynamic_img_size=True to interpolate the position embedding")
            if H % p or W % p:
                raise ValueError(f"image size {H}x{W} is not divisible by patch_size {p}")
            pos = resample_pos_embed(pos, (H // p, W // p), int(self.cls_token is not None))
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1+N, D)
        return x + pos

    def classify(self, z):
        """timm's readout: norm, class token (or token mean), fc_norm, head: (B, N(+1), D) -> (B, classes);
        num_classes=0 (no head, as timm): the pooled features (B, D)."""
        z = self.norm(z)
        return self.head(self.fc_norm(z[:, 0] if self.cls_token is not None else z.mean(dim=1)))

    # ----------------------------------------------------- timm's features API (docs/models.md "From Python")
    # forward(x, depth=L)'s logits are forward_head(forward_features(x, depth=L)) bit for bit.
    def forward_features(self, x, *, depth=None):
        """timm's forward_features: the final normalized tokens (B, T, D) of a `depth`-step run, T = N (+1)."""
        return self.forward_intermediates(x, [], output_fmt="NLC", depth=depth)[0]

    def forward_head(self, x, pre_logits=False):
        """timm's forward_head: tokens (B, T, D) -> pooled (B, D) if pre_logits (or no head), else logits."""
        x = self.fc_norm(x[:, 0] if self.cls_token is not None else x.mean(dim=1))
        return x if pre_logits else self.head(x)

    def no_weight_decay(self):
        """timm's name: the parameters an optimizer leaves undecayed by name (training/optim.py)."""
        return {"pos_embed", "cls_token"}

    def forward_intermediates(self, x, indices=None, return_prefix_tokens=False, norm=False, stop_early=False,
                              output_fmt="NCHW", intermediates_only=False, output_dict=False, *, depth=None):
        """timm's forward_intermediates (its arguments; timm_outputs) on the recursions: x (B, C, H, W) -> the states
        h_r after the recursions `indices` picks (take_indices) of the `depth` run (keyword; default as trained), before
        the mixture; norm=True: through the final norm; stop_early: stop after the last one picked. Final tokens: the
        normalized mixture of the recursions run. Sets `mix_weights` as forward does."""
        recursions = self.recursions if depth is None else depth
        take, h, mix, states = take_indices(recursions, indices), self.embed(x), StreamingMixture(), []
        for r in range(max(take) + 1 if stop_early and take else recursions):
            h, s = self.recursion(h, r)
            mix.add(h, s)
            if r in take:
                states.append(self.norm(h) if norm else h)
        self.mix_weights = mix.weights()
        final = self.norm(mix.result().to(h.dtype))
        return timm_outputs(self, x, final, states, return_prefix_tokens, output_fmt, intermediates_only, output_dict)

    def get_classifier(self):
        """timm's name: the head (nn.Linear, or nn.Identity without classes)."""
        return self.head

    def reset_classifier(self, num_classes, global_pool=None):
        """timm's name: a new head (PyTorch's init) for `num_classes`; 0: none, the model returns (B, D). The pooling
        is the build's (global_pool "token" with a class token, else "avg"): ValueError for another."""
        if global_pool not in (None, self.global_pool):
            raise ValueError(f"global_pool={global_pool!r}: the model pools as built: {self.global_pool!r}")
        self.num_classes = num_classes
        p = self.pos_embed
        self.head = nn.Linear(self.embed_dim, num_classes, device=p.device, dtype=p.dtype) if num_classes > 0 \
            else nn.Identity()

    # ----------------------------------------------------- machinery: init, checkpointing, compile, sizes
    def _init_weights(self, base):  # the base (INIT_BASES); `init` runs after it (__init__)
        if base == "pytorch":  # PyTorch's defaults (reset_parameters), pos_embed randn x 0.02, class token 0
            for m in self.modules():  # (the structured-init paper's baseline: its code's weight_init='skip')
                if isinstance(m, (nn.Linear, nn.Conv2d, nn.LayerNorm)):
                    m.reset_parameters()
            nn.init.normal_(self.pos_embed, std=0.02)
            if self.cls_token is not None:
                nn.init.zeros_(self.cls_token)
        else:  # timm/DeiT: trunc-normal(0.02) for Linear weights and position/class embeddings.
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
            if self.cls_token is not None:
                nn.init.normal_(self.cls_token, std=1e-6)
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.trunc_normal_(m.weight, std=0.02)
                    nn.init.zeros_(m.bias)
                elif isinstance(m, nn.LayerNorm):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
            # Patch embedding as a linear layer on flattened patches (timm's lecun-normal for conv).
            w = self.patch_embed.proj.weight
            nn.init.trunc_normal_(w.view(w.shape[0], -1), std=math.sqrt(1.0 / w[0].numel()))
            nn.init.zeros_(self.patch_embed.proj.bias)
        if self.router is not None:
            nn.init.zeros_(self.router.weight)  # uniform mixture at the start (our choice)

    def set_grad_checkpointing(self, enable=True):
        """timm's name: recompute each step's activations in backward (`_step`; training only). Returns self."""
        self.grad_checkpointing = enable
        return self

    nested_regions = False  # each step a nested compile region (apply_step): kernels.py turns it on

    def _step(self, fn, *args):
        # Activation checkpointing (Chen et al. 2016): keep the step's input, recompute the rest in backward
        # (use_reentrant=False: with compiled blocks, autocast and DDP; the RNG replayed: the same masks).
        if self.grad_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return apply_step(fn, *args) if self.nested_regions else fn(*args)  # (apply_step)

    def compile_regions(self, **kwargs):
        """Regional compilation: each layer of the body is compiled once (fullgraph) and reused by
        every recursion; the router and the streaming mixture (a few elementwise ops) stay eager,
        so neither R nor the recursion index causes a recompile. fullgraph and the drop-path rate as
        a tensor: see bvit.BViT.compile_regions. Call before DDP. Returns self."""
        for blk in self.blocks:
            blk.compile(fullgraph=True, **kwargs)
        return self

    def trains_as_one_graph(self):
        """True: a training forward at the trained recursions runs the same operations on the same
        shapes every step, so train.py may compile it whole (kernels.compile_for_training)."""
        return True

    def log_extras(self):
        """Mean mixture weight of each recursion over the last call's tokens (for log.jsonl)."""
        if self.mix_weights is None:
            return {}
        return {"mix_weights": [round(v, 4) for v in self.mix_weights.float().mean((0, 1)).tolist()]}

    def num_params(self):
        """Number of parameters: the plain ViT's plus 3*D*R for the router (0 when R = 1)."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_image(self, depth=None):
        """Analytic forward FLOPs per image, 2 x matmul multiply-adds as in bvit.py (depth*R
        layers) plus the router's T*D per recursion; `depth` = recursions R."""
        recursions = depth or self.recursions
        D, p = self.embed_dim, self.patch_size
        N = (self.img_size // p) ** 2
        T = N + int(self.cls_token is not None)
        per_layer = 4 * T * D * D + 2 * T * T * D + 2 * T * D * int(D * self.mlp_ratio)
        router = T * D if self.router is not None else 0
        macs = N * D * self.in_chans * p * p + recursions * (self.depth * per_layer + router)
        return 2 * (macs + D * self.num_classes)


# ----------------------------------------------------------------------------- hierarchical compilation
@getattr(torch.compiler, "nested_compile_region", lambda fn: fn)  # (a torch without it: the plain function)
def apply_step(block, *args):
    """block(*args), one step as a nested compile region: with `model.nested_regions` on (kernels.py), a
    whole-model torch.compile compiles the step once and calls it at every step; eagerly a plain call."""
    return block(*args)


# Named configurations (the ViT/DeiT sizes): a 12-layer body (SR-ViT-S at R=1 is DeiT-S), R=4 by default.
_SIZES = {"ti": (192, 3), "s": (384, 6), "b": (768, 12), "l": (1024, 16)}


def _sized(size, **kw):
    dim, heads = _SIZES[size]
    kw.setdefault("depth", 24 if size == "l" else 12)
    return SRViT(**{"embed_dim": dim, "num_heads": heads, **kw})  # (a given width wins, as in timm)


def srvit_ti(**kw): return _sized("ti", **kw)
def srvit_s(**kw): return _sized("s", **kw)
def srvit_b(**kw): return _sized("b", **kw)
def srvit_l(**kw): return _sized("l", **kw)


# ============================================================================= optional machinery
# ----------------------------------------------------------------------------- timm's features API
def take_indices(depth, indices):
    """The steps (a set) forward_intermediates keeps, as timm's feature_take_indices: None all `depth`, an int n
    the last n, a sequence those it names (negative: from the end). ValueError for a step outside the run."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    if indices is None:
        return set(range(depth))
    if isinstance(indices, int):
        if not 0 <= indices <= depth:
            raise ValueError(f"indices={indices}: a run of {depth} steps has 0..{depth} last steps to keep")
        return set(range(depth - indices, depth))
    steps = {k + depth if k < 0 else k for k in indices}
    if not all(0 <= k < depth for k in steps):
        raise ValueError(f"indices={list(indices)}: a run of {depth} steps has steps 0..{depth - 1} "
                         f"(or -{depth}..-1 from the end)")
    return steps


def timm_outputs(model, x, final, states, return_prefix_tokens, output_fmt, intermediates_only, output_dict):
    """forward_intermediates' return as timm's: final (B, T, D), states [(B, T, D)] -> states without the class token,
    (B, D, H/p, W/p) for output_fmt "NCHW", (B, N, D) for "NLC"; return_prefix_tokens: (state, class token (B, 1, D))
    pairs; intermediates_only: the list, else (final, list); output_dict: timm's dict. ValueError: another fmt."""
    if output_fmt not in ("NCHW", "NLC"):
        raise ValueError(f"output_fmt={output_fmt!r}; allowed: 'NCHW', 'NLC'")
    n, (H, W), p = int(model.cls_token is not None), x.shape[-2:], model.patch_size
    prefix, states = [z[:, :n] for z in states], [z[:, n:] for z in states]
    if output_fmt == "NCHW":
        states = [z.reshape(len(z), H // p, W // p, -1).permute(0, 3, 1, 2).contiguous() for z in states]
    out = {"image_intermediates": states, **({} if intermediates_only else {"image_features": final})}
    if n and return_prefix_tokens:
        out["image_intermediates_prefix"], states = prefix, list(zip(states, prefix))
    return out if output_dict else states if intermediates_only else (final, states)


# ----------------------------------------------------------------------------- other image sizes
# dynamic_img_size=True (timm's name): the position embedding resampled to the input's patch grid.
def resample_pos_embed(pos_embed, grid, num_prefix):
    """timm's resample_abs_pos_embed: pos_embed (1, num_prefix + n*n, D) -> (1, num_prefix + gh*gw, D) for grid
    (gh, gw), bicubic with antialiasing in float32, prefix rows kept; itself for (n, n); ValueError: not square."""
    prefix, patches = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    n, D = math.isqrt(patches.shape[1]), pos_embed.shape[-1]
    if n * n != patches.shape[1]:
        raise ValueError(f"the {patches.shape[1]} patch rows of pos_embed are not a square grid")
    if tuple(grid) == (n, n):
        return pos_embed
    patches = patches.float().reshape(1, n, n, D).permute(0, 3, 1, 2)  # (1, D, n, n)
    patches = F.interpolate(patches, size=tuple(grid), mode="bicubic", align_corners=False, antialias=True)
    patches = patches.permute(0, 2, 3, 1).reshape(1, -1, D).to(pos_embed.dtype)  # (1, gh*gw, D)
    return torch.cat([prefix, patches], dim=1)
