"""Anytime inference: each image stops when a rule says it is done (analyze.py --anytime, bench.py).

Every recurrent model file has the same step interface (begin, step(k, depth), readout,
blocks_per_step: bvit.py's "anytime" section), so a prediction can be read after any step. A step
budget L (which may exceed the trained depth) fixes the grid of the steps (reViT's coordinates
k / (L - 1), bViT's phases, ODE-ViT's time grid); an image leaves the batch at the first step where
its rule fires, and the last step's readout is its prediction. Per image, at step k (0-based),
with p_k the softmax of the readout and h_k the state's tokens (SR-ViT: the last recursion's):
  confidence    max p_k > threshold
  kl            KL(p_k || p_{k-1}) < threshold, from k = 1 (Geiping et al. 2025, "Scaling up Test-Time
                Compute with Latent Reasoning", their per-token exit, here per image)
  update        RMS(h_k - h_{k-1}) / RMS(h_{k-1}) < threshold (LoopVAE's eq. 12; h_{-1}: the embedding)
  second-order  |d_k - d_{k-1}| / d_{k-1} < threshold with d_k = RMS(h_k - h_{k-1}), from k = 1: the step
                size stops changing (our reading of Pappone et al. 2025, arXiv 2509.23314)
and the oracle, an upper bound no rule can beat: the first step from which the prediction is right and
stays right to the budget (step 0 for an image never right to the end). Images that never fire stop at
the budget. A step's readout does not depend on which other images are in the batch, so one traced run
(`trace`) gives every rule's exit steps at every threshold (`exit_steps`); `run` is the real path,
whose batch shrinks as images exit (what bench.py times).

Does it pay? `anytime_analysis` (analyze.py --anytime: anytime.json) puts each rule's top-1 against
its mean block applications beside fixed-depth truncation and the oracle, reads each rule's operating
point (the fewest applications within WITHIN top-1 points of the trained depth), chooses the best
(rule, threshold) on half the images and scores its gain over fixed depth on the other half
(`heldout_gain`), and says what the state does beyond the trained depth (`behaviour`).
"""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

import data

RULES = ("confidence", "kl", "update", "second-order")


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
    """(B,) bool: whether `rule` stops each image at this step, from its stats `s`."""
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
    """Refuse a budget the model cannot run (ValueError, one line)."""
    if budget < 1:
        raise ValueError(f"the step budget must be >= 1, got {budget}")
    untied = getattr(model, "num_blocks", 1) == getattr(model, "depth", None) and getattr(model, "depth", 1) > 1
    if untied and budget > model.depth:
        raise ValueError(f"an untied ViT has {model.depth} blocks, so a budget of at most {model.depth} steps; "
                         f"got {budget}")


@torch.no_grad()
def trace(model, x, budget):
    """Every image run to `budget` steps, read out after each: {pred (B, L) long, conf, kl, update,
    second (B, L) float (nan where undefined), residual (B, L): RMS(h_k - h_{k-1}), return2 (B, L):
    RMS(h_k - h_{k-2}) (nan for k < 2), small when the state cycles with period 2}."""
    check(model, budget)
    state = model.begin(x)
    prev, out = {"h": tokens(state)}, {k: [] for k in ("pred", "conf", "kl", "update", "second", "residual", "return2")}
    older = None
    for k in range(budget):
        state = model.step(state, k, budget)
        h_prev = prev["h"]
        prev = stats(model.readout(state), tokens(state), prev)
        out["return2"].append(rms(prev["h"] - older) if older is not None else torch.full_like(prev["d"], float("nan")))
        older = h_prev
        for key, name in (("pred", None), ("conf", "conf"), ("kl", "kl"), ("update", "update"),
                          ("second", "second"), ("residual", "d")):
            out[key].append(prev["logp"].argmax(-1) if key == "pred" else prev[name])
    return {k: torch.stack(v, 1).cpu() for k, v in out.items()}


def behaviour(residual, return2, trained):
    """Beyond the trained depth (mean curves over images, steps 0-based): "converges" when the last
    step's residual RMS(h_{k+1} - h_k) is under half the trained depth's, else "cycles" when the state
    comes back (RMS(h_k - h_{k-2}) under half the residual), else "drifts"; None within the trained depth.
    Our rule (the thresholds are ours), applied to the mean over the analysed images."""
    if len(residual) <= trained:
        return None
    if residual[-1] < 0.5 * residual[trained - 1]:
        return "converges"
    return "cycles" if return2[-1] < 0.5 * residual[-1] else "drifts"


