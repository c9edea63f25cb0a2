"""Resuming a run (issue 62): which folder a resumed run may write to, going back to an earlier checkpoint,
another --batch-size at an epoch boundary, every logged number of a resumed run equal to the uninterrupted
run's on 1 and 2 processes, a command to continue that can be pasted, and where the data is.

CPU only; tiny models on a fake CIFAR folder (a run takes about a second in-process).
"""
import json
import os
import shlex
import shutil
import signal
import sys

import pytest

import train
from training import checkpoints, exits
from test_cluster import free_port, signal_the_group, torchrun
from test_train import ROOT, TINY, fake_cifar, load


def records(out, name="log.jsonl"):
    return [json.loads(ln) for ln in open(os.path.join(out, name))]


@pytest.fixture
def job(tmp_path):
    return TINY + ["--data", "cifar100", "--data-dir", fake_cifar(tmp_path / "data"), "--warmup-epochs", "0"]


def test_resuming_into_the_folder_of_another_run_is_refused_and_leaves_it_untouched(tmp_path, job, capsys):
    """--resume A/ckpt.pt --out-dir B, B holding a run of its own: one line naming both, B's files as they were
    (before: rc 0, B's ckpt.pt and args.json overwritten by A's continuation, A's epoch in B's log)."""
    a, b = tmp_path / "A", tmp_path / "B"
    assert train.cli(job + ["--epochs", "1", "--out-dir", str(a)]) == 0
    assert train.cli(job + ["--epochs", "1", "--seed", "1", "--out-dir", str(b)]) == 0
    before = {f: open(b / f, "rb").read() for f in os.listdir(b)}
    capsys.readouterr()
    assert train.cli(job + ["--epochs", "2", "--resume", str(a / "ckpt.pt"), "--out-dir", str(b)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{b} holds another run" in err[0] and f"run of {a}" in err[0], err
    assert f"--resume {b / 'ckpt.pt'}" in err[0]  # how to continue B's own run instead
    assert {f: open(b / f, "rb").read() for f in os.listdir(b)} == before
    empty = tmp_path / "C"  # a folder without a run takes the continued run, its log starting afresh
    assert train.cli(job + ["--epochs", "2", "--resume", str(a / "ckpt.pt"), "--out-dir", str(empty)]) == 0
    assert [r["epoch"] for r in records(empty)] == [1]


def test_flags_restored_from_a_checkpoint_are_checked_as_given_ones(tmp_path, job, capsys):
    """A checkpoint's saved flags go through the flags' own checks (types, choices) when --resume restores them: a
    changed file with --mlp-ratio nan or an unknown --solver is one line naming the file and the flag, exit 2 (before:
    the run built its model from the value)."""
    import torch
    assert train.cli(job + ["--max-steps", "1", "--out-dir", str(tmp_path / "A")]) == 0
    ck = torch.load(tmp_path / "A" / "ckpt.pt", weights_only=True)
    for key, value, said in (("mlp_ratio", float("nan"), "its saved --mlp-ratio: expected a finite number, got 'nan'"),
                             ("solver", "bogus", "its saved --solver: 'bogus' is not one of")):
        bad = tmp_path / f"bad_{key}.pt"
        torch.save({**ck, "args": {**ck["args"], key: value}}, bad)
        capsys.readouterr()
        assert train.cli(job + ["--resume", str(bad), "--max-steps", "2", "--out-dir", str(tmp_path / key)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--resume {bad}: {said}" in err[0], err
        assert not (tmp_path / key).exists()
    assert train.cli(job + ["--resume", str(tmp_path / "A" / "ckpt.pt"), "--max-steps", "2"]) == 0  # an intact one


def test_a_refused_resume_leaves_nothing_behind(tmp_path, job, capsys):
    """A --resume refused in the set-up (here a flag that changes the model) creates no output folder and no
    .lock (before: an empty folder holding .lock); nor does a refused --eval-only."""
    assert train.cli(job + ["--max-steps", "1", "--out-dir", str(tmp_path / "A")]) == 0
    ck = str(tmp_path / "A" / "ckpt.pt")
    assert train.cli(job + ["--resume", ck, "--embed-dim", "64", "--out-dir", str(tmp_path / "new")]) == 2
    assert "--embed-dim was 32, now 64" in capsys.readouterr().err
    ev = ["--eval-only", "--resume", ck, "--eval-ema", "--ema", "0.9", "--out-dir", str(tmp_path / "ev")]
    assert train.cli(ev) == 2
    assert "holds no EMA weights" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["A", "data"]


def test_going_back_to_an_earlier_checkpoint_sets_the_later_records_aside_and_says_so(tmp_path, job, capsys):
    """--resume OUT/ckpt_e0.pt after the run went on to epoch 3 (with --eval-depths): log.jsonl holds one record per
    epoch of the branch that goes on (before: 0, 1, 2, 3, depths, 1, 2), the abandoned ones and their depth_eval.json
    in files of their own, and one line says so, naming the later ckpt.pt that the branch replaces."""
    out = tmp_path / "o"
    assert train.cli(job + ["--epochs", "1", "--out-dir", str(out)]) == 0
    shutil.copy(out / "ckpt.pt", out / "ckpt_e0.pt")
    assert train.cli(job + ["--epochs", "4", "--eval-depths", "1", "--resume", "auto", "--out-dir", str(out)]) == 0
    later = records(out)
    assert [r.get("epoch", r.get("depth")) for r in later] == [0, 1, 2, 3, 1]
    capsys.readouterr()
    assert train.cli(job + ["--epochs", "3", "--resume", str(out / "ckpt_e0.pt"), "--out-dir", str(out)]) == 0
    said = [ln for ln in capsys.readouterr().out.splitlines() if "moved to" in ln]
    assert len(said) == 1 and "(epoch 3, step 32)" in said[0] and f"{out / 'ckpt.pt'}, which this run does not " \
        "continue, is replaced" in said[0], said
    assert [(r["epoch"], r["step"]) for r in records(out)] == [(0, 8), (1, 16), (2, 24)]
    # (depth_eval.png, drawn only where matplotlib is installed, goes aside with its depth_eval.json)
    aside = sorted(f for f in os.listdir(out) if ".abandoned-" in f and not f.endswith(".png"))
    assert [f.split(".abandoned-")[0] for f in aside] == ["depth_eval", "log"], aside
    assert records(out, aside[1]) == later[1:]  # every later record, as it was
    assert json.load(open(out / aside[0]))["step"] == 32
    capsys.readouterr()  # the branch's own checkpoint, resumed in its folder: nothing to set aside, no line
    assert train.cli(job + ["--epochs", "4", "--resume", "auto", "--out-dir", str(out)]) == 0
    assert "moved to" not in capsys.readouterr().out
    assert [r["epoch"] for r in records(out)] == [0, 1, 2, 3]


@pytest.mark.parametrize("sizes", [(4, 8), (8, 4)], ids=["4->8", "8->4"])
def test_another_batch_size_at_an_epoch_boundary_follows_the_epochs(tmp_path, job, capsys, sizes):
    """64 images, epoch 0 at one --batch-size, epoch 1 at another: the schedule follows epochs (images seen), so
    epoch 1 is trained whole and the run ends at --min-lr, as a run at the second batch size all along does (before:
    4 -> 8 trained nothing, "nothing left"; 8 -> 4 ended half-way down the cosine); one line says how the step maps."""
    first, then = sizes
    out = str(tmp_path / "o")
    at = lambda bs: job + ["--batch-size", str(bs)]  # noqa: E731  (argparse takes the last value)
    assert train.cli(at(first) + ["--epochs", "1", "--out-dir", out]) == 0
    capsys.readouterr()
    assert train.cli(at(then) + ["--epochs", "2", "--resume", "auto", "--out-dir", out]) == 0
    said = capsys.readouterr().out
    assert f"resume: epoch 1 starts at step {64 // then} of this run ({64 // then} steps per epoch at --batch-size " \
           f"{then}), where the checkpoint counted step {64 // first}" in said, said
    assert [(r["epoch"], r["step"]) for r in records(out)] == [(0, 64 // first), (1, 2 * 64 // then)]
    assert abs(records(out)[-1]["lr"] - 1e-5) < 1e-12  # --min-lr
    ck = load(os.path.join(out, "ckpt.pt"))
    assert ck["step"] == ck["scheduler"]["last_epoch"] == 2 * 64 // then


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_stopped_run_continued_with_the_printed_command_logs_the_uninterrupted_runs_numbers(tmp_path, nproc, capsys,
                                                                                               monkeypatch):
    """SIGTERM inside epoch 0, then the command the run printed, pasted as it is (under torchrun: torchrun and its
    options; before: "the same torchrun command and ..."): every number logged, timings apart, equals the
    uninterrupted run's (before, on 2 processes: each rank's running loss was saved from rank 0 only, so the
    epoch's train_loss differed). One process runs in this one (SIGTERM while the checkpoint of step 3 is
    written), two under torchrun (SIGTERM to the job's process group after that checkpoint)."""
    job = TINY[:6] + ["--device", "cpu", "--workers", "0", "--val-subset", "16", "--eval-batch-size", "16",
                      "--batch-size", "4", "--data", "cifar100", "--data-dir", fake_cifar(tmp_path / "data"),
                      "--max-steps", "8", "--save-every", "3"]  # 16 steps per epoch: all inside epoch 0
    full, out = str(tmp_path / "full"), str(tmp_path / "run")
    if nproc == 1:
        assert train.cli(job + ["--out-dir", full]) == 0
        real = checkpoints.save_atomic

        def save_and_stop(obj, path):
            if obj["step"] == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            return real(obj, path)
        with monkeypatch.context() as mp:
            mp.setattr(checkpoints, "save_atomic", save_and_stop)
            assert train.cli(job + ["--out-dir", out]) == exits.PREEMPTED
        err, start = capsys.readouterr().err, ["python", "train.py"]
    else:
        r = torchrun(job + ["--out-dir", full])
        assert r.returncode == 0, r.stderr[-3000:]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(free_port())]
        rc, err = signal_the_group(job, out, signal.SIGTERM, launcher)
        assert rc == 1, err[-3000:]  # (torchrun's own status after its processes stopped)
        start = ["torchrun", *launcher[3:], os.path.join(ROOT, "train.py")]
    assert 3 <= load(os.path.join(out, "ckpt.pt"))["step"] < 8
    said = [ln for ln in err.splitlines() if ln.startswith("train.py:") and "continue with: " in ln]
    assert said, err[-3000:]
    words = shlex.split(said[0].split("continue with: ", 1)[1])
    assert words == start + job + ["--out-dir", out, "--resume", os.path.join(out, "ckpt.pt")], words
    if nproc == 1:
        assert train.cli(words[2:]) == 0
    else:
        again = torchrun(words[len(start):])
        assert again.returncode == 0, again.stderr[-3000:]
    timing = ("img_per_s", "epoch_time_s")
    drop = lambda recs: [{k: v for k, v in r.items() if k not in timing} for r in recs]  # noqa: E731
    assert drop(records(out)) == drop(records(full)) and len(records(out)) == 1
    a, b = load(os.path.join(full, "ckpt.pt")), load(os.path.join(out, "ckpt.pt"))
    assert all((a["model"][k] == b["model"][k]).all() for k in a["model"])


def test_the_torchrun_command_is_read_from_torchrun_or_rebuilt_from_its_environment():
    argv = ["--epochs", "2", "--out-dir", "o"]
    for parent in (["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc_per_node", "8", "train.py", *argv],
                   ["python", "-u", "-m", "torch.distributed.run", "--nproc_per_node", "8", "train.py", *argv]):
        assert checkpoints.launcher(parent, argv, {}) == ["torchrun", "--nproc_per_node", "8", "train.py"]
    env = {"GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "MASTER_ADDR": "node0",
           "MASTER_PORT": "29400", "WORLD_SIZE": "8"}  # (another launcher, or a parent that cannot be read)
    assert checkpoints.launcher(["srun", "x"], argv, env)[:-1] == [
        "torchrun", "--nnodes", "2", "--nproc_per_node", "4", "--node_rank", "1", "--master_addr", "node0",
        "--master_port", "29400"]


def test_resume_and_eval_only_take_the_data_dir_from_the_checkpoint_unless_it_is_given(tmp_path, job, capsys,
                                                                                      monkeypatch):
    """The data root: the command line's --data-dir, else the checkpoint's, else $RVITS_DATA, else ./data, for
    --resume as for --eval-only (before: --resume went to $RVITS_DATA, --eval-only to the checkpoint's)."""
    out = str(tmp_path / "o")
    assert train.cli(job + ["--max-steps", "2", "--out-dir", out]) == 0
    monkeypatch.setenv("RVITS_DATA", str(tmp_path / "elsewhere"))
    bare = job[:job.index("--data-dir")] + job[job.index("--data-dir") + 2:]
    assert train.cli(bare + ["--max-steps", "3", "--resume", "auto", "--out-dir", out]) == 0
    assert train.cli(["--eval-only", "--resume", out, "--eval-depths", "1", "--out-dir", str(tmp_path / "ev")]) == 0
    capsys.readouterr()
    given = ["--data-dir", str(tmp_path / "given")]  # given: it wins, for both
    assert train.cli(bare + given + ["--max-steps", "4", "--resume", "auto", "--out-dir", out]) == 2
    assert train.cli(["--eval-only", "--resume", out, *given, "--out-dir", str(tmp_path / "ev2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(str(tmp_path / "given") in ln for ln in err), err


def test_router_lr_scale_gives_the_router_its_own_rate_through_the_schedule_and_resume(tmp_path, job, capsys):
    """--router-lr-scale s (issue 63's engagement search; not the paper's): reViT's router (A.1, `router.*`) trains at
    s x the learning rate of every other parameter at every step of warmup and decay, and after --resume; a resume
    that would change the optimizer's groups is one line, exit 2. Without the flag the groups are the usual two."""
    import torch
    import revit
    from training import optim
    m = revit.ReViT(img_size=32, patch_size=8, num_classes=10, embed_dim=32, num_heads=2, depth=3, experts=4)
    assert [len(g["params"]) for g in optim.param_groups(m, 0.05)] == [
        len(optim.param_groups(m, 0.05, 1e-3, 4.0)[i]["params"]) + n for i, n in ((0, 2), (1, 2))]
    groups = optim.param_groups(m, 0.05, 1e-3, 4.0)
    router = {id(p) for n, p in m.named_parameters() if n.startswith("router.")}
    assert [{id(p) for p in g["params"]} <= router for g in groups] == [False, False, True, True]
    assert [(g.get("lr"), g["weight_decay"]) for g in groups[2:]] == [(4e-3, 0.05), (4e-3, 0.0)]
    revit_job = job + ["--model", "revit", "--experts", "4", "--warmup-epochs", "1", "--epochs", "3"]

    def rates(path):  # each group's learning rate in the checkpoint, over the first group's
        gs = load(path)["optimizer"]["param_groups"]
        return [round(g["lr"] / gs[0]["lr"], 6) for g in gs]
    a = tmp_path / "A"
    assert train.cli(revit_job + ["--router-lr-scale", "4", "--max-steps", "10", "--out-dir", str(a)]) == 0
    assert rates(a / "ckpt.pt") == [1, 1, 4, 4]  # (in warmup: 8 steps an epoch)
    capsys.readouterr()
    assert train.cli(revit_job + ["--resume", str(a / "ckpt.pt"), "--router-lr-scale", "1", "--out-dir", str(a)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "its --router-lr-scale is 4 and this run's 1" in err[0] and "--finetune" in err[0], err
    assert train.cli(revit_job + ["--resume", str(a / "ckpt.pt"), "--router-lr-scale", "2", "--out-dir", str(a)]) == 0
    assert rates(a / "ckpt.pt") == [1, 1, 2, 2]  # (this run's scale, after warmup)
    for bad, said in ((["--model", "vit"], "--router-lr-scale is a flag of --model revit"),
                      (["--model", "revit", "--experts", "1"], "--routing depth --experts 1"),
                      (["--model", "revit", "--routing", "smear"], "--routing smear --experts 4")):
        assert train.cli(job + bad + ["--router-lr-scale", "3", "--out-dir", str(tmp_path / "x")]) == 2
        assert said in capsys.readouterr().err, bad
