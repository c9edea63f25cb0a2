"""Resuming a run (issue 62): which folder a resumed run may write to, going back to an earlier checkpoint,
another --batch-size at an epoch boundary, every logged number of a resumed run equal to the uninterrupted
run's on 1 and 2 processes, a command to continue that can be pasted, and where the data is.

CPU only; tiny models on a fake CIFAR folder (a run takes about a second in-process).
"""
import pytest

import train
from test_train import TINY, fake_cifar


@pytest.fixture
def job(tmp_path):
    return TINY + ["--data", "cifar100", "--data-dir", fake_cifar(tmp_path / "data"), "--warmup-epochs", "0"]


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
