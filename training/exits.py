"""How a run ends: the one-line failures, the stop signals and train.py's exit statuses.

- Fail (a problem the user can fix: one line, exit status 2), PeerFailed (the DDP processes did not
  meet: 1), Preempted (stopped at a safe point: PREEMPTED = 75); a second Ctrl-C: INTERRUPTED = 130.
- Stop: the handler of SIGINT / SIGTERM / SIGUSR1 / SIGHUP and what a stopped run keeps; `stopping` agrees
  on a stop across the processes.
- write and cannot_write: a run's file written, or one Fail line naming it (a full disk); say (a line on
  stderr below a progress bar) and printable_output (every line printable, whatever the encoding of
  stdout; a line that cannot be written, Unfailing, ends nothing), with which the entries (train.py,
  analyze.py, probe.py) print these lines.
What happens around the steps (the bar, the estimate, the run's other lines) is training/monitor.py's.
"""
import errno
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm


class Fail(Exception):
    """A problem the user can fix: printed as one line, exit status 2."""


class PeerFailed(Exception):
    """The DDP processes could not start together (a peer that never came within --dist-timeout): one
    line, exit status 1, as for a peer that fails later."""


class Preempted(Exception):
    """A stop request (Stop) was honoured: the step in flight finished and a checkpoint was written,
    or an evaluation was cut short; printed as one line, exit status PREEMPTED."""


PREEMPTED = 75  # EX_TEMPFAIL (sysexits.h): a temporary failure, run the same command again
INTERRUPTED = 130  # 128 + SIGINT, the shell's status of a process ended by Ctrl-C


class Stop:
    """The run's stop requests and what a stopped run keeps (docs/cluster.md "Resuming and failures").

    As the signal handler of SIGTERM (what schedulers send before a kill), SIGUSR1 (SLURM's
    --signal), SIGINT (Ctrl-C) and SIGHUP (the terminal closed or the ssh session dropped; torchrun
    passes it on to its processes), from the start of the run to its end, it records a request;
    the run honours it at its next safe point: after the optimizer step in flight (with a
    checkpoint), after a checkpoint being written, after the evaluation batch in flight (one
    process; under DDP the processes agree between depths). A second Ctrl-C stops at once
    (KeyboardInterrupt), when it comes AGAIN_S or more after the first: torchrun relays the
    terminal's Ctrl-C to processes that the terminal has signalled already. `checkpoint`, `step`
    and `hint` (how to continue) name the last checkpoint written, for the line that ends the run.
    The first request is answered at once with a line (`master`: this process prints it; DDP: rank 0)
    saying what the run does in its phase (`phase`, set by the Monitor: (what a stop request does, what
    a second Ctrl-C does))."""
    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
    AGAIN_S = 1.0
    ANYWHERE = ("stops at its next safe point (after the step, checkpoint or evaluation batch in flight)",
                "stops at once")  # the phase outside the training steps and the epochs' evaluations

    def __init__(self):
        self.got, self.first_int = [], None
        self.checkpoint, self.step, self.hint, self.eval_only = None, None, "run the command again", False
        self.running = False  # set once the flags are read: a run (not --list-presets or --print-config)
        self.master, self.phase = True, self.ANYWHERE

    def __call__(self, signum, frame):
        now = time.monotonic()
        if signum == signal.SIGINT:
            if self.first_int is not None and now - self.first_int >= self.AGAIN_S:
                raise KeyboardInterrupt
            self.first_int = self.first_int or now
        if not self.got and self.running and self.master:
            self.answer(signum)
        self.got.append(signum)

    def __bool__(self):
        return bool(self.got)

    @staticmethod
    def name(signum):
        return signal.Signals(signum).name + {signal.SIGINT: " (Ctrl-C)", signal.SIGHUP: " (the terminal closed)"}.get(
            signum, "")

    def answer(self, signum):
        """The line that answers a first stop request: what the run does now and, for Ctrl-C, what a
        second Ctrl-C would do. Written from the signal handler: when the signal came in the middle of a
        write to stderr (a reentrant write raises RuntimeError), the line goes to its file descriptor."""
        doing, again = self.phase
        line = f"stop requested by {self.name(signum)}: the run {doing}" + (
            f"; Ctrl-C again, a second or more from now, {again}" if signum == signal.SIGINT else "")
        try:
            say(line)
        except RuntimeError:
            os.write(2, (line + "\n").encode("ascii", "backslashreplace"))

    def line(self, when):
        """The one line of a run stopped `when` (e.g. "after step 40"): the signal, what is kept."""
        name = self.name(self.got[0]) if self.got else "a stop signal to another process"
        return f"stopped by {name} {when}; {self.kept()}"

    def kept(self):
        """The last checkpoint and how to continue from it, in words."""
        if self.eval_only:
            return "nothing was written; run the same command again"
        if self.checkpoint is None:
            return "no checkpoint was written; run the command again"
        return f"checkpoint {self.checkpoint} (step {self.step}); {self.hint}"


