"""Summarize reViT's second regime at CPU scale (issue 39): students distilled from the study's ViT by its
final features alone, read by frozen probes and by their alignment with the teacher; RUNS/teacher.md.

    ARMS="vit revit-e1+feature-only revit-e4+feature-only" bash lab/reproduce_mini.sh
    python lab/summarize_teacher.py runs/mini [--results lab/docs/results.md --docs docs/models.md]

Reads RUNS/{vit, revit-e1+feature-only, revit-e4+feature-only}/seed<k>/ (finished runs: done.json) and
measures on the way, cached in each run's folder (a second call only reads):
- probe_linear.json, probe_seg.json, probe_depth.json: `probe.py --preset c100-probe-*` (CIFAR-100's
  linear probe; our dense analogue, CIFAR-100 mosaics segmented by class and regressed by zoom);
- alignment.json (students): `analyze.py --teacher RUNS/vit/seed<k>/ckpt.pt --num-images 256`.
The four claims (lab/claims.py, written before the runs; judged by claims.verdict on seeds paired, where
E=4's experts are at work, its eq. 6 / eq. 9 signature; `claims`):
(a) the distilled E=4 student keeps at least 95 % of its teacher's linear-probe top-1 (the paper: "retains
    nearly all");
(b) E=4 follows proportional teacher depth more closely than E=1: a higher rho and a lower MAD;
(c) most expert deletions cost less teacher CKA than random gate changes of the same merged-weight
    displacement (a deletion "costs less" when its CKA is above the random draws' mean by more than
    their standard deviation, "more" when below by more; the majority decides);
(d) every non-identity permutation of E=4's gate columns reduces the teacher CKA (by more than 1e-4).
Writes RUNS/teacher.md; --results / --docs put the claims / the per-arm table (probes, alignment) between the
files' <!-- teacher-claims --> / <!-- teacher-details --> markers.
"""
import argparse
import json
import math
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "lab"))
import claims as registry  # noqa: E402  (the claims and the one rule)
from summarize_mini import combine, finished_runs, fmt, study_runs, table, write_blocks  # noqa: E402

TEACHER, E1, E4 = "vit", "revit-e1+feature-only", "revit-e4+feature-only"
ARMS = [TEACHER, E1, E4]
PROBES = ("linear", "seg", "depth")
PAPER = {"a": "E=8 retains nearly all of its DINOv2 teacher's linear-probe top-1 (sec. 1, 4.2)",
         "b": "rho / MAD 0.969 / 1.54 at E=1 -> 0.999 / 0.23 at E=8 (App. D)",
         "c": "most deletions are less damaging than matched random gate perturbations (App. D)",
         "d": "no permutation matches the learned assignment: E=4 0.793 -> 0.208 on average (App. D)"}
TIE = 1e-4  # (d): a permutation within this of the identity's teacher CKA does not reduce it


def fail(msg):
    sys.stderr.write(f"summarize_teacher.py: error: {msg}\n")
    sys.exit(2)


def load_runs(root):
    """{arm: [{seed, dir, probe_* and alignment (each if measured)}]} of the finished runs of ARMS."""
    return finished_runs(root, ARMS, {**{f"probe_{t}": f"probe_{t}.json" for t in PROBES}, "alignment": "alignment.json"})


def measure(runs, root, data_dir):
    """Run what is not cached yet: each run's probes, each student's alignment with its seed's teacher."""
    import analyze
    import probe
    for arm, rs in runs.items():
        for r in rs:
            for task in PROBES:
                if f"probe_{task}" not in r:
                    print(f"probe {task}: {arm} seed {r['seed']}", flush=True)
                    if probe.cli(["--weights", os.path.join(r["dir"], "ckpt.pt"), "--preset", f"c100-probe-{task}",
                                  "--data-dir", data_dir, "--out-dir", r["dir"], "--seed", "0"]):
                        fail(f"probe.py failed on {r['dir']}")
                    r[f"probe_{task}"] = json.load(open(os.path.join(r["dir"], f"probe_{task}.json")))
            teacher = os.path.join(root, TEACHER, f"seed{r['seed']}", "ckpt.pt")
            if arm != TEACHER and "alignment" not in r and os.path.isfile(teacher):
                print(f"alignment: {arm} seed {r['seed']}", flush=True)
                if analyze.cli(["--resume", os.path.join(r["dir"], "ckpt.pt"), "--teacher", teacher, "--out-dir",
                                r["dir"], "--num-images", "256", "--data-dir", data_dir]):
                    fail(f"analyze.py --teacher failed on {r['dir']}")
                r["alignment"] = json.load(open(os.path.join(r["dir"], "alignment.json")))


