"""Summarize anytime inference on the CPU-scale study's checkpoints (issue 40): RUNS/anytime.md and a figure.

    bash lab/reproduce_mini.sh        # (or ARMS="vit bvit bvit-ds revit-e4 revit-e4-elastic srvit-r2 odevit-euler")
    python lab/summarize_anytime.py runs/mini [--results lab/docs/results.md]

For each finished run of ARMS it runs (once; cached in the run's folder) `analyze.py --anytime --out-dir
RUN --num-images N` and `bench.py --only anytime --anytime RUN` (bench_anytime.json), then writes a table
(per arm and rule: the mean steps that keep full-depth top-1 within 0.5 points, as a fraction of the
trained depth's block applications, and the wall-clock ratio of the exit path over the fixed-depth
forward), RUNS/anytime.png (top-1 against mean block applications, one panel per arm) and the two
claims (ours, not a paper's; lab/claims.py, written before the runs), judged by claims.verdict (`claims`):
(a) with deep supervision (bvit-ds), per-image exit keeps full-depth top-1 at no more than 60 % of the
    block applications (the best rule's operating point; 100 % when no threshold keeps it);
(b) for every recurrent arm, the best exit rule beats fixed-depth truncation at equal mean compute: the
    (rule, threshold) with the largest top-1 gain over the fixed-depth curve (interpolated) is chosen on
    half the test images and its gain scored on the other half (lab/analysis/anytime.heldout_gain), so that
    choosing the best of ~90 pairs does not make a gain by itself; the rule's t-interval runs over the seeds'
    gains, widened by twice the standard error of the mean gain over the scored images (readouts on the same
    images: no CPU-model widening).
"""
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "lab"))
from training import flags  # noqa: E402  (the number types of every tool's flags)
import claims as registry  # noqa: E402  (the claims and the one rule)
from summarize_mini import combine, finished_runs, fmt, table, write_blocks  # noqa: E402

ARMS = ["vit", "bvit", "bvit-ds", "revit-e4-elastic", "srvit-r2", "odevit-euler"]  # reViT: its elastic variant (A.2)
RECURRENT = ARMS[1:]
RULES = ("confidence", "kl", "update", "second-order")
LIMIT = 0.6  # claim (a): at most 60 % of the block applications


def fail(msg):
    sys.stderr.write(f"summarize_anytime.py: error: {msg}\n")
    sys.exit(2)


def load_runs(root):
    """{arm: [{seed, dir, anytime (if measured), bench (if measured)}]} of the finished runs of ARMS."""
    return finished_runs(root, ARMS, {"anytime": "anytime.json", "bench": "bench_anytime.json"})


def measure(runs, num_images, data_dir):
    import analyze
    for arm, rs in runs.items():
        for r in rs:
            old = r.get("anytime")
            if old and ("heldout" not in old or old["num_images"] != num_images):  # an older analysis: redone,
                r.pop("anytime"), r.pop("bench", None)  # and the timing at its operating points with it
            if "anytime" not in r:
                print(f"anytime: {arm} seed {r['seed']} ({num_images} images)", flush=True)
                if analyze.cli(["--resume", os.path.join(r["dir"], "ckpt.pt"), "--anytime", "--out-dir", r["dir"],
                                "--num-images", str(num_images), "--data-dir", data_dir]):
                    fail(f"analyze.py --anytime failed on {r['dir']}")
                r["anytime"] = json.load(open(os.path.join(r["dir"], "anytime.json")))
            if "bench" not in r:
                path = os.path.join(r["dir"], "bench_anytime.json")
                env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
                if subprocess.run([sys.executable, os.path.join(ROOT, "lab", "bench_anytime.py"), r["dir"], "--device",
                                   "cpu", "--json", path], env=env).returncode:
                    fail(f"bench_anytime.py failed on {r['dir']}")
                r["bench"] = json.load(open(path))


def fraction(a):
    """The best rule's operating point as a fraction of the trained depth's block applications (1.0 when no
    rule keeps full-depth top-1 within 0.5 points)."""
    ops = [v["operating_point"]["fraction_of_trained"] for v in a["rules"].values() if v["operating_point"]]
    return min(ops, default=1.0)


def claims(runs):
    """Claims (a) and (b): a list of (claim, here, verdict) rows."""
    rows, claim = [], {c.key: c for c in registry.claims_of("anytime")}
    ds_runs = [r for r in runs.get("bvit-ds", []) if "anytime" in r]
    if ds_runs:
        ds = [100 * fraction(r["anytime"]) for r in ds_runs]
        _, half, v = registry.judge(claim["anytime-ds-60"], [100 * LIMIT] * len(ds), ds, None,
                                    registry.mean_record([r["last"] for r in ds_runs]))
        rows.append((f"(a) with deep supervision, per-image exit keeps full-depth top-1 at <= {LIMIT:.0%} of the "
                     "block applications", f"bvit-ds: {fmt(ds)} % of them (best rule; resolves "
                     + ("-" if half == math.inf else f"{half:.2f}") + " points)", v))
    else:
        rows.append(("(a) with deep supervision, per-image exit keeps full-depth top-1 at <= 60 %", "", "not run"))
    per_arm = []
    for arm in RECURRENT:
        held = [r["anytime"]["heldout"] for r in runs.get(arm, []) if "heldout" in r.get("anytime", {})]
        if held:
            gains = [h["gain"] for h in held]
            # readouts of checkpoints on the same images: widened by twice the standard error of the mean gain over
            # the scored images, which the seeds' spread does not show
            sampling = 2 * math.sqrt(sum(h["se"] ** 2 for h in held)) / len(held)
            _, half, v = registry.judge(claim[f"anytime-exit-{arm}"], gains, [0.0] * len(gains), widen=sampling)
            per_arm.append((arm, gains, "/".join(sorted({h["rule"] for h in held})), half, v))
    if per_arm:
        v = combine([w.split(" (")[0] for *_, w in per_arm])
        if len(per_arm) < len(RECURRENT) and "disagree" not in v:  # "every arm": one that disagrees suffices
            v = f"{v}, on {len(per_arm)} of {len(RECURRENT)} arms so far"
        rows.append(("(b) for every recurrent arm, the best exit rule beats fixed-depth truncation at equal compute "
                     "(chosen on half the test images, scored on the other half)",
                     "; ".join(f"{arm} {fmt(g)} points ({rule}; resolves {'-' if n == math.inf else f'{n:.2f}'}: {w})"
                               for arm, g, rule, n, w in per_arm)
                     + "".join(f"; {arm} not run" for arm in RECURRENT if arm not in {a for a, *_ in per_arm}), v))
    else:
        rows.append(("(b) the best exit rule beats fixed-depth truncation at equal compute", "", "not run"))
    return rows


