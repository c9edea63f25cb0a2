"""Summarize issue 80's study of the calibrated exit policy: its registered claims, a table and a figure.

    python lab/anytime_study.py runs/replication/bvit-ds/seed3 ... --out-dir runs/anytime-study --bench
    python lab/keep_results.py runs/anytime-study lab/results/anytime-policy
    python lab/summarize_anytime_policy.py lab/results/anytime-policy [--results lab/docs/results.md]

Reads each ARM/seed<k>/ of the study (anytime_study.py's per-run part: anytime_study.json, done.json, the
training run's train_log.jsonl) for the arms of lab/claims.ANYTIME_ARMS on the claims' fresh seeds, and judges
with claims.judge, the one rule, on the registered rule (confidence; the KL rule is shown, not judged):
- anytime-policy-risk-ARM: per seed the worst eps's violation rate (% of the splits whose realized risk on the
  evaluation half exceeds eps) against delta = 10 %, "<=" with margin 1 point, widened by the mean 90 %
  Clopper-Pearson half-width of those rates (the splits' sampling error, which the seeds do not show);
- anytime-policy-saves-ds: bvit-ds's % of the budget's block applications saved at eps 1 % (mean over the
  splits) against 30 %, ">" (gate: deep supervision at work, its training record's stage-0 loss);
- anytime-policy-wall-256: bvit-ds's exit-path img/s over fixed-depth img/s at batch 256 (split 0's policy at
  eps 1 %) against 1.0, ">".
Writes ROOT/summary.md and ROOT/policy.png or --figure (realized risk against eps with the band up to the splits'
(1 - delta) quantile, and the block applications, per arm: mean over seeds); with --results, the page's
<!-- anytime-policy --> block.
"""
import argparse
import json
import math
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "lab"), ROOT]
import claims as registry  # noqa: E402  (the claims and the one rule)
import kept  # noqa: E402  (a kept study's runs.jsonl)
from summarize_mini import fmt, table, write_blocks  # noqa: E402

RULE = "confidence"  # the registered rule (lab/claims.py, issue 80)
SHOWN = ("confidence", "kl")
EPS = ("0.005", "0.01", "0.02", "0.05")
DELTA = 10.0  # %


def load_runs(root):
    """{arm: [{seed, dir, study (anytime_study.json), done, last (the training log's last epoch)}]} of the
    study's runs of claims.ANYTIME_ARMS on claims.ANYTIME_SEEDS, seeds in order."""
    root = kept.unpacked(root)
    runs = {}
    for arm in registry.ANYTIME_ARMS:
        for seed in registry.ANYTIME_SEEDS:
            d = os.path.join(root, arm, f"seed{seed}")
            if not os.path.isfile(os.path.join(d, "anytime_study.json")):
                continue
            with open(os.path.join(d, "anytime_study.json")) as f:
                study = json.load(f)
            with open(os.path.join(d, "done.json")) as f:
                done = json.load(f)
            last = {}
            if os.path.isfile(os.path.join(d, "train_log.jsonl")):
                with open(os.path.join(d, "train_log.jsonl")) as f:
                    epochs = [json.loads(x) for x in f if x.strip()]
                last = next((r for r in reversed(epochs) if "epoch" in r), {})
            runs.setdefault(arm, []).append({"seed": seed, "dir": d, "study": study, "done": done, "last": last})
    return runs


def worst(study, rule=RULE):
    """(the largest violation rate over the eps, in %, and its 90 % Clopper-Pearson half-width, in points)."""
    by = study["rules"][rule]
    s = max((by[e] for e in EPS if e in by), key=lambda v: v["violation_rate"])
    lo, hi = s["violation_interval_90"]
    return 100 * s["violation_rate"], 100 * (hi - lo) / 2