def curve(tr, right, rule, thresholds, blocks_per_step):
    """[(threshold, mean block applications per image, top-1 %)] of `rule` over `thresholds` on trace
    `tr` with right (B, L) bool: whether each step's prediction is right."""
    out = []
    for t in thresholds:
        e = exit_steps({**tr, "right": right}, rule, t)
        out.append((t, float((e + 1).float().mean()) * blocks_per_step,
                    float(100 * right.gather(1, e[:, None]).float().mean())))
    return out


def fixed_at(fixed_right, applications, blocks_per_step):
    """(B,) float: per image, fixed-depth correctness at mean compute `applications` (block applications
    per image), from fixed_right (B, L) bool (depth d's prediction right, d = 1..L). Between depths k and
    k + 1 it is their mixture (a fraction w of the images sent to k + 1: the linear interpolation of the
    fixed-depth curve); clamped to depth 1 and depth L outside them."""
    s = min(max(applications / blocks_per_step, 1.0), float(fixed_right.shape[1]))
    k = min(int(s), fixed_right.shape[1] - 1)  # depth k (1-based) and k + 1, weight w on k + 1
    w, f = s - k, fixed_right.float()
    return f[:, k - 1] if w == 0 else (1 - w) * f[:, k - 1] + w * f[:, k]


def heldout_gain(tr, right, fixed_right, thresholds, blocks_per_step):
    """The best exit rule's top-1 gain over fixed-depth truncation at equal mean compute, measured
    without the optimism of choosing among many (rule, threshold) pairs on the images that score it:
    the pair with the largest gain is chosen on the even-indexed images and scored on the odd ones.
    tr, right (B, L): a trace and its per-step correctness; fixed_right (B, L): depth d's correctness;
    thresholds {rule: [threshold]}. Returns {rule, threshold, chosen_gain (on the choosing half),
    gain, se (on the scoring half: the mean and standard error of the paired per-image difference,
    top-1 points), applications (the scoring half's mean block applications), images (scored)}.
    The gain can be negative: a rule that only helps on the images it was tuned on loses here. Our
    protocol for issue 40's claim (b), not a paper's."""
    def half(idx):
        sub = {k: v[idx] for k, v in tr.items()}
        return sub, right[idx], fixed_right[idx]

    def diffs(part, rule, t):  # per-image 100 * (exit-path correctness - fixed-depth mixture), and the compute
        sub, r, fr = part
        e = exit_steps({**sub, "right": r}, rule, t)
        apps = float((e + 1).float().mean()) * blocks_per_step
        return 100 * (r.gather(1, e[:, None])[:, 0].float() - fixed_at(fr, apps, blocks_per_step)), apps

    n = len(right)
    choose, score = half(torch.arange(0, n, 2)), half(torch.arange(1, n, 2))
    rule, t, chosen = max(((r, t, float(diffs(choose, r, t)[0].mean())) for r, ts in thresholds.items() for t in ts),
                          key=lambda p: p[2])
    d, apps = diffs(score, rule, t)
    se = float(d.std() / len(d) ** 0.5) if len(d) > 1 else float("nan")
    return {"rule": rule, "threshold": t, "chosen_gain": chosen, "gain": float(d.mean()), "se": se,
            "applications": apps, "images": len(d)}


def exit_steps(tr, rule, threshold):
    """(B,) the 0-based step at which each image of trace `tr` stops under `rule` at `threshold` (the
    budget's last step when it never fires); rule "oracle" needs tr["right"] (B, L) bool."""
    if rule == "oracle":
        right = tr["right"]
        stays = right.flip(1).cummin(1).values.flip(1)  # right from step k to the end
        first = torch.where(stays.any(1), stays.float().argmax(1), torch.zeros(len(right), dtype=torch.long))
        return first
    key = {"confidence": "conf", "kl": "kl", "update": "update", "second-order": "second"}.get(rule)
    if key is None:
        raise ValueError(f"unknown exit rule {rule!r}; allowed: {', '.join(RULES)}, oracle")
    v = tr[key]
    fire = (v > threshold) if rule == "confidence" else (v < threshold)  # nan never fires
    fire[:, -1] = True
    return fire.float().argmax(1)


@torch.no_grad()
def run(model, x, rule, threshold, budget):
    """The exit path: (logits (B, C) of each image's last step, its exit step (B,)); an image leaves the
    batch when `rule` fires at `threshold` (or at the budget), so the work falls with the mean number of
    steps."""
    check(model, budget)
    B = x.shape[0]
    logits, steps = None, torch.zeros(B, dtype=torch.long, device=x.device)
    state = model.begin(x)
    idx, prev = torch.arange(B, device=x.device), {"h": tokens(state)}
    for k in range(budget):
        state = model.step(state, k, budget)
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


