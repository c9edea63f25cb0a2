"""reViT: one recurrent ViT block whose FFN is programmed by depth through a bank of experts.

Paper: "One Block, Multiple Depths: Recurrent Vision Transformers with Depth-Programmed Experts"
(Bulat, Ouali, Tzimiropoulos, arXiv 2610.12448), sections 3, 4.4, A.1, A.2, A.5.

Idea. Like bViT, one block is applied `depth` times, with ONE shared attention and norms; but the FFN of each step is
its own dense FFN, a convex combination of E stored expert FFNs whose weights are programmed by the step's normalized
depth t ("weight-space merging": one FFN per step, any E). As t lives in [0, 1], one checkpoint runs at any depth, or
is materialized into L dense FFNs.

Equations (paper sections 3.1, 3.2 and A.1): for L steps, t_k = k / (L - 1) (t = 0 when L = 1), and
    g(t) = softmax(router(t)),  router = Linear(1, 16) -> SiLU -> Linear(16, E)    (A.1)
    W(t) = sum_e g_e(t) W_e  for both FFN layers' weights and biases                (3.1)
    z <- z + drop_path(ls1 * attn(norm1(z)));  z <- z + drop_path(ls2 * FFN_{W(t_k)}(norm2(z)))
Elastic depth (3.2, A.2): each step dropped per image with probability `depth_dropout` (the identity), the kept steps
renumbered evenly over [0, 1]. It is the paper's second stage (A.2-A.3: 0.3), not its supervised recipe (Table 6:
none), so it defaults to 0.0 (docs/models.md). ls1, ls2, drop_path, fc_norm: as in bvit.py. After the model: its
machinery, `apply_step`, `resample_pos_embed`, and `DenseReViT` (materialized, 3.1).

Measured: docs/models.md, section "reViT" (the 300-step CPU command, accuracy at other depths, the gates;
`python lab/check_readme.py --only revit-300` re-runs it) and the mini study in README "Results".
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


def classification_loss(logits, targets, kind="ce"):
    """Cross-entropy ("ce") or DeiT III's binary cross-entropy ("bce": mean over B x classes, class
    indices made one-hot), in fp32. logits (B, classes); targets (B,) indices or (B, classes) probs."""
    if kind == "ce":
        return F.cross_entropy(logits.float(), targets)
    t = F.one_hot(targets, logits.shape[1]) if targets.ndim == 1 else targets
    return F.binary_cross_entropy_with_logits(logits.float(), t.float())


# ----------------------------------------------------------------------------- the reViT step (paper 3.1, 3.2, A.1)
class ExpertMlp(nn.Module):
    """E expert FFNs Linear(D, H) -> GELU -> Linear(H, D), stacked (paper 3.1): fc1.weight (E, H, D),
    fc1.bias (E, H), fc2.weight (E, D, H), fc2.bias (E, D) (timm's names with an expert axis)."""

    def __init__(self, dim: int, hidden: int, experts: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Module(), nn.Module()
        self.fc1.weight = nn.Parameter(torch.empty(experts, hidden, dim))
        self.fc1.bias = nn.Parameter(torch.zeros(experts, hidden))
        self.fc2.weight = nn.Parameter(torch.empty(experts, dim, hidden))
        self.fc2.bias = nn.Parameter(torch.zeros(experts, dim))

    def tensors(self):
        return self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias

    def merge(self, g):
        """Merged FFN (w1, b1, w2, b2) = sum_e g_e (expert e's tensors): g (E,) gives (H, D), (H,),
        (D, H), (D,); g (U, E) gives U merged FFNs (U, H, D), (U, H), (U, D, H), (U, D)."""
        g = g.to(self.fc1.weight.dtype)  # merge in the parameters' precision, also under autocast
        return tuple(torch.tensordot(g, p, dims=1) for p in self.tensors())


def ffn(x, w1, b1, w2, b2):
    """One dense FFN with given weights: (..., D) -> (..., D)."""
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def to_device(t, device):
    """A host tensor (elastic rows, coordinates, groups) on `device` without a host wait (pinned, asynchronous)."""
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


class Block(nn.Module):
    """bvit.py's Block with its FFN weights as arguments, so one (compiled) step serves every step:
    `block(z, w1, b1, w2, b2)`, w1 (H, D), b1 (H,), w2 (D, H), b2 (D,); `grouped`: weights (U, ...), FFN groups[b]."""

    def __init__(self, dim, num_heads, mlp_ratio=4.0, experts=1, layer_scale=None, drop_path=0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.ls1 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ExpertMlp(dim, int(dim * mlp_ratio), experts)
        self.ls2 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.register_buffer("drop_prob", torch.tensor(float(drop_path)), persistent=False)
        self.stochastic = drop_path > 0

    def forward(self, x, w1, b1, w2, b2):
        dp = self.training and self.stochastic
        x = x + drop_path(self.ls1(self.attn(self.norm1(x))), self.drop_prob, dp)
        return x + drop_path(self.ls2(ffn(self.norm2(x), w1, b1, w2, b2)), self.drop_prob, dp)

    def grouped(self, x, w1, b1, w2, b2, groups):
        """Per-image FFNs: sort the images by group, one dense FFN per group, unsort (eager: the
        group sizes are data). groups (B,) long on the CPU, so that the sizes need no device sync."""
        dp = self.training and self.stochastic
        x = x + drop_path(self.ls1(self.attn(self.norm1(x))), self.drop_prob, dp)
        order = groups.argsort()
        sizes = torch.bincount(groups, minlength=w1.shape[0]).tolist()
        order = to_device(order, x.device)
        chunks = self.norm2(x)[order].split(sizes)
        y = torch.cat([ffn(c, w1[u], b1[u], w2[u], b2[u]) for u, c in enumerate(chunks)])  # group u: FFN u
        return x + drop_path(self.ls2(y[order.argsort()]), self.drop_prob, dp)


def router_losses(logits, mlp):
    """Sec. 3.2's E > 1 terms (ReViT's docstring), scalars {"bal": eq. 6, "z": eq. 8, "div": eq. 9}, over the gates
    `logits` (M, E) fp32 (reViT: the grid's L steps; Lory: each image at each step) and `mlp`'s experts."""
    E = logits.shape[1]
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)  # (M,) H(g), in nats
    theta = torch.cat([p.flatten(1) for p in mlp.tensors()], dim=1)  # (E, P)
    with torch.autocast(theta.device.type, enabled=False):  # a fp32 Gram matrix
        theta = F.normalize(theta.float(), dim=1)
        cos2 = (theta @ theta.T).pow(2)  # (E, E)
    return {"bal": (1 - entropy / math.log(E)).mean(),  # eq. 6
            "z": torch.logsumexp(logits, -1).pow(2).mean(),  # eq. 8
            "div": (cos2.sum() - cos2.diagonal().sum()) / (E * (E - 1))}  # eq. 9: the pairs e < e', twice


# ----------------------------------------------------------------------------- elastic depth (paper 3.2, A.2)
def sample_keep(batch: int, depth: int, p: float, device=None):
    """Depth dropout mask (batch, depth) bool: each step kept with probability 1 - p; an image dropping all keeps
    one uniformly chosen step (our choice). ReViT samples it on the CPU (a step's batch size is host data)."""
    keep = torch.rand(batch, depth, device=device) >= p
    empty = ~keep.any(1)  # (B,)
    pick = torch.randint(depth, (batch,), device=device)  # (B,) the step an empty image keeps
    return keep | (empty[:, None] & (torch.arange(depth, device=device) == pick[:, None]))


def step_coords(keep):
    """Coordinates of the retained steps: the j-th of an image's n retained steps gets j / (n - 1)
    (0 when n = 1), i.e. the grid of a depth-n model. keep (B, L) bool -> (B, L) float, 0 if dropped."""
    rank = keep.cumsum(1) - 1  # (B, L) index among the retained steps
    n = keep.sum(1, keepdim=True)  # (B, 1)
    return torch.where(keep, rank.float() / (n - 1).clamp(min=1).float(), 0.0)


# ----------------------------------------------------------------------------- the model
class ReViT(nn.Module):
    """Recurrent ViT with one shared block and `experts` FFN experts merged by normalized depth.

    `logits = model(x, depth=None, keep=None)`, `logits, loss = model(x, targets, ...)` (training): x (B, C, H, W);
    targets (B,) or (B, classes) probabilities; logits (B, classes); keep (B, depth) bool, the elastic mask (sampled in
    training when `depth_dropout > 0`). loss = CE (`loss="ce"`; "bce": DeiT III's) + for E > 1 (eq. 7) the terms of
    sec. 3.2 on the call's grid (our choice: not the drop mask's), weighted by lambda_bal, lambda_z, lambda_div:
        L_bal = (1/L) sum_k [1 - H(g(t_k)) / log E]                       eq. 6 (H: Shannon entropy)
        L_z   = (1/L) sum_k logsumexp(router_logits(t_k))^2               eq. 8
        L_div = 2 / (E (E - 1)) sum_{e < e'} cos(theta_e, theta_e')^2     eq. 9, theta_e: expert e flattened
    `model.aux`: the detached terms. experts=1 is the tied bViT block. As BViT: class_token, dynamic_img_size,
    set_grad_checkpointing, drop path (`shared_drop_rate`), `init_base` (each expert as a dense FFN, A.1), `init`;
    `block_fn`: Block's arguments with experts=, a module `block(z, w1, b1, w2, b2)` with an ExpertMlp `mlp` and
    `grouped`. Bad sizes or names raise ValueError.
    """

    def __init__(self, *, img_size=224, patch_size=16, in_chans=3, num_classes=1000,
                 embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0, experts=4,
                 depth_dropout=0.0, lambda_bal=1e-2, lambda_z=1e-3, lambda_div=1e-3,
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
        if depth < 1 or experts < 1:
            raise ValueError(f"need depth >= 1 and experts >= 1, got depth={depth}, experts={experts}")
        if not 0.0 <= depth_dropout < 1.0:
            raise ValueError(f"depth_dropout must be in [0, 1), got {depth_dropout}")
        if init_base not in ("timm", "pytorch") or not (init is None or callable(init)):
            raise ValueError(f"need init_base 'timm' or 'pytorch' and init None or a function model -> None "
                             f"(inits.py: inits.structured), got {init_base!r}, {init!r}")
        if loss not in ("ce", "bce"):
            raise ValueError(f"loss={loss!r}; allowed: 'ce', 'bce'")
        self.config = {k: v for k, v in locals().items() if k not in ("self", "__class__", "dims")}  # (DenseReViT's)
        self.depth, self.experts, self.num_classes = depth, experts, num_classes
        self.img_size, self.patch_size, self.in_chans = img_size, patch_size, in_chans
        self.embed_dim, self.num_heads, self.mlp_ratio = embed_dim, num_heads, mlp_ratio
        self.depth_dropout, self.lambdas, self.loss = depth_dropout, (lambda_bal, lambda_z, lambda_div), loss
        self.dynamic_img_size, self.grad_checkpointing = dynamic_img_size, False

        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, (img_size // patch_size) ** 2 + int(class_token), embed_dim))
        # Stochastic depth: the one block serves steps 0..depth-1, so the untied schedule's mean (shared_drop_rate).
        block_fn = block_fn or Block  # timm's block_fn: the shared block, built with Block's arguments
        self.blocks = nn.ModuleList([block_fn(dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio, experts=experts,
                                              layer_scale=layer_scale,
                                              drop_path=shared_drop_rate(drop_path_rate, range(depth), depth))])
        # A.1: the router sees only the normalized depth t (no step embedding), temperature 1.
        self.router = nn.Sequential(nn.Linear(1, 16), nn.SiLU(), nn.Linear(16, experts)) \
            if experts > 1 else None  # E = 1: the gate is always 1
        # timm: a class token is read after `norm`; the token mean (global_pool="avg") after `fc_norm`.
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6) if class_token else nn.Identity()
        self.fc_norm = nn.Identity() if class_token else nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()  # timm: 0 = features
        self.num_features = self.head_hidden_size = embed_dim  # timm's names; global_pool: the readout's
        self.global_pool, self.feature_info = "token" if class_token else "avg", [
            dict(num_chs=embed_dim, reduction=patch_size, module="blocks.0") for k in range(depth)]
        self.pretrained_cfg = self.default_cfg = dict(  # timm's; ImageNet's mean, std (a run's: its data's)
            input_size=(in_chans, img_size, img_size), num_classes=num_classes, mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225), fixed_input_size=not dynamic_img_size, first_conv="patch_embed.proj")
        self.aux = {}
        self._init_weights(init_base)
        if init is not None:  # e.g. inits.structured: the attention init, on the base
            init(self)

    def forward(self, x, targets=None, depth=None, keep=None):
        depth = self.depth if depth is None else depth
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        z = self.embed(x)
        if keep is None and self.training and self.depth_dropout > 0:
            keep = sample_keep(z.shape[0], depth, self.depth_dropout)  # on the CPU: no device sync
        if keep is None:  # every image runs the grid: one merged FFN per step, shared by the batch
            # the grid's merged FFNs, each split into its L steps by one unbind (views: the same numbers; in a
            # compiled graph its backward is one stack, where L indexings would scatter L zero-padded gradients)
            weights = [w.unbind(0) for w in self.grid_weights(depth)]  # L x (H, D), (H,), (D, H), (D,)
            for k in range(depth):
                z = self.step(z, k, depth, weights)
        else:  # elastic depth: each image runs its kept steps only
            if tuple(keep.shape) != (z.shape[0], depth):
                raise ValueError(f"keep must be ({z.shape[0]}, {depth}) bool, got shape {tuple(keep.shape)}")
            z = self.elastic(z, keep)
        logits = self.classify(z)
        if targets is None:
            return logits
        loss = classification_loss(logits, targets, self.loss)
        # Read before the next training step (CUDA graphs would overwrite it; train.py reads after each epoch).
        self.aux = {f"{self.loss}_loss": loss.detach()}
        if self.experts > 1:
            reg = self.regularizers(depth)
            loss = loss + sum(lam * reg[k] for lam, k in zip(self.lambdas, ("bal", "z", "div")))
            self.aux.update({f"{k}_loss": v.detach() for k, v in reg.items()})
        return logits, loss

    # ----------------------------------------------------- the router: t_k, g(t), W(t) (3.1, A.1) and eq. 6-9
    def grid(self, depth=None):
        """Normalized depths t_k = k / (L - 1) of the L steps (t = 0 when L = 1): (L,)."""
        depth = depth or self.depth
        return torch.arange(depth, device=self.pos_embed.device, dtype=torch.float32) / max(depth - 1, 1)

    def route(self, t):
        """Router logits (U, E) at coordinates t (U,); zeros (gate 1) for a single expert."""
        if self.router is None:
            return t.new_zeros(len(t), 1)
        return self.router(t[:, None].to(self.router[0].weight.dtype))  # (U, 1) -> (U, E)

    def ffn_weights(self, t):
        """Merged FFN weights at coordinates t (U,): w1 (U, H, D), b1 (U, H), w2 (U, D, H), b2 (U, D)."""
        return self.blocks[0].mlp.merge(self.route(t).float().softmax(-1))

    def regularizers(self, depth=None):
        """The E > 1 regularizers of the class docstring on the grid of `depth`: dict of scalars."""
        return router_losses(self.route(self.grid(depth)).float(), self.blocks[0].mlp)  # logits (L, E)

    # ----------------------------------------------------- elastic depth: each image runs its kept steps
    def elastic(self, z, keep):
        """Elastic depth (paper 3.2, A.2): z (B, N, D), keep (B, L) bool -> (B, N, D). Image b runs only its kept
        steps, its j-th of n at t = j / (n - 1). Step k: 1. rows, the images keeping it; 2. t, their coordinates;
        3. one merged FFN per distinct t; 4. the block on those rows, grouped by FFN (Block.grouped). The mask stays
        on the CPU (a step's batch is host data). A kept step is not rescaled by 1 / (1 - p) (our choice; the
        papers are silent): it computes what it computes at inference."""
        keep = keep.cpu()  # a mask given on the GPU: one copy
        if not keep.any(1).all():
            raise ValueError("keep must keep at least one step of every image")
        coords = step_coords(keep)  # (B, L)
        for k in range(keep.shape[1]):
            rows = keep[:, k].nonzero().squeeze(1)  # 1. (B_k,)
            if len(rows):
                z = self._step(self._elastic_step, z, to_device(rows, z.device), coords[rows, k])  # 2. (B_k,)
        return z

    def _elastic_step(self, z, rows, t):
        """Steps 3-4 of `elastic` for one step (inside the checkpointed region, so that the merging
        is recomputed in backward): rows (B_k,) on z's device, t (B_k,) on the CPU."""
        uniq, groups = t.unique(return_inverse=True)  # 3. (U,), (B_k,): one merged FFN per coordinate
        weights = self.ffn_weights(to_device(uniq, z.device))  # (U, H, D), (U, H), (U, D, H), (U, D)
        return z.index_copy(0, rows, self.blocks[0].grouped(z[rows], *weights, groups))  # 4.

    # ----------------------------------------------------- embedding and readout
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
    # forward(x, depth=L) without depth dropout runs begin, step k = 0..L-1, readout, as bViT's.
    blocks_per_step = 1  # block applications per step

    def begin(self, x):
        """The state before step 0: the embedded tokens (B, N(+1), D)."""
        return self.embed(x)

    def step(self, z, k, depth=None, weights=None):
        """Step k of a `depth`-step run (any depth: the grid resampled, 3.2): z (B, T, D), the shared block with the FFN
        merged at t_k = k / (L - 1); weights: the grid's merged FFNs (grid_weights), when the caller has them."""
        w1, b1, w2, b2 = self.grid_weights(depth) if weights is None else weights
        return self._step(self.blocks[0], z, w1[k], b1[k], w2[k], b2[k])

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
        """timm's forward_intermediates, as BViT's (timm_outputs): the states after the steps `indices` picks
        (take_indices) of a `depth`-step run (keyword) on its grid (no depth dropout)."""
        depth = self.depth if depth is None else depth
        take, z, states, weights = take_indices(depth, indices), self.begin(x), [], self.grid_weights(depth)
        for k in range(max(take) + 1 if stop_early and take else depth):
            z = self.step(z, k, depth, weights)
            if k in take:
                states.append(self.norm(z) if norm else z)
        return timm_outputs(self, x, self.norm(z), states, return_prefix_tokens, output_fmt, intermediates_only,
                            output_dict)

    def grid_weights(self, depth):
        """ffn_weights(grid(depth)), as forward merges them once for step(z, k, depth, weights): (L, ...) tensors."""
        return self.ffn_weights(self.grid(depth))

    def get_classifier(self):
        """timm's name: the head (nn.Linear, or nn.Identity without classes)."""
        return self.head

    def reset_classifier(self, num_classes, global_pool=None):
        """timm's name: a new head (PyTorch's init) for `num_classes`; 0: none, the model returns (B, D). The pooling
        is the build's (global_pool "token" with a class token, else "avg"): ValueError for another."""
        if global_pool not in (None, self.global_pool):
            raise ValueError(f"global_pool={global_pool!r}: the model pools as built: {self.global_pool!r}")
        self.num_classes = self.config["num_classes"] = num_classes  # (materialize builds from config)
        p = self.pos_embed
        self.head = nn.Linear(self.embed_dim, num_classes, device=p.device, dtype=p.dtype) if num_classes > 0 \
            else nn.Identity()

    # ----------------------------------------------------- the gate table and deployment
    @torch.no_grad()
    def gates(self, depth=None):
        """Expert weights g(t_k) of the grid of `depth` steps: (L, E), rows sum to 1."""
        return self.route(self.grid(depth)).float().softmax(-1)

    def log_extras(self):
        """For log.jsonl: the gate table (depth, E) at the training depth."""
        return {"gates": [[round(v, 4) for v in row] for row in self.gates().tolist()]}

    @torch.no_grad()
    def materialize(self, depth=None):
        """A plain model for fixed-depth deployment (paper 3.1): L dense FFNs merged once, no router."""
        return DenseReViT(self, depth or self.depth).to(self.pos_embed).train(self.training)

    # ----------------------------------------------------- machinery: init, checkpointing, compile, sizes
    def _init_weights(self, base):  # the base (INIT_BASES); `init` runs after it (__init__)
        mlp = self.blocks[0].mlp
        if base == "pytorch":  # PyTorch's defaults (reset_parameters), pos_embed randn x 0.02, class token 0
            for m in self.modules():  # (the structured-init paper's baseline: its code's weight_init='skip')
                if isinstance(m, (nn.Linear, nn.Conv2d, nn.LayerNorm)):
                    m.reset_parameters()
            nn.init.normal_(self.pos_embed, std=0.02)
            if self.cls_token is not None:
                nn.init.zeros_(self.cls_token)
            # A.1: each expert as a dense FFN is initialized, here nn.Linear's default: U(+-1/sqrt(fan_in)).
            for w, b in ((mlp.fc1.weight, mlp.fc1.bias), (mlp.fc2.weight, mlp.fc2.bias)):  # (E, out, in), (E, out)
                bound = 1.0 / math.sqrt(w.shape[-1])
                nn.init.uniform_(w, -bound, bound), nn.init.uniform_(b, -bound, bound)
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
            # A.1: experts initialized independently with the dense FFN init, no variance correction.
            for p in mlp.tensors():
                nn.init.trunc_normal_(p, std=0.02) if p.ndim == 3 else nn.init.zeros_(p)
        if self.router is not None:
            # Our choice: PyTorch's default U(-1, 1) for Linear(1, 16), so the 16 hidden units are
            # distinct functions of t in [0, 1] (std 0.02 would make them all ~0.01 t).
            self.router[0].reset_parameters()
            # A.1: zero-initialized output layer, so every expert starts with weight exactly 1/E.
            nn.init.zeros_(self.router[2].weight), nn.init.zeros_(self.router[2].bias)
        if base == "timm":
            w = self.patch_embed.proj.weight  # timm's lecun-normal for the patch embedding
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
        """Regional compilation (as BViT): the block's one-FFN step compiled once (fullgraph), for every step and
        depth; the merging and the elastic grouped steps stay eager. Call before DDP. Returns self."""
        self.blocks[0].compile(fullgraph=True, **kwargs)
        return self

    def trains_as_one_graph(self):
        """Whether a training forward has the same operations and shapes every step (then kernels.py may compile it
        whole): not with elastic depth, whose steps run a sampled, data-dependent subset of the images."""
        return self.depth_dropout == 0

    def num_params(self, exclude_embeddings=False):
        """Number of distinct parameters (the shared block counts once, each expert once)."""
        return sum(p.numel() for p in self.parameters()) - exclude_embeddings * self.pos_embed.numel()

    def flops_per_image(self, depth=None):
        """Forward FLOPs per image of the materialized graph, counted as BViT counts them (one dense
        FFN per step). Run-time merging adds 2E(2DH + H + D) per step per *batch*, not counted."""
        depth, D, p = depth or self.depth, self.embed_dim, self.patch_size
        N = (self.img_size // p) ** 2
        T, hidden = N + int(self.cls_token is not None), int(D * self.mlp_ratio)
        per_step = 4 * T * D * D + 2 * T * T * D + 2 * T * D * hidden
        return 2 * (N * D * self.in_chans * p * p + depth * per_step + D * self.num_classes)


# Named configurations (the ViT/DeiT sizes Ti, S, B, L): one shared block, E = 4 experts unless given (paper's main E).
def revit_ti(**kw): return ReViT(**{"embed_dim": 192, "num_heads": 3, "depth": 12, **kw})
def revit_s(**kw): return ReViT(**{"embed_dim": 384, "num_heads": 6, "depth": 12, **kw})
def revit_b(**kw): return ReViT(**{"embed_dim": 768, "num_heads": 12, "depth": 12, **kw})
def revit_l(**kw): return ReViT(**{"embed_dim": 1024, "num_heads": 16, "depth": 24, **kw})


# ============================================================================= optional machinery
# ----------------------------------------------------------------------------- hierarchical compilation
@getattr(torch.compiler, "nested_compile_region", lambda fn: fn)  # (a torch without it: the plain function)
def apply_step(block, *args):
    """block(*args), one step as a nested compile region: with `model.nested_regions` on (kernels.py), a
    whole-model torch.compile compiles the step once and calls it at every step; eagerly a plain call."""
    return block(*args)


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


# ----------------------------------------------------------------------------- fixed-depth deployment (paper 3.1)
class DenseReViT(ReViT):
    """reViT materialized at depth L (paper 3.1): the same model with L dense FFNs `blocks.0.mlp.fc{1,2}` (slot k:
    step k's merged FFN, which grid_weights gives ReViT's forward and step); no router, no merging at run time."""

    def __init__(self, src: ReViT, depth: int):
        super().__init__(**{**src.config, "depth": depth, "experts": 1, "depth_dropout": 0.0})
        H = int(src.embed_dim * src.mlp_ratio)
        self.blocks[0].mlp = ExpertMlp(src.embed_dim, H, depth)
        state = {k: v for k, v in src.state_dict().items() if not k.startswith(("router.", "blocks.0.mlp."))}
        for name, w in zip(("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"),
                           src.ffn_weights(src.grid(depth))):
            state[f"blocks.0.mlp.{name}"] = w  # (L, ...): slot k = the FFN merged at t_k
        self.load_state_dict(state, strict=True)

    def grid_weights(self, depth):
        """Its L stored FFNs (the slots step k reads), for its own depth only."""
        if depth not in (None, self.depth):
            raise ValueError(f"a materialized model runs only its depth {self.depth}, got {depth}")
        return self.blocks[0].mlp.tensors()
