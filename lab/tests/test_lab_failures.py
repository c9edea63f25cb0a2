"""The lab's tools under the failures of tests/test_failures.py (issues 52 and 62): lab/analyze.py, lab/probe.py
and lab/bench_anytime.py print a path on any stdout, refuse a bad flag or file in one line (exit status 2)
and name a tokenizer's checkpoint as such where a classifier is needed."""
import os

import pytest
import torch

import analyze
import bench_anytime
import probe
import train
from test_failures import SYNTH, ascii_stdout, flip_a_bit, loopvae_run  # noqa: F401  (loopvae_run: a fixture)
from test_train import TINY, fake_cifar, load

pytestmark = pytest.mark.slow  # (train.py runs: README's quick tier, -m "not slow", leaves them out)


def test_a_stdout_that_cannot_encode_a_path_prints_it_escaped_by_analyze_and_probe(tmp_path, monkeypatch):
    """A non-ASCII --out-dir on an ASCII stdout: analyze.py and probe.py print their lines with the path
    escaped (before: UnicodeEncodeError at the first line naming it)."""
    out = tmp_path / "r\u00e9sultats"
    assert train.cli(SYNTH + ["--out-dir", str(out)]) == 0
    escaped = str(out).encode("ascii", "backslashreplace").decode()
    raw = ascii_stdout(monkeypatch)
    assert analyze.cli(["--resume", str(out / "ckpt.pt"), "--out-dir", str(out / "an\u00e4lysis"), "--num-images",
                        "8"]) == 0
    cifar = fake_cifar(tmp_path / "data")
    assert probe.cli(["--weights", str(out), "--data-dir", cifar, "--out-dir", str(out / "pr\u00f6be"), "--num-train",
                      "20", "--num-test", "10", "--epochs", "1"]) == 0
    said = raw.getvalue().decode("ascii")
    assert f"wrote {escaped}/an\\xe4lysis/cka.json" in said and f"wrote {escaped}/pr\\xf6be/probe_linear.json" in said


def test_probe_seed_takes_train_pys_range(tmp_path, capsys):
    """probe.py's --seed takes train.py's range (tests/test_failures.py: a 64-bit seed is one line)."""
    assert probe.cli(["--weights", "x", "--out-dir", str(tmp_path / "p"), "--seed", str(2 ** 64)]) == 2
    assert "argument --seed: must be between" in capsys.readouterr().err


def test_probe_with_too_few_training_images_or_a_size_its_patches_do_not_divide_is_one_line(tmp_path, capsys):
    """probe.py --num-train 1 left no image to fit the head on beside the held-out one (ZeroDivisionError);
    --img-size 36 for a patch-8 backbone failed in its patch embedding (ValueError). One line each."""
    out = tmp_path / "o"
    assert train.cli(SYNTH[:-4] + ["--max-steps", "1", "--patch-size", "8", "--out-dir", str(out)]) == 0
    job = ["--weights", str(out), "--data-dir", fake_cifar(tmp_path / "data"), "--out-dir", str(tmp_path / "p"),
           "--num-test", "10", "--epochs", "1"]
    capsys.readouterr()
    for extra, says in ((["--num-train", "1"], "--num-train 1: the probe needs at least 2 training images"),
                        (["--img-size", "36"], "--img-size 36: not a multiple of the backbone's patch size 8; "
                                               "use 32 or 40")):
        assert probe.cli(job + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"probe.py: error: {says}") and "Traceback" not in "".join(err), err


def test_a_loopvae_checkpoint_where_a_classifier_is_needed_is_named_as_a_tokenizer_by_the_lab(loopvae_run, tmp_path,
                                                                                             capsys):
    """probe.py --weights called a LoopVAE checkpoint "neither an rvits checkpoint nor a ViT state dict";
    bench.py --anytime (now lab/bench_anytime.py) on its folder suggested the analyze.py command that refuses it."""
    said = ": a --model loopvae checkpoint, a tokenizer"
    assert probe.cli(["--weights", str(loopvae_run), "--out-dir", str(tmp_path / "p")]) == 2
    assert f"probe.py: error: --weights {loopvae_run}{said}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench_anytime.main(["--smoke", str(loopvae_run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and f"{loopvae_run}: a --model loopvae run, a tokenizer" in err[-1], err
    assert "analyze.py" not in err[-1]


def test_a_checkpoint_with_one_flipped_bit_is_refused_by_analyze_and_probe_naming_the_record(tmp_path, capsys):
    """analyze.py and probe.py read weights through training.weights.read_weights, as train.py does
    (tests/test_failures.py): a flipped bit is one line naming the file and the record, exit status 2."""
    good = tmp_path / "run"
    assert train.cli(SYNTH + ["--max-steps", "1", "--out-dir", str(good)]) == 0
    bad = tmp_path / "flipped" / "ckpt.pt"
    os.makedirs(bad.parent)
    record = flip_a_bit(good / "ckpt.pt", bad)
    a, b = load(good / "ckpt.pt")["model"], load(bad)["model"]  # torch.load alone: no error, another weight
    assert [k for k in a if not torch.equal(a[k], b[k])] == [next(iter(a))]
    capsys.readouterr()
    said = f"{bad}: corrupt, its record {record} (a tensor's bytes) fails the zip's CRC-32 check"
    out = ["--out-dir", str(tmp_path / "o")]
    for tool, flag, argv in [(analyze, "--resume", ["--resume", str(bad)] + out),
                             (probe, "--weights", ["--weights", str(bad)] + out)]:
        assert tool.cli(argv) == 2, (tool, argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"{tool.__name__}.py: error: {flag} {said}"), (argv, err)


def test_a_checkpoint_saved_with_distill_but_no_teacher_still_analyses(tmp_path, capsys):
    """An earlier train.py saved distill="feature" for every run; analyze.py distils nothing (tests/test_distill.py:
    evaluation)."""
    cifar = fake_cifar(tmp_path / "data")
    d = TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1"]
    assert train.cli(d + ["--model", "revit", "--out-dir", str(tmp_path / "r")]) == 0
    ck = load(tmp_path / "r" / "ckpt.pt")
    ck["args"].update(distill="feature", teacher=None)
    torch.save(ck, tmp_path / "old.pt")
    assert analyze.cli(["--resume", str(tmp_path / "old.pt"), "--out-dir", str(tmp_path / "a"),
                        "--num-images", "8"]) == 0, capsys.readouterr().err
