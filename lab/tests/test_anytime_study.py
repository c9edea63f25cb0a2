"""lab/anytime_study.py (issue 80, item 3): the Clopper-Pearson interval against its closed forms, the splits'
summary on a constructed table, and the study end to end on a tiny checkpoint (slow: trains through train.py)."""
import json
import math

import pytest
import torch

import anytime
import anytime_study


def test_clopper_pearson_meets_its_closed_forms_at_the_ends():
    # k = 0: hi = 1 - (a)^(1/n); k = n: lo = a^(1/n), a = 0.05 for a 90 % interval
    assert anytime_study.clopper_pearson(0, 50) == pytest.approx((0.0, 1 - 0.05 ** (1 / 50)), abs=1e-9)
    assert anytime_study.clopper_pearson(50, 50) == pytest.approx((0.05 ** (1 / 50), 1.0), abs=1e-9)
    lo, hi = anytime_study.clopper_pearson(5, 50)
    assert lo < 0.1 < hi and 0.04 < lo < 0.041 and 0.198 < hi < 0.2  # beta(5, 46)'s 5 % and beta(6, 45)'s 95 %


def test_the_splits_certify_on_one_half_and_score_on_the_other():
    # 40 images, 3 thresholds: column 0 never wrong, column 1 wrong on images 0 and 1, column 2 on every other one.
    # 20 calibration images at eps 20 %, binomial p = P(Bin(20, 0.2) <= k): k = 0: 0.0115, k = 1: 0.0692 (certified),
    # k = 2: 0.2061 (not); column 2 (about 10 wrong) never. So split s certifies column 1 unless both images 0 and 1
    # fall in its calibration half, and scores column 1 on the evaluation half: (images 0, 1 there) / 20
    losses = torch.zeros(40, 3)
    losses[:2, 1] = 1
    losses[::2, 2] = 1
    steps = torch.tensor([4, 3, 1]).expand(40, 3)
    per = anytime_study.splits(losses, steps, 4, [0.2], delta=0.1, n_splits=6)[0.2]
    for s, r in enumerate(per):
        cal, ev = anytime.split(40, None, s)
        both = {0, 1} <= set(cal.tolist())
        assert r["threshold_index"] == (0 if both else 1), s
        assert r["risk"] == pytest.approx(0.0 if both else len({0, 1} & set(ev.tolist())) / 20) and r["steps"] == (4 if both else 3)
    assert {r["threshold_index"] for r in per} == {0, 1}  # (splits 2: both in the calibration half; 0, 1, 3-5: not)
    summary = anytime_study.summary(per, 0.2, 0.1, 4, 0.0)
    assert summary["violations"] == 0 and summary["within_delta"] and summary["certified"] == 6
    assert summary["mean_steps"] == pytest.approx(sum(r["steps"] for r in per) / 6)


@pytest.mark.slow  # (trains through train.py)
def test_the_study_runs_on_a_tiny_checkpoint_and_writes_its_json(tmp_path, capsys):
    import train
    from test_train import TINY, fake_cifar
    cifar = fake_cifar(tmp_path / "data", n_test=40)
    run = tmp_path / "bvit"
    assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1", "--model", "bvit",
                             "--out-dir", str(run)]) == 0
    (run / "done.json").write_text('{"commit": "abc1234", "cpu": "X"}')  # (reproduce_mini.sh's record of the run)
    out = tmp_path / "study"
    assert anytime_study.main([str(run), "--out-dir", str(out), "--splits", "3", "--eps", "0.05", "0.2",
                               "--bench", "--smoke", "--device", "cpu"]) == 0
    res = json.loads((out / "anytime_study.json").read_text())["runs"][str(run)]
    assert res["budget"] == 2 and res["images"] == 40 and set(res["rules"]) == {"confidence", "kl"}
    s = res["rules"]["confidence"]["0.2"]
    assert s["splits"] == 3 and len(s["per_split"]) == 3 and 0 <= s["violation_rate"] <= 1
    assert 1 <= s["mean_steps"] <= 2 and math.isclose(s["fraction_of_blocks"], s["mean_steps"] / 2)
    assert set(res["bench"]["kl"]["batches"]) == {"1", "64", "256"}
    kept = out / "bvit" / "seed0"  # the run's part, kept as a line by lab/keep_results.py: where the study ran
    done = json.loads((kept / "done.json").read_text())
    assert done["commit"] and done["cpu"] and done["checkpoint_sha256"] == res["checkpoint_sha256"]
    assert json.loads((kept / "anytime_study.json").read_text())["budget"] == 2
    assert (kept / "train_log.jsonl").read_text() == (run / "log.jsonl").read_text()
    assert (kept / "train_args.json").is_file() and json.loads((kept / "train_done.json").read_text())["cpu"] == "X"
    with pytest.raises(SystemExit) as e:
        anytime_study.main([str(tmp_path), "--out-dir", str(out)])
    assert e.value.code == 2 and "no ckpt.pt there" in capsys.readouterr().err


def test_the_figure_draws_each_run_and_rule_with_its_band(monkeypatch, tmp_path):
    """(matplotlib is optional: a stand-in records the calls, so the figure's code runs without it)"""
    from unittest import mock
    plt = mock.MagicMock()
    axes = (mock.MagicMock(), mock.MagicMock())
    plt.subplots.return_value = (mock.MagicMock(), axes)
    axes[0].plot.return_value = [mock.MagicMock()]
    monkeypatch.setattr(anytime_study, "pyplot", lambda *paths: plt)
    s = {"mean_risk": 0.004, "risk_quantile": 0.008, "fraction_of_blocks": 0.6}
    res = {"runs": {"runs/a": {"rules": {r: {"0.01": s, "0.02": s} for r in ("confidence", "kl")}}}}
    anytime_study.figure(res, str(tmp_path / "f.png"), [0.01, 0.02], 0.1)
    assert axes[0].fill_between.call_count == 2 and axes[1].plot.call_count == 2
    x, lo, hi = axes[0].fill_between.call_args[0][:3]
    assert x == [1.0, 2.0] and lo == [0, 0] and hi == [0.8, 0.8]  # percent: the band up to the 90 % quantile
    plt.subplots.return_value[0].savefig.assert_called_once()
