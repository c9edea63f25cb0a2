"""GPU fast paths for rvits, each next to the plain-PyTorch reference it must equal.

Optional: model files import from here behind a fallback, so every model runs without it.

1. `merged_ffn`: reViT's per-image merged-expert FFN (elastic-depth steps, SPEC section 3; SMEAR/Lory
   in revit_moe.py). Image b uses FFN weights sum_e g[b, e] W_e. The reference materializes the B
   merged weight matrices (B x H x D memory) and runs two batched matmuls; the Triton kernel merges
   each weight tile in registers right before its tile matmul, so the merged weights never reach
   memory. One program computes a (BLOCK_T tokens, BLOCK_N features) output tile of one image and
   merges each (BLOCK_K, BLOCK_N) weight tile from the E experts once: cdiv(T, BLOCK_T) times per
   image, once with the 256-token tiles at T = 197 (the first version used 32-token tiles: 7
   merges per image). Tile sizes, warps and pipeline stages are autotuned per (T, N, K, E).
   Forward in Triton; backward by autograd through the reference (recomputation), so gradients are
   the reference's exactly, but a training step with the kernel pays Triton forward + reference
   forward + reference backward: slower than the plain path. The models therefore call it only
   without autograd (revit.fused_ffn_wins); bench.py's revit_elastic_grouped_over_fused_train_b64
   and _eval_b64 measure that choice on CUDA (not measured yet: no GPU run so far).
   Autocast: under autocast the kernel runs in the autocast dtype (x and the expert tensors are
   cast, as autocast casts a matmul's operands; the gates stay fp32), and the recompute in backward
   runs under the forward's autocast state.
   Tested on CPU under TRITON_INTERPRET=1 (test_speed.py) and on CUDA in bf16 (test_speed.py,
   test_kernel_cuda_bf16_equals_reference, skipped on CPU).
"""
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference path is used
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton reads it at import, so do we


# ----------------------------------------------------------------------------- 1. merged FFN
def merged_ffn_reference(x, gates, w1, b1, w2, b2):
    """Per-image merged FFN in plain PyTorch.

    x (B, T, D); gates (B, E) (rows are convex weights); w1 (E, H, D), b1 (E, H), w2 (E, D, H),
    b2 (E, D). Returns (B, T, D): gelu(x W1_b^T + b1_b) W2_b^T + b2_b with W_b = sum_e g_be W_e.
    The gates are cast to the experts' dtype (fp32 gates with bf16 experts: a bf16 merge), as
    revit.ExpertMlp.merge does; x must have the experts' dtype unless autocast is on.
    """
    g = gates.to(w1.dtype)
    W1 = torch.einsum("be,ehd->bhd", g, w1)  # (B, H, D)
    W2 = torch.einsum("be,edh->bdh", g, w2)  # (B, D, H)
    h = torch.nn.functional.gelu(torch.baddbmm((g @ b1)[:, None], x, W1.transpose(1, 2)))  # (B, T, H)
    return torch.baddbmm((g @ b2)[:, None], h, W2.transpose(1, 2))  # (B, T, D)


# Autotuned tiles (BLOCK_T, BLOCK_N, BLOCK_K, warps, stages): 256 tokens hold a ViT-S/16 image (T = 197).
CONFIGS = [(256, 64, 32, 8, 3), (128, 128, 32, 8, 3), (128, 64, 64, 4, 3), (64, 64, 64, 4, 4)]
INTERPRET_CONFIG = (32, 32, 32, 1, 1)  # the CPU interpreter: one small tile, nothing to tune

