"""Cases from public bug reports of comparable projects, round 5 (issue 37): nothing a run has trained
is lost to a write that fails, no line blames a flag nobody gave, a flag the model does not use is
refused, and what evaluation needs is checked before the first step."""
import errno
import json
import os
import subprocess
import sys

import pytest
import torch
from torchvision.transforms import v2

import data
import presets
from training.flags import get_parser
import train
import train_loopvae
from loopvae_train import flags as lvflags
from training import exits, flags, optim
from test_train import ROOT, TINY, free_port, load, run

pytestmark = pytest.mark.slow  # (train.py runs: README's quick tier, -m "not slow", leaves them out)

SYNTH = TINY + ["--data", "synthetic", "--max-steps", "4", "--epochs", "1"]


def lines(capsys):
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("train.py:")]


def full_disk_at(monkeypatch, name):
    """Every write of the run's file `name` (exits.write; a whole file goes to NAME.tmp first) fails as on a full
    disk."""
    real = open

    def fake(path, *a, **kw):
        if os.path.basename(str(path)) in (name, name + ".tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, *a, **kw)
    monkeypatch.setattr(exits, "open", fake, raising=False)


# ----------------------------------------------------------------------------- writes that fail
def test_a_whole_file_write_that_fails_midway_keeps_the_previous_file_and_no_partial_one(tmp_path, monkeypatch):
    """exits.write of a whole file: written to PATH.tmp and renamed, so a full disk (or a signal) mid-write keeps the
    previous file whole (depth_eval.json keeps the depths before) and leaves no PATH.tmp; an append is unchanged."""
    path = tmp_path / "depth_eval.json"
    exits.write(str(path), '{"results": [1]}', "kept")
    real = open

    class Half:  # writes half the text, then the disk is full
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[:len(text) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(exits, "open", lambda p, *a, **kw: Half(real(p, *a, **kw)), raising=False)
    with pytest.raises(exits.Fail, match="depth_eval.json failed .No space left on device.; free space in .*; kept"):
        exits.write(str(path), '{"results": [1, 2, 3, 4]}', "kept")
    assert path.read_text() == '{"results": [1]}' and os.listdir(tmp_path) == ["depth_eval.json"]
    monkeypatch.undo()
    exits.write(str(path), "\n", "kept", append=True)
    assert path.read_text() == '{"results": [1]}\n'


def test_a_full_disk_at_the_log_keeps_the_epoch_in_the_checkpoint(tmp_path, capsys, monkeypatch):
    full_disk_at(monkeypatch, "log.jsonl")
    out = tmp_path / "o"
    assert train.cli(SYNTH + ["--out-dir", str(out)]) == 2
    err = lines(capsys)
    assert len(err) == 1 and "log.jsonl failed (No space left on device)" in err[0], err
    assert f"checkpoint {out / 'ckpt.pt'} (step 4)" in err[0] and "--resume" in err[0]
    assert load(out / "ckpt.pt")["step"] == 4  # the epoch's training was saved before the log line
    monkeypatch.undo()  # space again: the continue command writes the epoch's record that the run could not
    assert train.cli(SYNTH + ["--out-dir", str(out), "--resume", str(out / "ckpt.pt")]) == 0
    assert "added the record of epoch 0 (step 4)" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["step"]) for r in records] == [(0, 4)] and "val_acc1" in records[0]
    assert train.cli(SYNTH + ["--out-dir", str(out), "--resume", str(out / "ckpt.pt")]) == 0  # once only
    assert len((out / "log.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("name,flag,kept", [("depth_eval.json", ["--eval-depths", "1"], "(step 4)"),
                                            ("args.json", [], "no checkpoint was written")])
def test_every_other_write_of_a_run_fails_as_one_line_saying_what_is_kept(tmp_path, capsys, monkeypatch, name, flag,
                                                                          kept):
    full_disk_at(monkeypatch, name)
    assert train.cli(SYNTH + flag + ["--out-dir", str(tmp_path / "o")]) == 2
    err = lines(capsys)
    assert len(err) == 1 and f"{name} failed (No space left on device)" in err[0] and kept in err[0], err