def claims(runs):
    """The four claims (a)-(d): a list of (claim, paper, here, verdict) rows, each judged by claims.judge on the
    per-seed scores of its arms, paired by seed (a seed missing from either arm is left out)."""
    rows, claim = [], {c.key: c for c in registry.claims_of("teacher")}
    by_seed = {arm: {r["seed"]: r for r in runs.get(arm, [])} for arm in ARMS}
    record = lambda seeds: registry.mean_record([by_seed[E4][s]["last"] for s in seeds])  # noqa: E731 (the gate)

    def paired(arm_a, arm_b, key, f):
        seeds = [s for s in sorted(set(by_seed[arm_a]) & set(by_seed[arm_b]))
                 if key in by_seed[arm_a][s] and key in by_seed[arm_b][s]]
        return seeds, [f(by_seed[arm_a][s][key]) for s in seeds], [f(by_seed[arm_b][s][key]) for s in seeds]

    def res(half):
        return "-" if half is None or half == math.inf else f"{half:.2f}"

    seeds, s, t = paired(E4, TEACHER, "probe_linear", lambda p: p["top1"])
    if seeds:
        mean, half, v = registry.judge(claim["teacher-keeps-95"], s, [0.95 * x for x in t], None, record(seeds))
        here = f"E=4 {fmt(s)} % vs 95 % of the teacher's {fmt(t)} % ({mean:+.2f}, resolves {res(half)})"
        rows.append(("(a) the distilled E=4 student keeps >= 95 % of its teacher's linear-probe top-1", PAPER["a"],
                     here, v))
    else:
        rows.append(("(a) ... >= 95 % of the teacher's linear-probe top-1", PAPER["a"], "", "not run"))
    seeds, r4, r1 = paired(E4, E1, "alignment", lambda a: a["rho"])
    if seeds:
        _, m1, m4 = paired(E1, E4, "alignment", lambda a: a["mad"])
        rho = registry.judge(claim["teacher-rho"], r4, r1, None, record(seeds))
        mad = registry.judge(claim["teacher-mad"], m1, m4, None, record(seeds))
        here = (f"rho {fmt(r1)} -> {fmt(r4)} ({rho[2]}); MAD {fmt(m1)} -> {fmt(m4)} layers ({mad[2]})")
        rows.append(("(b) E=4 aligns closer to proportional teacher depth than E=1", PAPER["b"], here,
                     combine([rho[2], mad[2]]) if "not engaged" not in rho[2] + mad[2] else rho[2]))
    else:
        rows.append(("(b) E=4 aligns closer to proportional teacher depth than E=1", PAPER["b"], "", "not run"))
    a4 = [r for r in runs.get(E4, []) if r.get("alignment", {}).get("deletions")]
    if a4:
        less, more, fractions = 0, 0, []
        for r in a4:
            dels = r["alignment"]["deletions"]
            lo = [d["teacher_cka"] > statistics.mean(d["random"]) + statistics.pstdev(d["random"]) for d in dels]
            hi = [d["teacher_cka"] < statistics.mean(d["random"]) - statistics.pstdev(d["random"]) for d in dels]
            less, more = less + sum(lo), more + sum(hi)
            fractions.append(sum(lo) / len(dels))
        n = sum(len(r["alignment"]["deletions"]) for r in a4)
        _, half, v = registry.judge(claim["teacher-deletions"], fractions, [0.5] * len(fractions), None,
                                    record([r["seed"] for r in a4]))
        rows.append(("(c) expert deletions cost less teacher CKA than matched random gate changes", PAPER["c"],
                     f"{less} of {n} deletions cost less, {more} more (E=4, {len(a4)} seed{'s' if len(a4) != 1 else ''};"
                     f" per seed, the fraction costing less against 1/2)", v))
    else:
        rows.append(("(c) expert deletions cost less than matched random gate changes", PAPER["c"], "", "not run"))
    perms = [r for r in runs.get(E4, []) if r.get("alignment", {}).get("permutations")]
    if perms:
        base = [r["alignment"]["teacher_cka"] for r in perms]
        best = [max(p["teacher_cka"] for p in r["alignment"]["permutations"][1:]) for r in perms]
        others = [p["teacher_cka"] for r in perms for p in r["alignment"]["permutations"][1:]]
        lower = sum(v < b - TIE for r, b in zip(perms, base) for v in (p["teacher_cka"] for p in r["alignment"]["permutations"][1:]))
        _, half, v = registry.judge(claim["teacher-permutations"], base, best, None, record([r["seed"] for r in perms]))
        rows.append(("(d) every non-identity permutation of E=4's gate columns reduces teacher CKA", PAPER["d"],
                     f"{lower} of {len(others)} permutations lower; teacher CKA {fmt(base)} -> {statistics.mean(others):.3f} on "
                     f"average, the best permutation {fmt(best)} (identity vs best, resolves {res(half)})", v))
    else:
        rows.append(("(d) every non-identity gate permutation reduces teacher CKA", PAPER["d"], "", "not run"))
    return rows


