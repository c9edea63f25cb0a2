"""ODEViT: the shared recurrent ViT block read as a neural ODE, solved with fixed-step solvers.

Paper: "Training Crossroads for Recurrent ViTs: Recurrence, Neural ODEs, and Deep Supervision"
(Gruszczynski et al.; only its abstract was available to us).

Idea. bViT applies one residual block F repeatedly: z_{k+1} = F(z_k). Since F(z) = z + v(z),
that is one Euler step of size 1 of the state-subtracted field dz/dt = F(z) - z. Here the same
block defines the field and a textbook solver (Euler, midpoint, Heun, RK4) integrates it from
t = 0 to the horizon T, so solver, step size and horizon become knobs: cost is counted in block
evaluations (NFE), and more steps at inference either extend T (recurrence view) or refine h
(ODE view). The black-box field dz/dt = F(z) is kept because the paper measures its cost.

Equations (our reading of the abstract; the block F as in bvit.py):
    z(0) = [cls; patch_embed(x)] + pos_embed                          (B, 1+N, D)
    dz/dt = F(z) - z   (field="subtracted")   or   dz/dt = F(z)   (field="blackbox")
    h = T / steps;  euler with h = 1 and steps = depth: z_{k+1} = F(z_k), bViT bit for bit
    logits = head(norm(z(T))[:, 0])     stage s of S reads out at t = s T / S (deep supervision)
Block F, LayerScale (ls1, ls2) and the readout (class token, or GAP through `fc_norm`) as in
bvit.py. Optional machinery, after the model: the attention inits (`init=` on the base `init_base=`, as in
bvit.py) and `resample_pos_embed`.

Measured (2026-11-30, commit 5634327, a 2-core AMD EPYC CPU shared with other jobs, one thread;
`STEPS=800 OUT=runs/crossroads_800 bash lab/crossroads_study.sh`): CIFAR-100, D=64, 2 heads,
patch 4, 800 steps of batch 64 (~1 epoch), top-1 on the first 2000 test images (s.e. ~0.7 points),
12 block evaluations each over T = 12: Euler x 12 10.35 (bit-identical to bViT, weights included),
Heun x 6 9.30, RK4 x 3 10.25. Euler at 24 / 48 steps: extend="time" 7.35 / 3.40, extend="refine"
10.30 / 9.95. More in docs/models.md.
"""
import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

NFE_PER_STEP = {"euler": 1, "midpoint": 2, "heun": 2, "rk4": 4}  # block evaluations per step
EXTENDS = ["time", "refine"]  # beyond the horizon: same h and larger T, or same T and smaller h


