"""A study's kept runs in one text file: lab/results/STUDY/runs.jsonl, one JSON line per run folder.

    python lab/kept.py pack runs/mini lab/results/mini      # a finished study's run folders -> runs.jsonl (merged)
    python lab/kept.py unpack lab/results/mini /tmp/mini    # -> /tmp/mini/ARM/seed<k>/..., as the runs left them
    python lab/kept.py list lab/results/mini                # arm, seed, commit, date, CPU of each kept run

A line: {"dir": "ARM/seed<k>", "arm", "seed", "commit", "date", "cpu" (from done.json, for a reader of the file),
"files": {NAME: the file's text}}: every text file of the run folder that a summarizer reads (args.json, log.jsonl,
done.json, depth_eval.json, model.txt, cka.json, steps.json, anytime.json, probe_*.json, alignment.json,
loops.json, ...), each byte for byte. A folder of a study that is no ARM/seed<k> run (lab/results/loopvae/groups32)
is a line of its own without arm and seed. Not kept: the checkpoints and the per-run figures (PNG: each summarizer
and analysis draws them again from the JSON beside them). The study's own files (README.md, summary.md, its
figures) stay as files in lab/results/STUDY/. unpack() recreates the folders a summarizer reads; the summarizers
read a kept study through unpacked() (a copy in a temporary folder), so `python lab/summarize_mini.py
lab/results/mini` reads it as it read the folders."""
import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = "runs.jsonl"  # in each study's folder
SKIP = (".png", ".pt", ".lock", ".claim", ".tmp")  # not kept (regenerable figures; checkpoints; a run's locks)
SEED = re.compile(r"seed(\d+)$")


def pack_dir(folder, rel):
    """The line of the run folder `folder` (its path `rel` in the study, "ARM/seed<k>"): its text files, and for a
    run its arm, seed and done.json's commit, date and CPU. Raises ValueError for a file that is not UTF-8 text."""
    files = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isfile(path) or name.endswith(SKIP) or name in ("running.json", "partial.json"):
            continue
        with open(path, "rb") as f:
            data = f.read()
        try:
            files[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path}: not UTF-8 text; a kept run holds its records as text") from None
    line = {"dir": rel}
    m = SEED.match(os.path.basename(rel))
    if m and os.sep not in os.path.dirname(rel) and "done.json" in files:
        done = json.loads(files["done.json"])
        line.update(arm=os.path.dirname(rel), seed=int(m.group(1)), commit=done.get("commit", "?"),
                    date=done.get("commit_date", "?"), cpu=done.get("cpu", "?"))
    line["files"] = files
    return line


def pack(folder):
    """The lines of every run folder under the study folder `folder` (ARM/seed<k>/ with its done.json), and of every
    other sub-folder holding files (a study's older layout), in path order; the study's own files (directly in
    `folder`) are not among them."""
    lines = []
    for here, _, names in sorted(os.walk(folder)):
        rel = os.path.relpath(here, folder)
        if rel == "." or not any(os.path.isfile(os.path.join(here, n)) and not n.endswith(SKIP) for n in names):
            continue
        lines.append(pack_dir(here, rel))
    return lines


def write(lines, path):
    """Write `lines` to the runs.jsonl at `path`, one JSON line each, in "dir" order."""
    with open(path, "w", encoding="utf-8") as f:
        for line in sorted(lines, key=lambda r: r["dir"]):
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


def read(study):
    """The lines of the kept study `study` (a folder holding runs.jsonl, or a path to one); [] when it has none."""
    path = study if study.endswith(".jsonl") else os.path.join(study, RUNS)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def unpack(study, dest):
    """Recreate the kept study `study` (its folder) in `dest`: the files of its folder (the study's own, and weights
    kept for a chain of runs: lab/keep_results.py --weights), and each line's folder with its files byte for byte
    (runs.jsonl itself is left out). Returns dest."""
    os.makedirs(dest, exist_ok=True)
    if os.path.isdir(study):
        shutil.copytree(study, dest, ignore=shutil.ignore_patterns(RUNS), dirs_exist_ok=True)
    for line in read(study):
        d = os.path.join(dest, line["dir"])
        if os.path.isabs(line["dir"]) or os.path.normpath(line["dir"]).startswith(".."):
            raise ValueError(f"{study}: a line's dir {line['dir']!r} leaves the study's folder")
        os.makedirs(d, exist_ok=True)
        for name, text in line["files"].items():
            with open(os.path.join(d, os.path.basename(name)), "wb") as f:
                f.write(text.encode("utf-8"))
    return dest


UNPACKED = {}  # a kept study's folder -> its runs unpacked in a temporary folder, once per process


def unpacked(root):
    """`root` itself, or for a kept study (a folder holding runs.jsonl) its folders unpacked into a temporary folder
    (unpack; removed when the process ends): what a summarizer lists and reads. Its own files stay in `root`."""
    if not os.path.isfile(os.path.join(root, RUNS)):
        return root
    key = os.path.abspath(root)
    if key not in UNPACKED:
        import atexit
        tmp = tempfile.mkdtemp(prefix="kept-")
        atexit.register(shutil.rmtree, tmp, True)
        UNPACKED[key] = unpack(root, os.path.join(tmp, os.path.basename(key)))
    return UNPACKED[key]


@contextlib.contextmanager
def folder(study):
    """A temporary folder holding the kept study `study` as its runs left it (unpack); removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="kept-") as tmp:
        yield unpack(study, os.path.join(tmp, os.path.basename(os.path.normpath(study))))


def keep(runs, dest):
    """Add the finished runs of the study folder `runs` (runs/mini: ARM/seed<k>/ with done.json) to the kept study
    `dest` (lab/results/STUDY): a run already kept is replaced by its new line. Returns the lines added."""
    new = [ln for ln in pack(runs) if "arm" in ln]
    lines = {ln["dir"]: ln for ln in read(dest)}
    lines.update({ln["dir"]: ln for ln in new})
    os.makedirs(dest, exist_ok=True)
    write(list(lines.values()), os.path.join(dest, RUNS))
    return new


def main(argv=None):
    cli = argparse.ArgumentParser(prog="kept.py", description=__doc__.split("\n\n")[0])
    sub = cli.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack", help="a study's run folders into DEST/runs.jsonl (lines of runs already kept: replaced)")
    p.add_argument("runs"), p.add_argument("dest")
    u = sub.add_parser("unpack", help="a kept study's folders, as its runs left them, into DEST")
    u.add_argument("study"), u.add_argument("dest")
    s = sub.add_parser("list", help="the kept runs of a study")
    s.add_argument("study")
    a = cli.parse_args(argv)
    source = a.runs if a.verb == "pack" else a.study
    if not os.path.isdir(source):
        cli.error(f"{source}: no such folder; give a study's folder (runs/STUDY, lab/results/STUDY)")
    if a.verb == "pack":
        print(f"kept {len(keep(a.runs, a.dest))} run(s) in {os.path.join(a.dest, RUNS)}")
    elif a.verb == "unpack":
        unpack(a.study, a.dest)
        print(f"unpacked {len(read(a.study))} folder(s) into {a.dest}")
    else:
        for ln in read(a.study):
            if "arm" in ln:
                print(f"{ln['arm']:32s} seed {ln['seed']}  {ln['commit']}  {ln['date']}  {ln['cpu']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
