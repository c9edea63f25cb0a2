"""The attention inits of the init study, for every model file: mimetic and structured.

Papers: mimetic init (Trockman & Kolter, arXiv 2305.09828, sec. 3) and Structured Initialization for
Vision Transformers (Zheng et al., arXiv 2505.19985, sec. 3), with the constants of its official code
(github.com/osiriszjq/structured_initialization: timm's vision_transformer.py, `impulse_init`,
post_weight_init='impulse').

A model takes one as its `init=` argument, a function model -> None that its constructor runs once its
base init (`init_base`: "timm" or "pytorch", the official code's `weight_init`) is done, where the
official code applies it: `bvit.BViT(..., init=inits.structured)`; train.py's `--init NAME` passes
INITS[NAME]. It sets each distinct block's `attn.qkv` and `attn.proj` weights (timm's layout: qkv rows
[q; k; v], head i owning rows i*hd:(i+1)*hd of each, so W_q^T W_k (d, d) is head i's bilinear form on
the tokens) from the model's `pos_embed`, `cls_token`, `img_size` and `patch_size`; biases keep the base's.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

OFFSETS = [4, 1, 5, 3, 7, 0, 2, 6, 8]  # official code: head i -> 3x3 window index k: row k//3-1, column k%3-1


def _factor(a):
    """a = l @ r with l = U sqrt(S), r = sqrt(S) V^T (SVD, batched): (.., d, d) -> 2 x (.., d, d)."""
    u, s, vh = torch.linalg.svd(a)
    return u * s.sqrt()[..., None, :], s.sqrt()[..., :, None] * vh


def _noisy_eye(n, d, alpha, beta):  # (n, d, d): alpha Z + beta I, Z ~ U(+-sqrt(3/d)), variance 1/d (mimetic, eq. 2)
    return alpha * (torch.rand(n, d, d) * 2 - 1) * math.sqrt(3.0 / d) + beta * torch.eye(d)


@torch.no_grad()
def init_attention_(attn, init, pos, grid):
    """Set an Attention's qkv and proj weights (biases are left alone). pos (N, d): the patch rows of
    the position embedding on a grid x grid map.
    'mimetic' (Trockman & Kolter, sec. 3): per head, W_q^T W_k = the rank-hd part of 0.7 Z + 0.7 I, so
    each token attends mostly to itself and similar tokens.
    'structured' (Zheng et al., sec. 3): head h should attend like a 3x3 convolution's impulse at one
    offset. Target logits W_h (N, N): 1000 where key = query + offset, small noise elsewhere; the
    queries and keys at initialization are P = LN(pos), so solve P W_q^T W_k P^T = W_h in the least-
    squares sense with P's pseudo-inverse and keep the rank-hd SVD factors as W_q and W_k.
    Both: W_v^T W_proj^T = 0.4 Z - 0.4 I (all heads together)."""
    h, d = attn.num_heads, attn.proj.weight.shape[0]
    hd = d // h
    wq, wk, wv = attn.qkv.weight.view(3, h, hd, d).unbind(0)  # views, (h, hd, d) each
    if init == "mimetic":
        q, k = _factor(_noisy_eye(h, d, 0.7, 0.7))  # (h, d, d) each; 0.7, 0.7: Trockman & Kolter, sec. 3
    else:
        # official code: off-impulse logits 3 x truncated N(0, 0.6), so softmax still spreads a little
        w = 3.0 * nn.init.trunc_normal_(torch.empty(h, grid ** 2, grid ** 2), std=0.6)  # (h, N, N)
        i, j = [t.flatten() for t in torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")]
        for head in range(h):
            ki, kj = i + OFFSETS[head % 9] // 3 - 1, j + OFFSETS[head % 9] % 3 - 1  # key of each query
            ok = (ki >= 0) & (ki < grid) & (kj >= 0) & (kj < grid)  # zero padding at the border
            w[head, ok.nonzero()[:, 0], (ki * grid + kj)[ok]] = 1000.0  # official code: softmax ~ one-hot there
        p = F.layer_norm(pos, (d,), eps=1e-6)  # (N, d): the tokens the first LayerNorm sees, if pos dominates
        u, s, vh = torch.linalg.svd(p.T @ p)  # (d, d) Gram matrix
        r = min(hd, p.shape[0])  # official code keeps hd singular values; our guard: P^T P has rank <= N
        pinv = (vh[:r].T / s[:r]) @ u[:, :r].T @ p.T  # (d, N): (P^T P)^+ P^T, the rank-r pseudo-inverse of P
        q, k = _factor(pinv @ w @ pinv.T)  # (h, d, d) each: W_q^T W_k = P+ W_h P+^T
        q, k = q[..., :hd], k[:, :hd]  # (h, d, hd), (h, hd, d): the rank-hd part
        # official code (norm_q = 7): each factor scaled to Frobenius norm 7
        q, k = 7.0 * q / q.norm(dim=(1, 2), keepdim=True), 7.0 * k / k.norm(dim=(1, 2), keepdim=True)
    wq.copy_(q[..., :hd].mT)
    wk.copy_(k[:, :hd])
    l, r = _factor(_noisy_eye(1, d, 0.4, -0.4)[0])  # 0.4 Z - 0.4 I: mimetic's W_v W_proj (both papers)
    wv.copy_(l.T.reshape(h, hd, d))
    attn.proj.weight.copy_(r.T)


def init_model_(model, init):
    """Attention init `init` ("mimetic" or "structured") of every distinct block of `model`, in block order;
    "structured" first scales the position embedding by 18 (official code, norm_p = 18: pos_embed then
    dominates LN(x) at the first block). ValueError for blocks without Attention's qkv and proj (a block_fn's)."""
    if init not in ("mimetic", "structured"):
        raise ValueError(f"init={init!r}; allowed: 'mimetic', 'structured'")
    if not all(hasattr(getattr(b, "attn", None), "qkv") for b in model.blocks):
        raise ValueError(f"init={init!r} sets each block's attn.qkv and attn.proj (init_attention_); the blocks "
                         f"{type(model.blocks[0]).__name__} have none: use init='default'")
    if init == "structured":
        model.pos_embed.data.mul_(18.0)
    pos, grid = model.pos_embed[0, int(model.cls_token is not None):], model.img_size // model.patch_size
    for blk in model.blocks:  # each distinct block once (a shared block: once)
        init_attention_(blk.attn, init, pos, grid)


def mimetic(model):
    """Mimetic init (Trockman & Kolter, sec. 3) of `model`'s attention: a model's `init=`."""
    init_model_(model, "mimetic")


def structured(model):
    """Structured init (Zheng et al., sec. 3) of `model`'s attention: a model's `init=`."""
    init_model_(model, "structured")


INITS = {"default": None, "mimetic": mimetic, "structured": structured}  # --init NAME -> a model's init=
