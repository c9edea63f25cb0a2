"""Every way a train.py run ends, tried on 1 and 2 processes (torchrun on the CPU): Ctrl-C once and twice,
SIGTERM, SIGHUP (output redirected, as when an ssh session drops), the terminal itself closing (a
pseudo-terminal whose master is closed), an error mid-epoch (an undecodable image, --max-bad-images 0), a
full disk under the run folder (a tmpfs too small for a second checkpoint, in a mount namespace of its own:
Linux, root) and under stdout (/dev/full), and a normal exit. Prints one markdown row per trial: the exit
status, the step of the ckpt.pt left behind, and train.py's own lines (docs/training.md "How a run ends").

    python lab/endings.py [--nproc 1,2] [--only SIGHUP,...]   # tiny synthetic runs, 7.5 min on 2 busy cores

A signal goes to the process group the command started in, as a terminal or a scheduler sends it (torchrun
starts its processes in sessions of their own and passes the signal on). What is measured is train.py's
behaviour; nothing here is asserted (the tests in tests/test_cluster.py and tests/test_failures.py do).
"""
import argparse
import fcntl
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import termios
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
TINY = ["--embed-dim", "16", "--num-heads", "2", "--depth", "2", "--device", "cpu", "--workers", "0",
        "--batch-size", "8", "--val-subset", "16", "--eval-batch-size", "16", "--max-steps", "40", "--save-every", "5"]
SLOW = ["--embed-dim", "256", "--num-heads", "4", "--depth", "12", "--batch-size", "64", "--save-every", "1"]
CASES = ("normal exit", "Ctrl-C once", "Ctrl-C twice", "SIGTERM", "SIGHUP", "terminal closes", "error mid-epoch",
         "full disk: run folder", "full disk: stdout")


def image_folder(root):
    """train/ and val/ of two classes, 8 PNGs each; one training image cut to 10 bytes (undecodable)."""
    from PIL import Image
    for split in ("train", "val"):
        for c in ("ant", "bee"):
            os.makedirs(os.path.join(root, split, c))
            for i in range(8):
                Image.new("RGB", (32, 32), (40 * i, 100, 7 * i)).save(os.path.join(root, split, c, f"{i}.png"))
    bad = os.path.join(root, "train", "bee", "5.png")
    with open(bad, "r+b") as f:
        f.truncate(10)
    return root


