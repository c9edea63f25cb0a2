"""Does anytime.py's guarantee hold, and what does it buy? (issue 80, item 3) Per checkpoint: every image of
its validation set traced once to the budget (anytime.trace), then for each of --splits random calibration /
evaluation splits (torch.randperm with seed s, half and half; split 0 is `anytime.py calibrate`'s) and each
eps, the threshold Learn-then-Test certifies on the calibration half (anytime.fixed_sequence, the product's
grid and p-value) and its realized risk and mean steps on the evaluation half.

    python lab/anytime_study.py RUN [RUN ...] --out-dir lab/results/anytime-policy [--splits 50] [--bench]

RUN: a run folder holding ckpt.pt (train.py's --out-dir), named ARM/seed<k> as lab/reproduce_mini.sh names them.
Per run, OUT/ARM/seed<k>/ holds its part of the study (anytime_study.json), where the study ran (done.json:
commit, commit date, CPU model, threads; what lab/claims.py dates the claims' judging runs by) and the training
run's own record (train_done.json, train_args.json, train_log.jsonl: which checkpoint, made where), so that
`python lab/keep_results.py OUT lab/results/anytime-policy` keeps each run as a line. Writes OUT/anytime_study.json and (matplotlib)
OUT/anytime_study.png: realized risk against eps with the band up to the (1 - delta) quantile of the splits
(which the guarantee puts under the line risk = eps, up to the evaluation half's own sampling error), and
the mean fraction of the budget's block applications against eps. Per (run, rule, eps): the fraction of
splits whose realized risk exceeds eps with its 90 % Clopper-Pearson interval (the claim: <= delta), the
mean realized risk and steps. --bench: the wall-time img/s of the exit path over the fixed-depth forward at
batch sizes 1, 64 and 256 on the same 256 evaluation images (split 0's policy at eps 1 %, each rule; as
bench.py times: warm-up, synchronize, median of repeats), measured in one run.
"""
import json
import math
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the product beside the lab

import torch  # noqa: E402
from torch.utils.data import DataLoader, Subset  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the lab's own modules
import anytime  # noqa: E402
import provenance  # noqa: E402  (where a result was measured)
import bench  # noqa: E402
from training import flags  # noqa: E402
from training.exits import Fail  # noqa: E402
from training.figures import pyplot  # noqa: E402

EPS = (0.005, 0.01, 0.02, 0.05)
BENCH_BATCHES = (1, 64, 256)


def clopper_pearson(k, n, level=0.9):
    """The two-sided `level` Clopper-Pearson interval (lo, hi) of a binomial rate from k successes of n:
    lo solves P(Bin(n, lo) >= k) = a, hi solves P(Bin(n, hi) <= k) = a, a = (1 - level) / 2 (bisection on
    anytime.binomial_cdf)."""
    a = (1 - level) / 2

    def solve(f):  # the p in (0, 1) where the increasing f(p) crosses a
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < a else (lo, mid)
        return (lo + hi) / 2
    lower = 0.0 if k == 0 else solve(lambda p: 1 - anytime.binomial_cdf(k - 1, n, p))
    upper = 1.0 if k == n else solve(lambda p: -anytime.binomial_cdf(k, n, p) + 2 * a)
    return lower, upper


def tables(tr, labels, rule, loss):
    """(losses (n, T) float, steps (n, T) long 1..L) of every image at every threshold of GRIDS[rule]."""
    ref = tr["pred"][:, -1] if loss == "disagreement" else labels
    cols, steps = [], []
    for t in anytime.GRIDS[rule]:
        e = anytime.exit_steps(tr, rule, t)
        cols.append((tr["pred"].gather(1, e[:, None])[:, 0] != ref).float())
        steps.append(e + 1)
    return torch.stack(cols, 1), torch.stack(steps, 1)


def splits(losses, steps, budget, eps_list, delta, n_splits, method="binomial"):
    """{eps: [{threshold_index, risk, steps} per split]}: split s (torch.randperm(n, seed s), its first n // 2
    the calibration half: anytime.split) certifies with fixed_sequence; its realized risk and mean steps are the
    evaluation half's (no threshold certified: the full budget, its risk that of the last grid column's... none:
    the budget's own prediction, risk 0 for disagreement)."""
    out = {eps: [] for eps in eps_list}
    n = losses.shape[0]
    for s in range(n_splits):
        cal, ev = anytime.split(n, None, s)
        for eps in eps_list:
            j, _ = anytime.fixed_sequence(losses[cal], eps, delta, method)
            if j is None:
                out[eps].append({"threshold_index": None, "risk": None, "steps": float(budget)})
            else:
                out[eps].append({"threshold_index": j, "risk": float(losses[ev, j].mean()),
                                 "steps": float(steps[ev, j].float().mean())})
    return out