def claims(runs):
    """The registered claims of the study: a list of (claim key, what was measured, verdict, a - b, half-width) rows
    (claims.judge's; None, None for a claim not run)."""
    claim = {c.key: c for c in registry.CLAIMS if c.study == "anytime-policy"}
    rows = []
    for arm in registry.ANYTIME_ARMS:
        c = claim[f"anytime-policy-risk-{arm}"]
        rs = runs.get(arm, [])
        if not rs:
            rows.append((c.key, f"{arm}: not run", "not run", None, None))
            continue
        w = [worst(r["study"]) for r in rs]
        rates, widen = [x for x, _ in w], statistics.mean(h for _, h in w)
        mean, half, v = registry.judge(c, rates, [DELTA] * len(rates), widen=widen)
        rows.append((c.key, f"{arm}: worst eps's violation rate {fmt(rates)} % of {rs[0]['study']['rules'][RULE]['0.01']['splits']} "
                     f"splits (delta {DELTA:g} %; resolves {'-' if half == math.inf else f'{half:.1f}'} points)", v, mean, half))
    ds = runs.get("bvit-ds", [])
    record = registry.mean_record([r["last"] for r in ds]) if ds else None
    c = claim["anytime-policy-saves-ds"]
    if ds:
        saved = [100 * r["study"]["rules"][RULE]["0.01"]["saved"] for r in ds]
        mean, half, v = registry.judge(c, saved, [30.0] * len(saved), record=record)
        rows.append((c.key, f"bvit-ds: {fmt(saved)} % of the block applications saved at eps 1 % (resolves "
                     f"{'-' if half == math.inf else f'{half:.1f}'} points)", v, mean, half))
    else:
        rows.append((c.key, "bvit-ds: not run", "not run", None, None))
    c = claim["anytime-policy-wall-256"]
    ratios = [r["study"]["bench"][RULE]["batches"]["256"]["ratio"] for r in ds if "bench" in r["study"]]
    if ratios:
        mean, half, v = registry.judge(c, ratios, [1.0] * len(ratios), record=record)
        rows.append((c.key, f"bvit-ds: exit path {fmt(ratios)}x the fixed-depth img/s at batch 256 (resolves "
                     f"{'-' if half == math.inf else f'{half:.2f}'})", v, mean, half))
    else:
        rows.append((c.key, "bvit-ds: not measured", "not run", None, None))
    return rows


def eps_table(runs):
    """Per arm, rule and eps: seeds, violations of the splits, mean realized risk, blocks applied, certified splits."""
    out = []
    for arm, rs in runs.items():
        for rule in SHOWN:
            for e in EPS:
                s = [r["study"]["rules"][rule][e] for r in rs if rule in r["study"]["rules"]]
                if not s:
                    continue
                out.append([f"`{arm}`", rule, f"{100 * float(e):g}", len(s),
                            " / ".join(f"{v['violations']}/{v['splits']}" for v in s),
                            fmt([100 * v["mean_risk"] for v in s]), fmt([100 * v["risk_quantile"] for v in s]),
                            fmt([100 * v["fraction_of_blocks"] for v in s]),
                            " / ".join(f"{v['certified']}" for v in s)])
    return table(["arm", "rule", "eps (%)", "seeds", "splits over eps (per seed)", "mean realized risk (%)",
                  "90 % quantile of the risk (%)", "blocks applied (% of budget)", "splits certified"], out)


def bench_table(runs):
    """Per arm and rule: the exit path's img/s over the fixed-depth forward at each batch size (eps 1 %)."""
    out = []
    for arm, rs in runs.items():
        for rule in SHOWN:
            b = [r["study"]["bench"][rule]["batches"] for r in rs if rule in r["study"].get("bench", {})]
            if b:
                bound = [1 / r["study"]["rules"][rule]["0.01"]["fraction_of_blocks"] for r in rs]
                out.append([f"`{arm}`", rule, len(b)] + [fmt([x[k]["ratio"] for x in b]) for k in ("1", "64", "256")]
                           + [fmt(bound)])
    return table(["arm", "rule", "seeds", "batch 1", "batch 64", "batch 256", "budget / mean steps at eps 1 %"], out) + (
        "\n\nEach cell: the exit path's img/s over the fixed-depth forward's on the same 256 evaluation images, split "
        "0's policy at eps 1 % (anytime_study.py --bench on the CPU: median of 3 repeats after 1 warm-up); the last "
        "column is what the saved block applications alone would give. A ratio above it is the timing's noise or "
        "the smaller batches' cache behaviour, not saved blocks.") if out else ""