def command(case, nproc, out, tmp):
    """(argv, the stdout line after which the trial acts) of one trial."""
    job = TINY + ["--data", "synthetic", "--out-dir", out]
    wait = "saved checkpoint at step 5"
    if case == "Ctrl-C twice":  # a step of seconds: the second Ctrl-C comes while the first is being honoured
        job, wait = job + SLOW, "saved checkpoint at step 1"
    if case == "error mid-epoch":
        job = TINY + ["--data", "imagenet", "--data-dir", image_folder(os.path.join(tmp, "images")), "--img-size", "32",
                      "--patch-size", "8", "--batch-size", "2", "--max-bad-images", "0", "--save-every", "2",
                      "--out-dir", out]
    if case == "full disk: run folder":  # 200 kB: a ckpt.pt (121 kB) is written beside the one before it, so the
        # second cannot be (the tmpfs is mounted in a mount namespace of its own: nothing else sees it)
        job = job[:job.index("--out-dir")] + ["--out-dir", "/mnt/endings"]
    launch = [sys.executable, os.path.join(ROOT, "train.py")]
    if nproc > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
                  str(free_port()), os.path.join(ROOT, "train.py")]
    if case == "full disk: run folder":
        inner = " ".join(launch + job)
        return ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=200k tmpfs /mnt && mkdir /mnt/endings && {inner}"
                f"; rc=$?; mkdir -p {out} && cp /mnt/endings/ckpt.pt {out}/ 2>/dev/null; exit $rc"], None
    return launch + job, wait


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid):
    """The processes below `pid` (from /proc), for the clean-up of a trial that hung."""
    kids = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            kids.setdefault(int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]), []).append(int(p))
        except (OSError, IndexError):
            pass
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def trial(case, nproc, tmp):
    """(exit status, step of the ckpt.pt left, train.py's lines) of one trial."""
    from training.weights import read_weights
    out, err_path = os.path.join(tmp, "run"), os.path.join(tmp, "stderr")
    argv, wait = command(case, nproc, out, tmp)
    err = open(err_path, "w")
    master = None
    if case == "terminal closes":
        master, slave = pty.openpty()
        p = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, start_new_session=True,
                             preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))  # the pty: its terminal
        os.close(slave)
        stream = master
    else:
        p = subprocess.Popen(argv, stdout=open("/dev/full", "w") if case == "full disk: stdout" else subprocess.PIPE,
                             stderr=err, cwd=ROOT, start_new_session=True)
        stream = p.stdout.fileno() if p.stdout else None
    seen, t0, buf = wait is None or stream is None, time.monotonic(), b""
    while not seen and time.monotonic() - t0 < 300 and p.poll() is None:
        if select.select([stream], [], [], 1)[0]:
            try:
                chunk = os.read(stream, 4096)
            except OSError:
                break
            buf += chunk
            seen = wait.encode() in buf
    if seen and wait is not None and case not in ("normal exit", "full disk: stdout"):
        if case == "terminal closes":
            os.close(master)
            master = None
        else:
            sig = {"SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP}.get(case, signal.SIGINT)
            os.killpg(p.pid, sig)
            if case == "Ctrl-C twice":
                time.sleep(1.5)
                os.killpg(p.pid, signal.SIGINT)
    if stream is not None and master is None and p.stdout:
        threading.Thread(target=p.stdout.read, daemon=True).start()  # (the rest of stdout, unread)
    try:
        rc = p.wait(timeout=300)
    except subprocess.TimeoutExpired:
        for q in descendants(p.pid) + [p.pid]:
            os.kill(q, signal.SIGKILL)
        rc = "hung (killed after 300 s)"
    if master is not None:
        os.close(master)
    err.close()
    text = open(err_path, errors="replace").read().replace("\r", "\n")
    lines = [ln for ln in text.splitlines() if ln.startswith(("train.py:", "stop requested"))]
    ckpt = os.path.join(out, "ckpt.pt")
    step = read_weights(ckpt, "ckpt")["step"] if os.path.exists(ckpt) else None
    if case == "terminal closes":
        lines = ["(the terminal is gone: nothing printed can be seen)"]
    return rc, step, lines


def short(line, tmp):
    """A line for the table: the trial's folder as TMP, a continue command's flags as '...' but its --resume."""
    line, cont = line.replace(tmp, "TMP"), "continue with: python train.py "
    if cont in line:
        head, tail = line.split(cont, 1)
        line = head + cont + "... " + " ".join(re.findall(r"--resume \S+$", tail))
    return line.replace("|", "\\|")[:400]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", default="1,2", help="process counts to try (1: python train.py, N > 1: torchrun)")
    p.add_argument("--only", help="cases to try, comma-separated (default: all): " + ", ".join(CASES))
    args = p.parse_args()
    cases = args.only.split(",") if args.only else CASES
    if os.geteuid() != 0 or not shutil.which("unshare"):
        cases = [c for c in cases if c != "full disk: run folder"]
    print("| processes | how it ends | exit status | ckpt.pt step | train.py's lines |\n|---|---|---|---|---|")
    for nproc in map(int, args.nproc.split(",")):
        for case in cases:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.monotonic()
                rc, step, lines = trial(case, nproc, tmp)
                said = "<br>".join(short(ln, tmp) for ln in lines) or "(none)"
                print(f"| {nproc} | {case} | {rc} | {step} | {said} |", flush=True)
                print(f"    ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
