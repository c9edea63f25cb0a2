"""Anytime inference under a guarantee: each image leaves the recurrence at its first step where an exit
rule fires, at a threshold calibrated so that the expected fraction of predictions that differ from the
full-depth model's is at most eps, with probability at least 1 - delta over the calibration images.

    python anytime.py calibrate --resume RUN/ckpt.pt --risk 0.01 --delta 0.1 --rule confidence --out policy.json
    python anytime.py evaluate --resume RUN/ckpt.pt --policy policy.json

    policy = anytime.calibrate(model, calib_loader, "confidence", risk=0.01, delta=0.1, budget=6)
    logits, steps = policy(model, x)      # (B, classes), (B,) steps each image ran (1..budget)

Every recurrent model file (bvit, revit incl. elastic depth, srvit, odevit) has the same step interface:
begin, step(k, depth), readout, blocks_per_step (bvit.py's "anytime" section). A step budget L fixes the
steps' grid (reViT's k / (L - 1), ODE-ViT's time grid); the budget's prediction is the reference.

The rules. Per image at step k (0-based), p_k the softmax of the readout, h_k the state's tokens:
  confidence    max p_k > threshold
  kl            KL(p_k || p_{k-1}) < threshold, from k = 1 (Geiping et al. 2025, "Scaling up Test-Time
                Compute with Latent Reasoning", their per-token exit, here per image)
  update        RMS(h_k - h_{k-1}) / RMS(h_{k-1}) < threshold (h_{-1}: the embedding)
  second-order  |d_k - d_{k-1}| / d_{k-1} < threshold, d_k = RMS(h_k - h_{k-1}), from k = 1 (our reading of
                Pappone et al. 2025, arXiv 2509.23314)
An image that never fires runs the budget. A step's readout does not depend on the other images of the
batch, so one traced run (`trace`) gives every threshold's exit steps (`exit_steps`); `run` is the exit
path, its batch compacted as images leave (no compute on an image that has left).

The guarantee (`calibrate`): Learn-then-Test (Angelopoulos, Bates, Candes, Jordan, Lei 2021, "Learn then
Test: Calibrating Predictive Algorithms to Achieve Risk Control", arXiv 2110.01052) with fixed-sequence
testing over the rule's threshold grid (GRIDS), ordered from the threshold that exits least to the one
that exits most. Threshold j's null hypothesis is "its risk R_j > eps"; its p-value is computed from the
calibration images' losses (`p_value`); the grid is walked in order and each threshold certified while
p_j <= delta; the last one certified is the policy's (the family-wise error of the walk is <= delta: each
test at level delta, the walk stops at the first that fails). So with probability >= 1 - delta over the
draw of the n calibration images, the expected loss of the policy on a new image exchangeable with them
is <= eps. Losses, per image: "disagreement" 1[exit prediction != the budget's prediction] (default) or
"error" 1[exit prediction != label] (the exit path's top-1 error). When no threshold is certified, the
policy runs every image to the budget (the disagreement is then 0; the budget's own error is not
certified) and says so.

What it does not say: it holds for images drawn as the calibration images were (exchangeable with
them); under a distribution shift (another dataset, corruptions, another resolution) it says nothing.
It bounds the expected loss (a mean over images), not any one image's.

Not the lab's: the studies of this (the curves, bench ratios, >= 50 splits) stand in lab/.
"""
import argparse
import hashlib
import json
import math
import os
import sys
import weakref

import torch
import torch.nn.functional as F

RULES = ("confidence", "kl", "update", "second-order")
LOSSES = ("disagreement", "error")
P_VALUES = ("binomial", "hoeffding-bentkus", "hoeffding")
# The threshold grids, each ordered from the threshold that exits least to the one that exits most (the
# order of the fixed-sequence test, fixed before any calibration image is seen).
_LOG = [10 ** (e / 4) for e in range(-40, 5)]  # 1e-10 .. 10, 4 a decade
GRIDS = {"confidence": [1 - 10 ** (-e / 4) for e in range(28, 4, -1)] + [0.05 * i for i in range(18, 0, -1)]
         + [0.04, 0.03, 0.02, 0.01, 0.0],
         "kl": _LOG, "update": _LOG, "second-order": _LOG}
