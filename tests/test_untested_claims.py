"""The papers' claims rvits never tested before (issue 64): registered in studies/claims.py before their runs, their
arms presets that differ from their partners only where the claim says, the runners know them, and a contrast claim
("X - Y", the "!~" kind) is judged through the one rule. CPU only, no training."""
import os
import subprocess
import sys

import pytest

import presets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "studies"))
import claims  # noqa: E402
import gpu_study  # noqa: E402

OURS = [c for c in claims.CLAIMS if c.registered == claims.ISSUE64]


def test_issue_64s_claims_are_registered_before_their_runs_in_the_papers_words():
    assert {c.key for c in OURS} == {"crossroads-blackbox-costs", "crossroads-blackbox-costs-few",
                                      "crossroads-rk4-gain-not-uniform", "crossroads-heun-gain-not-uniform",
                                      "bvit-width-trend-mini", "bvit-width-trend-gpu"}
    assert claims.ISSUE64 == "2026-12-04 17:27 6162896"
    quote = {"crossroads": "few accuracy points", "crossroads-rk4": "their gains are not uniform",
             "crossroads-heun": "their gains are not uniform", "bvit": "wider bViTs recovering much more"}
    for c in OURS:
        assert c.kind in claims.KINDS and c.seeds >= 3 and c.depth == 1 and not c.exploratory, c.key
        assert (c.margin is None) == (c.kind == ">") and c.why_margin, c.key
        assert quote[c.key.split("-")[0] if "gain" not in c.key else "-".join(c.key.split("-")[:2])] in c.words, c.key
        assert c.paper in ("Training Crossroads", "bViT") and c.where == "abstract", c.key  # (the abstracts' words)
        for arm in (c.a, c.b):  # every arm, and each side of a contrast, is a preset of its study
            for name in arm.split(claims.CONTRAST):
                study = {"untested": "mini", "untested-gpu": "gpu"}[c.study]  # (fresh runs of the mini / GPU presets)
                assert f"c100-{study}-{name}" in presets.PRESETS, (c.key, name)
    by_key = {c.key: c for c in OURS}
    assert by_key["crossroads-blackbox-costs-few"].margin == 5.0  # "few accuracy points": (0, 5]
    assert [by_key[k].kind for k in ("crossroads-rk4-gain-not-uniform", "bvit-width-trend-mini")] == ["!~", ">"]


def test_a_contrast_is_the_per_seed_difference_of_two_arms():
    scores = {"vit": [60.0, 61.0, 59.0], "bvit": [57.0, 59.5, 58.0], "short": [1.0]}
    assert claims.paired("vit", scores) == [60.0, 61.0, 59.0]
    assert claims.paired("vit - bvit", scores) == [3.0, 1.5, 1.0]
    with pytest.raises(KeyError, match="nosuch"):
        claims.paired("vit - nosuch", scores)
    with pytest.raises(ValueError, match="seed by seed"):
        claims.paired("vit - short", scores)


@pytest.mark.parametrize("said, mirrored", [("agree", "disagree"), ("disagree", "agree"),
                                            ("cannot tell", "cannot tell")])
def test_not_within_is_the_mirror_of_within_under_the_one_rule(monkeypatch, said, mirrored):
    """"!~" (the gains differ by more than the margin) agrees exactly where "~" disagrees and the reverse, on the
    contrasts of its arms, through the registry's verdict() (a stand-in here: the rule is tested with it)."""
    calls = []
    monkeypatch.setattr(claims, "verdict", lambda kind, margin, a, b: calls.append((kind, margin, a, b)) or said,
                        raising=False)
    scores = {"odevit-rk4": [50.0, 51.0, 52.0], "odevit-euler": [49.0, 49.0, 49.0],
              "odevit-rk4-nfe4": [40.0, 40.0, 40.0], "odevit-euler-nfe4": [41.0, 42.0, 43.0]}
    rk4 = next(c for c in OURS if c.key == "crossroads-rk4-gain-not-uniform")
    assert claims.judge_scores(rk4, scores) == mirrored
    assert calls == [("~", 1.0, [1.0, 2.0, 3.0], [-1.0, -2.0, -3.0])]  # the gains at NFE 8 and at NFE 4
    width = next(c for c in OURS if c.key == "bvit-width-trend-gpu")  # any other kind: the rule as it says
    scores = {"vit-d96": [50.0] * 3, "bvit-d96": [45.0] * 3, "vit": [60.0] * 3, "bvit": [58.0] * 3}
    assert claims.judge_scores(width, scores) == said and calls[-1] == (">", None, [5.0] * 3, [2.0] * 3)


def test_the_new_arms_differ_from_their_partners_only_where_the_claim_says():
    mini = lambda arm: presets.PRESETS[f"c100-mini-{arm}"][1]  # noqa: E731
    assert mini("odevit-blackbox") == {**mini("odevit-euler"), "field": "blackbox"}  # same NFE, solver and T
    nfe = {"euler": 1, "heun": 2, "rk4": 4}
    for solver in nfe:  # NFE 4 over T = 4: each solver's step size per block evaluation as at NFE 8 over T = 8
        four, eight = mini(f"odevit-{solver}-nfe4"), mini(f"odevit-{solver}")
        assert four["depth"] * nfe[solver] == 4 and four["horizon"] == 4.0 and eight["horizon"] == 8.0
        assert four["horizon"] / four["depth"] == eight["horizon"] / eight["depth"]
        assert {k: v for k, v in four.items() if k not in ("depth", "horizon", "eval_depths")} == \
               {k: v for k, v in eight.items() if k not in ("depth", "horizon", "eval_depths")}
    for family, narrow, wide in (("mini", "d48", 96), ("gpu", "d96", 192)):  # the width pair: only the width
        for model in ("vit", "bvit"):
            a, b = (presets.PRESETS[f"c100-{family}-{arm}"][1] for arm in (f"{model}-{narrow}", model))
            assert a["embed_dim"] == int(narrow[1:]) and a["num_heads"] == 3 and b.get("embed_dim", 192) == wide
            assert {k: v for k, v in a.items() if k not in ("embed_dim", "num_heads", "size")} == \
                   {k: v for k, v in b.items() if k not in ("embed_dim", "num_heads", "size")}
    for arm in ("odevit-blackbox", "odevit-euler-nfe4", "odevit-heun-nfe4", "odevit-rk4-nfe4", "vit-d48", "bvit-d48"):
        assert presets.TIMES[f"c100-mini-{arm}"][0].startswith("est. ")  # measured before: a cost estimate
        assert float(presets.TIMES[f"c100-mini-{arm}"][0].split()[1]) <= 45  # fits a CPU study run


def test_the_runners_know_the_new_arms(tmp_path):
    """reproduce_mini.sh accepts them one by one and as ARMS=untested (refused only for the missing DATA, before
    anything runs); the GPU study queues its width pair after the other groups."""
    script = os.path.join(ROOT, "studies", "reproduce_mini.sh")
    for arms in ("untested", "odevit-blackbox vit-d48 odevit-rk4-nfe4"):
        env = dict(os.environ, OUT=str(tmp_path / "mini"), ARMS=arms, DATA=str(tmp_path / "none"))
        r = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "DATA=" in r.stderr and "ARMS" not in r.stderr, r.stderr
    assert gpu_study.GROUPS[-1] == ["vit-d96", "bvit-d96"] and {"vit-d96", "bvit-d96"} <= set(gpu_study.ARMS)
