"""A researcher's first day (issue 41): what a short run prints and spends, outside a terminal too."""
import json

import pytest

from test_train import TINY, fake_cifar
import train
from training import evaluation

pytestmark = pytest.mark.slow  # (train.py runs: README's quick tier, -m "not slow", leaves them out)


def test_a_depth_is_evaluated_once_and_the_log_counts_toward_the_runs_end(tmp_path, monkeypatch, capsys):
    cifar = fake_cifar(tmp_path / "data", n_train=64, n_test=16)
    calls, real = [], evaluation.evaluate

    def counted(model, loader, device, amp_ctx, depth=None, **kw):
        calls.append(depth)
        return real(model, loader, device, amp_ctx, depth=depth, **kw)
    monkeypatch.setattr(evaluation, "evaluate", counted)
    out = tmp_path / "r"
    assert train.cli(TINY + ["--model", "bvit", "--data", "cifar100", "--data-dir", cifar, "--max-steps", "4",
                             "--eval-depths", "1,2,4", "--out-dir", str(out)]) == 0
    assert calls == [None, 1, 4]  # the epoch's evaluation at the trained depth 2 stands for --eval-depths' 2
    log = [json.loads(ln) for ln in (out / "log.jsonl").read_text().splitlines()]
    epoch = next(r for r in log if "epoch" in r)
    depth2 = next(r for r in log if r.get("depth") == 2)
    assert depth2["val_acc1"] == epoch["val_acc1"] and depth2["val_acc5"] == epoch["val_acc5"]
    rows = json.loads((out / "depth_eval.json").read_text())["results"]
    assert [r["depth"] for r in rows] == [1, 2, 4]
    printed = capsys.readouterr().out  # (not a terminal: progress lines instead of a bar)
    assert "step 4 of 4 (epoch 0: 4 of 8)" in printed, printed