NEVER = {"confidence": math.inf, "kl": -math.inf, "update": -math.inf, "second-order": -math.inf}  # never fires


# ----------------------------------------------------------------------------- the exit path
def tokens(state):
    """The token tensor (B, N, D) of a model's state (SR-ViT's state is a tuple: its h first)."""
    return state[0] if isinstance(state, tuple) else state


def rows(state, idx):
    """The state of the images `idx` (a tuple state row by row; None entries stay None)."""
    if isinstance(state, tuple):
        return tuple(None if t is None else t[idx] for t in state)
    return state[idx]


def rms(t):
    """Root mean square of each row of t (B, ...) -> (B,) in float32."""
    return t.float().flatten(1).square().mean(1).sqrt()


def stats(logits, h, prev):
    """Per-image statistics of one step: logits (B, C), h (B, N, D) the step's tokens, prev the
    previous step's stats or {"h": the embedding} -> {logp, h, conf, kl, update, d, second}
    (nan where a rule has no value yet)."""
    logp = F.log_softmax(logits.float(), -1)
    diff = rms(h - prev["h"])
    nan = torch.full_like(diff, float("nan"))
    out = {"logp": logp, "h": h, "conf": logp.exp().max(-1).values, "d": diff,
           "update": diff / rms(prev["h"]).clamp_min(1e-12)}
    out["kl"] = (logp.exp() * (logp - prev["logp"])).sum(-1) if "logp" in prev else nan
    out["second"] = (diff - prev["d"]).abs() / prev["d"].clamp_min(1e-12) if "d" in prev else nan
    return out


def fires(rule, s, threshold):
    """(B,) bool: whether `rule` stops each image at this step, from its stats `s` (nan never fires)."""
    if rule == "confidence":
        return s["conf"] > threshold
    if rule == "kl":
        return s["kl"] < threshold
    if rule == "update":
        return s["update"] < threshold
    if rule == "second-order":
        return s["second"] < threshold
    raise ValueError(f"unknown exit rule {rule!r}; allowed: {', '.join(RULES)}")


def check(model, budget):
    """Refuse a budget the model cannot run (ValueError, one line): below 1, or past an untied ViT's blocks."""
    if budget < 1:
        raise ValueError(f"the step budget must be >= 1, got {budget}")
    untied = getattr(model, "num_blocks", 1) == getattr(model, "depth", None) and getattr(model, "depth", 1) > 1
    if untied and budget > model.depth:
        raise ValueError(f"an untied ViT has {model.depth} blocks, so a budget of at most {model.depth} steps; "
                         f"got {budget}")


def stepper(model, budget):
    """step(state, k) of a `budget`-step run: model.step, with reViT's merged FFNs of the grid computed
    once (grid_weights, as its forward merges them) rather than at every step: the same numbers (revit_moe's
    token routings, default False, have no merged FFN)."""
    merged = hasattr(model, "grid_weights") and getattr(model, "default", True)
    weights = model.grid_weights(budget) if merged else None
    if weights is None:
        return lambda state, k: model.step(state, k, budget)
    return lambda state, k: model.step(state, k, budget, weights)


@torch.no_grad()
def trace(model, x, budget):
    """Every image of x (B, C, H, W) run to `budget` steps, read out after each: {pred (B, L) long, conf,
    kl, update, second (B, L) float (nan where undefined), residual (B, L): RMS(h_k - h_{k-1}), return2
    (B, L): RMS(h_k - h_{k-2}) (nan for k < 2), small when the state cycles with period 2}, on the CPU.
    ValueError for a budget the model cannot run (check)."""
    check(model, budget)
    step = stepper(model, budget)
    state = model.begin(x)
    prev, out = {"h": tokens(state)}, {k: [] for k in ("pred", "conf", "kl", "update", "second", "residual", "return2")}
    older = None
    for k in range(budget):
        state = step(state, k)
        h_prev = prev["h"]
        prev = stats(model.readout(state), tokens(state), prev)
        out["return2"].append(rms(prev["h"] - older) if older is not None else torch.full_like(prev["d"], float("nan")))
        older = h_prev
        for key, name in (("pred", None), ("conf", "conf"), ("kl", "kl"), ("update", "update"),
                          ("second", "second"), ("residual", "d")):
            out[key].append(prev["logp"].argmax(-1) if key == "pred" else prev[name])
    return {k: torch.stack(v, 1).cpu() for k, v in out.items()}


