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
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

import data

# The exit path itself (the rules' statistics, trace, exit_steps, run) is the product's (anytime.py at the top
# level: calibrated policies, issue 80); the analysis reads it from there.
from anytime import RULES, check, exit_steps, fires, rms, rows, run, stats, tokens, trace  # noqa: F401


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
