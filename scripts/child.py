"""Child processes with a wall-clock limit and a kill path, for the scripts that run inside a GPU
window (scripts/gpu_run.py, lab/gpu_study.py): a child that hangs costs its limit and a few
seconds more, never the window.

Each child starts in a process group of its own, so that the stop reaches everything it started
(DataLoader workers, inductor's compile-worker pool, torchrun's children). The stop: SIGTERM
(train.py finishes its step and writes a checkpoint), then after `grace` seconds SIGABRT
(Python's faulthandler, with PYTHONFAULTHANDLER=1, writes every thread's stack to the log: where a
hang sits), then SIGKILL: at most `grace` + ABRT_S seconds after the limit.
"""
import os
import signal
import subprocess
import threading
import time

GRACE_S, ABRT_S = 3.0, 1.0  # after the limit: SIGTERM, GRACE_S, SIGABRT, ABRT_S, SIGKILL
STOP_S = GRACE_S + ABRT_S  # the most a stop adds to a child's limit


def start(cmd, log=None, env=None, cwd=None):
    """Popen of `cmd` (a list) in a new process group, stdout and stderr merged; its output is copied
    to the open file `log` (or dropped) by a reader thread that records when the last output came
    (`proc.last_output`, time.monotonic()) and keeps the last line (`proc.last_line`)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                            start_new_session=True)
    proc.last_output, proc.last_line = time.monotonic(), ""

    def read():
        for raw in iter(lambda: proc.stdout.readline(), b""):
            proc.last_output = time.monotonic()
            text = raw.decode(errors="replace")
            if text.strip():
                proc.last_line = text.strip().split("\r")[-1]
            if log is not None:
                log.write(text)
                log.flush()
    proc.reader = threading.Thread(target=read, daemon=True)
    proc.reader.start()
    return proc


def stop(proc, grace=GRACE_S):
    """Stop `proc` and its process group: SIGTERM, SIGABRT after `grace` s, SIGKILL after ABRT_S more;
    returns once the child is gone (at most grace + ABRT_S seconds)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGABRT, ABRT_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break  # the group is gone
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
    reap_group(proc.pid)


def reap_group(pgid):
    """SIGKILL whatever is left of process group `pgid` (a grandchild that outlived its parent, such as
    a compile worker): nothing a child started outlives it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(cmd, limit_s, log=None, env=None, cwd=None):
    """Run `cmd` for at most `limit_s` seconds (then `stop`). Returns a dict: rc (124 when it was
    stopped at its limit), status ("ok", "FAILED", "TIMED OUT"), seconds (wall, the stop included),
    exit_delay_s (from its last output to its exit; None when stopped) and last_line."""
    t0 = time.monotonic()
    proc = start(cmd, log, env, cwd)
    try:
        rc = proc.wait(timeout=max(0.0, limit_s))
        done = time.monotonic()
        delay = max(0.0, done - proc.last_output)
        reap_group(proc.pid)
    except subprocess.TimeoutExpired:
        stop(proc)
        rc, delay = 124, None
    except BaseException:  # the runner itself is stopped (Ctrl-C, its own limit): the child goes too
        stop(proc)
        raise
    proc.reader.join(timeout=1.0)
    status = "ok" if rc == 0 else "TIMED OUT" if rc == 124 else "FAILED"
    return {"rc": rc, "status": status, "seconds": round(time.monotonic() - t0, 1),
            "exit_delay_s": None if delay is None else round(delay, 2), "last_line": proc.last_line[:300]}