if triton is not None:
    @triton.autotune(configs=[triton.Config({"BLOCK_T": t, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
                              for t, n, k, w, s in ([INTERPRET_CONFIG] if INTERPRET else CONFIGS)],
                     key=["T", "N", "K", "E"])
    @triton.jit
    def _merged_linear_kernel(x_ptr, g_ptr, w_ptr, b_ptr, out_ptr, T, K, N, E: tl.constexpr,
                              GELU: tl.constexpr, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
                              BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # out[b, t, n] = act(sum_k x[b, t, k] * (sum_e g[b, e] w[e, n, k]) + sum_e g[b, e] bias[e, n])
        pid_n, pid_t, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rt = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            xt = tl.load(x_ptr + b * T * K + rt[:, None] * K + kk[None, :],
                         mask=(rt[:, None] < T) & (kk[None, :] < K), other=0.0)  # (BLOCK_T, BLOCK_K)
            wt = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
            for e in range(E):  # merge the weight tile in registers, once for the BLOCK_T tokens
                ge = tl.load(g_ptr + b * E + e)
                wt += ge * tl.load(w_ptr + e * N * K + rn[None, :] * K + kk[:, None],
                                   mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0).to(tl.float32)
            wt = wt.to(xt.dtype)  # the tile matmul runs in the input dtype (bf16: tensor cores)
            if DOT_FP32:  # the interpreter multiplies bf16 tiles wrongly (Triton 3.8): same values in fp32
                xt, wt = xt.to(tl.float32), wt.to(tl.float32)
            acc = tl.dot(xt, wt, acc, input_precision=PRECISION)  # (BLOCK_T, BLOCK_N), fp32 accumulation
        bias = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for e in range(E):
            bias += tl.load(g_ptr + b * E + e) * tl.load(b_ptr + e * N + rn, mask=rn < N, other=0.0).to(tl.float32)
        acc += bias[None, :]
        if GELU:  # exact (erf) GELU, as F.gelu
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        tl.store(out_ptr + b * T * N + rt[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=(rt[:, None] < T) & (rn[None, :] < N))


def _merged_linear(x, gates, w, b, gelu, config=None):
    """One merged linear layer in Triton: x (B, T, K), gates (B, E) fp32, w (E, N, K), b (E, N), all
    but the gates of x's dtype -> (B, T, N) of x's dtype. config: one of CONFIGS instead of the
    autotuner's choice (tests)."""
    B, T, K = x.shape
    E, N, _ = w.shape
    out = torch.empty(B, T, N, device=x.device, dtype=x.dtype)
    args = (x.contiguous(), gates.contiguous(), w.contiguous(), b.contiguous(), out, T, K, N)
    # fp32 inputs: TF32 tiles only where torch allows TF32 matmuls, so fp32 results match cuBLAS's precision
    ieee = x.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32
    kw = dict(E=E, GELU=gelu, DOT_FP32=INTERPRET, PRECISION="ieee" if ieee else "tf32")
    if config is None:
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), triton.cdiv(T, meta["BLOCK_T"]), B)  # noqa: E731
        _merged_linear_kernel[grid](*args, **kw)
    else:
        bt, bn, bk, warps, stages = config
        _merged_linear_kernel.fn[(triton.cdiv(N, bn), triton.cdiv(T, bt), B)](
            *args, **kw, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
    return out


class _MergedFFN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gates, w1, b1, w2, b2):
        dev = x.device.type
        ctx.amp = dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev)
        ctx.save_for_backward(x, gates, w1, b1, w2, b2)
        if ctx.amp[1]:  # autocast: compute in its dtype, as it would run a matmul (a no-op cast if already)
            x, w1, b1, w2, b2 = (t.to(ctx.amp[2]) for t in (x, w1, b1, w2, b2))
        g = gates.float()  # the kernel merges in fp32 registers
        return _merged_linear(_merged_linear(x, g, w1, b1, True), g, w2, b2, False)

    @staticmethod
    def backward(ctx, grad):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        dev, amp, dtype = ctx.amp
        with torch.enable_grad(), torch.autocast(dev, dtype=dtype, enabled=amp):  # the forward's precision
            out = merged_ffn_reference(*inputs)
        needed = [t for t in inputs if t.requires_grad]
        grads = iter(torch.autograd.grad(out, needed, grad))
        return tuple(next(grads) if t.requires_grad else None for t in inputs)


def triton_usable(x):
    """True when the Triton kernel can run on x: CUDA tensors, or any tensor under TRITON_INTERPRET=1."""
    return triton is not None and (x.is_cuda or INTERPRET)


def merged_ffn(x, gates, w1, b1, w2, b2):
    """Per-image merged FFN (shapes as merged_ffn_reference): the Triton kernel where usable, else
    the reference. Differentiable either way; callers use it without autograd (module docstring)."""
    if triton_usable(x):
        return _MergedFFN.apply(x, gates, w1, b1, w2, b2)
    return merged_ffn_reference(x, gates, w1, b1, w2, b2)
