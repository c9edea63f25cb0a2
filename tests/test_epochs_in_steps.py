"""Epoch-valued flags that the schedule turns into a count of optimizer steps (training/flags.py IN_STEPS:
--warmup-epochs): one given > 0 that comes to 0 steps of the run (a short --max-steps, a small training set)
is said in one line of the run's first lines, naming the flag, the steps and what to give; --epochs itself,
an epoch of 0 steps, is refused in one line."""
import json

import pytest
import torch

import train
import train_loopvae
from loopvae_train import flags as lvflags
from training import flags
from training.run import Run
from test_train import fake_cifar

ENTRIES = {"train.py": (flags.get_parser, ["--model", "bvit"]), "train_loopvae.py": (lvflags.get_parser, [])}
# 2 epochs cut to 10 steps: a fifth of them (0.4 of 2 epochs) is 2 steps, a twentieth (0.1) 0.5, which rounds to 0
SHORT = ["--epochs", "2", "--max-steps", "10", "--data", "synthetic"]


def epoch_valued(p):
    """The dests of parser `p`'s flags counted in epochs (a name in _epochs, or 'in epochs' in its help),
    --epochs itself aside."""
    return {a.dest for a in p._actions if a.dest != "epochs"
            and (a.dest.endswith("_epochs") or "in epochs" in (a.help or ""))}


def notes(entry, argv, batches=20, config=None):
    """The rounding notes (flags.rounded_to_nothing) of the run `argv` of `entry` with `batches` batches an epoch."""
    make, model = ENTRIES[entry]
    p = make()
    args = flags.parse_args(p, model + argv + (["--config", config] if config else []))
    args = lvflags.resolve(args, p, 32) if entry == "train_loopvae.py" else flags.resolve(args, p, 32)
    run = Run(False, 0, 1, 0, torch.device("cpu"), 8, None, None)
    _, _, run.steps_per_epoch, run.total_steps, run.warmup = train.optimizer_and_schedule(
        args, torch.nn.Linear(2, 2), None, [None] * batches)
    return flags.rounded_to_nothing(p, args, run)


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_epoch_valued_flag_is_one_the_schedule_turns_into_steps(entry):
    """The class's members: every flag in epochs of each entry point is in IN_STEPS, with the Run field of
    its steps; a new one is caught here before it can round to 0 silently."""
    found = epoch_valued(ENTRIES[entry][0]())
    assert found == set(flags.IN_STEPS), found
    assert all(steps in Run.__dataclass_fields__ for steps, _ in flags.IN_STEPS.values())


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("dest", sorted(flags.IN_STEPS))
def test_a_given_epoch_valued_flag_that_comes_to_0_steps_says_so_in_one_line(entry, dest, tmp_path):
    """Given on the command line or in a --config file, 0.1 of 2 epochs cut to 10 steps is 0 steps: one note
    naming the flag, the steps and a value that gives one step (which it does: no note then); a value that
    comes to steps, 0 itself and the default (not given) say nothing."""
    flag = f"--{dest.replace('_', '-')}"
    said = notes(entry, SHORT + [flag, "0.1"])
    assert len(said) == 1 and said[0].startswith(f"note: {flag} 0.1 comes to 0 of this run's 10 optimizer steps "
                                                 "(0.1 of --epochs 2, cut to --max-steps 10)"), said
    assert "\n" not in said[0] and said[0].endswith(f"give {flag} 0.2 or more for one step, or 0"), said
    config = tmp_path / "config.json"
    config.write_text(json.dumps({dest: 0.1}))
    assert notes(entry, SHORT, config=str(config)) == said
    for quiet in (["0.2"], ["0.4"], ["0"]):
        assert notes(entry, SHORT + [flag, *quiet]) == [], quiet
    assert notes(entry, SHORT + ["--max-steps", "1"]) == []  # the default's 5 % of 1 step: not given, not noted
    assert notes(entry, SHORT + ["--max-steps", "1", flag, "0.1"])[0].endswith(
        "a run of one step has no room for one: give 0")  # (any warmup of a 1-step run is the whole run)
    # a small training set: 1 batch an epoch, 2 steps in all, 0.1 of 2 epochs of them
    assert notes(entry, ["--epochs", "2", "--data", "synthetic", flag, "0.1"], batches=1) == [
        f"note: {flag} 0.1 comes to 0 of this run's 2 optimizer steps (0.1 of --epochs 2): the run has "
        f"{flags.IN_STEPS[dest][1]}; give {flag} 1 or more for one step, or 0"]


def test_a_presets_warmup_that_comes_to_0_steps_says_so():
    """A preset's --warmup-epochs counts as given: c100-bvit-ti's 10 of 200 epochs is 0.2 of 4 steps, 1 of 20."""
    said = notes("train.py", ["--preset", "c100-bvit-ti", "--max-steps", "4"])
    assert len(said) == 1 and said[0].startswith("note: --warmup-epochs 10 comes to 0 of this run's 4 optimizer steps "
                                                 "(10 of --epochs 200, cut to --max-steps 4)"), said
    assert notes("train.py", ["--preset", "c100-bvit-ti", "--max-steps", "20"]) == []


TINY = ["--embed-dim", "16", "--num-heads", "2", "--depth", "2", "--device", "cpu", "--workers", "0",
        "--batch-size", "8", "--val-subset", "8", "--eval-batch-size", "8"]
TINY_LOOPVAE = ["--model", "loopvae", "--embed-dim", "32", "--num-blocks", "1", "--loops", "1", "--latent-dim", "4",
                "--device", "cpu", "--workers", "0", "--batch-size", "8", "--val-subset", "8", "--eval-batch-size", "8"]


@pytest.mark.slow
@pytest.mark.parametrize("cli,tiny", [(train.cli, TINY), (train_loopvae.cli, TINY_LOOPVAE)], ids=ENTRIES)
def test_each_entry_point_prints_the_note_and_refuses_an_epoch_of_0_steps(cli, tiny, tmp_path, capsys):
    """The note among the run's first lines, once; --epochs: a training set smaller than --batch-size is an
    epoch of 0 steps, refused in one line (exit 2) before anything is written."""
    cifar = fake_cifar(tmp_path / "data")  # 64 training images
    job = tiny + ["--data", "cifar100", "--data-dir", cifar, "--epochs", "2", "--max-steps", "2"]
    assert cli(job + ["--warmup-epochs", "0.1", "--out-dir", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert [ln for ln in out.splitlines() if ln.startswith("note: --warmup-epochs")] == [
        f"note: --warmup-epochs 0.1 comes to 0 of this run's 2 optimizer steps (0.1 of --epochs 2, cut to --max-steps "
        f"2): the run has {flags.IN_STEPS['warmup_epochs'][1]}; give --warmup-epochs 1 or more for one step, or 0"], out
    assert cli(job + ["--batch-size", "128", "--out-dir", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--batch-size 128 is larger than the training set (64)" in err, err
    assert not (tmp_path / "b").exists()