def odeint(f: Callable, z0: torch.Tensor, t0, t1, steps: int, method: str = "euler", *,
           subtracted: bool = False) -> torch.Tensor:
    """Integrate dz/dt = f(t, z) from t0 to t1 with `steps` fixed steps of an explicit solver.

    f(t, z): t a 0-dim float32 tensor (time is kept in float32 whatever the state's dtype, as
    torchdiffeq keeps it), z of z0's shape; returns dz/dt. z0: any shape and float dtype.
    Returns the state at t1, same shape as z0. Solvers (h = (t1 - t0) / steps):
      euler     z + h k1                                          (order 1, 1 call per step)
      midpoint  z + h f(t + h/2, z + h/2 k1)                      (order 2, 2 calls)
      heun      z + h/2 (k1 + f(t + h, z + h k1))                 (order 2, 2 calls)
      rk4       z + h/6 (k1 + 2 k2 + 2 k3 + k4), classic          (order 4, 4 calls)
    subtracted=True: f returns G(t, z) and the field is G(t, z) - z. Euler's
    update is then written (1 - h) z + h G, which for h = 1 is G bit for bit (0 * z + G), so the
    recurrence z <- G(z) is reproduced exactly instead of up to the rounding of z + (G - z).
    Step sizes are Python floats; the time grid t0 + k h is computed from k (no drift).
    """
    if method not in NFE_PER_STEP:
        raise ValueError(f"unknown solver {method!r}; allowed: {', '.join(NFE_PER_STEP)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    t0, t1 = float(t0), float(t1)
    h = (t1 - t0) / steps
    z = z0
    for k in range(steps):
        z = solver_step(f, z, t0 + k * h, h, method, subtracted)
    return z


def solver_step(f: Callable, z: torch.Tensor, t: float, h: float, method: str = "euler",
                subtracted: bool = False) -> torch.Tensor:
    """One step of odeint's solver from time t (a Python float) with step size h: z(t) -> z(t + h)."""
    def time(s):  # 0-dim float32 tensor on the state's device, filled there: no host-to-device copy
        return torch.full((), s, dtype=torch.float32, device=z.device)

    def v(t, z):  # the field dz/dt
        g = f(time(t), z)
        return g - z if subtracted else g

    if method == "euler":  # subtracted: (1 - h) z + h G = z + h (G - z), exact G for h = 1
        return (1.0 - h) * z + h * f(time(t), z) if subtracted else z + h * f(time(t), z)
    if method == "midpoint":
        k1 = v(t, z)
        return z + h * v(t + h / 2, z + (h / 2) * k1)
    if method == "heun":
        k1 = v(t, z)
        k2 = v(t + h, z + h * k1)
        return z + (h / 2) * (k1 + k2)
    k1 = v(t, z)  # rk4
    k2 = v(t + h / 2, z + (h / 2) * k1)
    k3 = v(t + h / 2, z + (h / 2) * k2)
    k4 = v(t + h, z + h * k3)
    return z + (h / 6) * (k1 + 2 * k2 + 2 * k3 + k4)


# ----------------------------------------------------------------------------- the block F
# Copied from bvit.py on purpose (one readable file per model; same names, so weights copy 1:1).
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
class ODEViT(nn.Module):
    """ViT whose single shared block F defines an ODE integrated by a fixed-step solver.

    Parameters are named exactly as in `BViT(num_blocks=1)` (patch_embed.proj, cls_token,
    pos_embed, blocks.0.*, norm, head), so a bViT state dict loads with strict=True.
    `depth` (or its alias `steps`) is the number of solver steps; `horizon` T (default: steps,
    i.e. h = 1); block evaluations per forward = steps x NFE_PER_STEP[solver], stored in
    `model.nfe` after each call. `depth=L` at call time runs L steps: `extend="time"` keeps h
    and integrates to T' = L h (recurrence view), `extend="refine"` keeps T and uses h = T / L
    (ODE view). Deep supervision: `stages=S` reads out at t = s T' / S (s = 1..S) with the shared
    norm + head; loss = the mean of the stage losses CE_s; `model.aux` holds the
    detached stage losses. Call: `logits = model(x, depth=None)`;
    `logits, loss = model(x, targets)` in training.

    The field is autonomous (F ignores t, as bViT has no step signal; our choice). Under an
    enclosing autocast, the embedding and head run autocast as usual; the solver arithmetic and
    the time grid run in full precision and autocast is re-entered only inside the field.
    As timm: without a class token the token mean goes through `fc_norm` (LayerNorm after pooling,
    `norm` the identity); `dynamic_img_size=True` takes any H, W divisible by patch_size, resampling
    pos_embed (`resample_pos_embed`); `set_grad_checkpointing()` recomputes each field evaluation
    in the backward pass (training only).
    Stochastic depth (`drop_path_rate`, drawn anew at every field evaluation; our choice): the one block
    serves the steps x NFE_PER_STEP[solver] evaluations of a forward, so it gets the untied schedule
    linspace(0, drop_path_rate, evaluations)'s mean, rate / 2 (0 for a single evaluation;
    `shared_drop_rate`, the rule of every model file): Euler at h = 1 stays bViT's, masks included.
    Fixed at construction, for the trained steps. Init: `init` (INITS) the attention's, `init_base`
    (INIT_BASES) every other layer's. `block_fn` (timm's name; default Block): the block F, as
    bvit.BViT's block_fn. Bad sizes or names raise ValueError.
    """

    def __init__(self, *, img_size=224, patch_size=16, in_chans=3, num_classes=1000,
                 embed_dim=768, depth=None, num_heads=12, mlp_ratio=4.0, class_token=True,
                 layer_scale=None, drop_path_rate=0.0, init=None, init_base="timm", solver="euler",
                 steps=None, horizon=None, field="subtracted", extend="time", stages=1,
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
        if depth is not None and steps is not None and depth != steps:
            raise ValueError(f"depth={depth} and steps={steps} both name the number of solver steps")
        steps = steps if steps is not None else (depth if depth is not None else 12)
        if steps < 1:
            raise ValueError(f"steps (depth) must be >= 1, got {steps}")
        for name, value, allowed in [("solver", solver, list(NFE_PER_STEP)), ("extend", extend, EXTENDS),
                                     ("field", field, ["subtracted", "blackbox"])]:
            if value not in allowed:
                raise ValueError(f"{name}={value!r}; allowed: {', '.join(allowed)}")
        if horizon is not None and not horizon > 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        if stages < 1 or steps % stages:
            raise ValueError(f"stages={stages} must be >= 1 and divide steps={steps}")
        if init_base not in ("timm", "pytorch") or not (init is None or callable(init)):
            raise ValueError(f"need init_base 'timm' or 'pytorch' and init None or a function model -> None "
                             f"(inits.py: inits.structured), got {init_base!r}, {init!r}")
        if loss not in ("ce", "bce"):
            raise ValueError(f"loss={loss!r}; allowed: 'ce', 'bce'")
        self.loss = loss
        self.depth = self.steps = steps
        self.horizon = float(horizon) if horizon is not None else float(steps)  # T; h = T / steps
        self.solver, self.field, self.extend, self.stages = solver, field, extend, stages
        self.img_size, self.patch_size, self.in_chans = img_size, patch_size, in_chans
        self.embed_dim, self.num_heads, self.mlp_ratio = embed_dim, num_heads, mlp_ratio
        self.dynamic_img_size, self.grad_checkpointing = dynamic_img_size, False
        self.num_classes = num_classes
        num_patches = (img_size // patch_size) ** 2

        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + int(class_token), embed_dim))
        # One block, a ModuleList so the names match BViT's `blocks.0.*`. Stochastic depth is drawn anew
        # at every field evaluation (our choice; off by default), at the untied schedule's mean over them.
        nfe = steps * NFE_PER_STEP[solver]  # block evaluations per forward
        block_fn = block_fn or Block  # timm's block_fn: the block F, built with Block's arguments
        self.blocks = nn.ModuleList([block_fn(dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio,
                                              layer_scale=layer_scale, stochastic=drop_path_rate > 0,
                                              drop_path=shared_drop_rate(drop_path_rate, range(nfe), nfe))])
        # timm: a class token is read after `norm`; the token mean (global_pool="avg") after `fc_norm`.
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6) if class_token else nn.Identity()
        self.fc_norm = nn.Identity() if class_token else nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()  # timm: 0 = features
        self.num_features = self.head_hidden_size = embed_dim  # timm's names; global_pool: the readout's
        self.global_pool, self.feature_info = "token" if class_token else "avg", [
            dict(num_chs=embed_dim, reduction=patch_size, module="blocks.0") for k in range(steps)]
        self.pretrained_cfg = self.default_cfg = dict(  # timm's; ImageNet's mean, std (a run's: its data's)
            input_size=(in_chans, img_size, img_size), num_classes=num_classes, mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225), fixed_input_size=not dynamic_img_size, first_conv="patch_embed.proj")
        self.aux, self.nfe = {}, 0
        self._init_weights(init_base)
        if init is not None:  # e.g. inits.structured: the attention init, on the base
            init(self)

    def forward(self, x, targets=None, depth=None, extend=None):
        depth = self.steps if depth is None else depth
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        if extend not in (None, *EXTENDS):
            raise ValueError(f"extend={extend!r}; allowed: {', '.join(EXTENDS)}")
        stages = self.stages if targets is not None else 1
        if depth % stages:
            raise ValueError(f"depth={depth} must be divisible by stages={stages} when computing a loss")
        T, _ = self.time_grid(depth, extend)
        dev = x.device.type
        f = self.field_fn(dev)
        self.nfe = 0
        z, stage_logits = self.embed(x), []
        for s in range(stages):  # stage s integrates [s T / S, (s+1) T / S] on the same grid
            with torch.autocast(dev, enabled=False):
                z = odeint(f, z, s * T / stages, (s + 1) * T / stages, depth // stages, self.solver,
                           subtracted=self.field == "subtracted")
            stage_logits.append(self.classify(z))
        logits = stage_logits[-1]
        if targets is None:
            return logits
        losses = torch.stack([classification_loss(l, targets, self.loss) for l in stage_logits])
        # Read before the next training step: compiled whole with CUDA graphs (kernels.py), these live in
        # the graph's memory and the next replay overwrites them (train.py reads them after each epoch).
        self.aux = {f"stage{s}_loss": v for s, v in enumerate(losses.detach())}
        # the mean, the final readout at 1/S as in bvit.py: our choice (the papers are silent); weights as Python
        # floats: no host-to-device copy per forward; same products, same sum
        return logits, torch.stack([l * (1.0 / self.stages) for l in losses]).sum()

    def field_fn(self, dev):
        """f(t, z): the block, in the caller's autocast state (the solver runs in float32 outside it); the
        solver subtracts z for field="subtracted". Counts its calls in self.nfe."""
        amp, amp_dtype = torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev)

        def f(t, z):
            self.nfe += 1
            with torch.autocast(dev, dtype=amp_dtype, enabled=amp):
                return self._step(self.blocks[0], z)
        return f

    # ----------------------------------------------------- anytime (docs/models.md): begin, step(k, depth), readout
    # A step is one solver step; forward(x, depth=L) at inference is begin, step k = 0..L-1, readout.
    @property
    def blocks_per_step(self):  # block evaluations per solver step
        return NFE_PER_STEP[self.solver]

    def begin(self, x):
        """The state z(0): the embedded tokens (B, N(+1), D)."""
        return self.embed(x)

    def step(self, z, k, depth=None, extend=None):
        """Solver step k (0-based) of a `depth`-step run (default: as trained; more under `extend`, as
        forward): z(t_k) -> z(t_k + h), with forward's grid (time_grid: h = T' / depth, t_k = k h)."""
        depth = self.steps if depth is None else depth
        T, _ = self.time_grid(depth, extend)
        dev = z.device.type
        h = (float(T) - 0.0) / depth  # odeint's h from 0 to T', so that the steps are forward's bit for bit
        with torch.autocast(dev, enabled=False):
            return solver_step(self.field_fn(dev), z, 0.0 + k * h, h, self.solver, self.field == "subtracted")

    def readout(self, z):
        """Logits (B, classes) of any step's state: the final norm and head, as deep supervision reads them."""
        return self.classify(z)

    def time_grid(self, depth=None, extend=None):
        """(horizon T', step size h) for `depth` steps under `extend` (see the class docstring)."""
        depth = self.steps if depth is None else depth
        h = self.horizon / self.steps
        if (extend or self.extend) == "refine":
            return self.horizon, self.horizon / depth
        return depth * h, h

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
                              output_fmt="NCHW", intermediates_only=False, output_dict=False, *, depth=None,
                              extend=None):
        """timm's forward_intermediates (its arguments; timm_outputs) on the solver: x (B, C, H, W) -> the states
        z(t_k + h) after the solver steps `indices` picks (take_indices) of the `depth`-step run (keyword; default as
        trained; more under `extend`, as forward); norm=True: through the final norm; stop_early: stop after the last
        one picked. Final tokens: the last state, normalized."""
        depth = self.steps if depth is None else depth
        take, z, states = take_indices(depth, indices), self.begin(x), []
        for k in range(max(take) + 1 if stop_early and take else depth):
            z = self.step(z, k, depth, extend)
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
        else:  # timm/DeiT, as in bvit.py: trunc-normal(0.02) Linear weights and position embedding.
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
        """Regional compilation: the block F is compiled once (fullgraph) and serves every field
        evaluation of every solver step; the solver loop and the float32 time grid stay eager, so
        neither the solver, the number of steps nor the horizon causes a recompile (fullgraph: see
        bvit.BViT.compile_regions). Call before DDP. Returns self."""
        self.blocks[0].compile(fullgraph=True, **kwargs)
        return self

    def trains_as_one_graph(self):
        """True: a training forward at the trained number of steps runs the same operations on the
        same shapes every step, so train.py may compile it whole (kernels.compile_for_training)."""
        return True

    def log_extras(self):
        """Logged by train.py next to `aux`: block evaluations of the last forward."""
        return {"nfe": self.nfe}

    def num_params(self, exclude_embeddings=False):
        """Number of parameters (the one block counts once, as in BViT(num_blocks=1))."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos_embed.numel() if exclude_embeddings else n

    def flops_per_image(self, depth=None):
        """Analytic forward FLOPs per image, as BViT.flops_per_image with `depth` block
        applications replaced by the NFE = steps x NFE_PER_STEP[solver] block evaluations (the
        solver's elementwise combinations, like norms and additions, are not counted)."""
        nfe = (self.steps if depth is None else depth) * NFE_PER_STEP[self.solver]
        D, p = self.embed_dim, self.patch_size
        N = (self.img_size // p) ** 2
        T = N + int(self.cls_token is not None)
        hidden = int(D * self.mlp_ratio)
        per_eval = 4 * T * D * D + 2 * T * T * D + 2 * T * D * hidden
        return 2 * (N * D * self.in_chans * p * p + nfe * per_eval + D * self.num_classes)


# ----------------------------------------------------------------------------- hierarchical compilation
@getattr(torch.compiler, "nested_compile_region", lambda fn: fn)  # (a torch without it: the plain function)
def apply_step(block, *args):
    """block(*args), one step as a nested compile region: with `model.nested_regions` on (kernels.py), a
    whole-model torch.compile compiles the step once and calls it at every step; eagerly a plain call."""
    return block(*args)


# Named configurations (the ViT/DeiT sizes): the bViT widths, 12 steps (24 for L) of Euler with h = 1.
_SIZES = {"ti": (192, 3), "s": (384, 6), "b": (768, 12), "l": (1024, 16)}


def _sized(size, **kw):
    dim, heads = _SIZES[size]
    if "steps" not in kw:
        kw.setdefault("depth", 24 if size == "l" else 12)
    return ODEViT(**{"embed_dim": dim, "num_heads": heads, **kw})  # (a given width wins, as in timm)


def odevit_ti(**kw): return _sized("ti", **kw)
def odevit_s(**kw): return _sized("s", **kw)
def odevit_b(**kw): return _sized("b", **kw)
def odevit_l(**kw): return _sized("l", **kw)


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
