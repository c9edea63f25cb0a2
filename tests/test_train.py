"""Reliability tests for train.py: exact resume after SIGKILL, atomic and safe checkpoints, one
clear line for every kind of bad input, non-finite losses, and a dying DDP peer.

CPU only; every run is a tiny model on a tiny fake CIFAR-100 folder written by the test.
"""
import errno
import os
import re
import pickle
import signal
import socket
import subprocess
import sys
import types
import time
from contextlib import nullcontext

import numpy as np
import pytest
import torch

from training import checkpoints
import data
import train
from training import monitor

pytestmark = pytest.mark.slow  # (train.py runs: README's quick tier, -m "not slow", leaves them out)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
TINY = ["--embed-dim", "32", "--num-heads", "2", "--depth", "2", "--device", "cpu", "--workers", "0",
        "--val-subset", "32", "--eval-batch-size", "32", "--batch-size", "8"]


def fake_cifar(root, n_train=64, n_test=32):
    """Write a CIFAR-100-layout folder of random images (same pickle format as the real one)."""
    folder = os.path.join(root, "cifar-100-python")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.RandomState(0)
    for split, n in (("train", n_train), ("test", n_test)):
        d = {"data": rng.randint(0, 256, (n, 3072)).astype(np.uint8),
             "fine_labels": rng.randint(0, 100, n).tolist()}
        with open(os.path.join(folder, split), "wb") as f:
            pickle.dump(d, f, protocol=2)
    return str(root)


def cmd(args):
    return [sys.executable, os.path.join(ROOT, "train.py")] + args