# ----------------------------------------------------------------------------- the analysis (analyze.py --anytime)
THRESHOLDS = {"confidence": [0.05 * i for i in range(1, 20)] + [0.97, 0.99, 0.999],
              **{r: [10 ** (e / 4) for e in range(-20, 3)] for r in ("kl", "update", "second-order")}}
PER_IMAGE = 256  # anytime.json keeps the per-image relative updates of the first this many images
MAX_BUDGET = 8  # --budget: at most this many times the trained depth
WITHIN = 0.5  # top-1 points: a rule's operating point keeps full-depth top-1 within this (issue 40)


def anytime_analysis(model, val_set, num_images, budget, trained, batch_size=128, device="cpu"):
    """The anytime curves of a classifier on the first `num_images` of val_set: a `trace` to `budget`
    steps; fixed-depth top-1 at depth 1..budget; per rule its curve over THRESHOLDS and its operating point (the fewest mean block applications whose top-1 is within WITHIN
    points of the trained depth's), its exit steps there (histogram; mean per class) and the best gain
    over fixed depth at equal mean compute (the fixed curve interpolated linearly); the oracle; per step
    the readout's top-1, relative update and residual (mean; the update also per image, for the first
    PER_IMAGE images), the behaviour beyond the trained depth (`behaviour`), and the best rule's
    gain chosen on half the images and scored on the other half (`heldout_gain`: claim (b) of
    issue 40)."""
    subset = Subset(val_set, range(min(num_images, len(val_set))))
    parts, labels, fixed_right = [], [], []
    for x, y in tqdm(DataLoader(subset, batch_size, shuffle=False), desc="anytime", unit="batch"):
        x, y, _ = data.drop_undecodable(x, y, subset)
        x = x.to(device)
        parts.append(trace(model, x, budget))
        labels.append(y)
        with torch.no_grad():  # (B, L): depth d's prediction right (reViT's depth d is not trace step d)
            fixed_right.append(torch.stack([model(x, depth=d).argmax(1).cpu() == y
                                            for d in range(1, budget + 1)], 1))
    tr = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    y, fixed_right = torch.cat(labels), torch.cat(fixed_right)
    n, bps = len(y), model.blocks_per_step
    right = tr["pred"] == y[:, None]
    fixed = [float(100 * v) for v in fixed_right.double().mean(0)]
    full = fixed[trained - 1]
    apps = [(d + 1) * bps for d in range(budget)]

    def at(c):  # the fixed-depth top-1 at mean compute c, interpolated between depths
        return float(100 * fixed_at(fixed_right, c, bps).mean())

    rules = {}
    for rule, ts in THRESHOLDS.items():
        pts = curve(tr, right, rule, ts, bps)
        ok = [p for p in pts if p[2] >= full - WITHIN]
        op = min(ok, key=lambda p: p[1]) if ok else None
        res = {"curve": [{"threshold": t, "applications": a, "top1": v} for t, a, v in pts],
               "best_gain_over_fixed": max(v - at(a) for _, a, v in pts), "operating_point": None}
        if op:
            e = exit_steps({**tr, "right": right}, rule, op[0])
            per_class = {int(c): float((e[y == c] + 1).float().mean()) for c in y.unique()}
            res["operating_point"] = {"threshold": op[0], "applications": op[1], "top1": op[2],
                                      "fraction_of_trained": op[1] / (trained * bps),
                                      "exit_histogram": torch.bincount(e, minlength=budget).tolist(),
                                      "earliest_classes": sorted(per_class, key=per_class.get)[:5],
                                      "latest_classes": sorted(per_class, key=per_class.get)[-5:],
                                      "mean_steps_per_class": per_class}
        rules[rule] = res
    oracle = exit_steps({**tr, "right": right}, "oracle", None)
    mean = lambda key: [float(v) for v in tr[key].nanmean(0)]
    return {"num_images": n, "budget": budget, "trained_depth": trained, "blocks_per_step": bps,
            "full_top1": full, "fixed": [{"depth": d + 1, "applications": a, "top1": v}
                                         for d, (a, v) in enumerate(zip(apps, fixed))],
            "rules": rules, "heldout": heldout_gain(tr, right, fixed_right, THRESHOLDS, bps),
            "oracle": {"applications": float((oracle + 1).float().mean()) * bps,
                       "top1": float(100 * right.gather(1, oracle[:, None]).float().mean())},
            "per_step": {"top1": [float(100 * v) for v in right.float().mean(0)], "update": mean("update"),
                         "residual": mean("residual"), "return2": mean("return2"),
                         "update_per_image": [[round(float(v), 5) for v in row] for row in tr["update"][:PER_IMAGE]]},
            "behaviour": behaviour(mean("residual"), mean("return2"), trained)}