def exit_steps(tr, rule, threshold):
    """(B,) the 0-based step at which each image of trace `tr` stops under `rule` at `threshold` (the
    budget's last step when it never fires); rule "oracle" needs tr["right"] (B, L) bool: the first step
    from which the prediction is right and stays right (0 for an image never right at the end)."""
    if rule == "oracle":
        right = tr["right"]
        stays = right.flip(1).cummin(1).values.flip(1)  # right from step k to the end
        return torch.where(stays.any(1), stays.float().argmax(1), torch.zeros(len(right), dtype=torch.long))
    key = {"confidence": "conf", "kl": "kl", "update": "update", "second-order": "second"}.get(rule)
    if key is None:
        raise ValueError(f"unknown exit rule {rule!r}; allowed: {', '.join(RULES)}, oracle")
    v = tr[key]
    fire = (v > threshold) if rule == "confidence" else (v < threshold)  # nan never fires
    fire[:, -1] = True
    return fire.float().argmax(1)


@torch.no_grad()
def run(model, x, rule, threshold, budget):
    """The exit path: x (B, C, H, W) -> (logits (B, C) of each image's last step, its exit step (B,), 0-based);
    an image leaves the batch when `rule` fires at `threshold` (or at the budget), so the work falls with
    the mean number of steps. ValueError for an unknown rule or a budget the model cannot run."""
    check(model, budget)
    if rule not in RULES:
        raise ValueError(f"unknown exit rule {rule!r}; allowed: {', '.join(RULES)}")
    step = stepper(model, budget)
    B = x.shape[0]
    logits, steps = None, torch.zeros(B, dtype=torch.long, device=x.device)
    state = model.begin(x)
    idx, prev = torch.arange(B, device=x.device), {"h": tokens(state)}
    for k in range(budget):
        state = step(state, k)
        out = model.readout(state)
        s = stats(out, tokens(state), prev)
        done = fires(rule, s, threshold) if k < budget - 1 else torch.ones_like(idx, dtype=torch.bool)
        logits = out.new_zeros(B, out.shape[1]) if logits is None else logits
        logits[idx[done]], steps[idx[done]] = out[done], k
        if done.all():
            break
        keep = ~done
        idx, state = idx[keep], rows(state, keep)
        prev = {key: s[key][keep] for key in ("logp", "h", "d")}
    return logits, steps


# ----------------------------------------------------------------------------- Learn-then-Test
def binomial_cdf(k, n, p):
    """P(Binomial(n, p) <= k), in float64 (k may be a float: its floor counts); 1 for k >= n, 0 for k < 0."""
    k = math.floor(k + 1e-9)
    if k >= n:
        return 1.0
    if k < 0:
        return 0.0
    if p <= 0:
        return 1.0
    if p >= 1:
        return 0.0
    j = torch.arange(k + 1, dtype=torch.float64)
    logpmf = (math.lgamma(n + 1) - torch.lgamma(j + 1) - torch.lgamma(n - j + 1)
              + j * math.log(p) + (n - j) * math.log1p(-p))
    return float(torch.logsumexp(logpmf, 0).exp().clamp(max=1.0))


def p_value(mean_loss, n, eps, method="binomial"):
    """A valid p-value for the null hypothesis "the expected loss > eps", from the mean `mean_loss` of n
    i.i.d. losses in [0, 1] (super-uniform under the null: P(p <= u) <= u):
      hoeffding          exp(-2 n (eps - mean)_+^2) (Hoeffding 1963; any loss in [0, 1])
      hoeffding-bentkus  min(exp(-n h(min(mean, eps), eps)), e P(Bin(n, eps) <= ceil(n mean))), h(a, b) =
                         a log(a / b) + (1 - a) log((1 - a) / (1 - b)) (Bates, Angelopoulos, Lei, Malik, Jordan
                         2021, "Distribution-Free, Risk-Controlling Prediction Sets", arXiv 2101.02703, the
                         HB bound; LTT uses it for bounded losses; any loss in [0, 1])
      binomial           P(Bin(n, eps) <= n mean), exact for 0-1 losses only (LTT's binomial p-value):
                         the loss count of n images is Bin(n, R), stochastically at least Bin(n, eps) under
                         the null
    ValueError for an unknown method."""
    if method == "hoeffding":
        return math.exp(-2 * n * max(eps - mean_loss, 0.0) ** 2)
    if method == "hoeffding-bentkus":
        a = min(mean_loss, eps)
        h = (a * math.log(a / eps) if a > 0 else 0.0) + (1 - a) * math.log((1 - a) / (1 - eps))
        return min(math.exp(-n * h), math.e * binomial_cdf(math.ceil(n * mean_loss - 1e-9), n, eps), 1.0)
    if method == "binomial":
        return binomial_cdf(round(n * mean_loss), n, eps)
    raise ValueError(f"unknown p-value {method!r}; allowed: {', '.join(P_VALUES)}")


