"""Keep a study's results without its checkpoints, so its summarizer can rebuild the tables later.

    python lab/keep_results.py runs/mini-loopvae lab/results/loopvae
    python lab/summarize_loopvae.py lab/results/loopvae        # the same summary.md, no retraining

Keeps RUNS/ARM/seed<k>/ of every finished run (done.json) as a line of DEST/runs.jsonl (lab/kept.py: one JSON
line per run, its files' text; a run kept before is replaced), and copies RUNS' own files (ledger.json, summary.md,
figures) into DEST, leaving out what is large or only means something while a run
trains: checkpoints (*.pt), train.log (of which its model line, "MODEL: P M params, F GFLOPs/img, ...", is kept
as model.txt, what lab/summarize_mini.py reads of it), running.json, partial.json, .lock, the per-run figures (PNG,
drawn again from the JSON beside them). A summarizer reads a kept run, unpacked (lab/kept.py unpack), like a
trained one (done.json, args.json, log.jsonl and the measurements it cached there: loops.json,
probe_*.json, alignment.json, anytime.json, steps.json, cka.json); what it has not cached needs the checkpoint and is gone.
Unfinished runs are not kept. Existing files in DEST are overwritten, others left alone.

A chain of runs longer than the time a machine is held (Fig. 2: teacher, students, elastic stage, probes) goes
on elsewhere from what was kept: --weights ARM/seed<k> ... also keeps those finished runs' weights, the
model's and its flags only (ckpt.pt without the optimizer's state: the file --teacher, --finetune and probe.py
read; a third of the checkpoint) as DEST/ARM/seed<k>/ckpt.pt, so that `python lab/kept.py unpack DEST RUNS` and
the same reproduce_mini.sh command continue the chain from them. Delete them (git rm DEST/ARM/seed<k>/ckpt.pt) once nothing starts from them.

    python lab/keep_results.py runs/fig2 lab/results/revit-fig2 --weights vit/seed2 revit-e4-fig2/seed2
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "lab"), ROOT]
import kept  # noqa: E402  (a study's kept runs: one line each)
import provenance  # noqa: E402  (a kept run's commit date)
from training.exits import Fail  # noqa: E402  (--weights: the reader's one-line failures)

SKIP = shutil.ignore_patterns("*.pt", "train.log", "running.json", "partial.json", ".lock", ".claim")


def keep_model_line(log, out):
    """The first line of `log` that announces the model ("revit: 0.365 M params, ..."), written to `out`;
    nothing when there is none."""
    if not os.path.isfile(log):
        return
    with open(log, errors="replace") as f:
        line = next((ln for ln in f if " M params, " in ln and "GFLOPs/img" in ln), None)
    if line is not None:
        with open(out, "w") as f:
            f.write(line)


def stamp_commit_date(done):
    """Add to the done.json at `done` the UTC date of its run's commit (lab/provenance.commit_date), when it
    names a commit and lacks the date (runs started before reproduce_mini.sh wrote it): what lab/claims.py
    compares with a claim's registration where the history is not there."""
    with open(done) as f:
        d = json.load(f)
    if "commit" in d and "commit_date" not in d:
        date = provenance.commit_date(d["commit"])
        if date != "unknown":
            with open(done, "w") as f:
                json.dump({**d, "commit_date": date}, f)


def keep(runs, dest):
    """Keep the finished runs under `runs` in `dest`/runs.jsonl and copy its top-level files into `dest`; returns
    the runs kept ("ARM/seed<k>"). Raises FileNotFoundError when `runs` is not a folder."""
    if not os.path.isdir(runs):
        raise FileNotFoundError(runs)
    with tempfile.TemporaryDirectory(prefix="keep-") as staged:  # each run as a kept folder, then one line each
        done = stage(runs, dest, staged)
        kept.keep(staged, dest)
    return done


def stage(runs, dest, staged):
    """Copy the finished runs under `runs` into `staged` (without what SKIP leaves out) and the top-level files
    of `runs` into `dest`; returns the runs ("ARM/seed<k>")."""
    kept = []
    for arm in sorted(os.listdir(runs)):
        src = os.path.join(runs, arm)
        if not os.path.isdir(src):
            if not SKIP(runs, [arm]):
                os.makedirs(dest, exist_ok=True)
                shutil.copy2(src, os.path.join(dest, arm))
            continue
        for seed in sorted(os.listdir(src)):
            if os.path.isfile(os.path.join(src, seed, "done.json")):
                shutil.copytree(os.path.join(src, seed), os.path.join(staged, arm, seed), ignore=SKIP,
                                dirs_exist_ok=True)
                keep_model_line(os.path.join(src, seed, "train.log"), os.path.join(staged, arm, seed, "model.txt"))
                stamp_commit_date(os.path.join(staged, arm, seed, "done.json"))
                kept.append(f"{arm}/{seed}")
    return kept


def keep_weights(run, out):
    """Write to `out` the model weights and flags of the rvits checkpoint RUN/ckpt.pt (read through
    training.weights.read_weights: tensors and plain values only), nothing else: an rvits checkpoint
    (registry.is_rvits_checkpoint) that --teacher, --finetune and probe.py read as they read the original.
    Raises training.exits.Fail for an unreadable or non-rvits file."""
    import torch
    from training.registry import is_rvits_checkpoint
    from training.weights import read_weights
    ck = read_weights(os.path.join(run, "ckpt.pt"), "--weights")
    if not is_rvits_checkpoint(ck):
        raise Fail(f"--weights {run}/ckpt.pt: not an rvits checkpoint (model weights and the flags of its run)")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = out + ".tmp"
    torch.save({"model": ck["model"], "args": ck["args"]}, tmp)
    os.replace(tmp, out)


def main(argv=None):
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("runs", help="a study's run folder (lab/reproduce_mini.sh's OUT)")
    cli.add_argument("dest", help="where to keep it (lab/results/<study>)")
    cli.add_argument("--weights", nargs="+", default=[], metavar="ARM/seedK",
                     help="also keep these finished runs' weights (model and flags, no optimizer) as DEST/ARM/seedK/ckpt.pt, "
                          "for a chain that continues from them (module docstring)")
    a = cli.parse_args(argv)
    bad = [w for w in a.weights if not os.path.isfile(os.path.join(a.runs, w, "done.json"))
           or not os.path.isfile(os.path.join(a.runs, w, "ckpt.pt"))]
    if bad:
        sys.stderr.write(f"keep_results.py: error: --weights {bad[0]}: not a finished run with a ckpt.pt in {a.runs}; "
                         "name finished runs as ARM/seed<k>\n")
        return 2
    try:
        kept = keep(a.runs, a.dest)
    except FileNotFoundError:
        sys.stderr.write(f"keep_results.py: error: {a.runs} is not a folder; give a study's run folder (runs/mini)\n")
        return 2
    for w in a.weights:
        try:
            keep_weights(os.path.join(a.runs, w), os.path.join(a.dest, w, "ckpt.pt"))
        except Fail as e:
            sys.stderr.write(f"keep_results.py: error: {e}\n")
            return 2
    print(f"kept {len(kept)} finished run(s) of {a.runs} in {a.dest} ("
          + (f"the weights of {', '.join(a.weights)}; no other checkpoint)" if a.weights else "no checkpoints)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
