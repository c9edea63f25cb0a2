"""LoopVAE: a hierarchical VAE whose encoder and decoder each reuse ONE small conditioned core at
every scale and every pass. Paper: Zhiying Lu, "LoopVAE: Recurrent Depth Across Scales for Visual
Tokenization" (arXiv 2609.11516); no official code is public.

Idea (sec. 3.1-3.2). A hierarchical encoder is h_{s+1} = T_s(F_s(h_s)): a stage F_s per scale s and
a transition T_s that changes the resolution. LoopVAE keeps every T_s (and the stem, the latent
projections, the output head) scale-specific, but replaces all stages F_s by one core F of K blocks,
run L_s times at scale s and conditioned on (scale, loop). Encoder and decoder cores have separate
weights. With K = 4 and L = [1, 2, 4] each branch stores 4 blocks and applies them K sum(L) = 28 times.

Equations (cited at the lines below):
    c_{s,t} = e_s + e_t                                              learned lookups      (eq. 3)
    h_{s,t+1} = F(h_{s,t} + 1[t>0] I_s(h_{s,0}), c_{s,t}),  t = 0..L_s-1                    (eq. 4)
    I_s(h) = g_s P_s(h):  P_s a 1x1 conv, g_s a scalar initialized to 0, once before the core
    d_core = K sum_s L_s = 28;  stored core: global K p, scale-wise S K p, unshared K p sum(L)  (eq. 5-6)
    block j: (beta1, gamma1, alpha1, beta2, gamma2, alpha2) = W_j SiLU(c) + b_j,  W_j, b_j = 0  (eq. 7)
             v = u + alpha1 * M1((1 + gamma1) * N1(u) + beta1)
             y = v + alpha2 * M2((1 + gamma2) * N2(v) + beta2)                                (eq. 8)
    CNN:  N = affine-free GroupNorm(32, eps 1e-6) (AdaGN); M1 = dw 7x7 -> SiLU -> 1x1; M2 = 1x1 C->4C -> SiLU -> 1x1
    ViT:  N = affine-free LayerNorm (AdaLN); M1 = attention, 2-D RoPE, local windows at fine scales; M2 = GELU MLP
    q(z|x) = N(mean, diag exp(logvar));  z = mean + exp(logvar/2) eps + 0.05 eps' in training, z = mean at
    evaluation;  Stage 1: L = |x - x_hat|_1 + lambda_p LPIPS + lambda_KL KL(q || N(0, I))    (sec. 3.5, eq. 10)
Images are in [-1, 1] (App. A.4 maps outputs to RGB by (x_hat + 1) / 2).

Tokenizer (sec. 3.4; the operators the paper leaves open are marked "our choice" at their lines):
    encoder: 4x4 stride-2 stem -> core at 2x -> 4x4/2 conv -> core at 4x -> 4x4/2 conv -> core at 8x
             -> GroupNorm, SiLU, 3x3 conv -> mean, logvar (latent_dim channels each)
    decoder: 3x3 conv (latent -> C) -> core at 8x -> up -> core at 4x -> up -> core at 2x -> up
             -> GroupNorm, SiLU, 3x3 conv -> RGB;  up = nearest x2, 3x3 conv (the last one to full size)
The loop interventions of sec. 4.4 are call options (class Interventions): prefix truncation,
single-pass bypass, the per-pass relative update (eq. 12) and the pass states. Weights other than
the zero-initialized ones keep PyTorch's default initialization (our choice; the paper does not say).

Stored vs executed (our `loopvae_cnn_f8d16()` at 256 px, from num_params() and macs_per_image()):
27,380,775 parameters against the paper's 29.07M (-5.8 %), 688.0 GMACs/img against 700.92 (-1.8 %).
The paper does not specify the transitions and heads; ours are marked "our choice". Its Transformer
is 32.46M - 29.07M = 3.39M larger, which is 8 x (ViT block - CNN block) = 8 x 424,320 = 3.39M: its
ablation apparently keeps the CNN's transitions and heads, as `operator="vit"` does here.
Measured: the CPU study of the sharing scopes on both cores and of Stage 2 (README.md "LoopVAE", docs/models.md,
lab/results/loopvae/).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


# ----------------------------------------------------------------------------- the conditioned block (sec. 3.3)
class Modulation(nn.Module):
    """(beta1, gamma1, alpha1, beta2, gamma2, alpha2) = W SiLU(c) + b (eq. 7): c (1, C) -> 6 x (1, C).
    W and b start at zero, so the gates alpha are 0 and the block is the identity at initialization."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 6 * dim)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, c):
        return self.proj(F.silu(c)).chunk(6, dim=-1)


class ConvBlock(nn.Module):
    """The CNN operator (sec. 3.3, a conditioned ConvNeXt block): u (B, C, H, W), c (1, C) -> (B, C, H, W).
    AdaGN; M1 = depthwise k x k conv -> SiLU -> 1x1 conv; M2 = 1x1 C -> rC -> SiLU -> 1x1 rC -> C."""

    def __init__(self, dim, num_groups=32, kernel_size=7, mlp_ratio=4.0):
        super().__init__()
        self.mod = Modulation(dim)
        self.norm1 = nn.GroupNorm(num_groups, dim, eps=1e-6, affine=False)
        self.dwconv = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        self.pwconv = nn.Conv2d(dim, dim, 1)
        self.norm2 = nn.GroupNorm(num_groups, dim, eps=1e-6, affine=False)
        self.fc1 = nn.Conv2d(dim, int(mlp_ratio * dim), 1)
        self.fc2 = nn.Conv2d(int(mlp_ratio * dim), dim, 1)

    def forward(self, u, c, window=None):  # window: unused, the Transformer's argument
        b1, g1, a1, b2, g2, a2 = (m.view(1, -1, 1, 1) for m in self.mod(c))  # broadcast over H, W
        v = u + a1 * self.pwconv(F.silu(self.dwconv((1 + g1) * self.norm1(u) + b1)))
        return v + a2 * self.fc2(F.silu(self.fc1((1 + g2) * self.norm2(v) + b2)))

    def macs(self, side):
        """Multiply-adds of one application on a side x side map (each conv: H W x weight.numel())."""
        convs = (self.dwconv, self.pwconv, self.fc1, self.fc2)
        return side * side * sum(m.weight.numel() for m in convs) + self.mod.proj.weight.numel()