# ----------------------------------------------------------------------------- checked before the first step
def test_what_evaluation_needs_is_checked_with_the_flags_before_any_training(tmp_path, capsys):
    out = tmp_path / "o"
    assert train_loopvae.cli(["--model", "loopvae", "--embed-dim", "32", "--num-blocks", "1", "--loops", "1,2",
                      "--latent-dim", "4", "--img-size", "8", *SYNTH[len(TINY):], "--device", "cpu", "--workers", "0",
                      "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--img-size 8" in err[0] and "SSIM needs images of at least 11x11" in err[0], err
    assert not out.exists()


def test_an_epoch_whose_every_step_is_non_finite_says_so_instead_of_a_loss_of_0(tmp_path, capsys, monkeypatch):
    def skipped(model, optimizer, scaler, clip_grad):  # every step's gradient "non-finite": skipped on the device
        optimizer.zero_grad(set_to_none=True)
        return torch.ones(())
    monkeypatch.setattr(optim, "optimizer_step", skipped)
    out = tmp_path / "o"
    assert train.cli(SYNTH + ["--max-nonfinite", "10", "--out-dir", str(out)]) == 0
    rec = json.loads((out / "log.jsonl").read_text().splitlines()[0])
    assert rec["train_loss"] is None and rec["nonfinite_steps"] == 4
    said = capsys.readouterr().out
    assert "no finite training step: all 4 of this epoch were skipped as non-finite" in said
    capsys.readouterr()
    monkeypatch.undo()
    assert train.cli(SYNTH + ["--out-dir", str(tmp_path / "fine")]) == 0  # a normal epoch: 0 skipped, a loss
    rec = json.loads((tmp_path / "fine" / "log.jsonl").read_text().splitlines()[0])
    assert rec["nonfinite_steps"] == 0 and rec["train_loss"] > 0


def test_a_rendezvous_that_times_out_is_one_line_and_exit_1():
    env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    r = run(SYNTH + ["--dist-timeout", "2", "--out-dir", os.devnull + "x"], env=env, timeout=120)
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert err[-1].startswith("train.py: error: rank 0: the 2 processes did not meet at 127.0.0.1:"), err
    assert "within --dist-timeout 2 s" in err[-1]


# ----------------------------------------------------------------------------- flags: given, or not
@pytest.fixture(scope="module")
def bvit_ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("bvit")
    assert train.cli(SYNTH[:-4] + ["--max-steps", "1", "--epochs", "1", "--patch-size", "8", "--out-dir", str(out)]) == 0
    return str(out / "ckpt.pt")


@pytest.mark.parametrize("flag", ["--stage2", "--finetune"])
def test_a_checkpoint_of_the_wrong_kind_is_named_not_blamed_on_a_flag_it_brought(bvit_ckpt, capsys, flag, tmp_path):
    """The bViT checkpoint brings --patch-size 8, which loopvae refuses; the line says what the file is."""
    assert train_loopvae.cli(["--model", "loopvae", flag, bvit_ckpt, "--data", "synthetic", "--device", "cpu",
                      "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag} {bvit_ckpt}: a --model bvit checkpoint, not a LoopVAE" in err[0], err
    assert "--patch-size" not in err[0]


@pytest.mark.parametrize("flag", ["--resume", "--eval-only", "--finetune"])
def test_a_checkpoint_trained_with_a_cut_flag_is_refused_by_name_and_the_flags_are_gone(bvit_ckpt, capsys, flag, tmp_path):
    """Issue 51 cut --stage-weights, --detach-stages and --step-embed (no preset, study or result used them).
    A checkpoint trained with one of them set cannot be rebuilt as it trained: one line naming the flag,
    exit 2, instead of a silently different model or loss. Checkpoints trained without them load as before."""
    ck = torch.load(bvit_ckpt, weights_only=True)
    path = tmp_path / "old.pt"
    torch.save({**ck, "args": {**ck["args"], "step_embed": True, "stage_weights": None}}, path)
    argv = {"--resume": ["--resume", str(path)], "--eval-only": ["--eval-only", "--resume", str(path)],
            "--finetune": ["--finetune", str(path), "--max-steps", "1"]}[flag]
    assert train.cli(argv + ["--device", "cpu", "--workers", "0", "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    shown = "--resume" if flag == "--eval-only" else flag
    assert len(err) == 1 and f"{shown} {path}: trained with --step-embed, which rvits no longer has" in err[0], err
    for cut in ("--stage-weights", "--detach-stages", "--step-embed"):
        assert cut not in get_parser().format_help()
    before = tmp_path / "before.pt"  # a checkpoint written before the cut: its args hold them, unset
    torch.save({**ck, "args": {**ck["args"], "step_embed": False, "stage_weights": None, "detach_stages": False}}, before)
    assert train.cli(["--eval-only", "--resume", str(before), "--device", "cpu", "--workers", "0", "--eval-depths", "2",
                      "--out-dir", str(tmp_path / "e")]) == 0


def test_stage2_of_a_stage2_checkpoint_is_refused_not_restarted(tmp_path, capsys):
    path = tmp_path / "s2.pt"
    torch.save({"args": {"model": "loopvae", "stage2": "runs/s1/ckpt.pt"}, "model": {}, "adversary": {"d": {}}}, path)
    assert train_loopvae.cli(["--model", "loopvae", "--stage2", str(path), "--data", "synthetic", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a Stage-2 checkpoint (its run had --stage2 runs/s1/ckpt.pt)" in err[0], err
    assert f"continue it with --resume {path}" in err[0]


@pytest.mark.parametrize("argv,says", [
    (["--model", "bvit", "--experts", "4"], "--experts is a flag of --model revit; --model bvit does not use it"),
    (["--model", "revit", "--stages", "3"], "--stages is a flag of --model vit, bvit or odevit; --model revit"),
    (["--model", "srvit", "--solver", "rk4"], "--solver is a flag of --model odevit"),
    (["--model", "bvit", "--loops", "1,2"], "unrecognized arguments: --loops 1,2"),  # (train_loopvae.py's)
    (["--model", "bvit", "--routing", "qwen3"], "--routing is a flag of --model revit")])
def test_a_flag_the_model_does_not_use_is_refused_by_name(argv, says, capsys):
    assert train.cli(argv + ["--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_flags_from_a_checkpoint_are_never_refused_as_given(bvit_ckpt, tmp_path, capsys):
    """--eval-only takes every flag of the checkpoint (its experts, loops, ... at their defaults): none is
    refused, as none was given; one given on the command line is."""
    assert train.cli(["--eval-only", "--resume", bvit_ckpt, "--eval-depths", "1", "--device", "cpu",
                      "--out-dir", str(tmp_path / "ev")]) == 0
    capsys.readouterr()
    assert train.cli(["--eval-only", "--resume", bvit_ckpt, "--experts", "2", "--out-dir", str(tmp_path / "ev2")]) == 2
    assert "--experts is a flag of --model revit" in capsys.readouterr().err


def test_every_preset_gives_only_flags_its_model_uses():
    for name, (_, given) in presets.PRESETS.items():  # (a refused flag exits 2); LoopVAE's: train_loopvae.py's
        flags.resolved(["--preset", name], entry=lvflags.ENTRY if given["model"] == "loopvae" else None)


@pytest.mark.parametrize("argv", [["--list-presets"], ["--print-config"]])
def test_output_read_through_a_closed_pipe_exits_quietly(argv):
    """`... | head -1`: the reader of the output goes away (here: before the first line); no
    BrokenPipeError traceback, exit 0."""
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=ROOT)
    p.stdout.close()  # the read end is closed before the process writes: its first write meets EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


# ----------------------------------------------------------------------------- one place defines the augmentation
def test_the_batched_loader_reads_the_runs_pipeline_so_a_new_augmentation_is_never_dropped(monkeypatch):
    args = flags.get_parser().parse_args(["--workers", "0"])
    assert data.batched_loader(args, torch.device("cpu"))
    real = data.build_transform

    def with_jitter(*a, **kw):  # an augmentation added to the per-image pipeline, and nowhere else
        t = real(*a, **kw)
        return v2.Compose(t.transforms[:-2] + [v2.ColorJitter(0.3)] + t.transforms[-2:])
    monkeypatch.setattr(data, "build_transform", with_jitter)
    assert not data.batched_loader(args, torch.device("cpu")) and not data.batched_loader(args, torch.device("cuda"))


def test_every_augmentation_flag_reaches_the_images_on_the_path_the_run_takes(tmp_path):
    """For each flag of --help's augmentation group (and --img-size), at a value that turns it on: the
    batched path is chosen only when the run's per-image pipeline (built as train.py builds it) holds
    nothing the batched path leaves out; MixUp/CutMix apply to batches on both paths (MixAndSmooth)."""
    from test_train import fake_cifar
    root = fake_cifar(tmp_path / "data", n_train=8, n_test=8)
    p = flags.get_parser()
    group = next(g for g in p._action_groups if g.title == "augmentation")
    tried = []
    for action in group._group_actions + [a for a in p._actions if a.dest == "img_size"]:
        kind = type(action).__name__
        on = [action.option_strings[0]] + ([] if kind in ("_StoreTrueAction", "BooleanOptionalAction") else ["64" if
                                           action.dest == "img_size" else "0.8" if action.dest in ("mixup", "cutmix", "reprob") else "9"])
        argv = ["--workers", "0", "--data-dir", root, *on] + (["--three-augment"] if action.dest == "color_jitter" else [])
        args = flags.parse_args(p, argv)
        args, train_set, _, _, _ = train.load_data(args, p)
        for dev in ("cpu", "cuda"):
            ops = train_set.transform.transforms
            if data.batched_loader(args, torch.device(dev)):
                assert all(type(op) in data.BATCHED_OPS for op in ops), (on, ops)
        tried.append(action.dest)
    assert {"mixup", "cutmix", "randaug", "reprob", "three_augment", "color_jitter", "repeated_aug", "img_size"} <= set(tried)
