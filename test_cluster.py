"""Runs that survive a shared cluster (issue 17): SIGTERM -> checkpoint -> `--resume auto`, the
resume policy, gradient accumulation, EMA evaluation, two nodes on localhost, the --out-dir lock.

CPU only; tiny models on a fake CIFAR folder or synthetic data.
"""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

import data
import train
from test_train import ROOT, TINY, cmd, fake_cifar, load, run

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
    assert p.wait() == train.PREEMPTED, err
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
    assert data.batched_loader(train.parse_args(train.get_parser(), job), torch.device("cpu"))
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
    assert json.load(open(ev / "depth_eval.json"))["results"][0]["weights"] == "model"
    capsys.readouterr()
    assert train.cli(SYNTH + ["--eval-ema", "--out-dir", str(tmp_path / "x")]) == 2
    assert "--ema" in capsys.readouterr().err


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_localhost_with_grad_accum_equal_one_process(tmp_path):
    job = SYNTH + ["--batch-size", "16", "--max-steps", "3", "--drop-path", "0"]
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
    p = subprocess.Popen([sys.executable, "-c", f"import checkpoints, time; f = checkpoints.lock_out_dir({str(out)!r}); "
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
SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shared", "data", "imagenet-sample")


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
            if line.startswith("saved checkpoint at step 3"):
                os.killpg(p.pid, sig)  # scancel / preemption: every process of the job
                break
        p.stdout.read()
        err = p.stderr.read()
        return p.wait(timeout=120), err
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


@pytest.mark.parametrize("case", ["cifar, 2 loader workers, SIGTERM", "image folder, 1 loader worker, SIGUSR1",
                                  "torchrun, 2 processes, 1 loader worker each, SIGTERM"])
def test_a_signal_to_the_whole_process_group_stops_at_a_checkpoint_and_the_requeue_finishes(tmp_path, case):
    """A cluster signals every process of a job. Loader workers leave the decision to the training
    process (data.ignore_stop_signals): same one line, same stop checkpoint as a signal to the
    training process alone, and the same command with --resume auto finishes the run."""
    sig = signal.SIGUSR1 if "SIGUSR1" in case else signal.SIGTERM
    workers = "2" if "2 loader" in case else "1"
    if "folder" in case:
        if not os.path.isdir(SAMPLE):
            pytest.skip("../shared/data/imagenet-sample not present")
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
    assert rc == (train.PREEMPTED if not launcher else 1), err[-3000:]
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