def summary(per_split, eps, delta, budget, full_risk):
    """The splits of one eps in numbers: violations (realized risk > eps), their rate and its 90 %
    Clopper-Pearson interval, the mean and (1 - delta) quantile of the realized risk, mean steps, blocks saved."""
    risks = [full_risk if r["risk"] is None else r["risk"] for r in per_split]
    k, n = sum(r > eps for r in risks), len(risks)
    q = sorted(risks)[min(n - 1, math.ceil((1 - delta) * n) - 1)]
    steps = sum(r["steps"] for r in per_split) / n
    return {"splits": n, "violations": k, "violation_rate": k / n, "violation_interval_90": clopper_pearson(k, n),
            "within_delta": k / n <= delta, "mean_risk": sum(risks) / n, "risk_quantile": q,
            "certified": sum(r["threshold_index"] is not None for r in per_split), "mean_steps": steps,
            "fraction_of_blocks": steps / budget, "saved": 1 - steps / budget}


def bench_ratios(model, x, rule, threshold, budget, device, warmup, repeats):
    """{batch: exit-path img/s over fixed-depth img/s} on the images x (N, C, H, W), each timed over all N
    images in batches of `batch` (bench.timed: warm-up, synchronize, median)."""
    out = {}
    for b in BENCH_BATCHES:
        parts = list(x.split(b))
        with torch.no_grad():
            fixed = bench.timed(lambda: [model(p, depth=budget) for p in parts], device, warmup, repeats)
            exit_ = bench.timed(lambda: [anytime.run(model, p, rule, threshold, budget) for p in parts], device,
                                warmup, repeats)
        out[b] = {"fixed_img_per_s": len(x) / fixed, "exit_img_per_s": len(x) / exit_, "ratio": fixed / exit_}
    return out


def study_run(path, args):
    """The study of one run folder (module docstring)."""
    ck = os.path.join(path, "ckpt.pt")
    model, val_set, run = anytime.load(types.SimpleNamespace(resume=ck, data_dir=args.data_dir, device=args.device))
    from training import registry
    budget = anytime.trained_steps(model)
    n = min(args.num_images or len(val_set), len(val_set))
    traces, labels = [], []
    for x, y in DataLoader(Subset(val_set, range(n)), args.batch_size, shuffle=False):
        traces.append(anytime.trace(model, x.to(args.device), budget))
        labels.append(y)
    tr = {k: torch.cat([t[k] for t in traces]) for k in traces[0]}
    labels = torch.cat(labels)
    res = {"model": run.model, "trained_depth": registry.trained_depth(run), "budget": budget,
           "blocks_per_step": model.blocks_per_step, "images": n, "checkpoint_sha256": anytime.file_sha256(ck),
           "full_top1": float(100 * (tr["pred"][:, -1] == labels).float().mean()), "rules": {}}
    for rule in args.rules:
        losses, steps = tables(tr, labels, rule, args.loss)
        full_risk = 0.0 if args.loss == "disagreement" else float((tr["pred"][:, -1] != labels).float().mean())
        per = splits(losses, steps, budget, args.eps, args.delta, args.splits, args.p_value)
        res["rules"][rule] = {str(eps): {**summary(per[eps], eps, args.delta, budget, full_risk), "per_split": per[eps]}
                              for eps in args.eps}
        print(f"{path} {rule}: " + "; ".join(
            f"eps {eps}: {s['violations']}/{s['splits']} over (90 % interval {100 * s['violation_interval_90'][0]:.0f}-"
            f"{100 * s['violation_interval_90'][1]:.0f} %), mean risk {100 * s['mean_risk']:.2f} %, "
            f"{100 * s['fraction_of_blocks']:.0f} % of blocks" for eps, s in
            ((e, res["rules"][rule][str(e)]) for e in args.eps)), flush=True)
    if args.bench:
        device = torch.device(args.device)
        warmup, repeats = (1, 1) if args.smoke else (3, 10) if device.type == "cuda" else (1, 3)
        cal, ev = anytime.split(n, None, 0)
        x = torch.stack([val_set[int(i)][0] for i in ev[:256]]).to(device)
        res["bench"] = {}
        for rule in args.rules:
            j = anytime.fixed_sequence(tables(tr, labels, rule, args.loss)[0][cal], 0.01, args.delta, args.p_value)[0]
            t = anytime.NEVER[rule] if j is None else anytime.GRIDS[rule][j]
            res["bench"][rule] = {"threshold": None if j is None else t, "images": len(x), "device": str(device),
                                  "batches": bench_ratios(model, x, rule, t, budget, device, warmup, repeats)}
    return res


