"""Summarize the CIFAR-100 study at GPU scale (lab/gpu_study.sh): a table and a verdict per claim.

    python lab/summarize_gpu.py                                   # lab/results/gpu -> lab/results/gpu/summary.md
    python lab/summarize_gpu.py --add OUT/results.jsonl --results lab/docs/results.md   # after a GPU window

Reads RESULTS/results.jsonl (committed: one line per finished run, written by gpu_study.sh) and,
with --add FILE, a window's new lines, which it appends to RESULTS/results.jsonl (a run already
there, the same arm and seed, is not added twice, and a shortened run, e.g. of a --dry-run, never
is; --no-save leaves the file alone: the GPU machine does that), and the concurrency measured in
that window (FILE's folder's concurrency.jsonl) to RESULTS/concurrency.jsonl. Writes OUT/summary.md (OUT: --out, default RESULTS) with
- the arms' top-1 (mean ± half the spread over seeds, n seeds) at 0.5x-4x the trained depth, top-5,
  parameters, img/s, training minutes, and the commits and GPUs of its runs; an arm without a run
  says "not run yet";
- one verdict per registered claim (lab/claims.py: the mini study's and the GPU init claim; reViT's),
  by claims.verdict on seeds paired;
- OUT/depth.png (top-1 vs evaluation depth) and OUT/gates.png when matplotlib is installed.
--results lab/docs/results.md puts both tables between that page's <!-- gpu-table --> / <!-- gpu-verdicts -->
markers and copies the figures to docs/gpu_*.png. Standard library only (matplotlib optional).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_study import ARMS  # noqa: E402
import claims as registry  # noqa: E402
from summarize_mini import RULE, claims_table, figures, fmt, write_blocks  # noqa: E402

# The mini study's claims (lab/claims.py), same arm names; only the init claim differs: the GPU recipe trains with
# the default (timm) init, so its arm with the structured init is the one that should win (study "gpu").
GPU_CLAIMS = registry.claims_of("mini", "gpu")
MOE_CLAIMS = registry.claims_of("revit")
COMMAND = ("`python train.py --preset c100-gpu-ARM --seed K --data-dir gpu_data --compile --device cuda --amp bf16` "
           "(`--init structured` for vit+structured; the distilled arm adds `--teacher` the vit run of its seed and "
           "`--distill feature`), run by `lab/gpu_study.sh`")


def protocol(r):
    """Whether a result ran the protocol (not shortened by --max-steps or --val-subset)."""
    return not (r.get("max_steps") or r.get("val_subset"))


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def as_run(r):
    """A results.jsonl line -> summarize_mini's run dict (depths relative to the trained depth)."""
    depths = {int(k) / r["trained_depth"]: v[0] for k, v in r["depths"].items()}
    return {"seed": r["seed"], "acc": depths[1.0], "acc5": r["depths"][str(r["trained_depth"])][1],
            "depths": depths, "depth": r["trained_depth"], "params_m": r["params_m"], "gflops": r["gflops"],
            "train_s": r["train_s"], "wall_s": r.get("wall_s"), "img_per_s": r["img_per_s"], "gates": r.get("gates"),
            "max_steps": r.get("max_steps"), "val_subset": r.get("val_subset"),
            "where": f"{r['commit']} {r['gpu'].replace('NVIDIA ', '')}", "cpu": r["gpu"],
            "last": {k: r[k] for k in ("bal_loss", "div_loss", "mix_weights") if k in r}}