def where(runs):
    """Where the study ran: commits, CPU models, threads, and which commits trained the checkpoints."""
    done = [r["done"] for rs in runs.values() for r in rs]
    trained = sorted({json.load(open(os.path.join(r["dir"], "train_done.json"))).get("commit", "?")
                      for rs in runs.values() for r in rs if os.path.isfile(os.path.join(r["dir"], "train_done.json"))})
    return (f"Study at commit {', '.join(sorted({d['commit'] for d in done}))} on {', '.join(sorted({d['cpu'] for d in done}))}"
            f" ({', '.join(sorted({str(d.get('threads')) for d in done}))} thread(s)); "
            f"checkpoints trained at {', '.join(trained) or '?'}; dates {', '.join(sorted({d['commit_date'] for d in done}))} (UTC).")


def blocks(runs):
    """The page's <!-- anytime-policy --> block: the claims, the per-eps table, the wall-time table, where it ran."""
    return "\n\n".join(x for x in (
        table(["claim", "measured (mean ± half the spread over seeds)", "verdict"], [list(r[:3]) for r in claims(runs)]),
        eps_table(runs), bench_table(runs), where(runs)) if x)


def figure(runs, path):
    """Realized risk against eps (mean over seeds, the band up to the splits' (1 - delta) quantile) and the block
    applications against eps, per arm, for the registered rule. Nothing without matplotlib."""
    from training.figures import pyplot
    plt = pyplot(path)
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    pct = [100 * float(e) for e in EPS]
    ax1.plot(pct, pct, "k--", lw=1, label="risk = eps")
    for arm, rs in runs.items():
        s = [[r["study"]["rules"][RULE][e] for r in rs] for e in EPS]
        line, = ax1.plot(pct, [100 * statistics.mean(v["mean_risk"] for v in x) for x in s], "o-", label=f"{arm} ({len(rs)} seeds)")
        ax1.fill_between(pct, [0] * len(pct), [100 * statistics.mean(v["risk_quantile"] for v in x) for x in s],
                         color=line.get_color(), alpha=0.15)
        ax2.plot(pct, [100 * statistics.mean(v["fraction_of_blocks"] for v in x) for x in s], "o-", color=line.get_color())
    ax1.set(xlabel="eps (%)", ylabel="realized disagreement, evaluation half (%)",
            title=f"{RULE} rule: mean; band to the splits' 90 % quantile", ylim=(0, None))
    ax2.set(xlabel="eps (%)", ylabel="block applications (% of the budget)", title="cost of the certified policy")
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("root", help="the study's folder (anytime_study.py's --out-dir) or its kept copy")
    cli.add_argument("--results", help="also write the <!-- anytime-policy --> block of this page")
    cli.add_argument("--figure", help="draw the figure here instead of ROOT/policy.png (docs/anytime_policy.png: the "
                     "models manual's and the results page's)")
    args = cli.parse_args(argv)
    if not os.path.isdir(args.root):
        cli.error(f"{args.root}: no such folder; give anytime_study.py's --out-dir or lab/results/anytime-policy")
    runs = load_runs(args.root)
    if not runs:
        cli.error(f"{args.root}: no run of {', '.join(registry.ANYTIME_ARMS)} on seeds "
                  f"{', '.join(map(str, registry.ANYTIME_SEEDS))} (ARM/seed<k>/anytime_study.json)")
    block = blocks(runs)
    with open(os.path.join(args.root, "summary.md"), "w") as f:
        f.write("# The calibrated exit policy (issue 80)\n\n" + block + "\n")
    figure(runs, args.figure or os.path.join(args.root, "policy.png"))
    if args.results:
        write_blocks(args.results, {"anytime-policy": block}, args.root, tool="summarize_anytime_policy.py", figures=())
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