def keep_run(run, res, out_dir, stamp):
    """Write run `run`'s part of the study `res` to OUT/ARM/seed<k>/ (module docstring): anytime_study.json, the
    study's done.json (`stamp`: where it ran) and the training run's done.json, args.json and log.jsonl as
    train_*. Returns the folder."""
    import shutil
    with open(os.path.join(run, "args.json")) as f:
        seed = json.load(f)["seed"]
    path = os.path.abspath(run)
    arm = os.path.basename(os.path.dirname(path) if os.path.basename(path).startswith("seed") else path)
    dest = os.path.join(out_dir, arm, f"seed{seed}")
    os.makedirs(dest, exist_ok=True)
    for name in ("done.json", "args.json", "log.jsonl"):
        if os.path.isfile(os.path.join(run, name)):
            shutil.copyfile(os.path.join(run, name), os.path.join(dest, "train_" + name))
    with open(os.path.join(dest, "anytime_study.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(dest, "done.json"), "w") as f:
        json.dump({**stamp, "study": "lab/anytime_study.py", "checkpoint": run,
                   "checkpoint_sha256": res["checkpoint_sha256"], "seconds": res["seconds"]}, f)
    return dest


def figure(res, path, eps_list, delta):
    plt = pyplot(path)
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    pct = [100 * e for e in eps_list]
    ax1.plot(pct, pct, "k--", lw=1, label="risk = eps")
    for run, r in res["runs"].items():
        for rule, by_eps in r["rules"].items():
            s = [by_eps[str(e)] for e in eps_list]
            line, = ax1.plot(pct, [100 * v["mean_risk"] for v in s], "o-", label=f"{os.path.basename(run)} {rule}")
            ax1.fill_between(pct, [0] * len(s), [100 * v["risk_quantile"] for v in s], color=line.get_color(), alpha=0.15)
            ax2.plot(pct, [100 * v["fraction_of_blocks"] for v in s], "o-", color=line.get_color())
    ax1.set(xlabel="eps (%)", ylabel="realized risk on the evaluation half (%)",
            title=f"mean, band to the {100 * (1 - delta):.0f} % quantile of the splits")
    ax2.set(xlabel="eps (%)", ylabel="block applications (% of the budget)", title="mean steps")
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def get_parser():
    p = flags.Parser(prog="anytime_study.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders holding ckpt.pt")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--splits", type=flags.positive(int), default=50, help="random calibration / evaluation splits")
    p.add_argument("--eps", type=flags.positive(float), nargs="+", default=list(EPS))
    p.add_argument("--delta", type=flags.positive(float), default=0.1)
    p.add_argument("--rules", nargs="+", default=["confidence", "kl"], choices=anytime.RULES)
    p.add_argument("--loss", default="disagreement", choices=anytime.LOSSES)
    p.add_argument("--p-value", default="binomial", choices=anytime.P_VALUES)
    p.add_argument("--num-images", type=flags.positive(int), help="the first N validation images (default: all)")
    p.add_argument("--data-dir")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch-size", type=flags.positive(int), default=256)
    p.add_argument("--bench", action="store_true", help="also the exit path's img/s over fixed depth at batch 1, 64, 256")
    p.add_argument("--smoke", action="store_true", help="--bench with one repeat: checks that it runs")
    return p


def main(argv=None):
    p = get_parser()
    args = p.parse_args(argv)
    bad = [e for e in args.eps + [args.delta] if not e < 1]
    if bad:
        p.error(f"--eps and --delta must be in (0, 1), got {bad[0]}")
    for run in args.runs:
        if not os.path.isfile(os.path.join(run, "ckpt.pt")):
            p.error(f"{run}: no ckpt.pt there; give run folders that hold one (a kept run without its checkpoint is "
                    "re-made first)")
    os.makedirs(args.out_dir, exist_ok=True)
    t0 = time.time()
    res = {"config": {k: getattr(args, k) for k in ("splits", "eps", "delta", "rules", "loss", "p_value", "num_images")},
           "runs": {}}
    for run in args.runs:
        if not os.path.isfile(os.path.join(run, "args.json")):
            p.error(f"{run}: no args.json there; give train.py's run folders")
    commit = provenance.commit()
    stamp = {"commit": commit, "commit_date": provenance.commit_date(commit), "cpu": provenance.cpu_model(),
             "threads": torch.get_num_threads(), "device": args.device}
    res["config"].update(stamp)
    try:
        for run in args.runs:
            t = time.time()
            res["runs"][run] = study_run(run, args)
            res["runs"][run]["seconds"] = time.time() - t
            keep_run(run, res["runs"][run], args.out_dir, stamp)
    except Fail as e:
        p.error(str(e))
    res["config"]["seconds"] = time.time() - t0
    out = os.path.join(args.out_dir, "anytime_study.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    figure(res, os.path.join(args.out_dir, "anytime_study.png"), args.eps, args.delta)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
