"""--log-every N: a step record {step, loss, lr, grad_norm, img_per_s} in log.jsonl every N optimizer steps,
read from the device at those steps only; --tensorboard: the same numbers as TensorBoard scalars; a run's
curves from log.jsonl (scripts/curves.py, training/figures.py); a missing matplotlib is one line naming the
figure it leaves out."""
import json
import os
import sys
import types

import pytest
import torch
from conftest import HostReads

import train
from training import figures, flags, monitor, optim
from training.exits import Stop
from training.run import Run

SYNTH = ["--data", "synthetic", "--embed-dim", "32", "--num-heads", "2", "--depth", "2", "--device", "cpu",
         "--workers", "0", "--batch-size", "8", "--val-subset", "16", "--eval-batch-size", "16", "--epochs", "2",
         "--max-steps", "6", "--warmup-epochs", "0"]


def records(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_step_records_every_n_steps_with_the_rate_each_step_used_and_the_epoch_records_unchanged(tmp_path, capsys):
    assert train.cli(SYNTH + ["--out-dir", str(tmp_path / "plain")]) == 0
    assert train.cli(SYNTH + ["--log-every", "2", "--out-dir", str(tmp_path / "logged")]) == 0
    plain, logged = records(tmp_path / "plain"), records(tmp_path / "logged")
    steps = [r for r in logged if "epoch" not in r]
    assert [r["step"] for r in steps] == [2, 4, 6] and all(set(r) == {"step", "loss", "lr", "grad_norm", "img_per_s"}
                                                             for r in steps)
    rate = optim.lr_lambda(6, 0, 1e-3, 1e-5)  # 6 steps, no warmup: the cosine from the first step
    assert [r["lr"] for r in steps] == [pytest.approx(1e-3 * rate(s - 1), rel=1e-12) for s in (2, 4, 6)]
    assert all(r["grad_norm"] > 0 and r["img_per_s"] > 0 and r["loss"] > 0 for r in steps)
    # the last step's loss is the one the model logged with the epoch (its stage loss), and the epoch records
    # (and so the run's numbers) are those of the run without --log-every, timing aside
    epoch = [r for r in logged if "epoch" in r]
    assert steps[-1]["loss"] == pytest.approx(epoch[-1]["stage0_loss"], rel=1e-6)
    timing = ("img_per_s", "epoch_time_s")
    assert [{k: v for k, v in r.items() if k not in timing} for r in plain] == \
        [{k: v for k, v in r.items() if k not in timing} for r in epoch]


def gpu_monitor(tmp_path, log_every):
    """A Monitor as train.py builds it, for a run on a GPU-like device (meta: reads every CHECK_EVERY steps)."""
    args = types.SimpleNamespace(workers=0, save_every=None, max_nonfinite=20, model="bvit", preset=None,
                                 log_every=log_every, tensorboard=False)
    run = Run(False, 0, 1, 0, torch.device("meta"), 8, None, Stop(), ckpt_path=str(tmp_path / "ckpt.pt"),
              log_path=str(tmp_path / "log.jsonl"), steps_per_epoch=100, total_steps=100)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    m = monitor.Monitor(args, run, None, sched)
    return m, opt


@pytest.mark.parametrize("log_every", [None, 7])
def test_a_step_record_reads_the_device_at_its_steps_only(tmp_path, log_every):
    """On a GPU the loop reads the device every CHECK_EVERY steps (and at an epoch's last): --log-every 7 adds
    one read at each 7th step, in which the loss, the non-finite count and the gradient norm come together;
    every other step reads nothing (each read is a host sync)."""
    m, opt = gpu_monitor(tmp_path, log_every)
    sums = monitor.EpochSums({}, torch.device("meta"))
    m.epoch(0, 0, 40, [])
    reads = {}
    for step in range(1, 41):
        loss, bad = torch.empty((), device="meta"), torch.empty((), device="meta")
        opt.grad_norm = torch.empty((), device="meta")
        sums.images += 8
        with HostReads(meta=True) as r:
            m.after_step(step, 0, step, loss, bad, sums)
        if r.seen:
            reads[step] = len(r.seen)
    checks = {1, 21, 40}  # i = 0 and 20 (CHECK_EVERY), and the epoch's last step
    logs = {7, 14, 21, 28, 35} if log_every else set()
    assert set(reads) == checks | logs and set(reads.values()) == {1}  # one read each, at those steps only
    got = [json.loads(line) for line in open(tmp_path / "log.jsonl")] if log_every else []
    assert [r["step"] for r in got] == sorted(logs)


def test_tensorboard_gets_the_numbers_of_log_jsonl(tmp_path, monkeypatch):
    """--tensorboard: every number of the step and epoch records as a scalar train/KEY or epoch/KEY at its step
    (a SummaryWriter stand-in: the tensorboard package is an optional extra)."""
    seen = []

    class Writer:
        def __init__(self, log_dir):
            self.log_dir = log_dir

        def add_scalar(self, tag, value, step):
            seen.append((tag, value, step))

        def flush(self):
            pass

        def close(self):
            seen.append("closed")
    monkeypatch.setattr(monitor, "tensorboard_writer", lambda out: Writer(os.path.join(out, "tensorboard")))
    monkeypatch.setattr(flags, "unusable", lambda *a: None)  # (the package is "installed")
    out = tmp_path / "run"
    assert train.cli(SYNTH + ["--log-every", "3", "--tensorboard", "--out-dir", str(out)]) == 0
    want = [(f"{'epoch' if 'epoch' in r else 'train'}/{k}", v, r["step"]) for r in records(out)
            for k, v in r.items() if k not in ("step", "epoch") and isinstance(v, (int, float))]
    assert seen == want + ["closed"] and ("train/grad_norm", records(out)[0]["grad_norm"], 3) in seen
    # --eval-only takes --tensorboard (and --log-every) from its command line, not from the checkpoint: on a
    # machine without the package the run's checkpoint is still evaluated
    monkeypatch.setattr(flags, "unusable", lambda *a: "is not installed")
    assert train.cli(["--eval-only", "--resume", str(out / "ckpt.pt"), "--eval-depths", "1",
                      "--out-dir", str(tmp_path / "eval")]) == 0


def test_tensorboard_without_its_package_is_one_line_before_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # (not installed; test_classes: every way)
    assert train.cli(SYNTH + ["--tensorboard", "--out-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tensorboard needs the tensorboard package" in err and "pip install" in err
    assert not os.path.exists(tmp_path / "run")


def test_curves_take_a_resumed_runs_last_record_of_each_step(tmp_path):
    log = tmp_path / "log.jsonl"
    recs = [{"step": 2, "loss": 3.0, "lr": 1, "grad_norm": 1, "img_per_s": 1},
            {"epoch": 0, "step": 4, "train_loss": 2.5, "val_acc1": 5.0},
            {"step": 6, "loss": 9.0, "lr": 1, "grad_norm": None, "img_per_s": 1},  # (lost: after the checkpoint)
            {"step": 6, "loss": 2.0, "lr": 1, "grad_norm": 1, "img_per_s": 1},  # the resumed run's
            {"depth": 3, "val_acc1": 4.0, "val_acc5": 9.0, "weights": "model"}]
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    steps, epochs = figures.read_log(str(log))
    assert [(r["step"], r["loss"]) for r in steps] == [(2, 3.0), (6, 2.0)] and epochs == [recs[1]]


def test_a_figure_without_matplotlib_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    """scripts/curves.py prints the epochs and, without matplotlib, says which figure it did not draw and how
    to get it (so do train.py's depth_eval.png and analyze.py's figures: figures.pyplot)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    import curves
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (import matplotlib raises ImportError)
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"epoch": 0, "step": 4, "train_loss": 2.5, "val_acc1": 5.0}) + "\n")
    assert curves.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "epoch 0: step 4, train_loss 2.5000, val_acc1 5.00" in out
    assert err == f"note: matplotlib is not installed: {tmp_path / 'curves.png'} not drawn (the numbers are in the " \
                  "JSON files); pip install matplotlib draws it\n"
    assert curves.main([str(tmp_path / "none")]) == 2 and capsys.readouterr().err.startswith("curves.py: error: ")
