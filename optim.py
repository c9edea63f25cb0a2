"""The optimizers and the learning-rate schedule of train.py: AdamW from torch or LAMB (below),
no weight decay on 1-D parameters (param_groups), and linear warmup + cosine decay (lr_lambda).
torch ships no LAMB; DeiT III (the in1k-* presets) trains with it."""
import math

import torch


def lr_lambda(total, warmup, lr, min_lr):
    """Multiplier of the peak lr at optimizer step s: linear warmup, then cosine to min_lr."""
    def f(s):
        if s < warmup:
            return (s + 1) / warmup
        t = (s - warmup) / max(1, total - warmup)
        return (min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(t, 1.0)))) / lr
    return f


def param_groups(model, weight_decay):
    """No weight decay on biases, norms, embeddings and other 1-D parameters (timm/DeiT)."""
    decay, no_decay = [], []
    for name, prm in model.named_parameters():
        # "bias" by name too: stacked expert biases (reViT) are 2-D
        if prm.ndim < 2 or name.split(".")[-1] in ("pos_embed", "cls_token", "step_embed", "bias"):
            no_decay.append(prm)
        else:
            decay.append(prm)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning"), DeiT III's optimizer.
    Per parameter tensor p with gradient g, at step t, with decoupled weight decay wd (as AdamW):
        m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2,   m_hat = m / (1 - b1^t),   v_hat = v / (1 - b2^t)
        u = m_hat / (sqrt(v_hat) + eps) + wd p
        trust = ||p|| / ||u||   (1 if either norm is 0)
        p <- p - lr trust u
    Norms are over the whole tensor (layer-wise adaptation). As in timm's Lamb, which DeiT III used,
    a group with wd = 0 (biases, norms, embeddings: see param_groups) takes trust = 1, a plain Adam
    step, unless always_adapt=True. Gradients are clipped by train.py (--clip-grad), not here."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, always_adapt=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      always_adapt=always_adapt))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            (b1, b2), wd = group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                st["step"] += 1
                t, m, v = st["step"], st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                u = m / (1 - b1 ** t) / ((v / (1 - b2 ** t)).sqrt() + group["eps"]) + wd * p
                trust = 1.0
                if wd or group["always_adapt"]:  # no host sync: trust stays a tensor
                    pn, un = p.norm(), u.norm()
                    trust = torch.where((pn > 0) & (un > 0), pn / un, torch.ones_like(pn))
                p.sub_(group["lr"] * trust * u)
        return loss
