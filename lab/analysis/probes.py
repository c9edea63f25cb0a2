"""Frozen-backbone probes (reViT paper, Bulat et al., arXiv 2610.12448, appendix A.3; probe.py's math).

The backbone never trains: its final post-LayerNorm tokens (forward_features, distill.post_layernorm) are computed once
per image set (`extract`), and only a head fits on them, with fixed seeds:
- linear: a linear classifier on [class token, mean of the patch tokens] (the mean alone without a
  class token), cross-entropy; top-1 (%).
- seg: a linear head on each patch token, its (classes, grid, grid) logits upsampled bilinearly to
  the label map, per-pixel cross-entropy (labels -1 ignored); mIoU (%), over the classes present in
  the test labels or predictions (`miou`).
- depth: a linear and a two-layer MLP head (hidden width = the token width, GELU) on each patch
  token, upsampled likewise, mean squared error on the valid pixels (nan = no reading); RMSE in the
  target's unit (`rmse`).
Every head trains with AdamW and a cosine schedule over `epochs` passes of the cached features; the
learning rate is chosen from `lrs` on a held-out tenth of the training features (seeded), then the
head is refitted on all of them (our protocol; the paper gives none beyond "linear" and "fixed seeds").
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from training.distill import post_layernorm

LRS = (1e-3, 1e-2, 1e-1)


@torch.no_grad()
def extract(model, loader, device, dense=False, progress=None, depth=None):
    """The frozen `model`'s features of every batch of `loader` (items (images, *targets)): (features,
    targets), features (M, F) for the linear probe ([class token; patch mean], or the patch mean) or
    (M, N, D) patch tokens when `dense` (float16, to fit a dense probe's set in memory; the heads read
    them in float32), on the CPU; targets: a list of the stacked targets. depth: a recurrent model run
    at this many steps (model(x, depth=depth)); None: its own."""
    model.eval()
    prefix = int(getattr(model, "cls_token", None) is not None)
    feats, targets = [], None
    for batch in (progress(loader) if progress else loader):
        x = batch[0].to(device)
        t = post_layernorm(model.norm, model.forward_features(x, **({} if depth is None else {"depth": depth}))).float()
        patches = t[:, prefix:]
        feats.append((patches.half() if dense else torch.cat([t[:, 0], patches.mean(1)], -1) if prefix
                      else patches.mean(1)).cpu())
        targets = [[] for _ in batch[1:]] if targets is None else targets
        for keep, y in zip(targets, batch[1:]):
            keep.append(y)
    return torch.cat(feats), [torch.cat(y) for y in targets]


def miou(pred, target, num_classes):
    """Mean intersection over union in %: pred, target (..., H, W) class indices, target -1 ignored;
    per class IoU = |pred = c and target = c| / |pred = c or target = c| over all pixels of the set,
    averaged over the classes with a non-empty union."""
    keep = target >= 0
    p, t = pred[keep], target[keep]
    conf = torch.bincount(t * num_classes + p, minlength=num_classes ** 2).view(num_classes, num_classes).double()
    inter, union = conf.diag(), conf.sum(0) + conf.sum(1) - conf.diag()
    return float(100 * (inter[union > 0] / union[union > 0]).mean())


def rmse(pred, target):
    """Root mean squared error over the pixels whose target is not nan (the target's unit)."""
    keep = ~torch.isnan(target)
    return float((pred[keep] - target[keep]).double().square().mean().sqrt())


class DenseHead(nn.Module):
    """Per-token head on patch tokens (B, N, D) -> (B, out, H, W): linear, or a two-layer MLP
    (`hidden`, GELU), on the sqrt(N) x sqrt(N) grid, upsampled bilinearly to `size` (H = W)."""

    def __init__(self, dim, out, hidden=None):
        super().__init__()
        self.net = nn.Linear(dim, out) if not hidden else nn.Sequential(nn.Linear(dim, hidden), nn.GELU(),
                                                                        nn.Linear(hidden, out))

    def forward(self, tokens, size):
        b, n, _ = tokens.shape
        g = math.isqrt(n)
        y = self.net(tokens.float()).transpose(1, 2).reshape(b, -1, g, g)
        return F.interpolate(y, size=(size, size), mode="bilinear", align_corners=False)


def fit(make_head, x, y, loss_fn, *, epochs, lr, batch_size=256, weight_decay=1e-4, seed=0, device="cpu", progress=None):
    """A fresh head = make_head() fitted on features x (M, ...) and targets y (M, ...) (on the CPU; each
    batch moves to `device`): AdamW at `lr`, cosine to 0 over `epochs` passes in seeded random order;
    loss_fn(head, xb, yb) -> 0-d loss; progress(iterable, desc) wraps the passes (a progress bar)."""
    torch.manual_seed(seed)
    head = make_head().to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    steps = epochs * math.ceil(len(x) / batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    g = torch.Generator().manual_seed(seed)
    for _ in (progress(range(epochs), f"head, lr {lr:g}") if progress else range(epochs)):
        order = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), batch_size):
            idx = order[i:i + batch_size]
            loss = loss_fn(head, x[idx].to(device), y[idx].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return head.eval()


def select_and_fit(make_head, x, y, loss_fn, score, *, epochs, lrs=LRS, seed=0, higher=True, device="cpu",
                   progress=None):
    """(head refitted on all of x, y at the chosen lr, {lr: held-out score}): each lr of `lrs` fitted on
    nine tenths (a seeded split) and scored on the rest with score(head, x, y) -> float."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=g)
    held, rest = order[:max(1, len(x) // 10)], order[max(1, len(x) // 10):]
    scores = {}
    for lr in lrs:
        head = fit(make_head, x[rest], y[rest], loss_fn, epochs=epochs, lr=lr, seed=seed, device=device,
                   progress=progress)
        with torch.no_grad():
            scores[lr] = score(head, x[held], y[held])
    best = (max if higher else min)(scores, key=scores.get)
    return fit(make_head, x, y, loss_fn, epochs=epochs, lr=best, seed=seed, device=device, progress=progress), {
        "lr": best, "held_out": scores}


@torch.no_grad()
def batched(head, x, *args, batch_size=256):
    """head's outputs on x in batches (each moved to the head's device), back on the CPU."""
    device = next(head.parameters()).device
    return torch.cat([head(x[i:i + batch_size].to(device), *args).cpu() for i in range(0, len(x), batch_size)])


def linear_probe(train, test, num_classes, epochs=30, seed=0, lrs=LRS, device="cpu", progress=None):
    """train, test: (features (M, F), labels (M,)). Returns {top1 (%), lr, held_out}."""
    (x, y), (xt, yt) = train, test
    top1 = lambda head, a, b: float(100 * (batched(head, a).argmax(-1) == b).float().mean())
    ce = lambda head, a, b: F.cross_entropy(head(a), b)
    head, how = select_and_fit(lambda: nn.Linear(x.shape[1], num_classes), x, y, ce, top1, epochs=epochs,
                               seed=seed, lrs=lrs, device=device, progress=progress)
    return {"top1": top1(head, xt, yt), **how}


def seg_probe(train, test, num_classes, epochs=20, seed=0, lrs=LRS, device="cpu", progress=None):
    """train, test: (patch tokens (M, N, D), labels (M, H, W), -1 ignored). Returns {miou, pixel_acc (%),
    lr, held_out}."""
    (x, y), (xt, yt) = train, test
    size = y.shape[-1]
    ce = lambda head, a, b: F.cross_entropy(head(a, size), b, ignore_index=-1)
    pred = lambda head, a: batched(head, a, size).argmax(1)
    score = lambda head, a, b: miou(pred(head, a), b, num_classes)
    head, how = select_and_fit(lambda: DenseHead(x.shape[-1], num_classes), x, y, ce, score, epochs=epochs,
                               seed=seed, lrs=lrs, device=device, progress=progress)
    p = pred(head, xt)
    return {"miou": miou(p, yt, num_classes), "pixel_acc": float(100 * (p == yt)[yt >= 0].float().mean()), **how}


def depth_probe(train, test, epochs=20, seed=0, lrs=LRS, device="cpu", progress=None):
    """train, test: (patch tokens (M, N, D), targets (M, H, W), nan = no reading). Returns {linear: {rmse,
    lr, held_out}, mlp: {...}}: a linear head and a two-layer MLP head (hidden = D)."""
    (x, y), (xt, yt) = train, test
    size, dim = y.shape[-1], x.shape[-1]

    def mse(head, a, b):
        keep = ~torch.isnan(b)
        return F.mse_loss(head(a, size)[:, 0][keep], b[keep])
    score = lambda head, a, b: rmse(batched(head, a, size)[:, 0], b)
    out = {}
    for name, hidden in (("linear", None), ("mlp", dim)):
        head, how = select_and_fit(lambda: DenseHead(dim, 1, hidden), x, y, mse, score, epochs=epochs, seed=seed,
                                   lrs=lrs, higher=False, device=device, progress=progress)
        out[name] = {"rmse": score(head, xt, yt), **how}
    return out
