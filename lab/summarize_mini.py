"""Summarize the CPU-scale CIFAR-100 study (lab/reproduce_mini.sh): RUNS/summary.md and figures.

    python lab/summarize_mini.py runs/mini
    python lab/summarize_mini.py runs/mini --results lab/docs/results.md --docs docs/models.md   # also the tables


Reads RUNS/<arm>/seed<k>/{log.jsonl, depth_eval.json, done.json} (finished runs only) and writes
- RUNS/summary.md: top-1 per arm (mean, spread over seeds = max - min, n seeds) at each evaluation
  depth, and one verdict per registered claim (lab/claims.py, studies "mini" and "init"; reViT's, study
  "revit", in the comparison table): "agree", "disagree", "cannot tell" (claims.verdict, seeds paired) or "not
  engaged at this scale" (its mechanism's signature failed);
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from presets import SEARCH  # noqa: E402  (the engagement search's candidates)
import claims as registry  # noqa: E402  (the claims and the one rule: lab/claims.py)
import kept  # noqa: E402  (a kept study's runs.jsonl, unpacked)

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
       "revit-e1-cont": "revit-e1 continued 3 epochs at fixed depth (the elastic arm's control)",
       **{f"revit-search-{k}": f"engagement search: E=4 with {what}" for k, (what, _) in SEARCH.items()}}
def load_runs(root):
    """{arm: [run, ...]} for every finished run; run = {seed, acc (trained depth), depths
    {relative depth: top-1}, wall_s, gates, params...}."""
    root = kept.unpacked(root)  # (a kept study: its runs.jsonl's folders)
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
    kept = os.path.join(d, "model.txt")  # (a kept run: model.txt; none in runs kept before it was kept)
    size = None
    if os.path.isfile(log) or os.path.isfile(kept):
        with open(log if os.path.isfile(log) else kept) as f:
            size = next(m for m in map(MODEL_LINE.match, f) if m)
    run = {"seed": args["seed"], "params_m": float(size[1]) if size else None, "gflops": float(size[2]) if size else None, "val_subset": args.get("val_subset"), "max_steps": args.get("max_steps"),
           "acc": epochs[-1]["val_acc1"], "acc5": epochs[-1]["val_acc5"],
           "wall_s": done["wall_s"], "train_s": sum(r["epoch_time_s"] for r in epochs),
           "img_per_s": statistics.mean(r["img_per_s"] for r in epochs),
           "gates": epochs[-1].get("gates"), "depth": depth, "depths": {1.0: epochs[-1]["val_acc1"]},
           "where": f"{done['commit']} {done['cpu']}" if "commit" in done else "",  # runs before 2026-12-01: not recorded
           "cpu": done.get("cpu"), "last": epochs[-1]}
    path = os.path.join(d, "depth_eval.json")
    if os.path.isfile(path):
        with open(path) as f:
            for row in json.load(f)["results"]:
                run["depths"][row["depth"] / depth] = row["val_acc1"]
    return run


def stats(values):
    """(mean, spread = max - min, n)."""
    return statistics.mean(values), max(values) - min(values), len(values)


CROSS_CPU, HARDWARE_NOISE = registry.CROSS_CPU, registry.HARDWARE_NOISE  # (where the rule's widening is defined)


def combine(parts):
    """One verdict from several of claims.verdict()'s (a claim made of parts): agree when all agree, disagree when
    any disagrees, else cannot tell."""
    plain = [p.split(" (")[0] for p in parts]  # (without claims.judge's notes: "(2 of 3 seeds)")
    return "agree" if all(p == "agree" for p in plain) else "disagree" if "disagree" in plain else "cannot tell"


def fmt(values):
    m, s, n = stats(values)
    return f"{m:.2f} ± {s / 2:.2f}" if n > 1 else f"{m:.2f}"


def paired(claim, runs):
    """(a's scores, b's scores, CPU pairs, the gated arm's mean last-epoch record) over the seeds both arms ran
    at the claim's depths (runs: load_runs')."""
    rel_b = claim.depth if claim.depth_b is None else claim.depth_b
    ra, rb = ({r["seed"]: r for r in runs.get(arm, [])} for arm in (claim.a, claim.b))
    seeds = [s for s in sorted(set(ra) & set(rb)) if claim.depth in ra[s]["depths"] and rel_b in rb[s]["depths"]]
    gated = {r["seed"]: r for r in runs.get(claim.gated or claim.a, [])}
    return ([ra[s]["depths"][claim.depth] for s in seeds], [rb[s]["depths"][rel_b] for s in seeds],
            [(ra[s].get("cpu"), rb[s].get("cpu")) for s in seeds],
            registry.mean_record([gated[s].get("last") for s in seeds if s in gated]))


def claims_table(claims, runs):
    """The markdown verdict tables of `claims` (lab/claims.py records) over `runs`: those registered before
    their runs, then the exploratory ones apart. Each row: a - b (mean of the paired differences), the smallest
    difference its seeds resolve (the 90 % interval's half-width) and the verdict (claims.judge)."""
    def rows(cs):
        out = ["| claim | paper | a | b | depth | a - b (points) | resolves | verdict |", "|---|---|---|---|---|---|---|---|"]
        for c in cs:
            mean, half, v = registry.judge(c, *paired(c, runs))
            depth = f"{c.depth:g}x" + (f" vs {c.depth_b:g}x" if c.depth_b is not None else "")
            kind = "" if c.kind == ">" else f" (by at most {c.margin:g})" if c.kind == "<=" else f" (within {c.margin:g})"
            out.append(f"| {c.words}{kind} | {c.paper}, {c.where} | {c.a} | {c.b} | {depth} | "
                       + ("| | " if mean is None else f"{mean:+.2f} | {'-' if half == float('inf') else f'{half:.2f}'} | ")
                       + f"{v} |")
        return out
    firm, late = [c for c in claims if not c.exploratory], [c for c in claims if c.exploratory]
    text = rows(firm)
    if late:
        text += ["", "Exploratory (registered after the runs they judge; confirmatory only on seeds run after):", "",
                 *rows(late)]
    return "\n".join(text)


RULE = ("Verdicts: lab/claims.py, registered before the runs unless said; a 90 % t-interval on the per-seed "
        "differences, widened by the same run's difference across CPU models ({hw:.2f} points: "
        + " vs ".join(f"{v:.2f}" for v in registry.CROSS_CPU.values()) + ") when a pair ran on two; \"resolves\": "
        "the interval's half-width, the smallest difference these seeds tell apart.")


def summary(runs):
    """summary.md's blocks: {"mini-table", "mini-verdicts", "moe-table"} -> markdown (the names of
    lab/docs/results.md's markers). The study table holds every arm but the comparison-only ones of MOE."""
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
    noise_line = RULE.format(hw=HARDWARE_NOISE)
    moe = ["Same backbone (D=96, patch 8, 8 steps, fixed depth), recipe and task loss; params as stored "
           "(the expert bank counts in full), GFLOPs per image at the trained depth.", "",
           "| arm | FFN | n | params (M) | GFLOPs/img | " + " | ".join(f"{k:g}x" for k in rel) + " | train min | "
           "eq. 6 / eq. 9 at the end |", "|---" * (len(rel) + 7) + "|"]
    for arm, what in MOE.items():
        if arm in runs:
            rs = runs[arm]
            terms = [(r.get("last") or {}).get(k) for r in rs for k in ("bal_loss", "div_loss")]
            sig = (f"{fmt([(r.get('last') or {})['bal_loss'] for r in rs])} / {fmt([(r.get('last') or {})['div_loss'] for r in rs])}"
                   if None not in terms else "")  # the signature of E=4's experts (lab/claims.py REVIT_E4)
            moe.append(f"| {arm} | {what} | {len(rs)} | {rs[0]['params_m']:.3f} | {rs[0]['gflops']:.3f} | "
                       f"{cells(rs)} | {statistics.mean(r['train_s'] for r in rs) / 60:.1f} | {sig} |")
    moe += ["", noise_line, "", claims_table(registry.claims_of("revit"), runs)]
    return {"mini-table": "\n".join(table),
            "mini-verdicts": noise_line + "\n\n" + claims_table(registry.claims_of("mini", "init"), runs),
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
    greys = iter(["black", "dimgray", "darkgray"] * 5)  # 3 greys against 5 styles: no two lines alike
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


def last_epoch(d):
    """The last epoch's record of the run folder d's log.jsonl ({} without one): what a claim's signature reads."""
    path = os.path.join(d, "log.jsonl")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        recs = [json.loads(line) for line in f if '"epoch"' in line]
    return recs[-1] if recs else {}


def study_runs(root, load, arms, command, tool):
    """load(root), the finished runs of a study's folder; exits 2 with one line naming `command` (what makes them)
    when root is not a folder or holds no finished run of `arms`."""
    if not os.path.isdir(root):
        sys.stderr.write(f"{tool}: error: {root} is not a directory; run {command} first\n")
        sys.exit(2)
    runs = load(root)
    if not runs:
        sys.stderr.write(f"{tool}: error: no finished {', '.join(arms)} run in {root}; run {command}\n")
        sys.exit(2)
    return runs


def finished_runs(root, arms, cached):
    """{arm: [{seed, dir, KEY: the JSON of ROOT/ARM/seed<k>/FILE for each KEY: FILE of `cached` that
    exists}]} of the finished runs (done.json) of `arms`, seeds in order: what a study's summarizer reads."""
    root = kept.unpacked(root)  # (a kept study: its runs.jsonl's folders)
    runs = {}
    for arm in arms:
        arm_dir = os.path.join(root, arm)
        for seed_dir in sorted(os.listdir(arm_dir)) if os.path.isdir(arm_dir) else []:
            d = os.path.join(arm_dir, seed_dir)
            if os.path.isfile(os.path.join(d, "done.json")):
                done = json.load(open(os.path.join(d, "done.json")))
                run = {"seed": int(seed_dir[4:]), "dir": d, "cpu": done.get("cpu"), "last": last_epoch(d)}
                for key, name in cached.items():
                    if os.path.isfile(os.path.join(d, name)):
                        run[key] = json.load(open(os.path.join(d, name)))
                runs.setdefault(arm, []).append(run)
    return runs


def write_blocks(path, blocks, root, prefix="mini", tool="summarize_mini.py", figures=("depth", "gates")):
    """Put each block of `blocks` ({name: markdown}) between the <!-- NAME --> and <!-- /NAME -->
    markers of the file at `path` (lab/docs/results.md, the results page; docs/models.md for the details)
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
    """Summarize ROOT (a folder, or a list of folders read as one: lab/results/mini and lab/results/init); with `results`
    (and `docs`) write the blocks there, or only the blocks named in `only` (e.g. ["moe-table"]: a folder holding
    one study's arms, whose other tables would be partial). summary.md and the figures go to the first folder."""
    roots = [root] if isinstance(root, str) else list(root)
    root = roots[0]
    for r in roots:
        if not os.path.isdir(r):
            sys.stderr.write(f"summarize_mini.py: error: {r} is not a directory; run lab/reproduce_mini.sh first\n")
            sys.exit(2)
    runs = {}
    for r in roots:  # (several kept folders: lab/results/mini and lab/results/init hold one study's arms between them)
        for arm, rs in load_runs(r).items():
            runs.setdefault(arm, []).extend(rs)
    if not runs:
        sys.stderr.write(f"summarize_mini.py: error: no finished run in {root} (finished = has done.json); "
                         "run lab/reproduce_mini.sh first\n")
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
        # the figures belong to the study's table: a call for another block (--blocks moe-table on lab/results/revit)
        # leaves docs/mini_*.png alone
        figs = ("depth", "gates") if "mini-table" in blocks else ()
        write_blocks(results, {k: v for k, v in blocks.items() if k not in in_docs}, root, figures=figs)
        if in_docs:
            write_blocks(docs, {k: blocks[k] for k in in_docs}, root, figures=())
    print(text)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("runs", nargs="*", default=["runs/mini"], help="run folders, read as one (default: runs/mini)")
    cli.add_argument("--results", metavar="FILE", help="also write the tables into this file between its markers "
                     "(lab/docs/results.md)")
    cli.add_argument("--docs", help="with --results: a file holding some of the markers (docs/models.md: the moe-table)")
    cli.add_argument("--blocks", help="with --results: write only these comma-separated blocks (mini-table, "
                     "mini-verdicts, moe-table), e.g. moe-table for a folder of reViT's arms alone")
    a = cli.parse_args()
    main(a.runs, a.results, a.docs, a.blocks.split(",") if a.blocks else None)
