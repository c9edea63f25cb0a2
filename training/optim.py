"""The optimizers, the learning-rate schedule and the weight EMA of train.py: AdamW from torch or
LAMB (below), no weight decay on 1-D parameters (param_groups), linear warmup + cosine decay
(lr_lambda), the step itself (optimizer_step: unscale, clip, step or skip) and EMA (below). torch
ships no LAMB; DeiT III (the in1k-vit, -bvit and -srvit presets) trains with it.

No host sync: a step whose gradients are not finite is skipped on the device. Both optimizers read
`optimizer.found_inf` (a 0-d float tensor, 1 = skip), as torch's fused AdamW does when GradScaler
sets it, so the host never waits for the GPU to decide whether to step (optimizer_step, below).
"""
import copy
import math

import torch


def lr_lambda(total, warmup, lr, min_lr, warmup_lr=None):
    """Multiplier of the peak lr at optimizer step s (0-based): a linear warmup over the first `warmup`
    steps, from warmup_lr at step 0 towards lr (DeiT's --warmup-lr, stepped per step here, not per
    epoch; None: lr (s + 1) / warmup, a ramp from 0), then a cosine from lr at step `warmup` to min_lr
    at step `total`."""
    def f(s):
        if s < warmup:
            return (s + 1) / warmup if warmup_lr is None else (warmup_lr + (lr - warmup_lr) * s / warmup) / lr
        t = (s - warmup) / max(1, total - warmup)
        return (min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(t, 1.0)))) / lr
    return f


def param_groups(model, weight_decay, lr=None, router_lr_scale=1.0):
    """No weight decay on biases, norms, embeddings and other 1-D parameters (timm/DeiT). With
    `router_lr_scale` != 1 the parameters of reViT's router (A.1; named `router.*`) form groups of their
    own at learning rate `lr` x router_lr_scale (the group's "lr_scale" says so; the schedule scales every
    group alike): train.py --router-lr-scale, a candidate of issue 63's engagement search, not the paper's."""
    groups = {}
    for name, prm in model.named_parameters():
        # "bias" by name too: stacked expert biases (reViT) are 2-D
        decays = not (prm.ndim < 2 or name.split(".")[-1] in ("pos_embed", "cls_token", "bias"))
        router = router_lr_scale != 1 and "router" in name.split(".")
        groups.setdefault((router, decays), []).append(prm)
    out = [{"params": groups.get((False, True), []), "weight_decay": weight_decay},
           {"params": groups.get((False, False), []), "weight_decay": 0.0}]
    for decays in (True, False):
        if groups.get((True, decays)):
            out.append({"params": groups[(True, decays)], "weight_decay": weight_decay if decays else 0.0,
                        "lr": lr * router_lr_scale, "lr_scale": router_lr_scale})
    return out