def fixed_sequence(losses, eps, delta, method="binomial"):
    """Learn-then-Test with fixed-sequence testing: losses (n, T) in [0, 1], column j the n calibration
    images' losses at grid threshold j, the columns in the order of testing (exiting least first). Walks
    j = 0, 1, ...: certifies j while p_j <= delta (p_value of its mean loss), stops at the first p_j > delta.
    Returns (index of the last certified threshold or None when the first fails, p-values (T,) as a list,
    None past the stop). With probability >= 1 - delta over the n i.i.d. images, every certified
    threshold has expected loss <= eps (LTT, arXiv 2110.01052: fixed-sequence testing controls the
    family-wise error at delta without a correction). ValueError for eps or delta outside (0, 1), or a
    binomial p-value of losses other than 0 and 1."""
    if not 0 < eps < 1:
        raise ValueError(f"risk eps must be in (0, 1), got {eps}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if method == "binomial" and not ((losses == 0) | (losses == 1)).all():
        raise ValueError("the binomial p-value is exact for 0-1 losses only; use hoeffding-bentkus or hoeffding")
    n = losses.shape[0]
    means = losses.double().mean(0).tolist()
    last, ps = None, [None] * len(means)
    for j, m in enumerate(means):
        ps[j] = p_value(m, n, eps, method)
        if ps[j] > delta:
            break
        last = j
    return last, ps


# ----------------------------------------------------------------------------- the policy
def weights_sha256(model):
    """sha256 (hex) of a model's weights: its state dict's names, dtypes, shapes and bytes, in order."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # (0-d: reshaped)
    return h.hexdigest()


def file_sha256(path):
    """sha256 (hex) of the file at `path`, read in 1 MiB chunks. OSError when unreadable."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class PolicyError(ValueError):
    """A policy that does not fit: another model or checkpoint, another budget, a malformed file (one line)."""


FIELDS = ("rule", "threshold", "eps", "delta", "budget", "loss", "p_value", "calibration", "checkpoint_sha256",
          "weights_sha256", "certified", "grid_index", "grid_size")


class Policy:
    """An exit policy: `rule` at `threshold` (None: no threshold certified, every image runs the budget),
    certified by `calibrate` for risk `eps` at confidence 1 - `delta` with `loss`, at `budget` steps (the most
    it runs: the depth calibrated for), `p_value` the method, `calibration` the calibration set ({description,
    size, ...}), checkpoint_sha256 (the checkpoint file's, when calibrated from one) and weights_sha256 (the
    model's weights: a policy is refused for another model).

    policy(model, x) -> (logits (B, classes), steps (B,) long, the steps each image ran, 1..budget).
    policy.save(path) writes the JSON; Policy.load(path, checkpoint=None) reads it (PolicyError for a
    malformed file, or for a checkpoint file whose sha256 is not the policy's)."""

    def __init__(self, **fields):
        missing = [k for k in FIELDS if k not in fields]
        if missing:
            raise PolicyError(f"a policy needs {', '.join(missing)}")
        for k in FIELDS:
            setattr(self, k, fields[k])
        self._checked = weakref.WeakSet()  # the models whose weights were checked (once each)

    def to_dict(self):
        return {k: getattr(self, k) for k in FIELDS}

    def save(self, path):
        """Write the policy as a small JSON file at `path`."""
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path, checkpoint=None):
        """The policy of the JSON file `path`; with `checkpoint` (a file), refused unless the file's sha256
        is the one it was calibrated for. PolicyError (one line) for a missing or malformed file or another
        checkpoint."""
        try:
            with open(path) as f:
                d = json.load(f)
        except OSError as e:
            raise PolicyError(f"{path}: cannot read it ({e.strerror or e})")
        except ValueError:
            raise PolicyError(f"{path}: not a JSON file (write one with `python anytime.py calibrate`)")
        if not isinstance(d, dict) or any(k not in d for k in FIELDS) or d["rule"] not in RULES:
            raise PolicyError(f"{path}: not an anytime policy (fields {', '.join(FIELDS)}); write one with "
                              "`python anytime.py calibrate`")
        policy = cls(**{k: d[k] for k in FIELDS})
        if checkpoint is not None:
            got = file_sha256(checkpoint)
            if got != policy.checkpoint_sha256:
                was = (f"the checkpoint with sha256 {policy.checkpoint_sha256[:12]}..." if policy.checkpoint_sha256
                       else "a model in Python, not a checkpoint file")
                raise PolicyError(f"{path} was calibrated for {was}, not {checkpoint} ({got[:12]}...); "
                                  "calibrate a policy for this checkpoint")
        return policy

    def check_model(self, model):
        """PolicyError unless `model`'s weights are those calibrated (weights_sha256); checked once per model
        object (weights changed in place afterwards are not seen)."""
        if model in self._checked:
            return
        got = weights_sha256(model)
        if got != self.weights_sha256:
            raise PolicyError(f"this policy was calibrated for the weights with sha256 {self.weights_sha256[:12]}..., "
                              f"not this model's ({got[:12]}...); calibrate a policy for this model")
        self._checked.add(model)

    def __call__(self, model, x, budget=None):
        """x (B, C, H, W) -> (logits (B, classes), steps (B,) long: the steps each image ran, 1..budget).
        budget: only the policy's own (the depth it was calibrated for); PolicyError for another, or for
        another model's weights."""
        if budget is not None and budget != self.budget:
            more = "beyond" if budget > self.budget else "other than"
            raise PolicyError(f"budget {budget}: {more} the {self.budget} steps this policy was calibrated for "
                              f"(its guarantee holds there only); calibrate a policy with budget {budget}")
        self.check_model(model)
        threshold = NEVER[self.rule] if self.threshold is None else self.threshold
        logits, steps = run(model, x, self.rule, threshold, self.budget)
        return logits, steps + 1

    def __repr__(self):
        what = f"threshold {self.threshold:.6g}" if self.threshold is not None else "no threshold certified (full budget)"
        return (f"Policy({self.rule}, {what}, risk <= {self.eps} ({self.loss}) with probability >= "
                f"{1 - self.delta:.3g}, budget {self.budget} steps)")


