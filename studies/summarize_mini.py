"""Summarize the CPU-scale CIFAR-100 study (studies/reproduce_mini.sh): RUNS/summary.md and figures.

    python studies/summarize_mini.py runs/mini
    python studies/summarize_mini.py runs/mini --results docs/results.md --docs docs/models.md   # also the tables


Reads RUNS/<arm>/seed<k>/{log.jsonl, depth_eval.json, done.json} (finished runs only) and writes
- RUNS/summary.md: top-1 per arm (mean, spread over seeds = max - min, n seeds) at each evaluation
  depth, and one verdict per claim of the papers: "agree", "disagree" or "cannot tell" (the difference
  of the means is within the seed spread, see `verdict`);
- RUNS/depth.png (top-1 vs evaluation depth per arm) and RUNS/gates.png (reViT E=4 gate table
  g_e(t) as a heat map), when matplotlib is installed (optional, not a requirement of rvits).
Standard library only, apart from the optional matplotlib.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import sys

# (claim as the paper states it, arm a, arm b, relative depth, what "agree" needs: a > b or a < b).
# A relative depth of 1 is the trained depth; 4 = four times it ("beyond the training horizon").
CLAIMS = [
    ("matched FLOPs: the untied ViT beats bViT (Training Crossroads)", "vit", "bvit", 1, ">"),
    ("matched parameters: the wider bViT beats the narrow untied ViT (Training Crossroads)",
     "bvit-wide", "vit-narrow", 1, ">"),
    ("deep supervision degrades gracefully beyond the horizon where naive recurrence collapses "
     "(4x depth; Training Crossroads)", "bvit-ds", "bvit", 4, ">"),
    ("deep supervision does not improve nominal accuracy (trained depth; Training Crossroads)",
     "bvit-ds", "bvit", 1, "<="),
    ("solver order at equal NFE: RK4 is no uniform gain over Euler (Training Crossroads)",
     "odevit-rk4", "odevit-euler", 1, "<="),
    ("solver order at equal NFE: Heun is no uniform gain over Euler (Training Crossroads)",
     "odevit-heun", "odevit-euler", 1, "<="),
    ("SR-ViT: R=2 recursions beat R=1 (SoftMoR)", "srvit-r2", "srvit-r1", 1, ">"),
    # Structured init (issue 50): its arms train an untied ViT on 8 x 8 patches (patch 4), every layer but the
    # attention at PyTorch's defaults, the paper's own baseline (c100-mini-init-*); written before the runs.
    ("(a) structured init beats PyTorch's default init, on 8x8 patches (structured init paper, small datasets; "
     "a reproduction with its code: CIFAR-100 73.40 vs 67.95)", "init-structured", "init-pytorch", 1, ">"),
    ("(b) structured init is not worse than mimetic init, both on PyTorch's default init, 8x8 patches (its "
     "earlier version: 70.46 vs 70.40)", "init-structured", "init-mimetic", 1, ">="),
]


ORDER = ["vit", "bvit", "bvit-wide", "vit-narrow", "bvit-ds", "odevit-euler", "odevit-heun", "odevit-rk4",
         "revit-e1", "revit-e4", "srvit-r1", "srvit-r2", "vit+default", "init-pytorch", "init-mimetic",
         "init-structured"]
# reViT's comparisons: arm -> what it is, in the order of the comparison table
MOE = {"revit-e4": "depth: E=4 merged by normalized depth (reViT), U = 1",
       "revit-lory": "Lory: E=4 merged per image from the state entering the step, U = 1",
       "revit-smear": "SMEAR: E=4 merged per image from its FFN input, no auxiliary loss, U = 1",
       "revit-deepseek": "DeepSeek-V3: 1 of 4 routed + 1 shared, ehr 2, sigmoid, bias balancer, U = 1",
       "revit-qwen3": "Qwen3: top-1 of 4, ehr 4, softmax renormalized, U = 1",
       "revit-moeut": "MoEUT: 1 of 4 standard FFN experts, sigmoid gate, U = 1",
       "revit-remoe": "ReMoE: 4 experts at ehr 1, ReLU gates, sparsity controller, U = 1",
       "revit-softmoe": "Soft-MoE: patch-count slots over 4 full-width experts, U = 1",
       "revit-e1": "E=1: the tied block",
       "revit-lora": "E=1 + layer-wise LoRA, rank 16 per step",
       "revit-e4+feature": "depth E=4, distilled from the same seed's vit (final features, weight 1)",
       "revit-e4-elastic": "revit-e4 continued 3 epochs with elastic depth (depth dropout 0.3; A.2)",
       "revit-e4-cont": "revit-e4 continued 3 epochs at fixed depth (the elastic arm's control)",
       "revit-e1-elastic": "revit-e1 continued 3 epochs with elastic depth (depth dropout 0.3; A.2)",
       "revit-e1-cont": "revit-e1 continued 3 epochs at fixed depth (the elastic arm's control)"}
# want: ">" a beats b; "~" a lands within the noise of b; ">=" a at least matches b (b does not beat it)
MOE_CLAIMS = [  # reViT paper, Table 5 and Table 3 (ImageNet-1k S/16, L = 12, U = 1; appendix B), Table 10 (B.1)
    ("reViT: E=4 depth-programmed experts beat E=1, both at fixed depth (reViT Table 5, S/16: 78.2 vs 70.6)",
     "revit-e4", "revit-e1", 1, ">"),
    *[(f"at U = 1, reViT E=4 beats {name} (Table 3: 78.2 vs {top1})", "revit-e4", f"revit-{arm}", 1, ">")
      for arm, name, top1 in (("deepseek", "DeepSeek-V3", "70.6"), ("qwen3", "Qwen3", "68.6"), ("moeut", "MoEUT", "67.8"),
                              ("remoe", "ReMoE", "70.1"), ("softmoe", "Soft-MoE", "69.2"))],
    ("Lory lands within the noise of reViT E=4 (Table 3: 77.9 vs 78.2)", "revit-lory", "revit-e4", 1, "~"),
    ("SMEAR lands within the noise of reViT E=4 (Table 3: 77.7 vs 78.2)", "revit-smear", "revit-e4", 1, "~"),
    ("reViT E=4 at least matches layer-wise LoRA (Table 10: 78.2 vs 77.6)", "revit-e4", "revit-lora", 1, ">="),
    ("final-feature distillation from a trained teacher beats supervised training alone (our control)",
     "revit-e4+feature", "revit-e4", 1, ">"),
]
# Elastic depth, the paper's second stage (Fig. 2's property, A.2-A.3): against the control continued
# identically at fixed depth (presets.elastic_arms), so that the extra epochs are not what is compared.
ELASTIC_CLAIMS = [
    ("elastic depth keeps the fixed-depth top-1 at the trained depth (within the noise; Fig. 2)",
     "revit-e4-elastic", "revit-e4-cont", 1, "~"),
    ("elastic depth degrades less than fixed depth at half the trained depth (Fig. 2)",
     "revit-e4-elastic", "revit-e4-cont", 0.5, ">"),
    ("elastic depth degrades less than fixed depth at twice the trained depth (Fig. 2)",
     "revit-e4-elastic", "revit-e4-cont", 2, ">"),
]


def load_runs(root):
    """{arm: [run, ...]} for every finished run; run = {seed, acc (trained depth), depths
    {relative depth: top-1}, wall_s, gates, params...}."""
    runs = {}
    found = sorted(os.listdir(root), key=lambda a: (ORDER.index(a) if a in ORDER else len(ORDER), a))
    for arm in found:
        arm_dir = os.path.join(root, arm)
        if not os.path.isdir(arm_dir):
            continue
        for seed_dir in sorted(os.listdir(arm_dir)):
            d = os.path.join(arm_dir, seed_dir)
            if not os.path.isfile(os.path.join(d, "done.json")):
                continue  # unfinished (or still running): not summarized
            try:
                run = load_run(d)
            except (OSError, ValueError, KeyError, IndexError, StopIteration) as e:
                print(f"summarize_mini.py: warning: skipping {d}: unreadable ({type(e).__name__}: {e})")
                continue
            runs.setdefault(arm, []).append(run)
    return runs


MODEL_LINE = re.compile(r"^[a-z]+: ([0-9.]+) M params, ([0-9.]+) GFLOPs/img")


def load_run(d):
    """One finished run folder -> run dict (see load_runs); raises on a missing or damaged file."""
    with open(os.path.join(d, "done.json")) as f:
        done = json.load(f)
    with open(os.path.join(d, "args.json")) as f:
        args = json.load(f)
    with open(os.path.join(d, "log.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    epochs = [r for r in recs if "epoch" in r]
    # trained depth in the unit of --eval-depths: recursions for SR-ViT, solver steps for ODEViT
    depth = args["recursions"] if args["model"] == "srvit" else args["depth"]
    log = os.path.join(d, "train.log")  # its model line: "revit: 0.365 M params, 0.032 GFLOPs/img, ..."
    with open(log if os.path.isfile(log) else os.path.join(d, "model.txt")) as f:  # (a kept run: model.txt)
        size = next(m for m in map(MODEL_LINE.match, f) if m)
    run = {"seed": args["seed"], "params_m": float(size[1]), "gflops": float(size[2]), "val_subset": args.get("val_subset"), "max_steps": args.get("max_steps"),
           "acc": epochs[-1]["val_acc1"], "acc5": epochs[-1]["val_acc5"],
           "wall_s": done["wall_s"], "train_s": sum(r["epoch_time_s"] for r in epochs),
           "img_per_s": statistics.mean(r["img_per_s"] for r in epochs),
           "gates": epochs[-1].get("gates"), "depth": depth, "depths": {1.0: epochs[-1]["val_acc1"]},
           "where": f"{done['commit']} {done['cpu']}" if "commit" in done else ""}  # runs before 2026-12-01: not recorded
    path = os.path.join(d, "depth_eval.json")
    if os.path.isfile(path):
        with open(path) as f:
            for row in json.load(f)["results"]:
                run["depths"][row["depth"] / depth] = row["val_acc1"]
    return run


def stats(values):
    """(mean, spread = max - min, n)."""
    return statistics.mean(values), max(values) - min(values), len(values)


def noise_floor(runs):
    """The protocol's seed noise: the largest top-1 spread of any arm with >= 2 seeds (0 if none).
    Used for arms run with one seed, whose own spread is unknown."""
    return max((stats([r["acc"] for r in rs])[1] for rs in runs.values() if len(rs) >= 2), default=0.0)


# The same run (c100-mini-srvit-r1, seed 0, code of commit 7cace80, one thread) on two CPU models: top-1 %.
# Other CPUs round differently (other SIMD kernels), and 3,900 steps carry the difference as far as a
# new seed would. Part of the noise of every verdict (docs/results.md, "CIFAR-100 at CPU scale").
CROSS_CPU = {"AMD EPYC (CPU-2, 2026-11-30)": 28.12, "Intel Xeon (2026-12-01, measured twice)": 29.77}
HARDWARE_NOISE = max(CROSS_CPU.values()) - min(CROSS_CPU.values())


def verdict(a, b, want, floor, hardware=0.0):
    """Compare top-1 lists a and b. The difference of the means counts only when it exceeds the
    noise: the seed spread, max(spread of a, spread of b), or `floor` (the protocol's seed noise)
    for an arm with one seed, and at least `hardware` (the same run's difference across CPU models,
    HARDWARE_NOISE for the mini study). want ">": the paper says a beats b; "<=": the paper says a
    does not beat b; ">=": a at least matches b (a clear loss disagrees); "~": a lands within the noise of
    b (a clear difference either way disagrees). Returns (verdict, difference of the means, the noise it
    was compared with)."""
    (ma, sa, na), (mb, sb, nb) = stats(a), stats(b)
    seed = max(sa if na > 1 else floor, sb if nb > 1 else floor)
    noise, diff = max(seed, hardware), ma - mb
    if want == ">":
        v = "agree" if diff > noise else "disagree" if diff < -noise else "cannot tell"
    elif want == ">=":  # a must not lose to b: a clear loss disagrees; a tie or a win agrees
        v = "disagree" if diff < -noise else "agree"
    elif want == "~":  # within the noise of each other
        v = "disagree" if abs(diff) > noise else "agree"
    else:  # "<=": a must not beat b: a clear win of a disagrees; a tie or a loss agrees
        v = "disagree" if diff > noise else "agree"
    if seed == 0 and min(na, nb) < 2:  # no seed spread measured yet: a lean, not a verdict
        v = f"leans {v} (one seed, spread unknown)"
    return v, diff, noise


def combine(parts):
    """One verdict from several of verdict()'s (a claim made of parts): agree when all agree, disagree when
    any disagrees, else cannot tell; a lean (a part judged on one seed) makes the whole a lean."""
    plain = [v.split(" (")[0].replace("leans ", "") for v in parts]
    v = "agree" if all(p == "agree" for p in plain) else "disagree" if "disagree" in plain else "cannot tell"
    return f"leans {v} (one seed, spread unknown)" if any(p.startswith("leans") for p in parts) else v


def fmt(values):
    m, s, n = stats(values)
    return f"{m:.2f} ± {s / 2:.2f}" if n > 1 else f"{m:.2f}"


def claims_table(claims, runs, floor, hardware=0.0):
    """The markdown verdict table of `claims` (see CLAIMS) over `runs` (`floor`, `hardware`: see verdict)."""
    out = ["| claim | a | b | depth | a - b (points) | noise | verdict |", "|---|---|---|---|---|---|---|"]
    for text, a, b, k, want in claims:
        if a not in runs or b not in runs or not all(k in r["depths"] for r in runs[a] + runs[b]):
            out.append(f"| {text} | {a} | {b} | {k}x | | | not run |")
            continue
        v, diff, noise = verdict([r["depths"][k] for r in runs[a]], [r["depths"][k] for r in runs[b]], want, floor,
                                 hardware)
        known = f"{noise:.2f}" if "leans" not in v else "unknown"
        out.append(f"| {text} | {a} | {b} | {k}x | {diff:+.2f} | {known} | {v} |")
    return "\n".join(out)


def summary(runs):
    """summary.md's blocks: {"mini-table", "mini-verdicts", "moe-table"} -> markdown (the names of
    docs/results.md's markers). The study table holds every arm but the comparison-only ones of MOE."""
    floor = noise_floor(runs)
    study = {arm: rs for arm, rs in runs.items() if arm in ORDER or arm not in MOE}
    rel = sorted({k for rs in runs.values() for r in rs for k in r["depths"]})
    subsets = sorted({r["val_subset"] for rs in runs.values() for r in rs} - {None})
    images = ("the 10,000 test images" if not subsets
              else f"the first {' or '.join(map(str, subsets))} test images (--val-subset)")
    short = sorted({r["max_steps"] for rs in runs.values() for r in rs} - {None})
    if short:
        images += f"; SHORTENED runs (--max-steps {' or '.join(map(str, short))}): not the protocol"

    recorded = any(r.get("where") for rs in runs.values() for r in rs)  # reproduce_mini.sh writes commit and CPU

    def cells(rs):
        return " | ".join(fmt([r["depths"][k] for r in rs]) if all(k in r["depths"] for r in rs) else "" for k in rel)

    table = [f"Top-1 (%) on {images}: mean ± half the spread (max - min) over seeds; n = seeds.",
             "Columns: evaluation depth relative to the trained depth (1x = as trained).", "",
             "| arm | n | trained depth | " + " | ".join(f"{k:g}x" for k in rel) + " | top-5 (1x) | train min | wall min |"
             + " commit, CPU |" * recorded, "|---" * (len(rel) + 6 + recorded) + "|"]
    for arm, rs in study.items():
        table.append(f"| {arm} | {len(rs)} | {rs[0]['depth']} | {cells(rs)} | {fmt([r['acc5'] for r in rs])} | "
                     f"{statistics.mean(r['train_s'] for r in rs) / 60:.1f} | {statistics.mean(r['wall_s'] for r in rs) / 60:.1f} |"
                     + f" {', '.join(sorted({r['where'] or 'not recorded' for r in rs}))} |" * recorded)
    noise_line = (f"Seed noise used for one-seed arms: {floor:.2f} points (the largest spread of an arm with "
                  "two or more seeds)." if any(len(rs) > 1 for rs in runs.values()) else
                  "Seed noise: unknown (no arm has two seeds yet), so one-seed comparisons are not verdicts.")
    noise_line += (f" Every verdict's noise is at least {HARDWARE_NOISE:.2f} points: the same run's top-1 on two "
                   "CPU models (" + " vs ".join(f"{v:.2f}" for v in CROSS_CPU.values()) + ").")
    moe = ["Same backbone (D=96, patch 8, 8 steps, fixed depth), recipe and task loss; params as stored "
           "(the expert bank counts in full), GFLOPs per image at the trained depth.", "",
           "| arm | FFN | n | params (M) | GFLOPs/img | " + " | ".join(f"{k:g}x" for k in rel) + " | train min |",
           "|---" * (len(rel) + 6) + "|"]
    for arm, what in MOE.items():
        if arm in runs:
            rs = runs[arm]
            moe.append(f"| {arm} | {what} | {len(rs)} | {rs[0]['params_m']:.3f} | {rs[0]['gflops']:.3f} | "
                       f"{cells(rs)} | {statistics.mean(r['train_s'] for r in rs) / 60:.1f} |")
    moe += ["", noise_line, "", claims_table(MOE_CLAIMS + ELASTIC_CLAIMS, runs, floor, HARDWARE_NOISE)]
    return {"mini-table": "\n".join(table),
            "mini-verdicts": noise_line + "\n\n" + claims_table(CLAIMS, runs, floor, HARDWARE_NOISE),
            "moe-table": "\n".join(moe)}


def markdown(blocks):
    """The text of summary.md."""
    return "\n".join(["# CPU-scale CIFAR-100 study (c100-mini-*)", "", blocks["mini-table"], "",
                      blocks["mini-verdicts"], "", "## reViT's comparisons", "",
                      blocks["moe-table"]]) + "\n"


def figures(runs, root, title="c100-mini: accuracy beyond the training horizon"):
    """depth.png and gates.png, if matplotlib is installed."""
    if not runs:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no figures (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = iter([":", "--", "-.", (0, (1, 3)), (0, (5, 5))] * 3)  # untied arms: reference lines
    greys = iter(["black", "dimgray", "darkgray", "black", "dimgray"] * 3)
    for arm, rs in runs.items():
        ks = sorted(k for k in rs[0]["depths"] if all(k in r["depths"] for r in rs))
        if len(ks) < 2:  # an untied model: its trained-depth accuracy as a reference line
            ax.axhline(statistics.mean(r["acc"] for r in rs), linestyle=next(styles), color=next(greys),
                       label=f"{arm} (n={len(rs)}, trained depth only)")
            continue
        m = [statistics.mean(r["depths"][k] for r in rs) for k in ks]
        lo = [m_ - min(r["depths"][k] for r in rs) for m_, k in zip(m, ks)]
        hi = [max(r["depths"][k] for r in rs) - m_ for m_, k in zip(m, ks)]
        ax.errorbar(ks, m, yerr=[lo, hi], marker="o", capsize=3, label=f"{arm} (n={len(rs)})")
    ax.axvline(1, color="lightgray", linewidth=1)  # the trained depth
    ax.set_xscale("log", base=2)
    ticks = sorted({k for rs in runs.values() for r in rs for k in r["depths"]})
    ax.set_xticks(ticks, [f"{k:g}x" for k in ticks])
    ax.set(xlabel="evaluation depth / trained depth", ylabel="CIFAR-100 top-1 (%)", title=title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.savefig(os.path.join(root, "depth.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)
    gates = next((r["gates"] for r in runs.get("revit-e4", []) if r["gates"]), None)
    if gates:
        fig, ax = plt.subplots(figsize=(4, 4))
        im = ax.imshow(gates, aspect="auto", cmap="viridis")
        ax.set(xlabel="expert e", ylabel="step t", title="reViT E=4: gate g_e(t)",
               xticks=range(len(gates[0])), yticks=range(len(gates)))
        fig.colorbar(im, ax=ax)
        fig.savefig(os.path.join(root, "gates.png"), dpi=120, bbox_inches="tight")
        plt.close(fig)


def table(header, rows):
    """A markdown table: the header's cells, then one row per list of cells."""
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def finished_runs(root, arms, cached):
    """{arm: [{seed, dir, KEY: the JSON of ROOT/ARM/seed<k>/FILE for each KEY: FILE of `cached` that
    exists}]} of the finished runs (done.json) of `arms`, seeds in order: what a study's summarizer reads."""
    runs = {}
    for arm in arms:
        arm_dir = os.path.join(root, arm)
        for seed_dir in sorted(os.listdir(arm_dir)) if os.path.isdir(arm_dir) else []:
            d = os.path.join(arm_dir, seed_dir)
            if os.path.isfile(os.path.join(d, "done.json")):
                run = {"seed": int(seed_dir[4:]), "dir": d}
                for key, name in cached.items():
                    if os.path.isfile(os.path.join(d, name)):
                        run[key] = json.load(open(os.path.join(d, name)))
                runs.setdefault(arm, []).append(run)
    return runs


def write_blocks(path, blocks, root, prefix="mini", tool="summarize_mini.py", figures=("depth", "gates")):
    """Put each block of `blocks` ({name: markdown}) between the <!-- NAME --> and <!-- /NAME -->
    markers of the file at `path` (docs/results.md, the results page; docs/models.md for the details)
    and copy the figures ROOT/FIG.png to PREFIX_FIG.png in the repository's docs/ folder: the file's
    own folder when it is docs/, else docs/ beside the file. The prose around the markers is for a
    person to update. Exits 2 with one line when the file lacks a block's markers."""
    text = open(path).read()
    for name, block in blocks.items():
        head, tail = f"<!-- {name} -->", f"<!-- /{name} -->"
        if head not in text or tail not in text:
            sys.stderr.write(f"{tool}: error: --results {path} has no {head} ... {tail} markers\n")
            sys.exit(2)
        before, rest = text.split(head, 1)
        text = before + head + "\n" + block.strip() + "\n" + tail + rest.split(tail, 1)[1]
    with open(path, "w") as f:
        f.write(text)
    here = os.path.dirname(os.path.abspath(path))
    docs = here if os.path.basename(here) == "docs" else os.path.join(here, "docs")
    for fig in figures:
        if os.path.exists(os.path.join(root, f"{fig}.png")):
            os.makedirs(docs, exist_ok=True)
            shutil.copy(os.path.join(root, f"{fig}.png"), os.path.join(docs, f"{prefix}_{fig}.png"))


def main(root, results=None, docs=None, only=None):
    """Summarize ROOT; with `results` (and `docs`) write the blocks there, or only the blocks named in `only`
    (e.g. ["moe-table"]: a folder holding one study's arms, whose other tables would be partial)."""
    if not os.path.isdir(root):
        sys.stderr.write(f"summarize_mini.py: error: {root} is not a directory; run studies/reproduce_mini.sh first\n")
        sys.exit(2)
    runs = load_runs(root)
    if not runs:
        sys.stderr.write(f"summarize_mini.py: error: no finished run in {root} (finished = has done.json); "
                         "run studies/reproduce_mini.sh first\n")
        sys.exit(2)
    blocks = summary(runs)
    text = markdown(blocks)
    unknown = sorted(set(only or ()) - set(blocks))
    if unknown:
        sys.stderr.write(f"summarize_mini.py: error: --blocks {','.join(unknown)}: allowed: {', '.join(blocks)}\n")
        sys.exit(2)
    blocks = {k: v for k, v in blocks.items() if not only or k in only}
    with open(os.path.join(root, "summary.md"), "w") as f:
        f.write(text)
    figures({arm: rs for arm, rs in runs.items() if arm in ORDER or arm not in MOE}, root)
    if results:
        short = sorted(f"{arm} seed {r['seed']}" for arm, rs in runs.items() for r in rs
                       if r["max_steps"] or r["val_subset"])
        if short:
            sys.stderr.write(f"summarize_mini.py: error: --results: {', '.join(short[:3])}{' ...' if len(short) > 3 else ''}"
                             f" ran shortened (--max-steps/--val-subset), not the protocol; {results} keeps its tables\n")
            sys.exit(2)
        # each block goes to --docs when that file holds its markers, else to --results (which says when it lacks them)
        in_docs = {k for k in blocks if docs and f"<!-- {k} -->" in open(docs).read()}
        write_blocks(results, {k: v for k, v in blocks.items() if k not in in_docs}, root)
        if in_docs:
            write_blocks(docs, {k: blocks[k] for k in in_docs}, root, figures=())
    print(text)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("runs", nargs="?", default="runs/mini")
    cli.add_argument("--results", metavar="FILE", help="also write the tables into this file between its markers "
                     "(docs/results.md)")
    cli.add_argument("--docs", help="with --results: a file holding some of the markers (docs/models.md: the moe-table)")
    cli.add_argument("--blocks", help="with --results: write only these comma-separated blocks (mini-table, "
                     "mini-verdicts, moe-table), e.g. moe-table for a folder of reViT's arms alone")
    a = cli.parse_args()
    main(a.runs, a.results, a.docs, a.blocks.split(",") if a.blocks else None)
