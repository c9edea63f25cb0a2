"""Summarize the reViT paper's Fig. 2 comparison at CPU scale (sec. 4.4, A.2-A.3; presets.fig2_arms): the
depth-only gate and the feature-only gate, students of the same seed's vit by its final features alone, after
the same elastic-depth stage, read by frozen probes at each evaluation depth; RUNS/fig2.md.

    ARMS=fig2 bash lab/reproduce_mini.sh
    python lab/summarize_fig2.py runs/mini [--results lab/docs/results.md] [--tasks linear,seg]

Reads RUNS/{revit-e4-fig2-elastic, revit-smear-fig2-elastic}/seed<k>/ (finished runs: done.json) and measures
on the way, cached in each run's folder (a second call only reads): probe_<task>_depth<N>.json, `probe.py --preset
c100-probe-<task> --depth N` at every depth of the run's --eval-depths (L = 6: 3, 4, 6, 8, 12, 24). Judges the
claims of lab/claims.py whose study is "fig2" with claims.verdict, seeds paired; a claim whose mechanism
signature (claims.engaged, on arm a's last epoch) fails reads "not engaged at this scale".
--results writes the claims and the probe table between the <!-- fig2-claims --> markers.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "lab"))
import claims as registry  # noqa: E402
from summarize_mini import finished_runs, fmt, study_runs, table, write_blocks  # noqa: E402

ARMS = ["revit-e4-fig2-elastic", "revit-smear-fig2-elastic"]
TASKS = ("linear", "seg", "depth")
METRIC = {"linear probe top-1": ("linear", lambda p: p["top1"]), "mosaic mIoU": ("seg", lambda p: p["miou"]),
          "zoom RMSE, linear": ("depth", lambda p: p["linear"]["rmse"])}


def fail(msg):
    sys.stderr.write(f"summarize_fig2.py: error: {msg}\n")
    sys.exit(2)


def load_runs(root):
    """{arm: [{seed, dir, args, last (the last epoch's log record), done, probe_<task>_depth<N>...}]}."""
    runs = finished_runs(root, ARMS, {"args": "args.json", "done": "done.json"})
    for rs in runs.values():
        for r in rs:
            with open(os.path.join(r["dir"], "log.jsonl")) as f:
                r["last"] = [json.loads(line) for line in f if '"epoch"' in line][-1]
            for name in os.listdir(r["dir"]):
                if name.startswith("probe_") and "_depth" in name and name.endswith(".json"):
                    r[name[:-5]] = json.load(open(os.path.join(r["dir"], name)))
    return runs


def claimed(claims=None):
    """{(arm, task, relative depth)} that the registered Fig. 2 claims read (`claims`: default, the registry's
    study "fig2"): what --claims-only measures (the linear probe at each claimed depth, the segmentation probe at
    L), a fraction of the whole table's cost."""
    out = set()
    for c in claims if claims is not None else registry.claims_of("fig2"):
        task = METRIC[c.metric][0]
        out |= {(c.a, task, c.depth), (c.b, task, c.depth if c.depth_b is None else c.depth_b)}
    return out


def measure(runs, data_dir, tasks, extra=(), only=None):
    """Run the probes not cached yet: each run at each of its --eval-depths, each of `tasks` (`extra`: more
    probe.py flags, e.g. a smoke test's --num-train); with `only` (claimed()), just the (arm, task, relative
    depth) it names. Seed by seed, so that an interrupted call has finished whole seeds' probes (each cached)."""
    import probe
    for arm, r in sorted(((arm, r) for arm, rs in runs.items() for r in rs), key=lambda x: x[1]["seed"]):
        for depth in r["args"]["eval_depths"]:
            for task in tasks:
                wanted = only is None or any(abs(depth - rel * r["args"]["depth"]) < 1e-9
                                             for a, t, rel in only if a == arm and t == task)
                if wanted and f"probe_{task}_depth{depth}" not in r:
                    print(f"probe {task} at depth {depth}: {arm} seed {r['seed']}", flush=True)
                    if probe.cli(["--weights", os.path.join(r["dir"], "ckpt.pt"), "--preset", f"c100-probe-{task}",
                                  "--depth", str(depth), "--data-dir", data_dir, "--out-dir", r["dir"], "--seed", "0", *extra]):
                        fail(f"probe.py failed on {r['dir']}")
                    r[f"probe_{task}_depth{depth}"] = json.load(
                        open(os.path.join(r["dir"], f"probe_{task}_depth{depth}.json")))


def score(r, metric, rel):
    """The run's `metric` at `rel` x its trained depth, or None when not measured (or not a whole step)."""
    task, get = METRIC[metric]
    depth = rel * r["args"]["depth"]
    if abs(depth - round(depth)) > 1e-9:
        return None
    p = r.get(f"probe_{task}_depth{round(depth)}")
    return get(p) if p else None


def judge(claim, runs):
    """(here: the scores in words, the smallest difference the seeds resolve, verdict) of one claim."""
    a, b = runs.get(claim.a, []), runs.get(claim.b, [])
    seeds = sorted({r["seed"] for r in a} & {r["seed"] for r in b})
    ra, rb = ({r["seed"]: r for r in rs} for rs in (a, b))
    rel_b = claim.depth if claim.depth_b is None else claim.depth_b
    pairs = [(score(ra[s], claim.metric, claim.depth), score(rb[s], claim.metric, rel_b)) for s in seeds]
    pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
    if not pairs:
        return "", "", "not run"
    xa, xb = [x for x, _ in pairs], [y for _, y in pairs]
    cpus = [(ra[s]["done"].get("cpu"), rb[s]["done"].get("cpu")) for s in seeds][:len(pairs)]
    gated = {r["seed"]: r for r in runs.get(claim.gated or claim.a, [])}
    mean, half, v = registry.judge(claim, xa, xb, cpus, registry.mean_record([gated[s]["last"] for s in seeds if s in gated]))
    here = f"{fmt(xa)} vs {fmt(xb)} ({mean:+.2f}, {len(pairs)} seed{'s' if len(pairs) > 1 else ''})"
    return here, "" if half == float("inf") else f"{half:.2f}", v


def rel_name(x):
    return {0.5: "1/2 L", 2 / 3: "2/3 L", 1: "L", 4 / 3: "4/3 L", 2: "2 L", 4: "4 L"}.get(x, f"{x:g} L")


def claims_block(runs):
    rows = []
    for c in (c for c in registry.CLAIMS if c.study == "fig2"):
        rel_b = c.depth if c.depth_b is None else c.depth_b
        arms = (f"`{c.a}` at {rel_name(c.depth)} vs " + (f"at {rel_name(rel_b)}" if c.a == c.b else
                                                         f"`{c.b}` at {rel_name(rel_b)}"))
        want = "a > b" if c.kind == ">" else f"a - b <= {c.margin:g}" if c.kind == "<=" else f"a - b within ±{c.margin:g}"
        here, resolves, v = judge(c, runs) if runs else ("", "", "not run")
        rows.append([f"{c.key}: \"{c.words}\" ({c.where})", arms, f"{c.metric}, {want}", here, resolves, v])
    return table(["claim (reViT, arXiv 2610.12448)", "arms", "score, kind", "here (mean ± half the spread)",
                  "resolves (points)", "verdict"], rows)


def probe_table(runs):
    """Per arm and depth: the probes, mean ± half the spread over seeds."""
    rows = []
    for arm in ARMS:
        rs = runs.get(arm, [])
        depths = sorted({d for r in rs for d in r["args"]["eval_depths"]})
        for d in depths:
            cells = []
            for metric in METRIC:
                task, get = METRIC[metric]
                vals = [get(r[f"probe_{task}_depth{d}"]) for r in rs if f"probe_{task}_depth{d}" in r]
                cells.append(fmt(vals) if vals else "")
            rows.append([f"`{arm}`", d, len(rs), *cells])
    return table(["arm", "depth", "seeds", *METRIC], rows)


def blocks(runs):
    return (claims_block(runs) + "\n\nL = 6 (presets.FIG2_L); students of the same seed's `c100-mini-vit` by its final "
            "features alone, then elastic depth (depth dropout 0.3); probes `probe.py --preset c100-probe-* --depth N` "
            "(the dense ones on our CIFAR-100 mosaics, not ADE20k or NYUv2). Verdicts: lab/claims.py's rule (90 % "
            "t-interval on the per-seed differences); \"resolves\": the interval's half-width (lab/summarize_fig2.py)."
            + ("\n\n" + probe_table(runs) if runs else ""))


def main(argv=None):
    from training import flags  # (the number types and one-line errors of every tool)
    cli = flags.Parser(prog="summarize_fig2.py", description=__doc__.split("\n\n")[0])
    cli.add_argument("runs", nargs="?", default="runs/mini")
    cli.add_argument("--results", metavar="FILE", help="write the claims and the probe table between this file's "
                     "<!-- fig2-claims --> markers (lab/docs/results.md)")
    cli.add_argument("--data-dir", default=os.environ.get("RVITS_DATA", "../shared/data"))
    cli.add_argument("--tasks", default=",".join(TASKS), help="probes to measure (default: linear,seg,depth)")
    cli.add_argument("--no-measure", action="store_true", help="only read what is cached")
    cli.add_argument("--claims-only", action="store_true", help="measure only the probes the registered claims read "
                     "(linear at each claimed depth, seg at L): the table's other cells stay empty")
    cli.add_argument("--num-train", type=flags.positive(int), help="probe.py --num-train (a smoke test: fewer images, not the protocol)")
    cli.add_argument("--num-test", type=flags.positive(int), help="probe.py --num-test (a smoke test)")
    a = cli.parse_args(argv)
    tasks = a.tasks.split(",")
    if set(tasks) - set(TASKS):
        fail(f"--tasks {a.tasks}: allowed: {', '.join(TASKS)}")
    runs = study_runs(a.runs, load_runs, ARMS, "ARMS=fig2 bash lab/reproduce_mini.sh", "summarize_fig2.py")
    if not a.no_measure:
        extra = [x for k in ("num_train", "num_test") if getattr(a, k) for x in (f"--{k.replace('_', '-')}", str(getattr(a, k)))]
        measure(runs, a.data_dir, tasks, extra, claimed() if a.claims_only else None)
    text = blocks(runs)
    with open(os.path.join(a.runs, "fig2.md"), "w") as f:
        f.write("# The reViT paper's Fig. 2 at CPU scale\n\n" + text + "\n")
    if a.results:
        write_blocks(a.results, {"fig2-claims": text}, a.runs, prefix="fig2", tool="summarize_fig2.py", figures=())
    print(text)


if __name__ == "__main__":
    main()
