"""Re-run README's quick commands and list each number beside its re-measured value.

    python lab/check_readme.py                       # the quick set, about 8 minutes on 2 cores
    python lab/check_readme.py --only bvit-300       # some runs (names: --list)
    python lab/check_readme.py --all                 # also the SR-ViT / init table (~5 more minutes)
    python lab/check_readme.py --readme README.md    # and write the new values, commit and CPU back

The numbers live in README.md (the first run), lab/docs/results.md ("Short CPU runs") and docs/models.md
(reViT's 300-step tables, the SR-ViT / init table): FILES says which section is in which file, Run.file
where each command is. Each run's command is read from that file itself (the code line after its anchor), with the data
folder (--data, else $RVITS_DATA, else ../shared/data) and a fresh output folder under --work put in.
The runs go one after another (each gets both cores); a finished run is kept (WORK/NAME/check.json)
and reused by the next call with the same command, so an interrupted check continues where it
stopped. Prints, and writes to WORK/check_readme.md, one line per number: where it is,
the written value, the re-measured value and the difference, then the commit and CPU of the run.
Another CPU model, or another torch, can change the last digits and more (lab/docs/results.md: the
same run gives 28.12 on one CPU model and 29.77 on another), so a difference is a finding to
record, not by itself a bug. With --readme README.md, each number's cell gets the new value and
each run's provenance lines (`<!-- check:NAME -->` lines) the commit, CPU model, cores, processes
and date, in that README and in the docs/ files beside it. Exit 2 for bad flags or a file whose
tables or commands moved (the error names the file and what it looked for). Standard library only.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from provenance import commit, cpu_model  # noqa: E402  (what results are stamped with; lab/provenance.py)


README = "README.md"  # the first run; the other files relative to README's folder:
RESULTS, MODELS = os.path.join("lab", "docs", "results.md"), os.path.join("docs", "models.md")


class Run:
    """One documented command: `anchor` is the text of the line in `file` the command follows (a
    comment line in a code block) or starts with (a table row naming its flags); `procs` = 2 runs it
    under torchrun with 2 processes (when the file's own line does not say so); `minutes`: alone on 2
    Intel Xeon cores (2026-12-01); `quick`: in the default set."""

    def __init__(self, name, anchor, minutes, procs=None, quick=True, file=README):
        self.name, self.anchor, self.minutes, self.procs, self.quick = name, anchor, minutes, procs, quick
        self.file = file


RUNS = [
    Run("bvit-300", "# a bViT (one block, 6 steps) on CIFAR-100, 300 steps on a CPU", 3),
    Run("bvit-300-ddp", "# a bViT (one block, 6 steps) on CIFAR-100, 300 steps on a CPU", 2, procs=2),
    Run("revit-300", "torchrun --nproc_per_node 2 train.py --model revit --experts 4", 3, file=MODELS),
] + [Run(name, "| " + row, 2 if "R=4" in row else 1, quick=False, file=MODELS) for name, row in [  # SR-ViT/init
    ("srvit-r1", "SR-ViT depth 3, R=1"), ("srvit-r2", "SR-ViT depth 3, R=2"), ("srvit-r4", "SR-ViT depth 3, R=4"),
    ("init-default", "bViT 4 steps (`--model bvit --depth 4 --init default`)"),
    ("init-mimetic", "bViT 4 steps (`--model bvit --depth 4 --init mimetic`)"),
    ("init-structured", "bViT 4 steps (`--model bvit --depth 4 --init structured`)")]]


def final(key):
    """The last epoch record's `key` (an accuracy in percent), formatted as README writes it."""
    return lambda log, *_: f"{[r for r in log if 'epoch' in r][-1][key]:.2f}"


def at_depth(depth, key):
    return lambda log, *_: f"{next(r[key] for r in log if r.get('depth') == depth):.2f}"


def gate(step, expert):
    return lambda log, *_: f"{[r for r in log if 'epoch' in r][-1]['gates'][step][expert]:.4f}"


def wall(log, seconds, where):
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def plural(n, word):
    return f"{n} {word}" + ("es" if word.endswith("s") else "s") * (n != 1)


def hardware(log, seconds, where):
    """'2-core CPU, 1 process' (', shared: load 4.1' when other jobs used the cores), from where the
    run was measured (see `provenance`)."""
    shared = f", shared: load {where['load']}" if where.get("load", 0) > where["cores"] + 0.5 else ""
    return f"{where['cores']}-core CPU, {plural(where['processes'], 'process')}{shared}"


def provenance(where):
    """README's line for a measurement: commit, CPU model, cores, processes, date."""
    return (f"commit {where['commit']}, {where['cpu']}, {where['cores']} cores, "
            f"{plural(where['processes'], 'process')}, {where['date']}")


# (run, section heading text, the row's first cell, the column's header, value: fn(log.jsonl
# records, wall seconds, where it ran: {commit, cpu, cores, processes, date}) -> the cell's text).
# A section is the text from its heading to the next heading; its table is the first one holding the row.
FIRST, SHORT = "The first run", "Short CPU runs"
BVIT_ROW = "bViT D=128 h=4 p=4, 6 steps (0.23 M params)"
REVIT = "reViT: one block, depth-programmed FFN experts"
SRVIT = "SR-ViT and attention inits"
FILES = {FIRST: README, SHORT: RESULTS, REVIT: MODELS, SRVIT: MODELS}  # the file each section is in
FIRST_RUN = [("top-1", final("val_acc1")), ("top-5", final("val_acc5")), ("wall time", wall), ("hardware", hardware)]
CELLS = [("bvit-300", where, BVIT_ROW, column, fn) for where in (FIRST, SHORT) for column, fn in FIRST_RUN] + [
    ("bvit-300-ddp", SHORT, "same, DDP", "top-1", final("val_acc1")),
    ("bvit-300-ddp", SHORT, "same, DDP", "top-5", final("val_acc5")),
    ("bvit-300-ddp", SHORT, "same, DDP", "wall time", wall),
    ("bvit-300-ddp", SHORT, "same, DDP", "hardware", hardware),
    ("revit-300", SHORT, "reViT E=4", "top-1", final("val_acc1")),
    ("revit-300", SHORT, "reViT E=4", "top-5", final("val_acc5")),
    ("revit-300", SHORT, "reViT E=4", "wall time", wall),
    ("revit-300", SHORT, "reViT E=4", "hardware", hardware),
] + [("revit-300", REVIT, f"top-{k} (%)", col, at_depth(d, f"val_acc{k}"))
     for k in (1, 5) for d, col in ((3, "3"), (6, "6 (trained)"), (9, "9"), (12, "12"))] + [
    ("revit-300", REVIT, str(k), f"g_{e + 1}", gate(k, e)) for k in range(6) for e in range(4)] + [
    (r.name, SRVIT, r.anchor[2:], col, fn) for r in RUNS if not r.quick
    for col, fn in (("top-1", final("val_acc1")), ("top-5", final("val_acc5")), ("wall", wall))]


class ReadmeError(ValueError):
    pass


def files_of(runs):
    """The files (relative to README's folder) that hold the commands and numbers of `runs`."""
    names = {r.name for r in runs}
    return sorted({r.file for r in runs} | {FILES[c[1]] for c in CELLS if c[0] in names})


def path_of(name, readme=None):
    """Where the file `name` (README or a docs/ file) is: README is `readme` (default: this
    repository's), the docs/ files are beside it."""
    readme = readme or os.path.join(ROOT, README)
    return readme if name == README else os.path.join(os.path.dirname(os.path.abspath(readme)), name)


def document(path):
    """The lines of the file at `path`. Raises ReadmeError when it is missing."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().split("\n")
    except FileNotFoundError:
        raise ReadmeError(f"no such file ({path})") from None


def cells_of(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def section(lines, heading):
    """(first, end) line indices of the section whose heading contains `heading` (a `# ...` line in a
    code block is a comment, not a heading)."""
    fenced, headings = False, []
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            headings.append(i)
    starts = [i for i in headings if heading in lines[i]]
    if not starts:
        raise ReadmeError(f"no heading containing {heading!r}")
    return starts[0], next((i for i in headings if i > starts[0]), len(lines))


def locate(lines, heading, row, column):
    """(line index, cell index) of a table cell: `row` starts the row's first cell, `column` is a header."""
    first, end = section(lines, heading)
    for i in range(first, end):
        if lines[i].startswith("|") and cells_of(lines[i])[0].startswith(row):
            top = i
            while top > first and lines[top - 1].startswith("|"):
                top -= 1
            header = cells_of(lines[top])
            if column not in header:
                raise ReadmeError(f"the table of row {row!r} under {heading!r} has no column {column!r}")
            return i, header.index(column)
    raise ReadmeError(f"no table row starting {row!r} under the heading {heading!r}")


def command(lines, run, data):
    """The command of `run` (found in `lines`, those of `run.file`) as an argument list, with
    --data-dir set to `data`."""
    at = next((i for i, line in enumerate(lines) if line.strip().startswith(run.anchor)), None)
    if at is None:
        raise ReadmeError(f"{run.name}: no line starting {run.anchor!r}")
    if lines[at].startswith("|"):  # a table row naming its flags: the section's common flags + the row's
        top = max(i for i in range(at) if re.match(r"#{1,6} ", lines[i]))  # the row's section heading
        common = re.search(r"common flags `([^`]*)`", " ".join(lines[top:at]))
        added = re.search(r"\(`([^`]*)`\)", lines[at])
        if not (common and added):
            raise ReadmeError(f"{run.name}: the row {run.anchor!r} lost its flags")
        text = "python train.py " + common.group(1) + " " + added.group(1)
    else:
        i = at + 1 if lines[at].lstrip().startswith("#") else at
        text = lines[i]
        while text.rstrip().endswith("\\"):
            i += 1
            text = text.rstrip()[:-1] + " " + lines[i]
    argv = shlex.split(text)
    if "--data-dir" in argv:
        argv[argv.index("--data-dir") + 1] = data
    else:
        argv += ["--data-dir", data]
    if "--out-dir" in argv:  # the documented placeholder folder: the run's own one is put in by main()
        del argv[argv.index("--out-dir"):argv.index("--out-dir") + 2]
    if argv[0] == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run"] + argv[1:]
    elif argv[0] == "python":
        argv[0] = sys.executable
        if run.procs:
            argv[1:1] = ["-m", "torch.distributed.run", "--nproc_per_node", str(run.procs)]
    return argv


def processes(argv):
    for i, a in enumerate(argv):
        if a.startswith("--nproc_per_node") or a.startswith("--nproc-per-node"):
            return int(a.split("=")[1] if "=" in a else argv[i + 1])
    return 1


def measure(run, argv, work, extra, where):
    """Train `run` in WORK/NAME, or reuse the finished run there (WORK/NAME/check.json, written at its
    end with its time and where it ran). Returns (log records, wall seconds, where).
    Raises RuntimeError on failure or when WORK/NAME holds an unfinished run."""
    out = os.path.join(work, run.name)
    done = os.path.join(out, "check.json")
    if os.path.exists(done):
        with open(done) as f:
            meta = json.load(f)
        if meta["argv"] == argv[1:] + extra:
            print("  (finished earlier: reused)", flush=True)
            with open(os.path.join(out, "log.jsonl")) as f:
                return [json.loads(line) for line in f if line.strip()], meta["seconds"], meta["where"]
    if os.path.exists(out):
        raise RuntimeError(f"{out} holds another or an unfinished run; remove it or give another --work")
    log = os.path.join(work, run.name + ".log")
    print(f"  training; its output goes to {log}", flush=True)
    t0, loads = time.time(), []
    with open(log, "w") as f:
        proc = subprocess.Popen(argv + ["--out-dir", out] + extra, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        while True:  # every 5 s, the machine's load while it trains: were the cores its own?
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                loads.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0)
    seconds = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{run.name} failed (exit {proc.returncode}); see {log}")
    where = dict(where, load=round(sum(loads[len(loads) // 2:]) / max(1, len(loads) - len(loads) // 2), 1))
    if where["load"] > where["cores"] + 0.5:
        print(f"  note: load {where['load']} on {where['cores']} cores: other jobs shared them, so the wall time "
              "is not this run's alone (the numbers are unaffected)", flush=True)
    with open(done, "w") as f:
        json.dump({"argv": argv[1:] + extra, "seconds": seconds, "where": where}, f)
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()], seconds, where


def difference(old, new):
    """new - old with old's decimals ('' for cells that are not one number, such as wall times)."""
    try:
        return f"{float(new) - float(old):+.{len(old.split('.')[1])}f}" if "." in old else ""
    except (ValueError, IndexError):
        return ""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, exit status 2 (as train.py)
        self.exit(2, f"check_readme.py: error: {message}\n")


class HelpFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action):  # a default that is a value, after the help
        shown = action.default not in (None, "", False, argparse.SUPPRESS)
        return (action.help or "") + (" (default: %(default)s)" if shown else "")


def main(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--only", default="", help="comma-separated run names (see --list)")
    p.add_argument("--all", action="store_true", help="also the runs outside the quick set")
    p.add_argument("--list", action="store_true", help="print the runs and their commands, then exit")
    p.add_argument("--data", default=os.environ.get("RVITS_DATA", os.path.normpath(os.path.join(ROOT, "..", "shared", "data"))),
                   help="the data root (holds cifar-100-python/)")
    p.add_argument("--work", default=os.path.join(ROOT, "runs", "check_readme"), help="run folders and the listing")
    p.add_argument("--readme", help="README to update with the re-measured values (usually README.md), and "
                                    "the docs/ files beside it")
    p.add_argument("--extra", default="", help="flags added to every command (e.g. '--max-steps 2' for a smoke "
                                               "test; then --readme is refused)")
    args = p.parse_args(argv)
    names = [r.name for r in RUNS]
    wanted = [n for n in args.only.split(",") if n]
    bad = [n for n in wanted if n not in names]
    if bad:
        p.error(f"--only: unknown run {', '.join(bad)}; runs: {', '.join(names)}")
    if args.readme and args.extra:
        p.error("--readme with --extra: a shortened run's numbers never go into README")
    runs = [r for r in RUNS if r.name in wanted] if wanted else [r for r in RUNS if r.quick or args.all]
    where_is = README  # the file an error is about
    try:
        docs = {}
        for name in files_of(RUNS if args.list else runs):
            where_is = name
            docs[name] = document(path_of(name, args.readme))
        argvs = {}
        for r in RUNS if args.list else runs:
            where_is = r.file
            argvs[r.name] = command(docs[r.file], r, args.data)
        for run, heading, row, column, _ in CELLS:
            if run in argvs:
                where_is = FILES[heading]
                locate(docs[where_is], heading, row, column)
    except ReadmeError as e:
        print(f"check_readme.py: error: {where_is}: {e}; update RUNS/CELLS/FILES in lab/check_readme.py",
              file=sys.stderr)
        return 2
    if args.list:
        for r in RUNS:
            quick = "" if r.quick else ", with --all"
            print(f"{r.name} (~{r.minutes} min{quick}, {r.file}): {shlex.join(argvs[r.name])}")
        return 0
    if not os.path.isfile(os.path.join(args.data, "cifar-100-python", "train")):
        print(f"check_readme.py: error: --data {args.data}: no cifar-100-python/train there; give the data root",
              file=sys.stderr)
        return 2
    os.makedirs(args.work, exist_ok=True)
    where = {"commit": commit(), "cpu": cpu_model(), "cores": os.cpu_count(), "date": datetime.date.today().isoformat()}
    print(f"check_readme: {len(runs)} run(s), about {sum(r.minutes for r in runs)} min; commit {where['commit']}, "
          f"{where['cpu']} ({where['cores']} cores)", flush=True)
    rows, failed = [], 0
    for k, r in enumerate(runs):
        print(f"[{k + 1}/{len(runs)}] {r.name}: {shlex.join(argvs[r.name][1:])}", flush=True)
        try:
            log, seconds, ran = measure(r, argvs[r.name], args.work, shlex.split(args.extra),
                                        dict(where, processes=processes(argvs[r.name])))
        except (RuntimeError, OSError, KeyError, ValueError, StopIteration) as e:
            print(f"  FAILED: {e}", flush=True)
            failed += 1
            continue
        for run, heading, row, column, fn in CELLS:
            if run != r.name:
                continue
            lines = docs[FILES[heading]]
            i, j = locate(lines, heading, row, column)
            old, new = cells_of(lines[i])[j], fn(log, seconds, ran)
            rows.append((r.name, f"{FILES[heading]}: {row} / {column}", old, new, difference(old, new)))
            print(f"  {row} / {column}: written {old}, now {new} {difference(old, new)}", flush=True)
            if args.readme:
                cells = cells_of(lines[i])
                cells[j] = new
                lines[i] = "| " + " | ".join(cells) + " |"
        marker = f"<!-- check:{r.name} -->"
        for lines in docs.values():
            for i, line in enumerate(lines):
                if args.readme and line.startswith(marker):
                    lines[i] = (f"{marker}Measured ({r.name}): {provenance(ran)} "
                                f"(`python lab/check_readme.py --only {r.name}`).")
        rows.append((r.name, "where", "", provenance(ran), ""))
    listing = ["| run | number (file: row / column) | written | now | now - written |", "|---|---|---|---|---|"]
    listing += ["| " + " | ".join(row) + " |" for row in rows]
    with open(os.path.join(args.work, "check_readme.md"), "w") as f:
        f.write("\n".join(listing) + "\n")
    if args.readme and rows:
        for name, lines in docs.items():
            with open(path_of(name, args.readme), "w", encoding="utf-8") as f:
                f.write("\n".join(lines))
    print(f"check_readme: listing in {os.path.join(args.work, 'check_readme.md')}"
          + (f"; updated {', '.join(path_of(name, args.readme) for name in docs)}" if args.readme and rows else "")
          + (f"; {failed} run(s) FAILED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
