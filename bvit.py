"""bViT: a single-block recurrent Vision Transformer (and, with more blocks, the plain ViT / DeiT).

Papers: "Investigating Single-Block Recurrence in Vision Transformers" (bViT, Byra et al., arXiv 2605.10661), "Training
Crossroads for Recurrent ViTs" (Gruszczynski et al.). Measured: see README.md "Results" (commands and hardware there).

Idea. A ViT stacks `depth` distinct blocks; bViT applies ONE block `depth` times, z_{k+1} = F(z_k), so the parameters
do not grow with depth and the depth can change at inference (`model(x, depth=24)`). Here `num_blocks` blocks serve
the steps in equal contiguous phases (Raptor, arXiv 2512.19941): 1 is bViT, `depth` the untied ViT/DeiT (timm's
parameter names: a timm ViT state dict loads strictly). Deep supervision (Training Crossroads) reads logits after each
of `stages` equal stages.

Equations (ViT, Dosovitskiy et al., arXiv 2010.11929; pre-norm as timm): z_0 = [cls; patch_embed(x)] + pos_embed
    z <- z + drop_path(ls1 * attn(norm1(z)));  z <- z + drop_path(ls2 * mlp(norm2(z)))
    logits = head(norm(z)[:, 0])  with a class token;  logits = head(fc_norm(mean(z)))  without
ls1, ls2: LayerScale (the identity unless `layer_scale`); drop_path: stochastic depth; no class token: the token
mean (GAP) through `fc_norm` (timm's names).

After the model, its machinery: the base init (`init_base` "timm": trunc-normal 0.02, zero biases; "pytorch":
PyTorch's defaults), the hook `init` (inits.py: mimetic, structured), compile regions, sizes, `resample_pos_embed`.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


# ----------------------------------------------------------------------------- building blocks
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


# ----------------------------------------------------------------------------- the model
class BViT(nn.Module):
    """Recurrent ViT: `num_blocks` blocks applied for `depth` steps in contiguous phases: step k of L uses block
    floor(k * num_blocks / L) (our rule, for any call-time `depth`). num_blocks=1: bViT; =depth: ViT/DeiT.

    `logits = model(x, depth=None)`, `logits, loss = model(x, targets)` (the training loop's form): x (B, C, H, W);
    targets (B,) class indices or (B, num_classes) probabilities; logits (B, num_classes); loss the mean over `stages`
    of the stage losses, cross-entropy (`loss="ce"`) or DeiT III's BCE ("bce"); `model.aux`: the detached stage
    losses. As timm: `class_token=False` reads the token mean through `fc_norm`; `dynamic_img_size=True` takes any H, W
    divisible by patch_size (`resample_pos_embed`); `set_grad_checkpointing()`; `block_fn` builds each distinct block
    with Block's keyword arguments (timm's Block: rvits_timm.timm_block). Drop path: block b at the mean of timm's
    untied schedule over its phase's steps (`shared_drop_rate`). Init: `init_base` "timm" or "pytorch" for every
    layer, then `init(model)` if given (inits.py). ValueError for sizes that do not fit, an unknown init_base or loss.
    """

    def __init__(self, *, img_size=224, patch_size=16, in_chans=3, num_classes=1000, embed_dim=768, depth=12,
                 num_heads=12, mlp_ratio=4.0, num_blocks=1, class_token=True, layer_scale=None, drop_path_rate=0.0,
                 stages=1, init=None, init_base="timm", loss="ce", dynamic_img_size=False, block_fn=None):
        super().__init__()
        dims = dict(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
                    num_heads=num_heads, **{"int(embed_dim x mlp_ratio)": int(embed_dim * mlp_ratio)})  # (first)
        if min(dims.values()) < 1:
            raise ValueError(", ".join(f"{k}={v}" for k, v in dims.items() if v < 1) + ": every width must be >= 1")
        if img_size % patch_size:
            raise ValueError(f"img_size {img_size} is not divisible by patch_size {patch_size}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if depth < 1 or num_blocks < 1 or num_blocks > depth:
            raise ValueError(f"need 1 <= num_blocks <= depth, got num_blocks={num_blocks}, depth={depth}")
        if init_base not in ("timm", "pytorch") or loss not in ("ce", "bce") or not (init is None or callable(init)):
            raise ValueError(f"need init_base 'timm' or 'pytorch', loss 'ce' or 'bce' and init None or a function "
                             f"model -> None (inits.py: inits.structured), got {init_base!r}, {loss!r}, {init!r}")
        self.depth, self.num_blocks, self.num_classes = depth, num_blocks, num_classes
        self.img_size, self.patch_size, self.in_chans = img_size, patch_size, in_chans
        self.embed_dim, self.num_heads, self.mlp_ratio = embed_dim, num_heads, mlp_ratio
        self.num_features = self.head_hidden_size = embed_dim  # timm's names
        if stages < 1 or depth % stages:
            raise ValueError(f"stages={stages} must be >= 1 and divide depth={depth}")
        self.stages, self.loss = stages, loss
        self.dynamic_img_size, self.grad_checkpointing = dynamic_img_size, False
        num_patches = (img_size // patch_size) ** 2

        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + int(class_token), embed_dim))
        # Stochastic depth: block b's rate is the untied schedule's mean over the steps of its phase
        # (shared_drop_rate); one step per block (num_blocks = depth) is DeiT/timm's linspace exactly.
        owner = self.phase_map()  # the block of each step
        rates = [shared_drop_rate(drop_path_rate, [k for k in range(depth) if owner[k] == b], depth)
                 for b in range(num_blocks)]
        block_fn = block_fn or Block  # timm's block_fn: the recurrent block, built with Block's arguments
        self.blocks = nn.ModuleList(block_fn(dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio,
                                             layer_scale=layer_scale, drop_path=r, stochastic=drop_path_rate > 0)
                                    for r in rates)
        # timm: a class token is read after `norm`; the token mean (global_pool="avg") after `fc_norm`.
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6) if class_token else nn.Identity()
        self.fc_norm = nn.Identity() if class_token else nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()  # timm: 0 = features
        self.aux, self.global_pool = {}, "token" if class_token else "avg"  # (timm's name for the readout)
        self.feature_info = [dict(num_chs=embed_dim, reduction=patch_size, module=f"blocks.{b}") for b in owner]
        self.pretrained_cfg = self.default_cfg = dict(  # timm's; ImageNet's mean, std (a run's: its data's)
            input_size=(in_chans, img_size, img_size), num_classes=num_classes, mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225), fixed_input_size=not dynamic_img_size, first_conv="patch_embed.proj")
        self._init_weights(init_base)
        if init is not None:  # e.g. inits.structured: the attention init, on the base
            init(self)

    def forward(self, x, targets=None, depth=None):
        depth = self.depth if depth is None else depth
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        # Deep supervision (Training Crossroads, "stage-wise"): read out after each stage.
        stages = self.stages if targets is not None else 1
        if depth % stages:
            raise ValueError(f"depth={depth} must be divisible by stages={stages} when computing a loss")
        readouts = {(s + 1) * depth // stages - 1 for s in range(stages)}
        z, stage_logits = self.begin(x), []
        for k in range(depth):
            z = self.step(z, k, depth)
            if k in readouts:
                stage_logits.append(self.classify(z))
        logits = stage_logits[-1]
        if targets is None:
            return logits
        losses = torch.stack([classification_loss(l, targets, self.loss) for l in stage_logits])
        # Read before the next training step: compiled whole with CUDA graphs (kernels.py), these live in
        # the graph's memory and the next replay overwrites them (train.py reads them after each epoch).
        self.aux = {f"stage{s}_loss": v for s, v in enumerate(losses.detach())}
        # The mean of the S stage losses, so the final readout weighs 1/S: our choice (the papers are silent; Training
        # Crossroads' abstract names no weights). As a sum of products with a Python float: no host-to-device copy.
        return logits, torch.stack([l * (1.0 / self.stages) for l in losses]).sum()

    def phase_map(self, depth=None):
        """Block index used by each of the `depth` steps: [floor(k * num_blocks / depth)]."""
        depth = depth or self.depth
        return [k * self.num_blocks // depth for k in range(depth)]

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

    # ----------------------------------------------------- anytime (docs/models.md): begin, step(k, depth), readout
    # forward(x, depth=L) runs begin, step k = 0..L-1, readout; a caller may read out after any step.
    blocks_per_step = 1  # block applications per step

    def begin(self, x):
        """The state before step 0: the embedded tokens (B, N(+1), D)."""
        return self.embed(x)

    def step(self, z, k, depth=None):
        """Step k (0-based) of a `depth`-step run (default: as trained), phase_map's block: (B, T, D) -> (B, T, D)."""
        depth = depth or self.depth
        return self._step(self.blocks[self.phase_map(depth)[k]], z)

    def readout(self, z):
        """Logits (B, classes) of any step's state: the final norm and head, as deep supervision reads them."""
        return self.classify(z)

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
        """timm's forward_intermediates (its arguments; timm_outputs): x (B, C, H, W) -> the states after the steps
        `indices` picks (take_indices) of the `depth` steps run (keyword; default as trained), norm=True: through the
        final norm; stop_early: stop after the last one picked. Final tokens: the last state, normalized."""
        depth = self.depth if depth is None else depth
        take, z, states = take_indices(depth, indices), self.begin(x), []
        for k in range(max(take) + 1 if stop_early and take else depth):
            z = self.step(z, k, depth)
            if k in take:
                states.append(self.norm(z) if norm else z)
        return timm_outputs(self, x, self.norm(z), states, return_prefix_tokens, output_fmt, intermediates_only,
                            output_dict)

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
        """Regional compilation: each distinct block compiled once, the step loop eager, so compile time does not grow
        with depth and a new depth, step or phase map needs no recompilation (tests/test_speed.py). fullgraph=True: one
        graph per block or an error, never a silent "graph break". Block holds its drop-path rate as a tensor (a float
        attribute is guarded by value). Call before DDP. kwargs go to torch.compile. Returns self."""
        for blk in self.blocks:
            blk.compile(fullgraph=True, **kwargs)
        return self

    def trains_as_one_graph(self):
        """True: a training forward runs the same operations on the same shapes: compiled whole (kernels.py)."""
        return True

    def num_params(self, exclude_embeddings=False):
        """Number of distinct parameters (a shared block counts once)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos_embed.numel() if exclude_embeddings else n

    def flops_per_image(self, depth=None):
        """Analytic forward FLOPs per image (2 x multiply-adds of matmuls; norms, softmax, GELU, additions ignored).
        Patch embed N*D*C*p^2; per step with T tokens: qkv 3TD^2 + scores T^2 D + weighted sum T^2 D + proj TD^2 +
        MLP 2rTD^2; head D*classes."""
        depth = depth or self.depth
        D, p = self.embed_dim, self.patch_size
        N = (self.img_size // p) ** 2
        T = N + int(self.cls_token is not None)
        hidden = int(D * self.mlp_ratio)
        per_step = 4 * T * D * D + 2 * T * T * D + 2 * T * D * hidden
        macs = N * D * self.in_chans * p * p + depth * per_step + D * self.num_classes
        return 2 * macs


# ----------------------------------------------------------------------------- hierarchical compilation
@getattr(torch.compiler, "nested_compile_region", lambda fn: fn)  # (a torch without it: the plain function)
def apply_step(block, *args):
    """block(*args), one step as a nested compile region: with `model.nested_regions` on (kernels.py), a
    whole-model torch.compile compiles the step once and calls it at every step; eagerly a plain call."""
    return block(*args)


# Named configurations (the ViT/DeiT sizes Ti, S, B, L). bvit_*: one shared block; vit_*: depth untied blocks.
_SIZES = {"ti": (192, 3), "s": (384, 6), "b": (768, 12), "l": (1024, 16)}


def _sized(size, untied, **kw):
    dim, heads = _SIZES[size]
    kw.setdefault("depth", 24 if size == "l" else 12)
    if untied:
        kw.setdefault("num_blocks", kw["depth"])
    return BViT(**{"embed_dim": dim, "num_heads": heads, **kw})  # (a given width wins, as in timm)


def bvit_ti(**kw): return _sized("ti", False, **kw)
def bvit_s(**kw): return _sized("s", False, **kw)
def bvit_b(**kw): return _sized("b", False, **kw)
def bvit_l(**kw): return _sized("l", False, **kw)
def vit_ti(**kw): return _sized("ti", True, **kw)
def vit_s(**kw): return _sized("s", True, **kw)
def vit_b(**kw): return _sized("b", True, **kw)
def vit_l(**kw): return _sized("l", True, **kw)


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