def probe_table(runs):
    """Per arm: the probes and the alignment, mean ± half the spread over seeds."""
    rows = []
    for arm in ARMS:
        rs = runs.get(arm, [])
        col = lambda key, f: fmt([f(r[key]) for r in rs if key in r]) if any(key in r for r in rs) else ""
        rows.append([f"`{arm}`", len(rs), col("probe_linear", lambda p: p["top1"]), col("probe_seg", lambda p: p["miou"]),
                     col("probe_depth", lambda p: p["linear"]["rmse"]), col("probe_depth", lambda p: p["mlp"]["rmse"]),
                     col("alignment", lambda a: a["rho"]), col("alignment", lambda a: a["mad"]),
                     col("alignment", lambda a: a["teacher_cka"])])
    return table(["arm", "seeds", "linear probe top-1 (%)", "mosaic mIoU (%)", "zoom RMSE, linear", "zoom RMSE, MLP",
                  "rho", "MAD (layers)", "teacher CKA"], rows)


def main(argv=None):
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("runs", nargs="?", default="runs/mini")
    cli.add_argument("--results", metavar="FILE", help="write the claims between this file's <!-- teacher-claims --> "
                     "markers (lab/docs/results.md)")
    cli.add_argument("--docs", help="write the per-arm table between this file's <!-- teacher-details --> markers")
    cli.add_argument("--data-dir", default=os.environ.get("RVITS_DATA", "../shared/data"))
    cli.add_argument("--no-measure", action="store_true", help="only read what is cached")
    a = cli.parse_args(argv)
    runs = study_runs(a.runs, load_runs, ARMS, f"ARMS=\"{' '.join(ARMS)}\" bash lab/reproduce_mini.sh",
                      "summarize_teacher.py")
    if not a.no_measure:
        measure(runs, a.runs, a.data_dir)
    seeds = ", ".join(f"{arm} {len(rs)}" for arm, rs in runs.items())
    blocks = {"teacher-claims": table(["claim", "paper (reViT, arXiv 2610.12448)", "here: c100-mini, 32 px", "verdict"],
                                      claims(runs)) + f"\n\nSeeds: {seeds}; mean ± half the spread over seeds "
                                      "(lab/summarize_teacher.py).",
              "teacher-details": probe_table(runs) + "\n\nStudents distilled from the same seed's `c100-mini-vit` by "
                                 "its final features alone (`--task-weight 0`); probes `probe.py --preset c100-probe-*` "
                                 "(the dense ones on our CIFAR-100 mosaics, not ADE20k or NYUv2); alignment `analyze.py "
                                 "--teacher`, 256 test images; mean ± half the spread over seeds."}
    block = "\n\n".join(blocks.values())
    with open(os.path.join(a.runs, "teacher.md"), "w") as f:
        f.write("# reViT's second regime at CPU scale\n\n" + block + "\n")
    for path, name in ((a.results, "teacher-claims"), (a.docs, "teacher-details")):
        if path:
            write_blocks(path, {name: blocks[name]}, a.runs, prefix="teacher", tool="summarize_teacher.py",
                     figures=())
    print(block)


if __name__ == "__main__":
    main()
