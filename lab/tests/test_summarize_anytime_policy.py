"""lab/summarize_anytime_policy.py (issue 80, item 3): the registered claims of the exit-policy study judged both
ways on constructed study folders, only on the claims' fresh seeds, and the gate read beside the verdict."""
import json

import pytest

import anytime_study
import claims
import summarize_anytime_policy as s


def write_run(root, arm, seed, rate, saved, ratio, stage0=3.0):
    """A run's part of the study as anytime_study.py writes it: every eps violated at `rate` of 50 splits,
    `saved` of the blocks at eps 1 %, the batch-256 wall ratio `ratio`; the training log's stage-0 loss."""
    k = round(rate * 50)
    per = {"splits": 50, "violations": k, "violation_rate": k / 50,
           "violation_interval_90": anytime_study.clopper_pearson(k, 50), "mean_risk": 0.004, "risk_quantile": 0.006,
           "certified": 50, "mean_steps": 8 * (1 - saved), "fraction_of_blocks": 1 - saved, "saved": saved}
    rules = {rule: {e: dict(per) for e in s.EPS} for rule in ("confidence", "kl")}
    bench = {rule: {"batches": {b: {"ratio": ratio} for b in ("1", "64", "256")}} for rule in ("confidence", "kl")}
    d = root / arm / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "anytime_study.json").write_text(json.dumps({"rules": rules, "bench": bench, "checkpoint_sha256": "0"}))
    (d / "done.json").write_text(json.dumps({"commit": "abc1234", "commit_date": "2026-12-07 11:00", "cpu": "X",
                                             "threads": 1}))
    (d / "train_log.jsonl").write_text(json.dumps({"epoch": 9, "stage0_loss": stage0}) + "\n")


def verdicts(root):
    return {key: v for key, _, v, _, _ in s.claims(s.load_runs(str(root)))}


def test_a_policy_that_holds_agrees_and_one_that_fails_disagrees(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    for seed, jitter in zip(claims.ANYTIME_SEEDS, (0.0, 0.01, 0.02)):
        write_run(good, "bvit-ds", seed, 0.0, 0.40 + jitter, 1.30 + jitter)
        write_run(bad, "bvit-ds", seed, 0.30 + jitter * 2, 0.10 + jitter, 0.80 + jitter)
    g, b = verdicts(good), verdicts(bad)
    assert g["anytime-policy-risk-bvit-ds"] == "agree"  # 0 of 50 splits over eps, widened by CP's 2.9 points
    assert b["anytime-policy-risk-bvit-ds"] == "disagree"  # 30 % of the splits over eps: well above delta
    assert g["anytime-policy-saves-ds"] == "agree (mechanism at work)"
    assert b["anytime-policy-saves-ds"] == "disagree (mechanism at work)"
    assert g["anytime-policy-wall-256"].startswith("agree") and b["anytime-policy-wall-256"].startswith("disagree")
    assert g["anytime-policy-risk-srvit-r2"] == "not run"  # an arm without runs is said so, never judged


def test_the_gate_stands_beside_the_verdict_and_only_fresh_seeds_count(tmp_path):
    for seed in claims.ANYTIME_SEEDS[:2]:
        write_run(tmp_path, "bvit-ds", seed, 0.0, 0.40 + seed / 100, 1.3, stage0=4.2)  # deep supervision idle
    write_run(tmp_path, "bvit-ds", 0, 0.9, 0.0, 0.1)  # seed 0 is not one of the claims' seeds: never read
    v = verdicts(tmp_path)
    assert v["anytime-policy-saves-ds"].startswith("agree (mechanism not at work: stage-0 loss 4.20 > 3.6")
    assert v["anytime-policy-saves-ds"].endswith("(2 of 3 seeds)")
    assert v["anytime-policy-risk-bvit-ds"] == "agree (2 of 3 seeds)"


def test_a_folder_without_runs_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        s.main([str(tmp_path)])
    assert e.value.code == 2 and "no run of bvit" in capsys.readouterr().err


def test_the_study_script_trains_and_studies_every_registered_arm_on_every_fresh_seed():
    """lab/anytime_policy.sh: its list trains the arms the replication lacks on claims.ANYTIME_SEEDS (an elastic run
    after its revit-e4), and its study loop reads every arm of claims.ANYTIME_ARMS on those seeds."""
    import os
    import re
    text = open(os.path.join(os.path.dirname(claims.__file__), "anytime_policy.sh")).read()
    items = re.search(r'LIST="([^"]*)"', text).group(1).split()
    trained = {tuple(i.split(":")) for i in items}
    seeds = {str(s) for s in claims.ANYTIME_SEEDS}
    assert trained == {(a, s) for a in ("revit-e4", "revit-e4-elastic", "srvit-r2") for s in seeds}
    assert all(items.index(f"revit-e4:{s}") < items.index(f"revit-e4-elastic:{s}") for s in seeds)
    studied = re.findall(r"\$(REPL|OUT)/([\w-]+)/seed\{([\d,]+)\}", text)
    assert {a for _, a, _ in studied} == set(claims.ANYTIME_ARMS)
    assert all(set(ss.split(",")) == seeds for _, _, ss in studied)