def run(args, env=None, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd(args), capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def load(path):
    return torch.load(path, weights_only=True)


@pytest.fixture
def cifar(tmp_path):
    return fake_cifar(tmp_path / "data")


# ----------------------------------------------------------------------------- exact resume
def test_sigkill_then_resume_equals_uninterrupted_run_bit_for_bit(tmp_path, cifar):
    # RandAugment, drop path and MixUp exercise every random stream; one loader worker process.
    job = TINY + ["--data", "cifar100", "--data-dir", cifar, "--epochs", "2", "--save-every", "2",
                  "--randaug", "5", "--drop-path", "0.1", "--mixup", "0.8", "--workers", "1"]
    full = run(job + ["--out-dir", str(tmp_path / "full")])
    assert full.returncode == 0, full.stderr
    out = str(tmp_path / "killed")
    p = subprocess.Popen(cmd(job + ["--out-dir", out]), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in p.stdout:  # blocks until the run reports its mid-epoch checkpoint at step 4
        if line.startswith("saved checkpoint at step 4"):
            p.send_signal(signal.SIGKILL)
            break
    p.wait()
    assert p.returncode == -signal.SIGKILL
    assert load(os.path.join(out, "ckpt.pt"))["step"] < 16  # it really was interrupted
    resumed = run(job + ["--out-dir", out, "--resume", os.path.join(out, "ckpt.pt")])
    assert resumed.returncode == 0, resumed.stderr
    a, b = load(tmp_path / "full" / "ckpt.pt"), load(os.path.join(out, "ckpt.pt"))
    assert a["step"] == b["step"] == 16
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    exp_avg = [s["exp_avg"] for s in a["optimizer"]["state"].values()]
    assert all(torch.equal(x, s["exp_avg"]) for x, s in zip(exp_avg, b["optimizer"]["state"].values()))


def test_crash_during_save_keeps_the_previous_checkpoint(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    checkpoints.save_atomic({"step": 1, "w": torch.ones(3)}, path)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("disk died mid-write")

    with pytest.raises(OSError, match="mid-write"):  # (issue 76: whatever torch wraps it in, an OSError: one line)
        checkpoints.save_atomic({"step": 2, "w": torch.zeros(1000), "boom": Boom()}, path)
    ck = load(path)
    assert ck["step"] == 1 and torch.equal(ck["w"], torch.ones(3))


def test_checkpoint_with_a_pickled_object_is_refused(tmp_path, cifar):
    good = str(tmp_path / "good")
    assert run(TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1", "--out-dir", good]).returncode == 0
    ck = load(os.path.join(good, "ckpt.pt"))
    ck["payload"] = np.random.RandomState(0)  # any object outside the weights_only allow-list
    evil = str(tmp_path / "evil.pt")
    torch.save(ck, evil)
    r = run(TINY + ["--data", "cifar100", "--data-dir", cifar, "--out-dir", str(tmp_path / "o"),
                    "--resume", evil])
    assert r.returncode == 2 and "refused" in r.stderr and "Traceback" not in r.stderr, r.stderr


class Payload:
    """Unpickling this calls open(marker, "w"): what an attacker's os.system call would be."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_cifar_pickle_that_would_run_code_is_refused_before_anything_runs(tmp_path, cifar, capsys):
    marker = tmp_path / "marker"
    with open(os.path.join(cifar, "cifar-100-python", "train"), "wb") as f:
        pickle.dump({"data": np.zeros((8, 3072), np.uint8), "fine_labels": [0] * 8,
                     "payload": Payload(str(marker))}, f, protocol=2)
    rc = train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--out-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "refused" in err[0] and ".open" in err[0], err
    assert not marker.exists()
    fake_cifar(tmp_path / "again")  # numpy's own array pickles (numpy 2 module names) still load
    assert len(data.load_cifar100(str(tmp_path / "again"), True)[0]) == 64


# ----------------------------------------------------------------------------- bad input
def bad_cases(tmp_path, cifar):
    """(flags, text the one error line must contain, extra env) for every kind of bad input."""
    d = ["--data", "cifar100", "--data-dir", cifar]
    empty = fake_cifar(tmp_path / "empty")
    open(os.path.join(empty, "cifar-100-python", "train"), "wb").close()
    corrupt = fake_cifar(tmp_path / "corrupt")
    with open(os.path.join(corrupt, "cifar-100-python", "test"), "wb") as f:
        f.write(b"\x80\x02}q\x00(garbage")
    other = str(tmp_path / "other_model")
    assert train.cli(TINY + d + ["--model", "vit", "--max-steps", "1", "--out-dir", other]) == 0
    vit_ckpt = os.path.join(other, "ckpt.pt")
    wide = str(tmp_path / "wide")
    assert train.cli(TINY + d + ["--max-steps", "1", "--embed-dim", "64", "--out-dir", wide]) == 0
    with open(vit_ckpt, "rb") as f:
        blob = f.read()
    truncated, garbage = str(tmp_path / "truncated.pt"), str(tmp_path / "garbage.pt")
    with open(truncated, "wb") as f:
        f.write(blob[: len(blob) // 2])
    with open(garbage, "wb") as f:
        f.write(b'{"a json file": "or any text"}\n' * 100)
    a_file = str(tmp_path / "a_file")
    open(a_file, "w").close()
    return {
        "unknown model": (d + ["--model", "nosuch"], "--model"),
        "unknown size": (d + ["--size", "xl"], "--size"),
        "unknown preset": (d + ["--preset", "nosuch"], "--preset"),
        "depth zero": (d + ["--depth", "0"], "--depth"),
        "depth negative": (d + ["--depth", "-3"], "--depth"),
        "stages do not divide depth": (d + ["--depth", "6", "--stages", "4"], "--stages"),
        "zero experts": (d + ["--model", "revit", "--experts", "0"], "--experts"),
        "depth dropout 1": (d + ["--model", "revit", "--depth-dropout", "1"], "--depth-dropout"),
        "negative depth dropout": (d + ["--model", "revit", "--depth-dropout", "-0.1"], "--depth-dropout"),
        "zero recursions": (d + ["--model", "srvit", "--recursions", "0"], "--recursions"),
        "zero lr": (d + ["--lr", "0"], "--lr"),
        "negative lr": (d + ["--lr", "-1e-3"], "--lr"),
        "zero batch": (d + ["--batch-size", "0"], "--batch-size"),
        "patch does not divide image": (d + ["--patch-size", "5"], "--patch-size 5"),
        "image size vs patch (synthetic)": (["--data", "synthetic", "--img-size", "30"], "--patch-size"),
        "missing dataset": (["--data", "cifar100", "--data-dir", str(tmp_path / "nowhere")], "nowhere"),
        "empty dataset file": (["--data", "cifar100", "--data-dir", empty], "unreadable"),
        "corrupt dataset file": (["--data", "cifar100", "--data-dir", corrupt], "unreadable"),
        "truncated checkpoint": (d + ["--model", "vit", "--resume", truncated], "corrupt"),
        "a text file as checkpoint": (d + ["--resume", garbage], "not a checkpoint (torch.save writes a zip"),
        "checkpoint of another model": (d + ["--model", "bvit", "--resume", vit_ckpt], "--model vit"),
        "checkpoint of another shape": (d + ["--resume", os.path.join(wide, "ckpt.pt")], "changes the model"),
        "checkpoint at another image size": (d + ["--embed-dim", "64", "--resume", os.path.join(wide, "ckpt.pt"),
                                              "--img-size", "128"], "--img-size was None, now 128"),  # mid-epoch
        "malformed eval depths": (d + ["--eval-depths", "3,x"], "--eval-depths"),
        "zero eval depth": (d + ["--eval-depths", "0,3"], "--eval-depths"),
        "out-dir not writable": (d + ["--out-dir", os.path.join(a_file, "sub")], "--out-dir"),
        "batch not divisible by processes": (d + ["--batch-size", "9"], "processes",
                                             {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}),
        "RANK and WORLD_SIZE left without torchrun": (d, "MASTER_ADDR and MASTER_PORT not: start the processes with "
                                                      "torchrun, or unset RANK", {"RANK": "0", "WORLD_SIZE": "2"}),
        "fp16 on cpu": (d + ["--amp", "fp16"], "fp16"),
        "ema decay 1.5": (d + ["--ema", "1.5"], "--ema"),
        "negative workers": (d + ["--workers", "-1"], "--workers"),
        "randaug beyond 30": (d + ["--randaug", "50"], "--randaug"),
        "label smoothing 2": (d + ["--label-smoothing", "2"], "--label-smoothing"),
        "drop path 1.5": (d + ["--drop-path", "1.5"], "--drop-path"),
        "min lr above lr": (d + ["--min-lr", "1"], "--min-lr"),
        "negative max bad images": (d + ["--max-bad-images", "-1"], "--max-bad-images"),
        "routing on bvit": (d + ["--routing", "qwen3"], "--model revit"),
        "lora with four experts": (d + ["--model", "revit", "--lora-rank", "2"], "--experts 1"),
        "lora with a content routing": (d + ["--model", "revit", "--experts", "1", "--lora-rank", "2", "--routing",
                                             "smear"], "got --routing smear"),
        "distill without teacher": (d + ["--distill", "logits"], "--teacher"),
        "unknown device": (d + ["--device", "tpu"], "--device"),
        "compile scope without --compile": (d + ["--compile-scope", "model"], "needs --compile"),
        "whole-model compile of elastic depth": (d + ["--model", "revit", "--depth-dropout", "0.3", "--compile",
                                                      "--compile-scope", "model", "--out-dir", str(tmp_path / "fresh")],
                                                 "changes shape"),
    }


def test_every_bad_input_is_one_clear_line_exit_2_and_keeps_the_checkpoint(tmp_path, cifar, capsys,
                                                                           monkeypatch):
    # In-process through train.cli (what `python train.py` runs): an uncaught exception, i.e. a
    # traceback, fails the test; two real subprocess runs are in tests/test_loop.py.
    out = tmp_path / "out"
    out.mkdir()
    sentinel = b"previous run's checkpoint"
    (out / "ckpt.pt").write_bytes(sentinel)
    cases = bad_cases(tmp_path, cifar)
    assert len(cases) >= 15
    capsys.readouterr()
    failures = []
    for name, (flags, says, *env) in cases.items():
        if "--out-dir" not in flags:
            flags = flags + ["--out-dir", str(out)]
        with monkeypatch.context() as mp:
            for k, v in (env[0] if env else {}).items():
                mp.setenv(k, v)
            rc = train.cli(TINY + flags)
        lines = capsys.readouterr().err.strip().splitlines()
        if rc != 2 or len(lines) != 1 or says not in lines[0]:
            failures.append(f"{name}: rc={rc} stderr={lines[-3:]}")
    assert not failures, "\n".join(failures)
    assert (out / "ckpt.pt").read_bytes() == sentinel
    assert not (tmp_path / "fresh").exists() or not os.listdir(tmp_path / "fresh")  # refused before writing


# ----------------------------------------------------------------------------- failures
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, cifar):
    out = str(tmp_path / "out")
    r = run(TINY + ["--data", "cifar100", "--data-dir", cifar, "--lr", "1e30", "--warmup-epochs", "0",
                    "--clip-grad", "0", "--max-nonfinite", "3", "--save-every", "1", "--out-dir", out])
    assert r.returncode == 2 and "non-finite" in r.stderr and "Traceback" not in r.stderr, r.stderr
    ck = load(os.path.join(out, "ckpt.pt"))
    assert 1 <= ck["step"] < 8
    assert all(torch.isfinite(v).all() for v in ck["model"].values())


def test_a_full_disk_while_a_checkpoint_is_written_is_one_line_naming_the_last_good_checkpoint(tmp_path, cifar,
                                                                                               capsys, monkeypatch):
    """The disk fills up while the step-4 checkpoint is written: one line, exit 2, the partial file
    removed, the step-2 checkpoint intact and named."""
    real = torch.save

    def save(obj, f, *a, **kw):  # a writer that runs out of space after some bytes at step 4
        if obj.get("step") != 4:
            return real(obj, f, *a, **kw)
        with open(f, "wb") if isinstance(f, str) else nullcontext(f) as out:
            out.write(b"PK\x03\x04 part of a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(torch, "save", save)
    out = tmp_path / "o"
    rc = train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--save-every", "2", "--out-dir", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("train.py:")]
    assert rc == 2 and len(err) == 1, err
    assert "at step 4 failed (No space left on device)" in err[0] and f"checkpoint {out / 'ckpt.pt'} (step 2)" in err[0]
    assert not (out / "ckpt.pt.tmp").exists() and load(out / "ckpt.pt")["step"] == 2


def test_loader_workers_out_of_shared_memory_is_one_line_saying_how_to_raise_it(tmp_path, cifar, capsys,
                                                                                monkeypatch):
    """A worker cannot hand its batch over through /dev/shm (Docker's 64 MB): the DataLoader's error
    becomes one line naming /dev/shm, how to raise it and --workers 0, and the last checkpoint."""
    real, calls = data.Seeded.__getitem__, []

    def item(self, i):  # (runs in the worker process: from its 9th image on, as torch's shm allocation fails)
        calls.append(i)
        if len(calls) > 8:
            raise RuntimeError("unable to write to file </torch_4242_1234567890_0>: No space left on device (28)")
        return real(self, i)
    monkeypatch.setattr(data.Seeded, "__getitem__", item)
    out = tmp_path / "o"
    rc = train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--cpu-loader", "--workers", "1",
                           "--batch-size", "4", "--save-every", "1", "--out-dir", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("train.py:")]
    assert rc == 2 and len(err) == 1, err
    assert "ran out of shared memory (/dev/shm" in err[0] and "--shm-size" in err[0] and "--workers 0" in err[0]
    assert f"checkpoint {out / 'ckpt.pt'} (step 2)" in err[0]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_ddp_peer_makes_the_others_exit_within_bounded_time(tmp_path, cifar):
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(
            cmd(TINY + ["--data", "cifar100", "--data-dir", cifar, "--epochs", "1000", "--batch-size", "4",
                        "--save-every", "2", "--dist-timeout", "30", "--out-dir", str(tmp_path / "o")]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT))
    for line in procs[0].stdout:  # rank 0 reports its first checkpoint: both ranks are training
        if line.startswith("saved checkpoint"):
            break
    procs[1].kill()
    t0 = time.monotonic()
    try:
        procs[0].wait(timeout=90)
    finally:
        procs[0].kill()
    assert time.monotonic() - t0 < 90
    err = procs[0].stderr.read()
    assert procs[0].returncode not in (0, None) and "peer" in err and "Traceback" not in err, err[-500:]


# ----------------------------------------------------------------------------- a new user's first hour (issue 25)
def test_help_groups_the_flags_and_shows_every_default(capsys):
    assert train.cli(["--help"]) == 0
    text = capsys.readouterr().out
    for group in ("reproduction:", "model:", "data:", "optimization:", "augmentation:", "distillation:",
                  "system and distributed:", "checkpoints:", "evaluation:"):
        assert f"\n{group}" in text, group
    flat = " ".join(text.split())
    for flag, default in (("--epochs EPOCHS", "100"), ("--batch-size BATCH_SIZE", "128"), ("--lr LR", "0.001"),
                          ("--warmup-epochs WARMUP_EPOCHS", "5.0"), ("--model", "bvit"),
                          ("--seed SEED", "0"), ("--mixup MIXUP", "0.0"), ("--init", "default"),  # 0 is shown
                          ("--field", "subtracted")):
        tail = flat.split(flag, 2)[-1]
        assert re.search(rf"\(default:? {re.escape(default)}\)", tail.split(" --")[0]), flag
    assert "a new folder per run" in flat  # --out-dir's default, in words
    assert not re.search(r"\(default [^:]|by default|\(the default\)", flat)  # one "(default: X)" form


def test_each_run_gets_its_own_default_folder_named_at_the_start_and_the_end(tmp_path):
    job = TINY + ["--data", "synthetic", "--max-steps", "1"]

    def run(args):  # in tmp_path: the default folder is relative to where the command runs
        return subprocess.run(cmd(args), capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    said = [run(job) for _ in range(2)]
    assert all(r.returncode == 0 for r in said), said[-1].stderr
    folders = sorted(os.listdir(tmp_path / "runs"))
    assert len(folders) == 2 and all(f.startswith("bvit-") for f in folders)
    for r, f in zip(said, folders):
        assert f"run folder: runs/{f}" in r.stdout and f"done: runs/{f} holds args.json, ckpt.pt, log.jsonl" in r.stdout
        assert re.search(r"epoch 0: validation top-1 [0-9.]+ %, top-5 [0-9.]+ % \(step 1 of 1\)", r.stdout)
    r = run(job + ["--resume", "auto"])
    assert r.returncode == 2 and "--resume auto needs --out-dir" in r.stderr


def test_the_estimate_skips_the_warm_up_and_is_refined_as_the_run_goes():
    """The first steps warm up: the estimate is measured from the first check 10 steps (or 30 s) after the
    process's first step to one 20 steps (or 60 s) later; then the bar and the lines show the time left at
    the pace since its first point (issue 41: the first 11 steps' pace said 15 min for 8)."""
    origin = (100, 0.0)  # (a resumed run starts at its checkpoint's step)
    assert not monitor.pace_point([], 105, 1.0, origin) and monitor.pace_point([], 110, 2.0, origin)
    assert monitor.pace_point([], 101, 31.0, origin)  # one slow step of 31 s is enough
    assert not monitor.pace_point([(110, 2.0)], 125, 5.0, origin) and monitor.pace_point([(110, 2.0)], 130, 5.0, origin)
    assert monitor.pace_point([(110, 2.0)], 111, 63.0, origin)  # or a minute of slow steps
    assert not monitor.pace_point([(110, 2.0), (130, 6.0)], 200, 99.0, origin)  # two points, then refined
    m = types.SimpleNamespace(pace=[(110, 2.0), (130, 6.0)], total_steps=330)
    assert monitor.Monitor.time_left(m, 130, 6.0) == "0 min 40 s"  # 0.2 s per step, 200 steps
    assert monitor.Monitor.time_left(m, 230, 32.0) == "0 min 25 s"  # slower since: 0.25 s per step, 100 steps
    assert monitor.Monitor.time_left(types.SimpleNamespace(pace=[(110, 2.0)], total_steps=330), 120, 3.0) is None
    assert monitor.duration(90061) == "1 d 1 h" and monitor.duration(3720) == "1 h 2 min"


def test_a_gpu_sized_run_on_a_cpu_says_how_long_and_names_the_cpu_preset(tmp_path):
    """The default model (Ti, 12 steps) for 100 epochs on a CPU: after its first steps the run says
    its estimated time and the model's CPU-sized preset; then it is stopped (SIGTERM)."""
    job = ["--data", "synthetic", "--device", "cpu", "--workers", "0", "--batch-size", "8", "--val-subset", "8",
           "--out-dir", str(tmp_path / "o")]
    p = subprocess.Popen(cmd(job), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = next((ln for ln in iter(p.stdout.readline, "") if "estimated time:" in ln), "")
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=120)
    assert " d " in line or " h " in line, line
    assert "--preset cpu-first-bvit is this model's CPU-sized run" in line, line