def optimizer_step(model, optimizer, scaler, clip_grad):
    """Unscale (fp16), clip the gradient norm to `clip_grad` (0 = no clipping) and step, without a
    host sync. Returns `bad`, a 0-d float tensor on the device: 1 when the gradient norm is not
    finite, in which case the update was skipped on the device (weights, moments and step counts
    keep their values): the optimizer reads `found_inf` as it does from GradScaler (torch's fused
    AdamW, optim.Lamb). The gradients are cleared either way. The host used to read the norm
    (`if torch.isfinite(gnorm)`) and so could never queue work ahead of the GPU. The norm before
    clipping stays on the device as `optimizer.grad_norm` (0-d), for --log-every's step records
    (monitor.Monitor.step_record), which read it at their steps only."""
    scaler.unscale_(optimizer)
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad or float("inf"))
    optimizer.grad_norm = gnorm.detach()
    bad = (~torch.isfinite(gnorm)).float()
    if scaler.is_enabled():  # fp16: GradScaler skips an overflowed step by the same mechanism
        scaler.step(optimizer)
    else:
        optimizer.found_inf = bad
        optimizer.step()
        del optimizer.found_inf
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return bad


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
        self._step_supports_amp_scaling = True  # GradScaler passes grad_scale / found_inf (no host sync)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Set by train.py (non-finite gradients) or GradScaler: found_inf 1 skips the whole step on the
        # device (weights, moments and the step count keep their values); grad_scale None = unscaled.
        found, scale = getattr(self, "found_inf", None), getattr(self, "grad_scale", None)
        for group in self.param_groups:
            (b1, b2), wd = group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad if scale is None else p.grad / scale
                st = self.state[p]
                if not st:
                    # the step count in float64 on the device: 1 - b ** t as exact as with a Python int
                    st.update(step=torch.zeros((), dtype=torch.float64, device=p.device),
                              exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                elif not torch.is_tensor(st["step"]):  # a checkpoint of an earlier version: a Python int
                    st["step"] = torch.tensor(float(st["step"]), dtype=torch.float64, device=p.device)
                skip = None if found is None else found.to(p.device) > 0
                t = st["step"] + (1 if skip is None else (~skip).double())
                m = torch.add(st["exp_avg"] * b1, g, alpha=1 - b1)
                v = torch.addcmul(st["exp_avg_sq"] * b2, g, g, value=1 - b2)
                u = m / (1 - b1 ** t) / ((v / (1 - b2 ** t)).sqrt() + group["eps"]) + wd * p
                trust = 1.0
                if wd or group["always_adapt"]:  # no host sync: trust stays a tensor
                    pn, un = p.norm(), u.norm()
                    trust = torch.where((pn > 0) & (un > 0), pn / un, torch.ones_like(pn))
                new_p = p - group["lr"] * trust * u
                if skip is not None:  # keep the old values where the step is skipped (NaN-safe select)
                    m, v, new_p = (torch.where(skip, old, new) for old, new in
                                   ((st["exp_avg"], m), (st["exp_avg_sq"], v), (p, new_p)))
                st["step"] = t
                st["exp_avg"].copy_(m)
                st["exp_avg_sq"].copy_(v)
                p.copy_(new_p)
        return loss


class EMA:
    """Exponential moving average of a model's weights (Polyak averaging; timm's ModelEmaV3, DeiT's
    --model-ema): ema <- decay * ema + (1 - decay) * w after every optimizer step, for parameters and
    floating-point buffers alike; the first update copies the weights. `ema.module` is the averaged
    copy of the model (evaluate it like the model). Same state dict as torch.optim.swa_utils.
    AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True), which earlier
    train.py versions saved, but the update count lives on the host: AveragedModel reads its
    device-side count (a host sync) twice per update; here one foreach lerp is all the update does."""

    def __init__(self, model, decay):
        self.module, self.decay, self.n_averaged = copy.deepcopy(model).requires_grad_(False), decay, 0
        self._src = [*model.parameters(), *model.buffers()]
        self._dst = [*self.module.parameters(), *self.module.buffers()]

    @torch.no_grad()
    def update(self, model):
        """Average in the current weights of `model` (the model this EMA was built from). As
        AveragedModel: the first update copies every tensor; integer buffers keep that copy."""
        if self.n_averaged == 0:
            torch._foreach_copy_(self._dst, self._src)
        else:
            floats = [(d, s) for d, s in zip(self._dst, self._src) if d.is_floating_point()]
            torch._foreach_lerp_([d for d, _ in floats], [s for _, s in floats], 1 - self.decay)
        self.n_averaged += 1

    def state_dict(self):
        sd = {"module." + k: v for k, v in self.module.state_dict().items()}
        return {**sd, "n_averaged": torch.tensor(self.n_averaged)}

    def load_state_dict(self, sd):
        self.module.load_state_dict({k[len("module."):]: v for k, v in sd.items() if k.startswith("module.")})
        self.n_averaged = int(sd["n_averaged"])
