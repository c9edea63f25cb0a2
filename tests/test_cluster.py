"""Runs that survive a shared cluster (issue 17): SIGTERM -> checkpoint -> `--resume auto`, the
resume policy, gradient accumulation, EMA evaluation, two nodes on localhost, the --out-dir lock;
and how runs end (issue 30): Ctrl-C, a stop in every phase, errors while loader workers run.

CPU only; tiny models on a fake CIFAR folder or synthetic data.
"""
import io
import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import data
import train
from training.flags import get_parser, parse_args
from training import checkpoints, evaluation, exits, optim, registry
from test_train import ROOT, TINY, cmd, fake_cifar, load, run

pytestmark = pytest.mark.slow  # (train.py runs: README's quick tier, -m "not slow", leaves them out)

SYNTH = ["--embed-dim", "32", "--num-heads", "2", "--depth", "2", "--device", "cpu", "--workers", "0",
         "--val-subset", "32", "--eval-batch-size", "32", "--data", "synthetic"]


def weights_close(a, b, atol=1e-5):
    return all(torch.allclose(a[k], b[k], atol=atol, rtol=1e-4) for k in a)


def test_sigterm_mid_epoch_then_resume_auto_equals_an_uninterrupted_run(tmp_path):
    cifar = fake_cifar(tmp_path / "data")
    job = TINY + ["--data", "cifar100", "--data-dir", cifar, "--epochs", "4", "--save-every", "3",
                  "--drop-path", "0.1", "--mixup", "0.8", "--workers", "1", "--resume", "auto"]
    full = run(job + ["--out-dir", str(tmp_path / "full")])
    assert full.returncode == 0, full.stderr
    out = str(tmp_path / "pre")
    p = subprocess.Popen(cmd(job + ["--out-dir", out]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in p.stdout:  # the first mid-epoch checkpoint: the run is inside epoch 0
        if line.startswith("saved checkpoint at step 3"):
            p.send_signal(signal.SIGTERM)
            break
    p.stdout.read()
    err = p.stderr.read()
    assert p.wait() == exits.PREEMPTED, err
    said = [ln for ln in err.splitlines() if "train.py:" in ln]  # (not the progress bar)
    assert len(said) == 1 and "SIGTERM" in said[0] and "--resume auto" in said[0], err
    ck = load(os.path.join(out, "ckpt.pt"))
    assert 3 <= ck["step"] < 32 and ck["batch"] > 0  # mid-epoch, after the signal's step
    again = run(job + ["--out-dir", out])  # the same command: the requeue
    assert again.returncode == 0, again.stderr
    a, b = load(tmp_path / "full" / "ckpt.pt"), load(os.path.join(out, "ckpt.pt"))
    assert a["step"] == b["step"] == 32
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_resume_prints_changed_flags_and_refuses_a_new_batch_size_mid_epoch(tmp_path, capsys):
    cifar = fake_cifar(tmp_path / "data")
    job = TINY + ["--data", "cifar100", "--data-dir", cifar, "--epochs", "2", "--warmup-epochs", "0"]
    out = str(tmp_path / "o")
    assert train.cli(job + ["--max-steps", "3", "--save-every", "2", "--out-dir", out]) == 0
    ck = os.path.join(out, "ckpt.pt")
    assert load(ck)["batch"] == 3  # the epoch's end-of-run checkpoint: epoch 0, step 3 of 8
    capsys.readouterr()
    flags = job + ["--out-dir", out, "--resume", ck]
    assert train.cli(flags + ["--batch-size", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch-size was 8, now 16" in err[0] and "mid-epoch" in err[0], err
    assert f"--config {out}/args.json gives every flag of the run" in err[0]  # and it does (on a copy of the run):
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    assert train.cli(["--config", os.path.join(copy, "args.json"), "--out-dir", copy, "--resume",
                      os.path.join(copy, "ckpt.pt"), "--max-steps", "4"]) == 0
    assert load(os.path.join(copy, "ckpt.pt"))["step"] == 4
    capsys.readouterr()
    assert train.cli(flags + ["--repeated-aug", "3"]) == 2  # another sampler: other images for the rest of the epoch
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--repeated-aug was 0, now 3" in err[0] and "mid-epoch" in err[0], err
    assert train.cli(flags + ["--embed-dim", "64"]) == 2
    assert "--finetune" in capsys.readouterr().err
    assert train.cli(flags + ["--lr", "2e-3", "--max-steps", "5"]) == 0  # allowed, and said
    said = capsys.readouterr().out
    assert "resume: --lr 0.001 -> 0.002" in said and "resume: --max-steps 3 -> 5" in said
    ck = load(ck)  # the new --lr really applies: the cosine ends at --min-lr, not at half of it
    assert ck["scheduler"]["base_lrs"] == [2e-3, 2e-3] and ck["step"] == 5
    last = json.loads(open(os.path.join(out, "log.jsonl")).read().splitlines()[-1])
    assert abs(last["lr"] - 1e-5) < 1e-12


def test_a_new_batch_size_is_allowed_at_an_epoch_boundary(tmp_path, capsys):
    cifar = fake_cifar(tmp_path / "data")
    job = TINY + ["--data", "cifar100", "--data-dir", cifar]
    out = str(tmp_path / "o")
    assert train.cli(job + ["--epochs", "1", "--out-dir", out]) == 0
    assert load(os.path.join(out, "ckpt.pt"))["batch"] == 0
    capsys.readouterr()
    # 3 epochs of 4 steps at batch 16 is 12 steps: 8 are done, epoch 1 takes the remaining 4
    rc = train.cli(job + ["--epochs", "3", "--batch-size", "16", "--out-dir", out, "--resume", "auto"])
    said = capsys.readouterr().out
    assert rc == 0 and "resume: --batch-size 8 -> 16" in said and "resume: --epochs 1 -> 3" in said
    assert load(os.path.join(out, "ckpt.pt"))["step"] == 8 + 4


def test_a_requeue_that_spells_out_defaults_resumes_and_another_optimizer_starts_fresh(tmp_path, capsys):
    """--img-size 32 on CIFAR, --size ti beside explicit widths, --num-blocks 1 for bvit describe the
    checkpoint's model: no refusal, no resume line. --opt lamb on an AdamW checkpoint: said, and
    LAMB starts from fresh state while the schedule goes on."""
    cifar = fake_cifar(tmp_path / "data")
    job = TINY + ["--data", "cifar100", "--data-dir", cifar, "--epochs", "2", "--save-every", "2"]
    out = str(tmp_path / "o")
    assert train.cli(job + ["--max-steps", "3", "--out-dir", out]) == 0  # stopped inside epoch 0
    capsys.readouterr()
    again = job + ["--out-dir", out, "--resume", "auto", "--img-size", "32", "--size", "ti", "--num-blocks", "1"]
    assert train.cli(again + ["--max-steps", "4"]) == 0, capsys.readouterr().err
    assert [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("resume:")] == [
        "resume: --max-steps 3 -> 4"]
    assert train.cli(again + ["--max-steps", "6", "--opt", "lamb"]) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "resume: --opt adamw -> lamb: the new optimizer starts from fresh state" in said
    ck = load(os.path.join(out, "ckpt.pt"))
    assert ck["step"] == 6 and all(g["always_adapt"] is False for g in ck["optimizer"]["param_groups"])
    assert ck["scheduler"]["last_epoch"] == 6


def test_grad_accum_equals_the_single_big_batch(tmp_path):
    job = SYNTH + ["--batch-size", "16", "--max-steps", "3", "--drop-path", "0", "--label-smoothing", "0.1"]
    big, acc = tmp_path / "big", tmp_path / "acc"
    assert train.cli(job + ["--out-dir", str(big)]) == 0
    assert train.cli(job + ["--grad-accum", "2", "--out-dir", str(acc)]) == 0
    a, b = load(big / "ckpt.pt")["model"], load(acc / "ckpt.pt")["model"]
    assert weights_close(a, b) and not weights_close(a, train_init(), atol=1e-3)
    la, lb = [json.loads(ln) for ln in open(big / "log.jsonl")], [json.loads(ln) for ln in open(acc / "log.jsonl")]
    assert abs(la[0]["train_loss"] - lb[0]["train_loss"]) < 1e-5


def test_grad_accum_equals_the_big_batch_on_the_batched_cifar_loader(tmp_path):
    # The batched loader's crops are a function of (seed, epoch, index), not of the batch split.
    cifar = fake_cifar(tmp_path / "data")
    job = TINY + ["--data", "cifar100", "--data-dir", cifar, "--batch-size", "16", "--max-steps", "3"]
    assert data.batched_loader(parse_args(get_parser(), job), torch.device("cpu"))
    assert train.cli(job + ["--out-dir", str(tmp_path / "big")]) == 0
    assert train.cli(job + ["--grad-accum", "4", "--out-dir", str(tmp_path / "acc")]) == 0
    assert weights_close(load(tmp_path / "big" / "ckpt.pt")["model"], load(tmp_path / "acc" / "ckpt.pt")["model"])


def train_init():
    import bvit
    torch.manual_seed(0)
    return bvit.BViT(img_size=32, patch_size=4, num_classes=100, embed_dim=32, num_heads=2, depth=2).state_dict()


def test_eval_ema_uses_the_ema_weights_and_says_so(tmp_path, capsys):
    out = tmp_path / "o"
    job = SYNTH + ["--batch-size", "16", "--max-steps", "4", "--ema", "0.5", "--eval-depths", "2"]
    assert train.cli(job + ["--eval-ema", "--out-dir", str(out)]) == 0
    rows = [json.loads(ln) for ln in open(out / "log.jsonl")]
    epoch, depth = rows[0], rows[1]
    assert depth["weights"] == "ema" and depth["val_acc1"] == epoch["ema_val_acc1"]
    assert epoch["ema_val_loss"] != epoch["val_loss"]  # the two sets of weights differ
    ev = tmp_path / "ev"
    assert train.cli(["--eval-only", "--resume", str(out / "ckpt.pt"), "--eval-ema", "--eval-depths", "2",
                      "--out-dir", str(ev), "--workers", "0"]) == 0
    res = json.load(open(ev / "depth_eval.json"))["results"][0]
    assert res["val_acc1"] == epoch["ema_val_acc1"] and res["weights"] == "ema"
    assert train.cli(["--eval-only", "--resume", str(out / "ckpt.pt"), "--eval-depths", "2",  # not inherited
                      "--out-dir", str(ev), "--workers", "0"]) == 0
    assert json.load(open(ev / "depth_eval-2.json"))["results"][0]["weights"] == "model"  # (the first's kept)
    assert json.load(open(ev / "depth_eval.json"))["results"][0]["weights"] == "ema"
    capsys.readouterr()
    assert train.cli(SYNTH + ["--eval-ema", "--out-dir", str(tmp_path / "x")]) == 2
    assert "--ema" in capsys.readouterr().err


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sampler", [[], ["--repeated-aug", "3"]], ids=["plain", "repeated-aug"])
def test_two_nodes_on_localhost_with_grad_accum_equal_one_process(tmp_path, sampler):
    """Also under repeated augmentation: each step's 16 samples are the same slots of the one repeated list
    (data.ResumableSampler) on one process as on two."""
    job = SYNTH + ["--batch-size", "16", "--max-steps", "3", "--drop-path", "0", *sampler]
    assert train.cli(job + ["--out-dir", str(tmp_path / "one")]) == 0
    port, env = free_port(), {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
                               str(r), "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
                               str(port), os.path.join(ROOT, "train.py")] + job + ["--grad-accum", "2", "--out-dir",
                                                                                   str(tmp_path / "two")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
             for r in (0, 1)]
    for n in nodes:
        _, err = n.communicate(timeout=300)
        assert n.returncode == 0, err[-2000:]
    a, b = load(tmp_path / "one" / "ckpt.pt"), load(tmp_path / "two" / "ckpt.pt")
    assert len(b["rng"]) == 2 and weights_close(a["model"], b["model"])


def hold_lock(out):
    """Another process that takes the --out-dir lock and then waits."""
    p = subprocess.Popen([sys.executable, "-c", f"import time; from training import checkpoints; f = checkpoints.lock_out_dir({str(out)!r}); "
                          "print('locked', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_a_second_run_on_a_live_out_dir_is_refused_and_a_dead_one_leaves_no_lock(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    live = hold_lock(out)
    assert train.cli(SYNTH + ["--max-steps", "1", "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "in use" in err and str(live.pid) in err
    live.kill()  # SIGKILL: no chance to clean up; the OS releases the lock
    live.wait()
    assert train.cli(SYNTH + ["--max-steps", "1", "--out-dir", str(out)]) == 0


# ----------------------------------------------------------------------------- signals to the whole process group (issue 24)
from conftest import SAMPLE  # noqa: E402  ($RVITS_DATA/imagenet-sample, else ../shared/data's)


def command(args, launcher):
    """train.py with `args`, under `launcher` (torchrun) if given."""
    return [*launcher, os.path.join(ROOT, "train.py"), *args] if launcher else cmd(args)


def signal_the_group(job, out, sig, launcher=()):
    """Start `job` in a process group of its own (as a cluster job is), signal the whole group once
    the first mid-epoch checkpoint is written, and return (exit status, stderr)."""
    p = subprocess.Popen(command(job + ["--out-dir", out], launcher), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        for line in p.stdout:
            if line.strip() == "saved checkpoint at step 3":
                os.killpg(p.pid, sig)  # scancel / preemption / Ctrl-C: every process of the job
                break
        p.stdout.read()
        err = p.stderr.read()
        return p.wait(timeout=120), err
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


@pytest.mark.parametrize("case", ["cifar, 2 loader workers, SIGTERM", "image folder, 1 loader worker, SIGUSR1",
                                  "torchrun, 2 processes, 1 loader worker each, Ctrl-C (SIGINT)"])
def test_a_signal_to_the_whole_process_group_stops_at_a_checkpoint_and_the_requeue_finishes(tmp_path, case):
    """A cluster signals every process of a job, and so does a terminal's Ctrl-C (which torchrun
    relays to its processes too). Loader workers leave the decision to the training process
    (data.worker_signals): same one line, same stop checkpoint as a signal to the training process
    alone, and the same command with --resume auto finishes the run."""
    sig = {"SIGUSR1": signal.SIGUSR1, "SIGINT": signal.SIGINT}.get(case.split()[-1].strip("()"), signal.SIGTERM)
    workers = "2" if "2 loader" in case else "1"
    if "folder" in case:
        if not os.path.isdir(SAMPLE):
            pytest.skip(f"{SAMPLE} not present (set RVITS_DATA)")
        data_flags = ["--data", "imagenet", "--data-dir", SAMPLE, "--img-size", "32", "--patch-size", "8"]
    else:
        data_flags = ["--data", "cifar100", "--data-dir", fake_cifar(tmp_path / "data"), "--cpu-loader"]
    job = TINY[:6] + ["--device", "cpu", "--workers", workers, "--val-subset", "16", "--eval-batch-size", "16",
                      "--batch-size", "4", *data_flags, "--max-steps", "12", "--save-every", "3", "--resume", "auto"]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                str(free_port())] if "torchrun" in case else []
    out = str(tmp_path / "run")
    rc, err = signal_the_group(job, out, sig, launcher)
    said = [ln for ln in err.splitlines() if ln.startswith("train.py:")]
    assert said and all(f"stopped by {sig.name}" in ln for ln in said), err[-3000:]
    assert "Traceback" not in err or launcher, err[-3000:]  # (torchrun's own report of a signal is a traceback)
    assert rc == (exits.PREEMPTED if not launcher else 1), err[-3000:]
    ck = load(os.path.join(out, "ckpt.pt"))
    assert 3 <= ck["step"] < 12
    again = subprocess.run(command(job + ["--out-dir", out], launcher), capture_output=True, text=True, cwd=ROOT,
                           timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert load(os.path.join(out, "ckpt.pt"))["step"] == 12


def test_a_checkpoint_of_the_earlier_non_fused_adamw_resumes(tmp_path):
    """Runs before the device-side skip of non-finite steps saved AdamW as fused=False on the CPU;
    the fused AdamW this train.py needs (it reads found_inf) must take over on --resume."""
    out = tmp_path / "o"
    job = SYNTH + ["--batch-size", "16", "--out-dir", str(out)]
    assert train.cli(job + ["--max-steps", "2"]) == 0
    ck = load(out / "ckpt.pt")
    for g in ck["optimizer"]["param_groups"]:
        g.update(fused=False, foreach=None)  # as f937315 saved it
    torch.save(ck, out / "ckpt.pt")
    assert train.cli(job + ["--max-steps", "4", "--resume", "auto"]) == 0
    assert load(out / "ckpt.pt")["step"] == 4


# ----------------------------------------------------------------------------- how runs end (issue 30)
FORK_SERVER = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import train
from training import optim
for line in sys.stdin:
    cmd, arg = line.split(" ", 1)
    if cmd == "wait":
        print(f"@@exit {os.waitstatus_to_exitcode(os.waitpid(int(arg), 0)[1])}", flush=True)
        continue
    job = json.loads(arg)
    pid = os.fork()
    if pid:
        print(f"@@pid {pid}", flush=True)
        continue
    os.setsid()  # a process group of its own, as a job's or a terminal command's
    os.dup2(os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    if job["quiet"]:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.environ.update(job["env"])
    if job["fail_at"]:  # a bug that raises in the middle of an epoch, at this optimizer step
        step, calls = optim.optimizer_step, []
        def failing(*a):
            calls.append(1)
            if len(calls) == job["fail_at"]:
                raise RuntimeError("a bug in the middle of an epoch")
            return step(*a)
        optim.optimizer_step = failing
    sys.exit(train.cli(job["argv"]))
"""


class Forks:
    """One process that has imported train.py and forks a process per run: a run starts in a fraction
    of a second instead of the ~7 s that importing torch takes on 2 cores, and it ends as `python
    train.py` does (cli's status through sys.exit, then the interpreter's exit handlers). Rank 0's
    (or the only run's) stdout lines come through this process's stdout, each child's stderr goes
    to a file."""

    def __init__(self):
        self.p = subprocess.Popen([sys.executable, "-c", FORK_SERVER, ROOT], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, bufsize=0, env={**os.environ, "OMP_NUM_THREADS": "1"})

    def start(self, argv, stderr, env=None, fail_at=0, quiet=False):
        job = dict(argv=argv, stderr=str(stderr), env=env or {}, fail_at=fail_at, quiet=quiet)
        self.p.stdin.write(f"run {json.dumps(job)}\n".encode())
        return int(self.until(lambda ln: ln.startswith("@@pid "), 120).split()[1])

    def until(self, want, timeout):
        """The first line of the output that `want` accepts, within `timeout` seconds."""
        deadline, fd = time.monotonic() + timeout, self.p.stdout.fileno()
        while True:
            line = b""
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError(f"no such line within {timeout} s")
                line += os.read(fd, 1) or pytest.fail("the fork server ended")
            if want(line.decode().strip()):
                return line.decode().strip()

    def wait(self, pid, timeout):
        """The run's exit status, within `timeout` seconds; else its process group is killed and the
        test fails."""
        self.p.stdin.write(f"wait {pid}\n".encode())
        try:
            return int(self.until(lambda ln: ln.startswith("@@exit "), timeout).split()[1])
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)
            self.until(lambda ln: ln.startswith("@@exit "), 30)
            pytest.fail(f"the run had not ended {timeout} s later")

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


@pytest.fixture(scope="module")
def forks():
    f = Forks()
    yield f
    f.close()


def children(pid):
    """The pids of a process's children (its loader workers), from /proc (Linux)."""
    tasks = os.listdir(f"/proc/{pid}/task")
    return [int(c) for t in tasks for c in open(f"/proc/{pid}/task/{t}/children").read().split()]


def alive(pids):
    """The processes of `pids` that still exist (zombies excluded)."""
    def state(p):
        try:
            return open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "gone"
    return [p for p in pids if state(p) not in ("gone", "Z")]


def status(argv):
    """train.cli's exit status, or "KeyboardInterrupt" when that escapes it (no handler for SIGINT)."""
    try:
        return train.cli(argv)
    except KeyboardInterrupt:
        return "KeyboardInterrupt"


def ours(path):
    """train.py's own lines in a stderr file (a progress bar's \\r-separated updates apart)."""
    return [ln for ln in open(path).read().replace("\r", "\n").splitlines() if ln.startswith("train.py:")]


def test_ctrl_c_to_the_training_process_or_to_its_group_stops_at_a_checkpoint_and_the_run_resumes_exactly(
        tmp_path, forks):
    """Ctrl-C in a terminal signals the whole process group (training process and loader workers), `kill
    -INT PID` only the training process: either way the step in flight finishes, a checkpoint is written,
    one line says how to continue, the process and its workers end and the lock is free; the printed
    command then continues, and the run ends with the weights of an uninterrupted run."""
    cifar = fake_cifar(tmp_path / "data")
    job = TINY[:6] + ["--device", "cpu", "--workers", "2", "--val-subset", "16", "--eval-batch-size", "16",
                      "--batch-size", "4", "--data", "cifar100", "--data-dir", cifar, "--cpu-loader", "--randaug", "5",
                      "--max-steps", "40", "--save-every", "3"]  # (31 steps after the last signal: it lands
    # before the run ends on a loaded machine, where 3 did not; the resumed run crosses two epoch boundaries)
    out, argv = str(tmp_path / "run"), job + ["--out-dir", str(tmp_path / "run")]
    for n, (at, kill) in enumerate([(3, os.kill), (9, os.killpg)]):  # the training process alone, then its group
        pid = forks.start(argv, tmp_path / f"err{n}")
        forks.until(lambda ln: ln == f"saved checkpoint at step {at}", 120)
        workers = children(pid)
        kill(pid, signal.SIGINT)
        assert forks.wait(pid, 60) == exits.PREEMPTED, open(tmp_path / f"err{n}").read()[-2000:]
        said = ours(tmp_path / f"err{n}")
        assert len(said) == 1 and "stopped by SIGINT (Ctrl-C) after step" in said[0], said
        assert len(workers) == 2 and not alive(workers)
        assert at <= load(os.path.join(out, "ckpt.pt"))["step"] < 40  # (the step in flight, if any), then the stop
        if n == 0:
            assert "continue with: python train.py " in said[0]
            argv = shlex.split(said[0].split("continue with: python train.py ", 1)[1])
        else:
            assert "continue with the same command" in said[0]
    assert train.cli(argv) == 0
    assert train.cli(job[:job.index("--workers") + 1] + ["0"] + job[job.index("--workers") + 2:]
                     + ["--out-dir", str(tmp_path / "full")]) == 0  # (workers do not change the data)
    a, b = load(tmp_path / "full" / "ckpt.pt"), load(os.path.join(out, "ckpt.pt"))
    assert a["step"] == b["step"] == 40 and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


class TerminalGone(io.StringIO):
    """sys.stdout or sys.stderr on a terminal that has closed: every write and flush raises EIO."""

    def write(self, text):
        raise OSError(5, "Input/output error")  # errno.EIO

    def flush(self):
        raise OSError(5, "Input/output error")


def test_sighup_stops_like_sigterm_also_with_the_terminal_gone(tmp_path, capsys, monkeypatch):
    """The terminal closes or the ssh session drops: SIGHUP ended `python train.py` at once (status 129, no
    checkpoint, no line). Now it is a stop request like SIGTERM: the step in flight finishes, a checkpoint, one
    line with the command that continues, status 75; and so when the terminal is gone and every line written
    to it fails (EIO), the stop's own lines included. (A guard stands in for SIGHUP's default action here, so
    that without the handler the test fails instead of ending pytest.)"""
    step, calls = optim.optimizer_step, []

    def hangup(*a):  # in the 2nd step: the terminal closes
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGHUP)
        return step(*a)

    def unhandled(*a):
        raise AssertionError("SIGHUP reached the process's own handler: train.py does not handle it")
    monkeypatch.setattr(optim, "optimizer_step", hangup)
    before = signal.signal(signal.SIGHUP, unhandled)
    try:
        job = SYNTH + ["--batch-size", "8", "--max-steps", "8", "--save-every", "4"]
        out = tmp_path / "run"
        assert status(job + ["--out-dir", str(out)]) == exits.PREEMPTED
        said = [ln for ln in capsys.readouterr().err.splitlines() if "SIGHUP" in ln]
        assert len(said) == 2 and said[0].startswith("stop requested by SIGHUP (the terminal closed): the run "), said
        assert said[1].startswith(f"train.py: stopped by SIGHUP (the terminal closed) after step 2 of 8; checkpoint "
                                  f"{out / 'ckpt.pt'} (step 2); continue with: python train.py "), said
        assert load(out / "ckpt.pt")["step"] == 2
        calls.clear()
        monkeypatch.setattr(sys, "stdout", TerminalGone())
        monkeypatch.setattr(sys, "stderr", TerminalGone())
        assert status(job + ["--out-dir", str(tmp_path / "gone")]) == exits.PREEMPTED
        assert load(tmp_path / "gone" / "ckpt.pt")["step"] == 2
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_second_ctrl_c_stops_at_once_and_torchruns_relayed_copy_of_the_first_does_not(tmp_path, capsys,
                                                                                       monkeypatch):
    """Two SIGINTs within Stop.AGAIN_S (a terminal's Ctrl-C and torchrun relaying it) are one stop
    request; a second Ctrl-C after that stops at once, in the middle of a step, with one line naming
    the last checkpoint."""
    step, calls = optim.optimizer_step, []

    def ctrl_c_twice(*a):  # in the 4th step: Ctrl-C, and Ctrl-C again
        calls.append(1)
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return step(*a)
    monkeypatch.setattr(optim, "optimizer_step", ctrl_c_twice)
    job = SYNTH + ["--batch-size", "8", "--max-steps", "8", "--save-every", "2"]
    assert status(job + ["--out-dir", str(tmp_path / "relayed")]) == exits.PREEMPTED
    assert "stopped by SIGINT (Ctrl-C) after step 4 of 8" in capsys.readouterr().err
    calls.clear()
    monkeypatch.setattr(exits.Stop, "AGAIN_S", 0.0)  # every second SIGINT counts as a second Ctrl-C
    assert status(job + ["--out-dir", str(tmp_path / "twice")]) == 130
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("train.py:")]
    assert len(err) == 1 and "stopped at once by a second Ctrl-C" in err[0], err
    assert f"checkpoint {tmp_path / 'twice' / 'ckpt.pt'} (step 2)" in err[0]
    assert load(tmp_path / "twice" / "ckpt.pt")["step"] == 2 and not os.path.exists(tmp_path / "twice" / "ckpt.pt.tmp")


def test_an_error_in_the_middle_of_an_epoch_ends_the_processes_and_their_loader_workers_within_seconds(
        tmp_path, forks):
    """An exception that escapes as a traceback while loader workers run, in one process and in one of
    two DDP processes (started as torchrun starts them): every process exits within seconds and no
    worker outlives it (before, Python's exit waited forever for workers that ignore SIGTERM)."""
    cifar = fake_cifar(tmp_path / "data")
    job = TINY[:6] + ["--device", "cpu", "--val-subset", "16", "--eval-batch-size", "16", "--batch-size", "4",
                      "--data", "cifar100", "--data-dir", cifar, "--cpu-loader", "--randaug", "5", "--max-steps", "12"]
    job += ["--save-every", "1"]  # (its first line says that the loader's workers have started)
    pid = forks.start(job + ["--workers", "2", "--out-dir", str(tmp_path / "one")], tmp_path / "err", fail_at=3)
    forks.until(lambda ln: ln == "saved checkpoint at step 1", 120)
    workers = children(pid)
    assert forks.wait(pid, 30) == 1 and len(workers) == 2 and not alive(workers)
    assert "RuntimeError: a bug in the middle of an epoch" in open(tmp_path / "err").read()
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    ranks = [forks.start(job + ["--workers", "1", "--dist-timeout", "60", "--out-dir", str(tmp_path / "ddp")],
                         tmp_path / f"err{r}", env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, fail_at=3 * r,
                         quiet=r == 1) for r in (0, 1)]
    forks.until(lambda ln: ln == "saved checkpoint at step 1", 120)
    workers = children(ranks[0]) + children(ranks[1])
    assert [forks.wait(pid, 30) for pid in ranks] == [1, 1] and len(workers) == 2 and not alive(workers)
    assert "a peer failed" in ours(tmp_path / "err0")[0]
    assert "RuntimeError: a bug in the middle of an epoch" in ours(tmp_path / "err1")[0]


def test_a_stop_is_honoured_in_every_phase_of_a_run(tmp_path, capsys, monkeypatch):
    """A stop request outside a training step: during the set-up (before the first step), while a
    checkpoint is written (the file is finished, then the run stops, without another step), during
    an epoch's evaluation (it finishes, the epoch is saved), during the --eval-depths evaluations
    after training and during --eval-only (after the batch in flight): exit 75 and one line each;
    the same command then finishes what was left."""
    def signal_when(mp, module, name, sig, when):  # send `sig` to this process when `when` holds for a call
        real = getattr(module, name)

        def wrapper(*a, **kw):
            if when(*a, **kw):
                os.kill(os.getpid(), sig)
            return real(*a, **kw)
        mp.setattr(module, name, wrapper)
    out = tmp_path / "o"
    job = TINY + ["--data", "cifar100", "--data-dir", fake_cifar(tmp_path / "data"), "--epochs", "2", "--save-every",
                  "2", "--eval-depths", "1,2,4", "--out-dir", str(out), "--resume", "auto"]  # 8 steps an epoch
    phases = [  # (function, signal, when, what the line says, the checkpoint's step)
        (registry, "build_model", signal.SIGINT, lambda *a, **kw: True, "stopped by SIGINT (Ctrl-C) before the first step",
         None),
        (checkpoints, "save_atomic", signal.SIGTERM, lambda obj, path: obj["step"] == 2, "after step 2 of 16", 2),
        (evaluation, "evaluate", signal.SIGINT, lambda *a, depth=None, **kw: depth is None,
         "stopped by SIGINT (Ctrl-C) after step 8 of 16, the end of epoch 0", 8),
        (evaluation, "evaluate", signal.SIGTERM, lambda *a, depth=None, **kw: depth == 4,  # (2: the epoch's own)
         "in the evaluation at depth 4 (2 of 3 depths done, after training to step 16)", 16)]
    for module, name, sig, when, says, step in phases:
        with monkeypatch.context() as mp:
            signal_when(mp, module, name, sig, when)
            assert status(job) == exits.PREEMPTED
        assert says in capsys.readouterr().err
        assert load(out / "ckpt.pt")["step"] == step if step else not (out / "ckpt.pt").exists()
    log = [json.loads(ln) for ln in open(out / "log.jsonl")]
    assert [r.get("epoch", r.get("depth")) for r in log] == [0, 1, 1, 2]  # epochs 0 and 1, depths 1 and 2
    ev = ["--eval-only", "--resume", str(out / "ckpt.pt"), "--eval-depths", "1,2", "--out-dir", str(tmp_path / "ev")]
    with monkeypatch.context() as mp:
        signal_when(mp, evaluation, "evaluate", signal.SIGINT, lambda *a, depth=None, **kw: depth == 2)
        assert status(ev) == exits.PREEMPTED
    assert "stopped by SIGINT (Ctrl-C) in the evaluation at depth 2 (1 of 2 depths done); depth_eval.json holds " \
        "depth(s) 1; run the same command again" in capsys.readouterr().err
    # each finished depth is kept before the next starts (issue 62, item 6): depth 1 is there, depth 2 is not
    assert [r["depth"] for r in json.load(open(tmp_path / "ev" / "depth_eval.json"))["results"]] == [1]
    assert status(job) == 0, capsys.readouterr().err  # the requeue: nothing left to train, the evaluations again
    assert [r["depth"] for r in map(json.loads, open(out / "log.jsonl")) if "depth" in r] == [1, 2, 1, 2, 4]

# ----------------------------------------------------------------------------- one decision, every process (issue 53)
def torchrun(args, nproc=2):
    """train.py under torchrun with `nproc` processes on this machine: the finished process."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
                str(free_port())]
    return subprocess.run(command(args, launcher), capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_eval_depths_after_torchrun_training_equal_eval_only_on_one_and_two_processes(tmp_path):
    """--eval-depths after a 2-process run reuses the trained depth's epoch evaluation on every process or
    on none: each depth's numbers equal --eval-only's of the same checkpoint (1 and 2 processes), exit 0.
    (Each process used to read log.jsonl, which rank 0 alone writes, so a peer could take the other path
    and pair its depths with rank 0's in one all-reduce.)"""
    out = tmp_path / "run"
    job = SYNTH[:-4] + ["--val-subset", "64", "--eval-batch-size", "16", "--data", "synthetic", "--batch-size", "16",
                        "--max-steps", "4", "--eval-depths", "1,2,3,4"]
    r = torchrun(job + ["--out-dir", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    trained = {d["depth"]: d for d in json.load(open(out / "depth_eval.json"))["results"]}
    assert sorted(trained) == [1, 2, 3, 4]
    for nproc in (1, 2):
        ev = tmp_path / f"eval{nproc}"
        job = ["--eval-only", "--resume", str(out / "ckpt.pt"), "--eval-depths", "1,2,3,4", "--out-dir", str(ev),
               "--workers", "0", "--device", "cpu"]
        e = torchrun(job, nproc) if nproc > 1 else subprocess.run(cmd(job), capture_output=True, text=True, cwd=ROOT,
                                                                  timeout=300)
        assert e.returncode == 0, e.stderr[-3000:]
        for d in json.load(open(ev / "depth_eval.json"))["results"]:
            for k in ("val_acc1", "val_acc5", "val_loss"):
                assert abs(d[k] - trained[d["depth"]][k]) < 1e-4, (nproc, d, trained[d["depth"]])


def test_a_run_that_fails_after_joining_its_process_group_leaves_it(tmp_path, monkeypatch, capsys):
    """A Fail after the process group is joined (here: OUT/ckpt.pt exists and --resume is not given)
    leaves the group before cli returns (exits.leave_process_group): a gloo group still open at exit
    ended rank 0 with SIGABRT after its line, so torchrun reported a signal instead of exit 2."""
    import torch.distributed as dist
    out = tmp_path / "run"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"")
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)
    assert train.cli(SYNTH + ["--batch-size", "16", "--max-steps", "2", "--out-dir", str(out)]) == 2
    assert "ckpt.pt" in capsys.readouterr().err
    assert not dist.is_initialized()


def test_a_node_that_does_not_see_the_run_folder_is_refused_on_every_process(tmp_path):
    """--resume auto read per process: a node whose --out-dir holds no checkpoint (its own disk, not the
    shared one) would start afresh beside a resuming rank 0. Both processes refuse it with one line (exit 2, which torchrun
    reports as its own exit 1), before a step."""
    job = SYNTH + ["--batch-size", "16", "--max-steps", "2", "--resume", "auto"]
    assert train.cli(job + ["--out-dir", str(tmp_path / "shared")]) == 0
    port, env = free_port(), {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
                               str(r), "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
                               str(port), os.path.join(ROOT, "train.py")] + job + ["--max-steps", "4", "--out-dir",
                                                                                   str(tmp_path / ("shared", "own")[r])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
             for r in (0, 1)]
    for n in nodes:
        _, err = n.communicate(timeout=300)
        said = [ln for ln in err.splitlines() if ln.startswith("train.py:")]
        assert n.returncode == 1 and len(said) == 1 and "exitcode  : 2" in err, err[-2000:]
        assert "rank 0 resumes" in said[0] and "rank 1 starts afresh" in said[0] and "shared filesystem" in said[0]
    assert load(tmp_path / "shared" / "ckpt.pt")["step"] == 2  # nothing was trained further
