"""Cases modelled on public bug reports of comparable projects, round 6 (issue 52): nothing a run trained
or recorded is lost, whatever ends it; a refusal is one line naming the flag or file; a path prints on any
stdout."""
import io
import json
import os
import sys

import pytest
import torch

import analyze
import probe
import train
from training import monitor
from test_train import ROOT, TINY, fake_cifar, load, run

SYNTH = TINY + ["--data", "synthetic", "--max-steps", "4", "--epochs", "1"]


def lines(capsys):
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("train.py:")]


# ----------------------------------------------------------------------------- a path on any stdout
def ascii_stdout(monkeypatch):
    """sys.stdout as a terminal set to ASCII has it (PYTHONIOENCODING=ascii): strict; returns its bytes."""
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii", errors="strict", write_through=True))
    return raw


def test_a_stdout_that_cannot_encode_a_path_prints_it_escaped(tmp_path, monkeypatch):
    """A non-ASCII --out-dir on an ASCII stdout: train.py, analyze.py and probe.py print their lines with
    the path escaped (before: UnicodeEncodeError at the first line naming it)."""
    out = tmp_path / "r\u00e9sultats"
    r = run(SYNTH + ["--out-dir", str(out)], env={"PYTHONIOENCODING": "ascii"})
    escaped = str(out).encode("ascii", "backslashreplace").decode()
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"run folder: {escaped}" in r.stdout and f"done: {escaped} holds" in r.stdout
    raw = ascii_stdout(monkeypatch)
    assert analyze.cli(["--resume", str(out / "ckpt.pt"), "--out-dir", str(out / "an\u00e4lysis"), "--num-images",
                        "8"]) == 0
    cifar = fake_cifar(tmp_path / "data")
    assert probe.cli(["--weights", str(out), "--data-dir", cifar, "--out-dir", str(out / "pr\u00f6be"), "--num-train",
                      "20", "--num-test", "10", "--epochs", "1"]) == 0
    said = raw.getvalue().decode("ascii")
    assert f"wrote {escaped}/an\\xe4lysis/cka.json" in said and f"wrote {escaped}/pr\\xf6be/probe_linear.json" in said


# ----------------------------------------------------------------------------- what a line counts
def test_evaluation_under_torchrun_counts_the_images_of_every_process(tmp_path):
    """2 processes, 64 validation images: the epoch's evaluation and --eval-depths name 64 (each process
    holds 32 of them; the lines used to say 32)."""
    from test_cluster import torchrun
    r = torchrun(SYNTH[:-4] + ["--data", "synthetic", "--val-subset", "64", "--batch-size", "16", "--max-steps", "2",
                               "--eval-depths", "1", "--out-dir", str(tmp_path / "o")])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "epoch 0: evaluating on 64 validation images" in r.stdout, r.stdout
    assert "evaluating at depth 1 on 64 validation images" in r.stdout, r.stdout