class Exiting(torch.nn.Module):
    """`model` under `policy`, as one module (what hubconf.from_run(run, policy=...) returns): forward(x)
    (B, C, H, W) -> (logits (B, classes), steps (B,) long, 1..budget), policy(model, x) exactly; the policy
    checks the model's weights on the first call (PolicyError for another model's)."""

    def __init__(self, model, policy):
        super().__init__()
        self.model, self.policy = model, policy

    def forward(self, x):
        return self.policy(self.model, x)


def losses_of(tr, reference, rule, grid):
    """(n, T) float losses of each image at each threshold of `grid`: 1[its exit prediction != reference],
    tr a trace (pred (n, L) and the rule's statistic), reference (n,) long. And (T,) mean steps (1..L)."""
    cols, steps = [], []
    for t in grid:
        e = exit_steps(tr, rule, t)
        cols.append((tr["pred"].gather(1, e[:, None])[:, 0] != reference).float())
        steps.append(float((e + 1).float().mean()))
    return torch.stack(cols, 1), steps


@torch.no_grad()
def calibrate(model, calib_loader, rule="confidence", risk=0.01, delta=0.1, budget=None, loss="disagreement",
              method="binomial", grid=None, calibration=None, checkpoint=None, device=None):
    """The exit policy of `model` (eval mode) certified by Learn-then-Test (module docstring) on the images of
    calib_loader ((x (B, C, H, W), y (B,)) batches, never the evaluation's): `rule` at the last threshold of
    `grid` (default GRIDS[rule], ordered exiting least first) that fixed_sequence certifies for expected `loss`
    <= risk with probability >= 1 - delta. budget: the steps of the reference (default: the model's trained
    depth: `recursions` for SR-ViT, `steps` for ODE-ViT, else `depth`). calibration: a dict describing the
    calibration set (its size is added); checkpoint: the checkpoint file the model came from (its sha256 goes
    into the policy). Returns a Policy. ValueError (one line) for a bad rule, loss, method, risk, delta or budget."""
    if rule not in RULES:
        raise ValueError(f"unknown exit rule {rule!r}; allowed: {', '.join(RULES)}")
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; allowed: {', '.join(LOSSES)}")
    if method not in P_VALUES:
        raise ValueError(f"unknown p-value {method!r}; allowed: {', '.join(P_VALUES)}")
    fixed_sequence(torch.zeros(1, 1), risk, delta)  # (the risk and delta checks, before any image)
    budget = budget or trained_steps(model)
    check(model, budget)
    grid = list(GRIDS[rule] if grid is None else grid)
    device = device or next(model.parameters()).device
    traces, refs = [], []
    for x, y in calib_loader:
        tr = trace(model, x.to(device), budget)
        traces.append(tr)
        refs.append(tr["pred"][:, -1] if loss == "disagreement" else y.cpu())
    if not traces:
        raise ValueError("the calibration loader gave no images")
    tr = {k: torch.cat([t[k] for t in traces]) for k in traces[0]}
    table, steps = losses_of(tr, torch.cat(refs), rule, grid)
    j, ps = fixed_sequence(table, risk, delta, method)
    n = table.shape[0]
    tested = [p for p in ps if p is not None]
    info = dict(calibration or {}, size=n, tested=len(tested), p_value_at_threshold=None if j is None else ps[j],
                p_value_that_stopped=tested[-1] if tested[-1] > delta else None,
                mean_steps=None if j is None else steps[j],
                empirical_risk=None if j is None else float(table[:, j].mean()),
                budget_risk=float(table[:, -1].mean()) if loss == "error" else 0.0)
    return Policy(rule=rule, threshold=None if j is None else float(grid[j]), eps=risk, delta=delta, budget=budget,
                  loss=loss, p_value=method, calibration=info,
                  checkpoint_sha256=file_sha256(checkpoint) if checkpoint else None,
                  weights_sha256=weights_sha256(model), certified=j is not None,
                  grid_index=j, grid_size=len(grid))