def summary(lines):
    """{"gpu-table", "gpu-verdicts"} -> markdown, over result lines."""
    runs = {}
    for r in lines:
        runs.setdefault(r["arm"], []).append(as_run(r))
    rel = sorted({k for rs in runs.values() for r in rs for k in r["depths"]} | {0.5, 1.0, 2.0, 4.0})
    short = sorted({f"{r['arm']} seed {r['seed']}" for r in lines if r.get("max_steps") or r.get("val_subset")})
    head = (f"Top-1 (%) on the 10,000 CIFAR-100 test images: mean ± half the spread (max - min) over seeds; "
            f"n = seeds. Columns: evaluation depth relative to the trained depth. Each run: {COMMAND}; "
            "commit and GPU per row.")
    if short:
        head += f" SHORTENED runs (--max-steps/--val-subset, not the protocol): {', '.join(short)}."
    table = [head, "", "| arm | n | trained depth | " + " | ".join(f"{k:.3g}x" for k in rel)
             + " | top-5 (1x) | params (M) | img/s | train min | commit, GPU |", "|---" * (len(rel) + 8) + "|"]
    for arm in ARMS + sorted(set(runs) - set(ARMS)):
        rs = runs.get(arm)
        if not rs:
            continue
        cells = " | ".join(fmt([r["depths"][k] for r in rs]) if all(k in r["depths"] for r in rs) else "" for k in rel)
        where = ", ".join(sorted({r["where"] for r in rs}))
        table.append(f"| {arm} | {len(rs)} | {rs[0]['depth']} | {cells} | {fmt([r['acc5'] for r in rs])} | "
                     f"{rs[0]['params_m']:.3f} | {statistics.median(r['img_per_s'] for r in rs):,.0f} | "
                     f"{statistics.mean(r['train_s'] for r in rs) / 60:.1f} | {where} |")
    missing = [arm for arm in ARMS if arm not in runs]
    if missing:  # one line, not a row each
        table += ["", f"Not run yet ({len(missing)} arms): {', '.join(missing)}."]
    decided = lambda claims: [c for c in claims if c.a in runs and c.b in runs]  # noqa: E731 (both arms ran)
    verdicts = [RULE.format(hw=registry.HARDWARE_NOISE)]
    for title, claims in (("", GPU_CLAIMS), ("reViT's comparisons:", MOE_CLAIMS)):
        if decided(claims):
            verdicts += ["", *([title, ""] if title else []), claims_table(decided(claims), runs)]
    undecided = len(GPU_CLAIMS) + len(MOE_CLAIMS) - len(decided(GPU_CLAIMS)) - len(decided(MOE_CLAIMS))
    if undecided == len(GPU_CLAIMS) + len(MOE_CLAIMS):
        verdicts = ["No claim has a verdict at GPU scale yet: each needs both of its arms."]
    elif undecided:
        verdicts += ["", f"{undecided} more claim(s) wait for an arm not run yet."]
    return {"gpu-table": "\n".join(table), "gpu-verdicts": "\n".join(verdicts)}, runs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="?", default="lab/results/gpu", help="folder of results.jsonl (default lab/results/gpu)")
    p.add_argument("--add", metavar="FILE", help="a window's results.jsonl (OUT of gpu_study.sh) to add")
    p.add_argument("--out", help="where summary.md and the figures go (default: the results folder)")
    p.add_argument("--no-save", action="store_true", help="with --add: do not append to RESULTS/results.jsonl")
    p.add_argument("--results", metavar="FILE", dest="page",
                   help="also write the tables into this file between its markers (lab/docs/results.md)")
    a = p.parse_args(argv)
    path = os.path.join(a.results, "results.jsonl")
    if not os.path.isdir(a.results) or (a.add and not os.path.isfile(a.add)):
        what = a.results if not os.path.isdir(a.results) else a.add
        sys.stderr.write(f"summarize_gpu.py: error: {what} does not exist (results: the folder of results.jsonl, "
                         "default lab/results/gpu; --add: the results.jsonl that gpu_study.sh wrote)\n")
        return 2
    lines = read(path) if os.path.isfile(path) else []
    new = read(a.add) if a.add else []
    keep = {(r["arm"], r["seed"]) for r in lines}
    added = []
    for r in new:  # one run per arm and seed: the first of each (a shortened run is never kept)
        if (r["arm"], r["seed"]) not in keep and protocol(r):
            keep.add((r["arm"], r["seed"]))
            added.append(r)
    shortened = [r for r in new if not protocol(r)]
    if a.page and shortened:
        sys.stderr.write("summarize_gpu.py: error: --results: a result ran shortened (--max-steps/--val-subset, "
                         f"e.g. a --dry-run), not the protocol; nothing was added and {a.page} keeps its tables\n")
        return 2
    if added and not a.no_save:
        with open(path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in added)
        window = os.path.join(os.path.dirname(a.add), "concurrency.jsonl")  # measured once per GPU: kept
        if os.path.isfile(window):
            with open(os.path.join(a.results, "concurrency.jsonl"), "a") as f:
                f.writelines(json.dumps(c) + "\n" for c in read(window) if not c.get("dry_run"))
    lines = lines + added + [r for r in shortened if a.no_save]  # a dry run's own summary shows them
    blocks, runs = summary(lines)
    out = a.out or a.results
    os.makedirs(out, exist_ok=True)
    text = "\n".join(["# CIFAR-100 at GPU scale (c100-gpu-*)", "", blocks["gpu-table"], "", blocks["gpu-verdicts"]]) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    figures(runs, out, title="c100-gpu: accuracy beyond the training horizon")
    if a.page:
        write_blocks(a.page, blocks, out, prefix="gpu", tool="summarize_gpu.py")
    print(text + (f"\n{len(added)} new run(s) added to {path}" if added and not a.no_save else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