def stopping(stop, ddp, device):
    """True once any process holds a stop request (`stop`, a Stop: SIGINT, SIGTERM, SIGUSR1, SIGHUP). The flag
    is all-reduced, so every rank stops after the same step and takes part in the checkpoint; the
    training loop asks every CHECK_EVERY steps on a GPU."""
    if not ddp:
        return bool(stop)
    flag = torch.tensor(float(bool(stop)), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


def write(path, text, kept, append=False):
    """Write (append: add) `text` to the run's file `path`. A whole file is written to PATH.tmp and renamed over
    `path`, so a run ended mid-write (a signal, a full disk) keeps the previous file whole (depth_eval.json,
    rewritten after each depth, keeps the depths before). A write that fails (a full disk, a folder that became
    read-only) raises Fail: one line naming the file, what the run keeps (`kept`, e.g. Stop.kept()) and how to
    continue, never a traceback; the partial PATH.tmp is removed."""
    if append:
        try:
            with open(path, "a") as f:
                f.write(text)
        except OSError as e:
            raise cannot_write(path, e, kept)
        return
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise cannot_write(path, e, kept)
        raise


def cannot_write(path, e, kept):
    """The Fail of a write of `path` that raised OSError `e`: the file, the cause, the fix (free space
    for a full disk or quota), what the run keeps (`kept`)."""
    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
    fix = f"free space in {os.path.dirname(path) or '.'}" if full else f"make {path} a file the run can write"
    return Fail(f"writing {path} failed ({e.strerror or e}); {fix}; {kept}")


def leave_process_group(finished=True):
    """Leave the DDP process group, if this process joined one, before the interpreter exits: a gloo
    group still open at exit can end the process with SIGABRT ("terminate called without an active
    exception") after its last line was printed, and torchrun then reports a signal instead of the run's
    exit status. `finished`: the run ended normally. NCCL's group is left only then, as before (after
    a failure its teardown can wait on a peer that is gone); gloo's teardown is local and always
    safe. Safe to call more than once."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if not finished and dist.get_backend() == "nccl":
        return
    try:
        dist.destroy_process_group()
    except Exception:  # (a group already broken by the failure that ends the run: the exit closes it)
        pass


def say(line):
    """One line on stderr, on a line of its own below an open progress bar (tqdm.write)."""
    tqdm.write(line, file=sys.stderr)


def printable_output(prog):
    """Let this process's stdout and stderr print any text, and let a line that cannot be written end
    nothing. A character their encoding cannot hold (a user's path or class name on a stdout set to ASCII
    by PYTHONIOENCODING=ascii or a C locale, a file name that is not UTF-8) is written as a backslash
    escape (backslashreplace, Python's own handler for stderr) instead of raising UnicodeEncodeError; a
    write that fails (OSError: a full disk under `> train.log`, a terminal gone after SIGHUP, a closed
    pipe) is dropped (Unfailing; `prog` names the tool in the one line that says so). The entries that
    print call it first (train.py, probe.py and analyze.py's cli): their lines, print's and say's, all go
    through these two streams."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
        if not isinstance(stream, Unfailing):
            setattr(sys, name, Unfailing(stream, name, prog))


class Unfailing:
    """A text stream (sys.stdout or sys.stderr, named `name`) whose write and flush never raise OSError:
    failing to print never ends a run. At the first failure the stream is given up: its file
    descriptor, if it has one, is pointed at os.devnull (so the interpreter's own flush at exit cannot
    fail either, which would turn any exit status into 120), what follows is dropped, and one line on
    stderr (when that still works, and not for a closed pipe, the way `| head` reads) says so, naming
    `prog`. Everything else (fileno, encoding, isatty, reconfigure, ...) is the stream's."""

    def __init__(self, stream, name, prog):
        self.stream, self.name, self.prog, self.lost = stream, name, prog, False

    def write(self, text):
        if not self.lost:
            try:
                return self.stream.write(text)
            except OSError as e:
                self.give_up(e)
        return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except OSError as e:
            if not self.lost:
                self.give_up(e)

    def give_up(self, e):
        self.lost = True
        try:
            fd, null = self.stream.fileno(), os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        except (OSError, ValueError, AttributeError):  # a stream without a file descriptor (in-process, tests)
            pass
        if self.name == "stdout" and e.errno != errno.EPIPE:
            say(f"{self.prog}: writing to stdout failed ({e.strerror or e}); it goes on without printing there")

    def __getattr__(self, name):
        return getattr(self.stream, name)