def rope_2d(t, base=10000.0):
    """2-D rotary position embedding (RoFormer, Su et al. 2024, per axis): t (..., H, W, d) with d % 4 == 0.
    Channel pair (i, i + d/2) turns by angle y * f_i for i < d/4 and x * f_{i - d/4} otherwise,
    f_i = base^(-i / (d/4)) (our choice: half the pairs per axis), so q . k depends on the offset only."""
    H, W, d = t.shape[-3:]
    freqs = base ** (-torch.arange(d // 4, device=t.device, dtype=torch.float32) / (d // 4))  # (d/4,)
    ay = torch.arange(H, device=t.device, dtype=torch.float32)[:, None, None] * freqs  # (H, 1, d/4)
    ax = torch.arange(W, device=t.device, dtype=torch.float32)[None, :, None] * freqs  # (1, W, d/4)
    ang = torch.cat([ay.expand(H, W, -1), ax.expand(H, W, -1)], dim=-1)  # (H, W, d/2)
    cos, sin = ang.cos().to(t.dtype), ang.sin().to(t.dtype)
    t1, t2 = t.chunk(2, dim=-1)
    return torch.cat([t1 * cos - t2 * sin, t1 * sin + t2 * cos], dim=-1)


def _windows(t, w):  # (B, h, H, W, d) -> (B, h, H/w * W/w, w*w, d): non-overlapping w x w windows
    B, h, H, W, d = t.shape
    t = t.reshape(B, h, H // w, w, W // w, w, d).transpose(3, 4)  # (B, h, H/w, W/w, w, w, d)
    return t.reshape(B, h, (H // w) * (W // w), w * w, d)


def _unwindows(t, H, W, w):  # inverse of _windows: (B, h, nW, w*w, d) -> (B, h, H, W, d)
    B, h, _, _, d = t.shape
    return t.view(B, h, H // w, W // w, w, w, d).transpose(3, 4).reshape(B, h, H, W, d)


class WindowAttention(nn.Module):
    """Multi-head self-attention on x (B, H, W, C) with 2-D RoPE on q and k (sec. 3.3), inside
    non-overlapping window x window windows (Swin, Liu et al. 2021) or globally (window None)."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, window=None):
        B, H, W, C = x.shape
        qkv = self.qkv(x).view(B, H, W, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(3, 0, 4, 1, 2, 5).unbind(0)  # 3 x (B, h, H, W, d)
        q, k = rope_2d(q), rope_2d(k)  # absolute positions; inside a window only offsets matter
        if window is not None and window < max(H, W) and (H % window or W % window):
            raise ValueError(f"a {H}x{W} token grid does not split into {window}x{window} windows: the Transformer "
                             "operator runs at the image size it was built for (img_size), or one that keeps each "
                             "windowed scale a multiple of window_size")
        if window is None or window >= max(H, W):
            o = F.scaled_dot_product_attention(*(t.flatten(2, 3) for t in (q, k, v))).view(q.shape)
        else:
            o = _unwindows(F.scaled_dot_product_attention(*(_windows(t, window) for t in (q, k, v))), H, W, window)
        return self.proj(o.permute(0, 2, 3, 1, 4).reshape(B, H, W, C))  # (B, H, W, C)


class AttentionBlock(nn.Module):
    """The Transformer operator (sec. 3.3, a DiT block conditioned on (scale, loop)): u (B, C, H, W),
    c (1, C) -> (B, C, H, W); AdaLN, windowed RoPE attention, C -> rC -> GELU -> C MLP."""

    def __init__(self, dim, num_heads=6, mlp_ratio=4.0):
        super().__init__()
        self.mod = Modulation(dim)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.attn = WindowAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.fc1 = nn.Linear(dim, int(mlp_ratio * dim))
        self.fc2 = nn.Linear(int(mlp_ratio * dim), dim)

    def forward(self, u, c, window=None):
        b1, g1, a1, b2, g2, a2 = (m.view(1, 1, 1, -1) for m in self.mod(c))
        u = u.permute(0, 2, 3, 1)  # (B, H, W, C): tokens on their grid
        v = u + a1 * self.attn((1 + g1) * self.norm1(u) + b1, window)
        y = v + a2 * self.fc2(F.gelu(self.fc1((1 + g2) * self.norm2(v) + b2)))
        return y.permute(0, 3, 1, 2)  # (B, C, H, W)

    def macs(self, side, window=None):
        """Multiply-adds on a side x side grid: the linear maps, q k^T and attn v (2 N n C for windows of n tokens)."""
        n = side * side if window is None or window >= side else window * window
        lin = sum(m.weight.numel() for m in (self.attn.qkv, self.attn.proj, self.fc1, self.fc2))
        return side * side * (lin + 2 * n * self.fc2.out_features) + self.mod.proj.weight.numel()


# ----------------------------------------------------------------------------- the core (sec. 3.2)
def relative_update(h, new):
    """r = RMS(new - h) / max(RMS(h), 1e-8) per image (eq. 12; RMS over the whole feature, App. A.4): (B, ...) -> (B,)."""
    rms = lambda t: t.float().pow(2).flatten(1).mean(1).sqrt()
    return rms(new - h) / rms(h).clamp_min(1e-8)


class Injection(nn.Module):
    """I_s(h) = g_s P_s(h) (eq. 4): a 1x1 conv (the Transformer's token-wise linear map) and a scalar gate g_s = 0."""

    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Conv2d(dim, dim, 1)
        self.gate = nn.Parameter(torch.zeros(()))

    def forward(self, h):
        return self.gate * self.proj(h)


class Interventions:
    """Options of one forward (sec. 4.4): truncate {stage: k} keeps the first k passes of a stage;
    bypass {(stage, t)} replaces pass t's output (0-based) by its input; a dict `trace` receives
    {stage: (B, passes)} relative updates (eq. 12); a dict `states` receives the pass states."""

    def __init__(self, truncate=None, bypass=None, trace=None, states=None):
        self.truncate, self.trace, self.states = dict(truncate or {}), trace, states
        if isinstance(bypass, (tuple, list)) and len(bypass) == 2 and isinstance(bypass[0], str):
            bypass = [bypass]  # one (stage, t) pair, as a tuple or a list
        self.bypass = {tuple(b) for b in bypass or ()}

    def check(self, schedule):
        """ValueError for a stage not in schedule {stage: passes}, k outside 1..passes, t outside 0..passes-1,
        or a bypass of a pass that the truncation of its stage removes (it would be silently ignored)."""
        for name in list(self.truncate) + [b[0] for b in self.bypass]:
            if name not in schedule:
                raise ValueError(f"unknown stage {name!r}; the stages are {list(schedule)}")
        for name, k in self.truncate.items():
            if not 1 <= k <= schedule[name]:
                raise ValueError(f"truncate {name!r} to k={k}: need 1 <= k <= {schedule[name]}")
        for name, t in self.bypass:
            if not 0 <= t < schedule[name]:
                raise ValueError(f"bypass pass t={t} of {name!r}: need 0 <= t < {schedule[name]}")
            if name in self.truncate and t >= self.truncate[name]:
                raise ValueError(f"bypass pass t={t} of {name!r}: the truncation to k={self.truncate[name]} passes "
                                 "removes it")
        return self


class LoopCore(nn.Module):
    """F: K conditioned blocks run loops[s] times at scale s (traversal order), eq. 3-6.
    share="global" stores K blocks, "scale" S*K (one set per scale), "none" K*sum(loops) (one set per
    pass); all three run the same K*sum(loops) block applications. names[s] names scale s's stage
    (e.g. "enc_f8") for the interventions; windows[s] is the Transformer's window there (None: global)."""

    def __init__(self, dim, loops, num_blocks, share, make_block, names, windows):
        super().__init__()
        sets = {"global": 1, "scale": len(loops), "none": sum(loops)}[share]
        self.loops, self.num_blocks, self.share, self.names, self.windows = loops, num_blocks, share, names, windows
        self.blocks = nn.ModuleList(make_block() for _ in range(sets * num_blocks))
        # Learned lookups (eq. 3), nn.Embedding's N(0, 1) init: with zero e and zero W_j (eq. 7) both
        # would receive zero gradient forever, since SiLU(0) = 0.
        self.scale_embed = nn.Embedding(len(loops), dim)
        self.loop_embed = nn.Embedding(max(loops), dim)
        # One injection per looped scale (a scale with one pass never uses it, and an unused
        # parameter would stall DDP): scale-specific, as eq. 4's I_s.
        self.inject = nn.ModuleDict({str(s): Injection(dim) for s, n in enumerate(loops) if n > 1})
        self.grad_checkpointing = False

    def block(self, s, t, j):
        """Block j of pass t at scale s under the sharing scope (eq. 6)."""
        i = {"global": 0, "scale": s, "none": sum(self.loops[:s]) + t}[self.share]
        return self.blocks[i * self.num_blocks + j]

    def _run(self, blk, u, c, window):  # (not `_apply`: that name is nn.Module.to()'s)
        # Activation checkpointing (Chen et al. 2016): keep each application's input, recompute in backward.
        if self.grad_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(blk, u, c, window, use_reentrant=False)
        return blk(u, c, window)

    def forward(self, h, s, ctl):
        """The passes at scale s (eq. 4) under the interventions `ctl` (sec. 4.4): (B, C, H, W) -> (B, C, H, W)."""
        name = self.names[s]
        passes = ctl.truncate.get(name, self.loops[s])  # prefix truncation: the first k passes
        h0, inj, updates, states = h, None, [], [h]
        for t in range(passes):
            if (name, t) in ctl.bypass:
                new = h  # bypass: the pass's output is its (pre-injection) input (sec. 4.4)
            else:
                if t > 0 and inj is None:  # I_s(h_{s,0}) does not depend on t: computed once (our choice)
                    inj = self.inject[str(s)](h0)
                u = h + inj if t > 0 else h  # added once before the whole core, not per block (sec. 3.2)
                c = self.scale_embed.weight[s:s + 1] + self.loop_embed.weight[t:t + 1]  # (1, C), eq. 3
                for j in range(self.num_blocks):
                    u = self._run(self.block(s, t, j), u, c, self.windows[s])
                new = u
            if ctl.trace is not None:
                updates.append(relative_update(h, new))
            h = new
            states.append(h)
        if ctl.trace is not None:
            ctl.trace[name] = torch.stack(updates, dim=1)  # (B, passes)
        if ctl.states is not None:
            ctl.states[name] = states  # [h_{s,0}, ..., h_{s,passes}], pre-injection
        return h


# ----------------------------------------------------------------------------- transitions, encoder, decoder (sec. 3.4)
def downsample(cin, cout):
    """Stem and encoder transition, (B, cin, H, W) -> (B, cout, H/2, W/2): a 4x4 stride-2 conv (our choice:
    the paper says "stride-2" only; kernel = 2 x stride weighs every input pixel alike, no asymmetric padding)."""
    return nn.Conv2d(cin, cout, 4, stride=2, padding=1)


class Upsample(nn.Module):
    """Decoder transition, (B, C, H, W) -> (B, C, 2H, 2W): nearest x2 then a 3x3 conv (our choice, as the
    SD/FLUX VAE decoders; no transposed conv, so no checkerboard artifacts, Odena et al. 2016)."""

    def __init__(self, dim):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Encoder(nn.Module):
    """x (B, 3, H, W) -> mean, logvar (B, z, H/2^S, W/2^S): stride-2 stem, the core at 2x -> 4x -> ... with a
    scale-specific downsampling between scales, then the posterior head (sec. 3.4)."""

    def __init__(self, in_chans, dim, latent_dim, num_groups, core):
        super().__init__()
        S = len(core.loops)
        self.stem = downsample(in_chans, dim)
        self.core = core
        self.down = nn.ModuleList(downsample(dim, dim) for _ in range(S - 1))
        # The head predicts mean and log-variance (sec. 3.4); "its own normalization and output
        # projection" (sec. 3.4, Multi): GroupNorm, SiLU, 3x3 conv (our choice, as the SD VAE's conv_out).
        self.norm_out = nn.GroupNorm(num_groups, dim, eps=1e-6)
        self.head = nn.Conv2d(dim, 2 * latent_dim, 3, padding=1)

    def forward(self, x, ctl):
        h = self.stem(x)  # (B, C, H/2, W/2): scale 2x
        for s in range(len(self.core.loops)):
            h = self.core(h, s, ctl)  # F at scale s (eq. 4)
            if s < len(self.down):
                h = self.down[s](h)  # T_s (eq. 2), scale-specific
        mean, logvar = self.head(F.silu(self.norm_out(h))).chunk(2, dim=1)  # 2 x (B, z, h, w)
        return mean, logvar.clamp(-30.0, 20.0)  # our choice, as latent diffusion's autoencoder: exp() stays finite


class Decoder(nn.Module):
    """z (B, z, h, w) -> x_hat (B, 3, 2^S h, 2^S w): latent projection, the core at 8x -> 4x -> 2x (traversal
    order, so the most passes run at the finest scale), an upsampling after each scale (the last one to
    full resolution), GroupNorm, SiLU, 3x3 output conv (sec. 3.4; the operators: our choice)."""

    def __init__(self, out_chans, dim, latent_dim, num_groups, core):
        super().__init__()
        self.proj_in = nn.Conv2d(latent_dim, dim, 3, padding=1)  # latent -> width (sec. 3.4); 3x3: our choice
        self.core = core
        self.up = nn.ModuleList(Upsample(dim) for _ in core.loops)
        self.norm_out = nn.GroupNorm(num_groups, dim, eps=1e-6)
        self.conv_out = nn.Conv2d(dim, out_chans, 3, padding=1)

    def forward(self, z, ctl):
        h = self.proj_in(z)
        for s in range(len(self.core.loops)):
            h = self.up[s](self.core(h, s, ctl))
        return self.conv_out(F.silu(self.norm_out(h)))


# ----------------------------------------------------------------------------- posterior and the model
def kl_divergence(mean, logvar):
    """KL(N(mean, exp(logvar)) || N(0, 1)) per latent element: 0.5 (mean^2 + exp(logvar) - 1 - logvar)."""
    return 0.5 * (mean.float().pow(2) + logvar.float().exp() - 1.0 - logvar.float())


def sample_posterior(mean, logvar, noise_std, training):
    """Training: z = mean + exp(logvar / 2) eps + noise_std eps' (sec. 3.5: the sample is perturbed by
    N(0, 0.05^2)); evaluation: the posterior mode z = mean."""
    if not training:
        return mean
    return mean + (0.5 * logvar).exp() * torch.randn_like(mean) + noise_std * torch.randn_like(mean)


SHARES = ("global", "scale", "none")
OPERATORS = ("cnn", "vit")


class LoopVAE(nn.Module):
    """LoopVAE-Single (sec. 3.4): encoder and decoder, each with its own LoopCore.

    Call: `x_hat, loss = model(x, targets=None, *, truncate=None, bypass=None, trace=None, states=None)`,
    x (B, 3, H, W) in [-1, 1] with H, W divisible by 2^len(loops); x_hat (B, 3, H, W), unclipped.
    The target is x itself: any `targets` that is not None (train.py passes the class labels) asks
    for the Stage-1 loss (sec. 3.5, eq. 10), l1 + lambda_kl * kl (+ lambda_p * perceptual after
    `set_perceptual(fn)`), l1 the mean over pixels, kl the mean over latent elements and batch;
    `model.aux` holds the detached terms. Loss None without targets.
    Training mode decodes a posterior sample perturbed by N(0, latent_noise^2); eval mode the mode.
    The interventions (sec. 4.4, class Interventions) name stages `schedule()`'s way: "enc_f2",
    "enc_f4", "enc_f8", "dec_f8", "dec_f4", "dec_f2" for three scales.
    Raises ValueError for sizes that do not fit (width not divisible by num_groups or num_heads, ...).
    """

    def __init__(self, *, img_size=256, in_chans=3, embed_dim=384, num_blocks=4, loops=(1, 2, 4),
                 latent_dim=16, share="global", operator="cnn", mlp_ratio=4.0, num_groups=32,
                 kernel_size=7, num_heads=6, window_size=8, windowed_scales=2, latent_noise=0.05,
                 lambda_kl=1e-6, lambda_p=1.0):
        super().__init__()
        loops, S = tuple(int(n) for n in loops), len(loops)
        if share not in SHARES or operator not in OPERATORS:
            raise ValueError(f"need share in {SHARES} and operator in {OPERATORS}, got {share!r}, {operator!r}")
        if S < 1 or min(loops) < 1 or num_blocks < 1:
            raise ValueError(f"need num_blocks >= 1 and loops of positive pass counts, got {num_blocks}, {loops}")
        dims = dict(img_size=img_size, in_chans=in_chans, embed_dim=embed_dim, latent_dim=latent_dim,
                    num_groups=num_groups, kernel_size=kernel_size)
        dims.update(dict(num_heads=num_heads, window_size=window_size) if operator == "vit" else {})
        dims["int(embed_dim x mlp_ratio)"] = int(embed_dim * mlp_ratio)  # the blocks' MLP width
        if min(dims.values()) < 1:  # (first: the checks below divide by these; a width of 0 computes nothing)
            raise ValueError(", ".join(f"{k}={v}" for k, v in dims.items() if v < 1) + ": every width must be >= 1")
        if img_size % 2 ** S:
            raise ValueError(f"img_size {img_size} is not divisible by 2^{S} (one halving per scale)")
        if embed_dim % num_groups:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_groups {num_groups}")
        if operator == "vit" and (embed_dim % num_heads or (embed_dim // num_heads) % 4):
            raise ValueError(f"embed_dim {embed_dim} / num_heads {num_heads} must be a multiple of 4 (2-D RoPE)")
        self.img_size, self.in_chans, self.embed_dim, self.latent_dim = img_size, in_chans, embed_dim, latent_dim
        self.num_blocks, self.loops, self.share, self.operator = num_blocks, loops, share, operator
        self.latent_noise, self.lambda_kl, self.lambda_p = latent_noise, lambda_kl, lambda_p
        enc_names = [f"enc_f{2 ** (s + 1)}" for s in range(S)]  # traversal order 2x -> 4x -> 8x
        dec_names = [f"dec_f{2 ** (S - s)}" for s in range(S)]  # 8x -> 4x -> 2x
        # Windows (sec. 3.3: "at high-resolution scales"): window_size at the `windowed_scales` finest
        # scales, global attention elsewhere (our choice, as the paper's LoopVAE-Multi, App. A.2).
        fine = lambda f: f <= 2 ** windowed_scales  # f: the scale's downsampling factor
        enc_win = [window_size if fine(2 ** (s + 1)) else None for s in range(S)]
        dec_win = [window_size if fine(2 ** (S - s)) else None for s in range(S)]
        for f, w in zip([2 ** (s + 1) for s in range(S)], enc_win):
            side = img_size // f
            if operator == "vit" and w is not None and side > w and side % w:
                raise ValueError(f"the {side}x{side} map at scale {f}x is not divisible by window_size {w}")
        if operator == "cnn":
            make_block = lambda: ConvBlock(embed_dim, num_groups, kernel_size, mlp_ratio)
        else:
            make_block = lambda: AttentionBlock(embed_dim, num_heads, mlp_ratio)
        core = lambda names, windows: LoopCore(embed_dim, loops, num_blocks, share, make_block, names, windows)
        self.encoder = Encoder(in_chans, embed_dim, latent_dim, num_groups, core(enc_names, enc_win))
        self.decoder = Decoder(in_chans, embed_dim, latent_dim, num_groups, core(dec_names, dec_win))
        self.__dict__["perceptual"] = None  # outside the module tree: see set_perceptual
        self.aux = {}

    def schedule(self):
        """{stage: passes} in execution order, e.g. {"enc_f2": 1, ..., "dec_f2": 4}."""
        cores = (self.encoder.core, self.decoder.core)
        return {name: n for core in cores for name, n in zip(core.names, core.loops)}

    def encode(self, x, ctl=None):
        """x (B, 3, H, W) -> mean, logvar (B, latent_dim, H/2^S, W/2^S)."""
        S = len(self.loops)
        if x.shape[-1] % 2 ** S or x.shape[-2] % 2 ** S:
            raise ValueError(f"image size {tuple(x.shape[-2:])} is not divisible by 2^{S}")
        return self.encoder(x, ctl or Interventions())

    def decode(self, z, ctl=None):
        """z (B, latent_dim, h, w) -> x_hat (B, 3, 2^S h, 2^S w), unclipped, [-1, 1] the valid range."""
        return self.decoder(z, ctl or Interventions())

    def reconstruct(self, x, *, truncate=None, bypass=None, trace=None, states=None):
        """x -> (x_hat, mean, logvar) under the interventions (class Interventions)."""
        ctl = Interventions(truncate, bypass, trace, states).check(self.schedule())
        mean, logvar = self.encode(x, ctl)
        z = sample_posterior(mean, logvar, self.latent_noise, self.training)
        return self.decode(z, ctl), mean, logvar

    def forward(self, x, targets=None, **interventions):
        x_hat, mean, logvar = self.reconstruct(x, **interventions)
        if targets is None:
            return x_hat, None
        l1 = (x_hat.float() - x.float()).abs().mean()  # averaged over pixels (sec. 3.5)
        kl = kl_divergence(mean, logvar).mean()  # averaged over latent elements and batch (sec. 3.5)
        loss = l1 + self.lambda_kl * kl
        self.aux = {"l1": l1.detach(), "kl": kl.detach()}
        if self.perceptual is not None:
            p = self.perceptual(x_hat, x)
            loss = loss + self.lambda_p * p
            self.aux["perceptual"] = p.detach()
        return x_hat, loss

    def set_perceptual(self, fn):
        """fn(x_hat, x) -> 0-d loss (LPIPS in the paper, weight lambda_p, sec. 3.5), or None. Kept out of
        the module tree, so its frozen weights are neither counted, saved with the model, nor seen by
        DDP or EMA. Returns self."""
        self.__dict__["perceptual"] = fn
        return self

    @torch.no_grad()
    def metrics(self, x, **interventions):
        """Per-image reconstruction metrics (B,) of `reconstruct` (eval mode: the posterior mode): see
        reconstruction_metrics."""
        x_hat, mean, logvar = self.reconstruct(x, **interventions)
        return reconstruction_metrics(x, x_hat, mean, logvar)

    def last_layer(self):
        """The decoder's output conv weight: where Stage 2's adaptive weight compares gradients (App. A.1)."""
        return self.decoder.conv_out.weight

    # ------------------------------------------------------------------------- machinery
    def set_grad_checkpointing(self, enable=True):
        """timm's name: recompute every block application in the backward pass. Returns self."""
        self.encoder.core.grad_checkpointing = self.decoder.core.grad_checkpointing = enable
        return self

    def compile_regions(self, **kwargs):
        """Regional compilation: each distinct block compiled once (fullgraph, static shapes), the
        loops eager. A globally shared block meets every scale's resolution, so it holds one graph per
        scale (3, under torch's default limit of 8). Call before DDP. Returns self."""
        kwargs.setdefault("dynamic", False)
        for core in (self.encoder.core, self.decoder.core):
            for blk in core.blocks:
                blk.compile(fullgraph=True, **kwargs)
        return self

    def trains_as_one_graph(self):
        """True: without interventions a training forward runs the same operations on the same shapes
        every step, so train.py may compile it whole (kernels.compile_for_training)."""
        return True

    def num_params(self, core_only=False):
        """Stored parameters of encoder + decoder (a shared block counts once; the perceptual net and
        the discriminator are not part of the model). core_only: the core blocks alone, eq. 6's K p."""
        mods = [self.encoder.core.blocks, self.decoder.core.blocks] if core_only else [self]
        return sum(p.numel() for m in mods for p in m.parameters())

    def macs_per_image(self, img_size=None):
        """Analytic multiply-adds per image of the plain forward: every conv and linear map (H W x
        weight.numel()), attention's two matmuls, the modulation once per block application;
        norms, activations and additions are ignored (as the paper's estimate, sec. 4.7)."""
        n, S, blocks = img_size or self.img_size, len(self.loops), []
        enc, dec = self.encoder, self.decoder
        conv = lambda m, side: side * side * m.weight.numel()
        macs = conv(enc.stem, n // 2) + conv(enc.head, n >> S) + conv(dec.proj_in, n >> S) + conv(dec.conv_out, n)
        for s in range(S):
            macs += conv(enc.down[s], n >> (s + 2)) if s < S - 1 else 0
            macs += conv(dec.up[s].conv, n >> (S - s - 1))
            blocks += [(enc.core, s, n >> (s + 1)), (dec.core, s, n >> (S - s))]
        for core, s, side in blocks:
            L = core.loops[s]
            if L > 1:
                macs += conv(core.inject[str(s)].proj, side)  # once per scale
            for t in range(L):
                for j in range(core.num_blocks):
                    blk = core.block(s, t, j)
                    macs += blk.macs(side) if self.operator == "cnn" else blk.macs(side, core.windows[s])
        return macs

    def flops_per_image(self, img_size=None):
        """2 x macs_per_image() (as bvit.py: one multiply-add = 2 FLOPs)."""
        return 2 * self.macs_per_image(img_size)


# ----------------------------------------------------------------------------- reconstruction metrics (sec. 4.1, App. A.4)
def to_unit(x):
    """[-1, 1] -> [0, 1] (App. A.4: u = (x_hat + 1) / 2)."""
    return (x.float() + 1.0) / 2.0


def psnr(u, y, clip=True):
    """PSNR in dB per image, data range 1: u, y (B, C, H, W) in [0, 1] -> (B,). clip: u clipped to [0, 1]
    first (the standard diagnostic; False gives App. A.4's raw PSNR). Capped at 120 dB (App. A.4)."""
    u = u.clamp(0, 1) if clip else u
    mse = (u.float() - y.float()).pow(2).flatten(1).mean(1)
    return (-10.0 * torch.log10(mse.clamp_min(1e-12))).clamp_max(120.0)


def gaussian_window(size=11, sigma=1.5):
    """(size, size) normalized Gaussian in float64, the SSIM window of Wang et al. 2004."""
    g = torch.exp(-(torch.arange(size, dtype=torch.float64) - (size - 1) / 2) ** 2 / (2 * sigma ** 2))
    g = g / g.sum()
    return g[:, None] * g[None, :]  # float64


SSIM_WINDOW = 11  # SSIM's Gaussian window, 11x11 (Wang et al. 2004; App. A.4): images must be at least this big


def ssim(u, y, size=SSIM_WINDOW, sigma=1.5):
    """SSIM per image (Wang et al. 2004, eq. 13; C1 = 0.01^2, C2 = 0.03^2 for data range 1) with a
    valid size x size Gaussian window (App. A.4), averaged over positions and channels:
    u, y (B, C, H, W) in [0, 1] (u clipped) -> (B,). ValueError for images smaller than the window."""
    B, C, H, W = u.shape
    if H < size or W < size:
        raise ValueError(f"SSIM needs images of at least {size}x{size}, got {H}x{W}")
    u, y = u.double().clamp(0, 1), y.double()  # float64: E[u^2] - E[u]^2 cancels badly in float32
    w = gaussian_window(size, sigma).to(u.device, torch.float64).expand(C, 1, size, size)
    blur = lambda t: F.conv2d(t, w, groups=C)  # local weighted mean, valid window
    mu_u, mu_y = blur(u), blur(y)
    var_u, var_y = blur(u * u) - mu_u ** 2, blur(y * y) - mu_y ** 2
    cov = blur(u * y) - mu_u * mu_y
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    s = (2 * mu_u * mu_y + c1) * (2 * cov + c2) / ((mu_u ** 2 + mu_y ** 2 + c1) * (var_u + var_y + c2))
    return s.flatten(1).mean(1).float()


def out_of_range(u):
    """Fraction of pixels with any channel strictly outside [0, 1] (App. A.4): (B, C, H, W) -> (B,)."""
    return ((u < 0) | (u > 1)).any(dim=1).float().flatten(1).mean(1)


def reconstruction_metrics(x, x_hat, mean, logvar):
    """Per-image metrics (B,) from images x, x_hat in [-1, 1] and the posterior: l1 (in [-1, 1] units, the
    loss's), psnr (dB, clipped), psnr_raw (dB, unclipped), ssim, kl (mean over latent elements),
    out_of_range (fraction of pixels)."""
    u, y = to_unit(x_hat), to_unit(x)
    return {"l1": (x_hat.float() - x.float()).abs().flatten(1).mean(1), "psnr": psnr(u, y),
            "psnr_raw": psnr(u, y, clip=False), "ssim": ssim(u, y),
            "kl": kl_divergence(mean, logvar).flatten(1).mean(1), "out_of_range": out_of_range(u)}


# ----------------------------------------------------------------------------- named configurations
def loopvae_cnn_f8d16(**kw):
    """The paper's LoopVAE-CNN (App. A.1, Table 6): 256 px, width 384, K = 4, loops [1, 2, 4], f8d16 latent
    16 x 32 x 32. 27.38M parameters here vs the paper's 29.07M (module docstring)."""
    return LoopVAE(**{**dict(img_size=256, embed_dim=384, num_blocks=4, loops=(1, 2, 4), latent_dim=16), **kw})


def loopvae_vit_f8d16(**kw):
    """The Transformer ablation (sec. 4.3) at the same graph: 6 heads of 64 (our choice), 8 x 8 windows at
    2x and 4x, global attention at 8x (our choice, as App. A.2). 30.78M parameters here vs the paper's
    32.46M (-5.2 %); 898.7 GMACs/img vs 959.89 (its window sizes are not given)."""
    return loopvae_cnn_f8d16(**{**dict(operator="vit", num_heads=6, window_size=8, windowed_scales=2), **kw})


def loopvae_cnn_mini(**kw):
    """CPU size for 32 px images (CIFAR): width 64, the f8d16 latent 16 x 4 x 4 (the paper's 12x compression).
    (The lab's c100-mini-loopvae-* arms train width 32 through train.py's flags: lab/arms.py.)"""
    return LoopVAE(**{**dict(img_size=32, embed_dim=64, num_blocks=4, loops=(1, 2, 4), latent_dim=16), **kw})


def loopvae_vit_mini(**kw):
    """The Transformer ablation at the CPU size: 4 heads of 16, 8 x 8 windows at the two finest scales."""
    return loopvae_cnn_mini(**{**dict(operator="vit", num_heads=4, window_size=8, windowed_scales=2), **kw})


# ============================================================================= Stage 2 (sec. 3.5, App. A.1)
# Pure tensor math for the adversarial stage; the step that alternates generator and discriminator
# updates is training/adversarial.py's, called from train.py's loop.
def hinge_d_loss(real_logits, fake_logits):
    """Discriminator hinge loss 0.5 (mean relu(1 - D(x)) + mean relu(1 + D(x_hat))) (sec. 3.5; the 1/2
    as VQGAN, Esser et al. 2021: our choice)."""
    return 0.5 * (F.relu(1.0 - real_logits.float()).mean() + F.relu(1.0 + fake_logits.float()).mean())


def hinge_g_loss(fake_logits):
    """Generator adversarial loss: the negative mean discriminator score (sec. 3.5, eq. 11)."""
    return -fake_logits.float().mean()


def adaptive_gan_weight(rec_loss, g_loss, last_layer, step, start=5000, max_weight=1e4, multiplier=0.5):
    """lambda_a of eq. 11 (App. A.1, VQGAN's adaptive weight): 0 before Stage-2 step `start`, then
    multiplier * clamp(|grad_w rec_loss| / (|grad_w g_loss| + 1e-4), 0, max_weight), w = last_layer
    (the decoder's output conv weight), detached. Both losses must still have their graphs."""
    if step < start:
        return torch.zeros((), device=last_layer.device)
    g_rec, = torch.autograd.grad(rec_loss, last_layer, retain_graph=True)
    g_adv, = torch.autograd.grad(g_loss, last_layer, retain_graph=True)
    weight = g_rec.norm() / (g_adv.norm() + 1e-4)  # 1e-4: VQGAN's guard against a zero adversarial gradient
    return multiplier * weight.clamp(0.0, max_weight).detach()


def r1_penalty(discriminator, real):
    """R1 (Mescheder et al. 2018): E ||grad_x D(x)||^2 over real images x (B, C, H, W) -> 0-d tensor,
    with the graph kept so it can be minimized. D(x) may return patch logits (summed per image)."""
    real = real.detach().requires_grad_(True)
    grad, = torch.autograd.grad(discriminator(real).float().sum(), real, create_graph=True)
    return grad.pow(2).flatten(1).sum(1).mean()


def lazy_r1_loss(discriminator, real, d_step, gamma=10.0, every=16):
    """Lazy R1 (App. A.1: weight 10 every 16 discriminator updates): gamma / 2 * every * r1_penalty on
    steps with d_step % every == 0 (scaled by `every` as StyleGAN2's lazy regularization, Karras et al.
    2020, so the average pull is unchanged), else None. The caller passes the images D sees
    (augmented, our choice)."""
    if d_step % every:
        return None
    return 0.5 * gamma * every * r1_penalty(discriminator, real)


DIFFAUG = ("color", "translation", "cutout")  # DiffAugment's policy (Zhao et al. 2020); App. A.1 names the cutout


def diff_augment(x, policy=DIFFAUG, translation=0.125, cutout=0.2):
    """Differentiable augmentation in the spirit of DiffAugment (Zhao et al. 2020), fresh draws per image,
    applied to real and fake images alike before D: x (B, C, H, W) in [-1, 1] -> same shape.
    color: brightness + U(-0.5, 0.5), saturation x U(0, 2), contrast x U(0.5, 1.5); translation: an
    integer shift of up to `translation` x the size, zeros shifted in; cutout: one zeroed square of side
    `cutout` x the size (App. A.1: 0.2), inside the image (our choice)."""
    B, C, H, W = x.shape
    r = lambda: torch.rand(B, 1, 1, 1, device=x.device, dtype=x.dtype)
    if "color" in policy:
        x = x + (r() - 0.5)
        m = x.mean(dim=1, keepdim=True)
        x = (x - m) * (2 * r()) + m
        m = x.mean(dim=(1, 2, 3), keepdim=True)
        x = (x - m) * (r() + 0.5) + m
    if "translation" in policy:
        sy, sx = int(H * translation + 0.5), int(W * translation + 0.5)
        dy = torch.randint(-sy, sy + 1, (B, 1), device=x.device)
        dx = torch.randint(-sx, sx + 1, (B, 1), device=x.device)
        iy = torch.arange(H, device=x.device) + sy - dy  # (B, H): source row in the padded image
        ix = torch.arange(W, device=x.device) + sx - dx  # (B, W)
        xp = F.pad(x, (sx, sx, sy, sy))
        x = xp[torch.arange(B, device=x.device)[:, None, None], :, iy[:, :, None], ix[:, None, :]]  # (B, H, W, C)
        x = x.permute(0, 3, 1, 2)
    if "cutout" in policy:
        ch, cw = int(H * cutout + 0.5), int(W * cutout + 0.5)
        cy = torch.randint(0, H - ch + 1, (B, 1, 1), device=x.device)
        cx = torch.randint(0, W - cw + 1, (B, 1, 1), device=x.device)
        rows = torch.arange(H, device=x.device)[None, :, None]
        cols = torch.arange(W, device=x.device)[None, None, :]
        hole = (rows >= cy) & (rows < cy + ch) & (cols >= cx) & (cols < cx + cw)  # (B, H, W)
        x = x * (~hole).unsqueeze(1).to(x.dtype)
    return x


class PatchDiscriminator(nn.Module):
    """A small conv discriminator (our choice, after the PatchGAN of pix2pix that VQGAN uses; the paper's
    main run uses frozen DINOv2 features): (B, C, H, W) -> patch logits (B, 1, H/2^depth, W/2^depth).
    depth 4x4 stride-2 convs doubling the width from `width`, GroupNorm and LeakyReLU(0.2) between
    them (GroupNorm, not BatchNorm: R1 and DDP see per-image terms), then a 3x3 conv to one logit."""

    def __init__(self, in_chans=3, width=64, depth=3):
        super().__init__()
        layers, ch = [nn.Conv2d(in_chans, width, 4, stride=2, padding=1), nn.LeakyReLU(0.2)], width
        for _ in range(depth - 1):
            layers += [nn.Conv2d(ch, 2 * ch, 4, stride=2, padding=1), nn.GroupNorm(math.gcd(32, 2 * ch), 2 * ch),
                       nn.LeakyReLU(0.2)]
            ch *= 2
        self.net = nn.Sequential(*layers, nn.Conv2d(ch, 1, 3, padding=1))

    def forward(self, x):
        return self.net(x)