def trained_steps(model):
    """The steps a model was trained to run: SR-ViT's recursions, ODE-ViT's solver steps, else its depth."""
    for name in ("recursions", "steps", "depth"):
        v = getattr(model, name, None)
        if isinstance(v, int):
            return v
    raise ValueError(f"{type(model).__name__}: no trained depth (recursions, steps or depth); give budget=")


# ----------------------------------------------------------------------------- the command line
def split(n, calib_size=None, seed=0):
    """(calibration indices, evaluation indices) of n images: a seeded permutation (torch.randperm with
    Generator.manual_seed(seed)), its first calib_size (default n // 2) the calibration's, the rest the
    evaluation's; disjoint, each sorted. ValueError when calib_size is not in 1..n - 1."""
    calib_size = n // 2 if calib_size is None else calib_size
    if not 0 < calib_size < n:
        raise ValueError(f"--calib-size must be in 1..{n - 1} (the {n} images split in two), got {calib_size}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[:calib_size].sort().values, perm[calib_size:].sort().values


def get_parser():
    from training import flags

    def fraction(s):
        v = flags.number(s)
        if not 0 < v < 1:
            raise argparse.ArgumentTypeError(f"must be in (0, 1), got {s}")
        return v

    p = flags.Parser(prog="anytime.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, what in (("calibrate", "write a policy certified on the calibration half of the validation set"),
                       ("evaluate", "run a policy on the evaluation half: its realized risk and steps")):
        c = sub.add_parser(name, help=what, description=what)
        c.add_argument("--resume", required=True, metavar="CKPT", help="an rvits checkpoint (train.py's ckpt.pt)")
        c.add_argument("--data-dir", help="dataset root (default: the checkpoint's --data-dir)")
        c.add_argument("--split-seed", type=flags.seed, help="the seed of the calibration / evaluation "
                       "split of the validation set (default 0; evaluate: the policy's)")
        c.add_argument("--calib-size", type=flags.positive(int), help="calibration images (default: half the "
                       "validation set, 5,000 of CIFAR-100's 10,000; evaluate: the policy's)")
        c.add_argument("--num-images", type=flags.positive(int), help="use only the first N images of the half "
                       "(a quick check; the policy says how many it saw)")
        c.add_argument("--batch-size", type=flags.positive(int), default=256)
        c.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
        c.add_argument("--budget", type=flags.positive(int), help="steps of the reference prediction (default: the "
                       "trained depth; at most 8x it). evaluate: only the policy's own")
        if name == "calibrate":
            c.add_argument("--rule", default="confidence", choices=RULES)
            c.add_argument("--risk", type=fraction, required=True, help="eps: the expected loss to certify, in (0, 1)")
            c.add_argument("--delta", type=fraction, default=0.1, help="the certificate fails with probability "
                           "at most delta, in (0, 1) (default 0.1)")
            c.add_argument("--loss", default="disagreement", choices=LOSSES, help="disagreement with the budget's "
                           "prediction (default), or error: top-1 error against the labels")
            c.add_argument("--p-value", default="binomial", choices=P_VALUES)
            c.add_argument("--out", required=True, help="the policy's JSON file")
        else:
            c.add_argument("--policy", required=True, help="a policy JSON written by `anytime.py calibrate`")
            c.add_argument("--json", help="also write the evaluation's numbers to this JSON file")
    return p


MAX_BUDGET = 8  # --budget: at most this many times the trained depth (the lab's analyze.py --anytime)


def load(args):
    """(model in eval mode on args.device, the validation set, the run's resolved flags) of args.resume,
    built as train.py builds it. Fail (training.exits) for a bad file or data."""
    import data
    from training import flags, registry
    from training.exits import Fail
    from training.weights import read_weights
    ck = read_weights(args.resume, "--resume")
    if not registry.is_rvits_checkpoint(ck):
        raise Fail(f"--resume {args.resume}: not an rvits classifier's checkpoint (model weights, a class head "
                   "and the flags of its run)")
    run = flags.get_parser().parse_args([])
    vars(run).update(ck["args"], teacher=None, distill=None, perceptual="none")
    if args.data_dir:
        run.data_dir = args.data_dir
    try:
        _, val_set, classes, img_size = data.build_datasets(
            run.data, run.data_dir, run.img_size, seed=run.seed, val_labels=run.val_labels, train=False,
            mean_std=registry.MODELS[run.model].normalization)
    except (data.DataError, ValueError) as e:
        raise Fail(f"{e} (the checkpoint's data; give --data-dir to read it elsewhere)")
    run = flags.resolve(run, flags.get_parser(), img_size)
    model = registry.build_model(run, img_size, classes)
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as e:
        raise Fail(f"--resume {args.resume}: its weights do not fit the model its flags describe "
                   f"({str(e).strip().splitlines()[-1].strip()})")
    if not hasattr(model, "begin"):
        raise Fail(f"--resume {args.resume}: --model {run.model} has no step interface (begin, step, readout)")
    return model.to(args.device).eval(), val_set, run


def half(val_set, args, which, seed, calib_size):
    """The DataLoader of the calibration (which=0) or evaluation (1) half of val_set, and its description."""
    from torch.utils.data import DataLoader, Subset
    idx = split(len(val_set), calib_size, seed)[which]
    idx = idx[:args.num_images] if args.num_images else idx
    desc = {"description": f"{'calibration' if which == 0 else 'evaluation'} half of the validation set "
                           f"({len(val_set)} images): torch.randperm({len(val_set)}, seed {seed}), positions "
                           + (f"[:{calib_size}]" if which == 0 else f"[{calib_size}:]")
                           + (f", its first {args.num_images}" if args.num_images else ""),
            "dataset_images": len(val_set), "split_seed": seed, "calib_size": calib_size}
    return DataLoader(Subset(val_set, idx.tolist()), args.batch_size, shuffle=False), desc


def check_budget(args, run, model):
    from training import registry
    from training.exits import Fail
    trained = registry.trained_depth(run)
    budget = args.budget or trained_steps(model)
    if budget > MAX_BUDGET * trained:
        raise Fail(f"--budget {budget}: at most {MAX_BUDGET}x the trained depth ({MAX_BUDGET * trained} steps)")
    try:
        check(model, budget)
    except ValueError as e:
        raise Fail(f"--budget {budget}: {e}")
    return budget


def main_calibrate(args):
    from training.exits import Fail
    from training.weights import checkpoint_file
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise Fail(f"--out {args.out}: no folder {out_dir}; create it first")
    model, val_set, run = load(args)
    budget = check_budget(args, run, model)
    calib_size = args.calib_size or len(val_set) // 2
    try:
        loader, desc = half(val_set, args, 0, args.split_seed or 0, calib_size)
    except ValueError as e:
        raise Fail(str(e))
    policy = calibrate(model, loader, args.rule, args.risk, args.delta, budget, args.loss, args.p_value,
                       calibration={**desc, "data": run.data},
                       checkpoint=checkpoint_file(args.resume, "--resume"))
    policy.save(args.out)
    c = policy.calibration
    said = (f"threshold {policy.threshold:.6g}: mean {c['mean_steps']:.2f} of {budget} steps, "
            f"calibration {policy.loss} {100 * c['empirical_risk']:.2f} %" if policy.certified else
            f"no threshold certified: every image runs the full budget of {budget} steps")
    print(f"{args.rule}, risk <= {args.risk} ({args.loss}) with probability >= {1 - args.delta:.3g} on "
          f"{c['size']} calibration images: {said}; wrote {args.out}")


def main_evaluate(args):
    from training.exits import Fail
    from training.weights import checkpoint_file
    ckpt = checkpoint_file(args.resume, "--resume")
    if not os.path.isfile(ckpt):
        raise Fail(f"--resume {args.resume}: no such file")
    try:
        policy = Policy.load(args.policy, checkpoint=ckpt)
    except PolicyError as e:
        raise Fail(f"--policy {e}")
    if args.budget is not None and args.budget != policy.budget:
        raise Fail(f"--budget {args.budget}: the policy was calibrated for {policy.budget} steps and runs at most "
                   f"those (its guarantee holds there only); calibrate a policy with --budget {args.budget}")
    for flag, mine, its in (("--split-seed", args.split_seed, policy.calibration.get("split_seed")),
                            ("--calib-size", args.calib_size, policy.calibration.get("calib_size"))):
        if mine is not None and mine != its:
            raise Fail(f"{flag} {mine}: the policy's calibration split has {its}; the evaluation half is its "
                       f"complement (leave {flag} out)")
    model, val_set, run = load(args)
    loader, desc = half(val_set, args, 1, policy.calibration["split_seed"], policy.calibration["calib_size"])
    disagree = wrong = wrong_full = steps_sum = n = 0
    for x, y in loader:
        x = x.to(args.device)
        logits, steps = policy(model, x)
        with torch.no_grad():
            full = model(x, depth=policy.budget).argmax(1).cpu()
        pred = logits.argmax(1).cpu()
        disagree += int((pred != full).sum())
        wrong += int((pred != y).sum())
        wrong_full += int((full != y).sum())
        steps_sum += int(steps.sum())
        n += len(y)
    res = {"policy": os.path.abspath(args.policy), "images": n, "evaluation": desc["description"],
           "disagreement": disagree / n, "top1": 100 * (1 - wrong / n), "full_top1": 100 * (1 - wrong_full / n),
           "mean_steps": steps_sum / n, "budget": policy.budget, "eps": policy.eps, "delta": policy.delta,
           "loss": policy.loss, "risk": (disagree if policy.loss == "disagreement" else wrong) / n}
    res["within_eps"] = res["risk"] <= policy.eps
    print(f"{n} evaluation images: {policy.loss} {100 * res['risk']:.2f} % (eps {100 * policy.eps:.2f} %), top-1 "
          f"{res['top1']:.2f} % (full depth {res['full_top1']:.2f} %), mean {res['mean_steps']:.2f} of "
          f"{policy.budget} steps ({100 * res['mean_steps'] / policy.budget:.0f} % of the block applications)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


def cli(argv=None):
    """The command line (module docstring): 0, or 2 after one line naming the flag or file for bad input."""
    from training.exits import Fail
    args = get_parser().parse_args(argv)
    try:
        (main_calibrate if args.command == "calibrate" else main_evaluate)(args)
    except Fail as e:
        print(f"anytime.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
