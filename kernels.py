"""GPU fast paths for rvits, each next to the plain-PyTorch reference it must equal.

Optional: model files import from here behind a fallback, so every model runs without it.

1. `merged_ffn`: reViT's per-image merged-expert FFN (elastic-depth training, SPEC section 3).
   Image b uses FFN weights sum_e g[b, e] W_e. The reference materializes the B merged weight
   matrices (B x H x D memory) and runs two batched matmuls; the Triton kernel merges each weight
   tile in registers right before its tile matmul, so the merged weights never reach memory.
   Forward in Triton; backward by autograd through the reference (recomputation), so gradients
   are the reference's exactly. Tested on CPU under TRITON_INTERPRET=1 (test_kernels.py);
   speed-up vs the reference: bench.py (CUDA only; not measured yet, no GPU so far).
"""
import math

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference path is used
    triton = None


# ----------------------------------------------------------------------------- 1. merged FFN
def merged_ffn_reference(x, gates, w1, b1, w2, b2):
    """Per-image merged FFN in plain PyTorch.

    x (B, T, D); gates (B, E) (rows are convex weights); w1 (E, H, D), b1 (E, H), w2 (E, D, H),
    b2 (E, D). Returns (B, T, D): gelu(x W1_b^T + b1_b) W2_b^T + b2_b with W_b = sum_e g_be W_e.
    """
    W1 = torch.einsum("be,ehd->bhd", gates, w1)  # (B, H, D)
    W2 = torch.einsum("be,edh->bdh", gates, w2)  # (B, D, H)
    h = F.gelu(torch.baddbmm((gates @ b1)[:, None], x, W1.transpose(1, 2)))  # (B, T, H)
    return torch.baddbmm((gates @ b2)[:, None], h, W2.transpose(1, 2))  # (B, T, D)


if triton is not None:
    @triton.jit
    def _merged_linear_kernel(x_ptr, g_ptr, w_ptr, b_ptr, out_ptr, T, K, N,
                              E: tl.constexpr, GELU: tl.constexpr, BLOCK_T: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # out[b, t, n] = act(sum_k x[b, t, k] * (sum_e g[b, e] w[e, n, k]) + sum_e g[b, e] bias[e, n])
        pid, b = tl.program_id(0), tl.program_id(1)
        n_tiles = tl.cdiv(N, BLOCK_N)
        t0, n0 = (pid // n_tiles) * BLOCK_T, (pid % n_tiles) * BLOCK_N
        rt, rn, rk = t0 + tl.arange(0, BLOCK_T), n0 + tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            xt = tl.load(x_ptr + b * T * K + rt[:, None] * K + kk[None, :],
                         mask=(rt[:, None] < T) & (kk[None, :] < K), other=0.0)
            wt = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            for e in range(E):  # merge the weight tile in registers
                ge = tl.load(g_ptr + b * E + e)
                wt += ge * tl.load(w_ptr + e * N * K + rn[:, None] * K + kk[None, :],
                                   mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0).to(tl.float32)
            acc += tl.dot(xt, tl.trans(wt.to(xt.dtype)))
        bias = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for e in range(E):
            bias += tl.load(g_ptr + b * E + e) * tl.load(b_ptr + e * N + rn, mask=rn < N, other=0.0).to(tl.float32)
        acc += bias[None, :]
        if GELU:  # exact (erf) GELU, as F.gelu
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        tl.store(out_ptr + b * T * N + rt[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=(rt[:, None] < T) & (rn[None, :] < N))


def _merged_linear(x, gates, w, b, gelu):
    B, T, K = x.shape
    E, N, _ = w.shape
    out = torch.empty(B, T, N, device=x.device, dtype=x.dtype)
    BT, BN, BK = 32, 64, 32
    grid = (triton.cdiv(T, BT) * triton.cdiv(N, BN), B)
    _merged_linear_kernel[grid](x.contiguous(), gates.float().contiguous(), w.contiguous(), b.contiguous(),
                                out, T, K, N, E=E, GELU=gelu, BLOCK_T=BT, BLOCK_N=BN, BLOCK_K=BK)
    return out


class _MergedFFN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gates, w1, b1, w2, b2):
        ctx.save_for_backward(x, gates, w1, b1, w2, b2)
        return _merged_linear(_merged_linear(x, gates, w1, b1, True), gates, w2, b2, False)

    @staticmethod
    def backward(ctx, grad):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        with torch.enable_grad():
            out = merged_ffn_reference(*inputs)
        needed = [t for t in inputs if t.requires_grad]
        grads = iter(torch.autograd.grad(out, needed, grad))
        return tuple(next(grads) if t.requires_grad else None for t in inputs)


def triton_usable(x):
    """True when the Triton kernel can run on x: CUDA tensors, or any tensor under TRITON_INTERPRET=1."""
    import os
    return triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def merged_ffn(x, gates, w1, b1, w2, b2):
    """Per-image merged FFN (shapes as merged_ffn_reference): the Triton kernel where usable,
    else the reference."""
    if triton_usable(x):
        return _MergedFFN.apply(x, gates, w1, b1, w2, b2)
    return merged_ffn_reference(x, gates, w1, b1, w2, b2)