def rule_table(runs):
    rows = []
    for arm in ARMS:
        rs = [r for r in runs.get(arm, []) if "anytime" in r]
        if not rs:
            continue
        cells = []
        for rule in RULES:
            ops = [r["anytime"]["rules"][rule]["operating_point"] for r in rs]
            if not all(ops):
                cells.append("never within 0.5")
                continue
            bps = rs[0]["anytime"]["blocks_per_step"]
            ratio = [r["bench"].get(f"anytime_{rule}_over_fixed_img_per_s") for r in rs if "bench" in r]
            ratio = [x for x in ratio if x is not None]
            cells.append(f"{fmt([o['applications'] / bps for o in ops])} steps ({fmt([100 * o['fraction_of_trained'] for o in ops])} %)"
                         + (f", {fmt(ratio)}x img/s" if ratio else ""))
        rows.append([f"`{arm}`", len(rs), fmt([r["anytime"]["full_top1"] for r in rs]), *cells,
                     ", ".join(sorted({r["anytime"]["behaviour"] or "-" for r in rs}))])
    return table(["arm", "seeds", "full-depth top-1 (%)", *RULES, "beyond the trained depth"], rows)


def figure(runs, root):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no figure (pip install matplotlib)")
        return
    arms = [a for a in ARMS if any("anytime" in r for r in runs.get(a, []))]
    if not arms:
        return
    fig, axes = plt.subplots(1, len(arms), figsize=(3.3 * len(arms), 3), sharey=True, squeeze=False)
    for ax, arm in zip(axes[0], arms):
        a = next(r["anytime"] for r in runs[arm] if "anytime" in r)  # the first seed
        ax.plot([p["applications"] for p in a["fixed"]], [p["top1"] for p in a["fixed"]], "k.-", label="fixed depth")
        for rule, v in a["rules"].items():
            ax.plot([p["applications"] for p in v["curve"]], [p["top1"] for p in v["curve"]], ".-", ms=2, label=rule)
        ax.plot([a["oracle"]["applications"]], [a["oracle"]["top1"]], "r*", label="oracle")
        ax.set(title=arm, xlabel="mean block applications")
    axes[0][0].set_ylabel("top-1 (%)")
    axes[0][-1].legend(fontsize=6)
    fig.savefig(os.path.join(root, "anytime.png"), dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    cli = flags.Parser(prog="summarize_anytime.py", description=__doc__.split("\n\n")[0])
    cli.add_argument("runs", nargs="?", default="runs/mini")
    cli.add_argument("--results", metavar="FILE", help="write the claims and the table between this file's "
                     "<!-- anytime --> markers (lab/docs/results.md)")
    cli.add_argument("--num-images", type=flags.positive(int), default=10000, help="test images per analysis (10000: all of CIFAR-100's)")
    cli.add_argument("--data-dir", default=os.environ.get("RVITS_DATA", "../shared/data"))
    cli.add_argument("--no-measure", action="store_true", help="only read what is cached")
    a = cli.parse_args(argv)
    runs = load_runs(a.runs) if os.path.isdir(a.runs) else fail(f"{a.runs} is not a directory")
    if not runs:
        fail(f"no finished run of {', '.join(ARMS)} in {a.runs}; run lab/reproduce_mini.sh first")
    if not a.no_measure:
        measure(runs, a.num_images, a.data_dir)
    images = sorted({r["anytime"]["num_images"] for rs in runs.values() for r in rs if "anytime" in r})
    block = (table(["claim", "here: c100-mini, 32 px", "verdict"], claims(runs)) + "\n\n" + rule_table(runs)
             + f"\n\nEach cell: mean steps (and % of the trained depth's block applications) at the fewest that keep "
             f"full-depth top-1 within 0.5 points, and the exit path's img/s over the fixed-depth forward (bench.py); "
             f"{'/'.join(str(n) for n in images)} test images; mean ± half the spread over seeds "
             f"(lab/summarize_anytime.py).")
    with open(os.path.join(a.runs, "anytime.md"), "w") as f:
        f.write("# Anytime inference at CPU scale\n\n" + block + "\n")
    figure(runs, a.runs)
    if a.results:
        write_blocks(a.results, {"anytime": block}, a.runs, prefix="mini", tool="summarize_anytime.py",
                     figures=("anytime",))
    print(block)


if __name__ == "__main__":
    main()
