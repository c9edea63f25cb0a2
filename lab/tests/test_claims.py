"""lab/claims.py: the one rule (verdict) on constructed per-seed scores, both ways, and the registry's records.

Issue 63: "agree" must need evidence as much as "disagree" does: every outcome is reachable for every kind,
and two noisy seeds of a tie give "cannot tell", never "agree"."""
import dataclasses
import json
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "lab"))
import claims  # noqa: E402
import summarize_fig2  # noqa: E402

B = [30.0, 31.0, 29.5]  # one arm's three seeds; a = B + a paired difference


def shifted(diffs):
    return [b + d for b, d in zip(B, diffs)]


@pytest.mark.parametrize("kind, margin, diffs, want", [
    (">", None, [2.0, 2.2, 1.9], "agree"),              # clearly above 0
    (">", None, [-2.0, -2.2, -1.9], "disagree"),        # clearly below 0
    (">", None, [1.0, -1.0, 0.2], "cannot tell"),       # straddles 0
    ("<=", 1.0, [0.1, 0.0, 0.2], "agree"),              # wholly below +margin
    ("<=", 1.0, [-3.0, -3.2, -2.9], "agree"),           # a loses: it does not beat b
    ("<=", 1.0, [3.0, 3.1, 2.9], "disagree"),           # wholly above +margin
    ("<=", 1.0, [1.0, 0.0, 2.5], "cannot tell"),        # straddles +margin
    ("~", 1.0, [0.1, -0.1, 0.05], "agree"),             # inside +-margin
    ("~", 1.0, [3.0, 3.2, 2.9], "disagree"),            # wholly above +margin
    ("~", 1.0, [-3.0, -3.2, -2.9], "disagree"),         # wholly below -margin
    ("~", 1.0, [0.5, 1.5, 1.0], "cannot tell"),         # straddles +margin
])
def test_every_outcome_is_reachable_for_every_kind(kind, margin, diffs, want):
    assert claims.verdict(kind, margin, shifted(diffs), B) == want


def test_the_interval_is_a_90_percent_t_interval_on_the_paired_differences():
    d = [2.0, 2.2, 1.9]
    mean, half = claims.interval(shifted(d), B)
    sd = math.sqrt(sum((x - sum(d) / 3) ** 2 for x in d) / 2)
    assert mean == pytest.approx(sum(d) / 3) and half == pytest.approx(2.920 * sd / math.sqrt(3))
    # paired: a common per-seed shift (seed 1 easier for both arms) does not widen it
    assert claims.interval([x + 5 * i for i, x in enumerate(shifted(d))], [x + 5 * i for i, x in enumerate(B)]) \
        == pytest.approx((mean, half))
    assert claims.interval([1.0], [0.0]) == (1.0, math.inf)  # one pair: nothing resolved


def test_two_noisy_seeds_of_a_tie_give_cannot_tell_never_agree():
    """A tie measured on two seeds whose differences straddle 0 and lie half the margin or more apart: the
    t-interval (df 1: t = 6.314, half-width 3.16 x their gap) reaches past the margin, so neither "~" nor "<="
    can agree. The old rule (the difference of the means within the seed spread: agree) said "agree" to all."""
    margin = 1.0
    for gap in (0.5, 0.8, 1.0, 2.0, 3.3):
        for t in (0.0, 0.25, 0.5, 0.75, 1.0):
            d1 = -t * gap  # the seeds' differences: d1 <= 0 <= d1 + gap
            a, b = [30.0 + d1, 31.0 + d1 + gap], [30.0, 31.0]
            for kind in ("~", "<="):
                assert claims.verdict(kind, margin, a, b) == "cannot tell", (kind, d1, gap)
                assert claims.verdict(kind, margin, b, a) == "cannot tell", (kind, d1, gap)
    assert claims.verdict("~", margin, [30.0, 31.0], [30.05, 31.02]) == "agree"  # (a precise tie can agree)


def test_the_rule_is_symmetric():
    """Swapping the arms negates the interval: ">" agree becomes disagree, "~" keeps its verdict."""
    for diffs in ([2.0, 2.2, 1.9], [-2.0, -2.2, -1.9], [1.0, -1.0, 0.2], [0.1, -0.1, 0.05], [3.0, 3.2, 2.9]):
        a = shifted(diffs)
        fwd, back = claims.verdict(">", None, a, B), claims.verdict(">", None, B, a)
        assert {fwd, back} in ({"agree", "disagree"}, {"cannot tell"})
        assert claims.verdict("~", 1.0, a, B) == claims.verdict("~", 1.0, B, a)


def test_pairs_on_different_cpu_models_are_widened_by_the_measured_cross_cpu_difference():
    a = shifted([1.0, 1.1, 0.95])
    same = [("AMD EPYC", "AMD EPYC")] * 3
    mixed = [("AMD EPYC", "AMD EPYC"), ("AMD EPYC", "Intel(R) Xeon(R) Processor"), ("AMD EPYC", "AMD EPYC")]
    assert claims.verdict(">", None, a, B, same) == "agree"
    assert claims.verdict(">", None, a, B, mixed) == "cannot tell"  # 1.02 points < 1.65 points of hardware
    assert claims.verdict(">", None, a, B, [(None, "AMD EPYC")] * 3) == "cannot tell"  # unknown: not the same
    assert claims.interval(a, B, mixed)[1] == pytest.approx(claims.interval(a, B, same)[1] + claims.HARDWARE_NOISE)
    assert claims.HARDWARE_NOISE == pytest.approx(1.65)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="equal lengths"):
        claims.verdict(">", None, [1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="kind"):
        claims.verdict(">=", None, [1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="margin"):
        claims.verdict("~", None, [1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="margin"):
        claims.Claim("k", "ours", "", "", "mini", "a", "b", 1, "<=", None, "", 3, None, "2026-12-04 00:00 abc")


def test_every_registered_claim_is_complete():
    keys = [c.key for c in claims.CLAIMS]
    assert len(keys) == len(set(keys)) and keys
    for c in claims.CLAIMS:
        assert c.kind in claims.KINDS and c.seeds >= 2 and c.words and c.where and c.paper, c.key
        assert (c.margin is None) == (c.kind == ">") and (c.kind == ">" or c.why_margin), c.key
        assert all(op in (">=", "<=") for _, op, _ in c.gate), c.key


def fig2_run(root, arm, seed, scores, bal=0.4, div=0.45, cpu="AMD EPYC"):
    """A finished Fig. 2 run folder at L = 6 with linear-probe top-1 `scores` {depth: top-1}."""
    d = root / arm / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "done.json").write_text(json.dumps({"wall_s": 1, "commit": "abc", "cpu": cpu}))
    (d / "args.json").write_text(json.dumps({"depth": 6, "eval_depths": [3, 4, 6, 8, 12, 24], "seed": seed}))
    (d / "log.jsonl").write_text(json.dumps({"epoch": 2, "val_acc1": 1.0, "bal_loss": bal, "div_loss": div}) + "\n")
    for depth, top1 in scores.items():
        (d / f"probe_linear_depth{depth}.json").write_text(json.dumps({"top1": top1}))


def test_fig2_claims_are_judged_by_the_rule_and_the_gate_is_read_beside_the_verdict(tmp_path):
    """summarize_fig2 pairs seeds and reads each depth's probe; when the depth gate's experts are idle (eq. 6 term
    below its registered threshold) the rule's verdict still stands, the mechanism's reading beside it (issue 77)."""
    for seed, (e4, smear) in enumerate([(30.0, 25.0), (31.0, 25.5), (30.5, 24.8)]):
        fig2_run(tmp_path, "revit-e4-fig2-elastic", seed, {4: e4 - 2, 6: e4, 8: e4 + 1, 12: e4 + 0.5})
        fig2_run(tmp_path, "revit-smear-fig2-elastic", seed, {6: smear, 12: smear + 0.1 * seed})
    runs = summarize_fig2.load_runs(str(tmp_path))
    by_key = {c.key: c for c in claims.CLAIMS}
    here, resolves, v = summarize_fig2.judge(by_key["fig2-ahead-at-L"], runs)
    assert v == "agree (mechanism at work)" and "+5.40" in here and float(resolves) > 0
    assert summarize_fig2.judge(by_key["fig2-improves-to-L"], runs)[2].startswith("agree")
    assert summarize_fig2.judge(by_key["fig2-ahead-at-L-seg"], runs)[2] == "not run"  # no seg probe measured
    for r in runs["revit-e4-fig2-elastic"]:
        r["last"]["bal_loss"] = 0.01  # near-uniform gates: eq. 6 term under 0.1
    assert summarize_fig2.judge(by_key["fig2-ahead-at-L"], runs)[2] == "agree (mechanism not at work: eq. 6 0.01 < 0.1)"
    assert summarize_fig2.judge(by_key["fig2-feature-only-flat"], runs)[2] == "agree"  # ungated (the control)


def test_a_gate_never_replaces_the_verdict_both_ways_and_unmeasured():
    """Issue 77: a failed gate prints the rule's verdict with the reading beside it, a disagree included; an
    unmeasured signature is said the same way, never instead of the verdict."""
    c = claims.Claim("g", "ours", "", "w", "mini", "a", "b", 1, ">", None, "", 3, "sig", "2026-12-07 00:00 x",
                     gate=(("bal_loss", ">=", 0.1), ("div_loss", "<=", 0.7)))
    up, down = [31.0, 32.0, 31.5], [30.0, 30.5, 30.1]
    idle = {"bal_loss": 0.01, "div_loss": 0.85}
    assert claims.judge(c, up, down, record=idle)[2] == "agree (mechanism not at work: eq. 6 0.01 < 0.1, eq. 9 0.85 > 0.7)"
    assert claims.judge(c, down, up, record=idle)[2].startswith("disagree (mechanism not at work")
    assert claims.judge(c, down, up, record={"bal_loss": 0.4, "div_loss": 0.3})[2] == "disagree (mechanism at work)"
    assert claims.judge(c, down, up, record={})[2] == "disagree (signature not measured)"
    assert claims.judge(c, down[:2], up[:2], record={})[2] == "cannot tell (signature not measured) (2 of 3 seeds)"
    plain = dataclasses.replace(c, gate=())
    assert claims.judge(plain, up, down, record=idle)[2] == "agree"


def test_a_claim_is_confirmatory_only_when_every_part_was_fixed_before_its_first_run(monkeypatch):
    """Issue 77: the timeline of each part; a part fixed after a judging run makes the claim exploratory and is named
    (a gate fixed after the runs shows as such); a rerun that reproduces an earlier run bit for bit counts as it."""
    c = claims.Claim("t", "ours", "", "w", "mini", "a", "b", 1, ">", None, "", 3, "sig", "2026-12-01 00:00 r",
                     gate=claims.DS)
    t = claims.timeline(c)
    assert t["words, arms, kind"] == "2026-12-01 00:00 r" and t["rule"] == claims.RULE_FIXED
    assert t["gate"] == claims.GATES_FIXED[claims.DS] and "margin" not in t
    runs = {"before": [("a", 0, "c1", "2026-12-02 10:00"), ("b", 0, "c1", "2026-12-02 10:00")],
            "after": [("a", 0, "c2", "2026-12-05 10:00"), ("b", 0, "c2", "2026-12-05 10:00")]}
    for when, want in (("before", ["seeds", "rule", "gate"]), ("after", [])):
        monkeypatch.setattr(claims, "first_runs", lambda claim, w=when: runs[w])
        assert claims.fixed_after(c) == want
        assert claims.exploratory(c) is bool(want)
    late = dataclasses.replace(c, registered="2026-12-06 00:00 r")  # everything after the 12-05 runs
    assert claims.fixed_after(late) == ["words, arms, kind", "seeds", "rule", "gate"]
    assert claims.exploratory(dataclasses.replace(c, exploratory=True))  # registered so: stays so


def test_the_timelines_dates_are_the_commits_that_first_wrote_them():
    """RULE_FIXED, SEEDS_FIXED and GATES_FIXED name the first commit of lab/claims.py's history (studies/claims.py
    before the move) that holds the rule, the seeds field and each gate (`git log -S`)."""
    if not os.path.isdir(os.path.join(claims.ROOT, ".git")):
        pytest.skip("no git history (a copy without .git)")
    import subprocess

    def first(text):
        out = subprocess.run(["git", "log", "--reverse", "--format=%h", "-S", text, "--", "studies/claims.py",
                              "lab/claims.py"], cwd=claims.ROOT, capture_output=True, text=True).stdout.split()
        return out[0] if out else None
    if first("T90 = ") is None:
        pytest.skip("shallow history")
    assert claims.RULE_FIXED.endswith(first("T90 = "))
    assert claims.SEEDS_FIXED.endswith(first("    seeds: int"))
    for gate, stamp in claims.GATES_FIXED.items():
        k, op, t = gate[0]
        assert stamp.endswith(first(f'("{k}", "{op}", {t:g})')), gate


def test_the_reruns_of_the_partner_arms_count_as_the_runs_they_reproduce():
    """Issue 77 (3): results/untested's vit, bvit and odevit-euler seeds 0-1 are results/mini's 2026-12-02 runs made again
    bit for bit, so the width-trend claim (registered 2026-12-04) is exploratory on them."""
    width = next(c for c in claims.CLAIMS if c.key == "bvit-width-trend-mini")
    dates = {(arm, seed): date for arm, seed, _, date in claims.first_runs(width)}
    if ("vit", 0) not in dates:
        pytest.skip("no kept runs")
    assert dates[("vit", 0)] < width.registered[:16] and "words, arms, kind" in claims.fixed_after(width)
    assert claims.exploratory(width)


def violations(registry, root=claims.ROOT, git=claims.ROOT):
    """(claim, arm, seed) of every kept run older than a confirmatory claim that judges it (the arms of a contrast
    "X - Y" included)."""
    def arms(c):
        return {n for side in (c.a, c.b) for n in side.split(claims.CONTRAST)} | {c.gated}
    return [(c.key, arm, seed) for c in registry if not c.exploratory
            for arm, seed, commit, date in claims.kept_runs(c.study, root)
            if arm in arms(c) and (not c.fresh_seeds or seed in c.fresh_seeds)  # (a fresh-seed claim: those only)
            and claims.older(commit, date, c.registered, git)]


def test_no_kept_run_is_older_than_a_confirmatory_claim_that_judges_it():
    """Issue 63: a claim is registered before its runs, or it is exploratory. Checked by git ancestry where the
    history is there (a clone of main) and by the dates done.json records where it is not."""
    assert violations(claims.CLAIMS) == []
    assert violations(claims.CLAIMS, git=None) == []
    late = [claims.Claim("late", "ours", "", "", "revit", "revit-e4", "revit-e1", 1, ">", None, "", 3, None,
                         "2026-12-03 07:00 3ee76cf")]  # after revit-e4's and revit-e1's runs at eb32335
    assert len(violations(late, git=None)) == 4 and len(violations(late)) == 4
    assert violations([dataclasses.replace(late[0], exploratory=True)]) == []
    contrast = dataclasses.replace(late[0], a="revit-e4 - revit-e1", b="revit-lora")  # each arm of "X - Y" counts
    assert sorted({arm for _, arm, _ in violations([contrast], git=None)}) == ["revit-e1", "revit-e4"]  # (lora: later)


def test_older_is_strict_ancestry_with_git_and_the_date_without():
    assert claims.older("e9b7d1a", "?", "2026-12-03 06:40 eb32335") is os.path.exists(os.path.join(claims.ROOT, ".git"))
    assert not claims.older("eb32335", "2026-12-03 06:40", "2026-12-03 06:40 eb32335")  # the registering commit itself
    assert claims.older("x", "2026-12-02 09:41", "2026-12-03 06:40 y", git=None)
    assert not claims.older("x", "2026-12-03 06:41", "2026-12-03 06:40 y", git=None)
    assert not claims.older("x", "2026-12-03", "2026-12-03 06:40 y", git=None)  # a day: the same day is not older
    assert claims.older("x", "?", "2026-12-03 06:40 y", git=None)  # no date: cannot show it came after


def test_readmes_headlines_are_what_the_kept_runs_give(tmp_path, capsys):
    """README's headline verdicts are lab/headlines.py's over the kept runs, and nothing else (issue 63: no
    block a rebuild would not write survives)."""
    import shutil
    import headlines
    readme, results = tmp_path / "README.md", tmp_path / "results.md"
    shutil.copy(os.path.join(ROOT, "README.md"), readme)
    shutil.copy(os.path.join(ROOT, "lab", "docs", "results.md"), results)
    headlines.main(["--readme", str(readme), "--results", str(results)])
    assert readme.read_text() == open(os.path.join(ROOT, "README.md")).read()
    assert results.read_text() == open(os.path.join(ROOT, "lab", "docs", "results.md")).read()  # replication, timeline
    out = capsys.readouterr().out
    assert "E=4 vs MoEUT disagree" in out and "experts idle" in out  # the rule's verdict, the gate beside it


def test_headlines_tally_names_every_verdict_that_is_not_the_commonest():
    """One line for many claims: the verdicts that differ from the commonest are named, never folded into it."""
    import headlines
    said = [("fig2-a", "cannot tell (2 of 3 seeds)"), ("fig2-b", "agree"), ("fig2-c", "cannot tell")]
    assert headlines.tally(said, "fig2-") == "b agree; 2 others cannot tell"
    assert headlines.tally(said[:1] + said[2:], "fig2-") == "2 claims cannot tell"
    assert headlines.tally([("x", "agree"), ("y", "disagree")], "fig2-") == "y disagree; x agree"


def test_headlines_both_groups_parts_by_verdict_and_folds_only_one_verdict():
    """A study's few claims on one line: one verdict for all reads '(a)-(d) ...'; mixed verdicts name every part,
    each beside its own verdict, never under another's."""
    import headlines
    assert headlines.both([("(a)", "cannot tell (2 of 3 seeds)"), ("(b)", "cannot tell")]) == "(a)-(b) cannot tell"
    parts = [("(a)", "agree"), ("(b)", "cannot tell"), ("(c)", "disagree"), ("(d)", "cannot tell (1 of 3 seeds)")]
    assert headlines.both(parts) == "(a) agree, (c) disagree, (b, d) cannot tell"
    assert headlines.both(parts[:2]) == "(a) agree, (b) cannot tell"


def test_keep_results_stamps_a_kept_runs_commit_date_for_a_clone_without_history(tmp_path):
    """A run started before reproduce_mini.sh wrote commit_date gets it when kept (from git), so that the
    registration test can compare dates where .git is absent."""
    import keep_results
    run = tmp_path / "runs" / "vit" / "seed0"
    run.mkdir(parents=True)
    (run / "done.json").write_text(json.dumps({"wall_s": 1, "commit": "e9b7d1a", "cpu": "AMD EPYC"}))
    keep_results.keep(str(tmp_path / "runs"), str(tmp_path / "kept"))
    import kept
    done = json.loads(kept.read(str(tmp_path / "kept"))[0]["files"]["done.json"])
    if os.path.exists(os.path.join(claims.ROOT, ".git")):
        assert done["commit_date"] == "2026-11-30 09:44" and done["wall_s"] == 1
    assert json.loads((run / "done.json").read_text()) == {"wall_s": 1, "commit": "e9b7d1a", "cpu": "AMD EPYC"}


def test_keep_results_weights_keeps_a_finished_runs_model_and_flags_for_a_chain_to_continue(tmp_path, capsys):
    """--weights ARM/seed<k>: the kept ckpt.pt holds the model's weights and the run's flags, the same tensors,
    without the optimizer's state, and reads as an rvits checkpoint (what --teacher, --finetune and probe.py
    need); a run not finished, or without ckpt.pt, is refused in one line with exit 2; without --weights no
    checkpoint is kept."""
    import keep_results
    import torch
    from training.registry import is_rvits_checkpoint
    from training.weights import read_weights
    run = tmp_path / "runs" / "vit" / "seed2"
    run.mkdir(parents=True)
    (run / "done.json").write_text(json.dumps({"wall_s": 1, "commit": "e9b7d1a", "cpu": "AMD EPYC", "commit_date": "x"}))
    model = {"head.weight": torch.randn(100, 8), "blocks.0.w": torch.randn(8, 8)}
    torch.save({"model": model, "args": {"model": "vit", "seed": 2},
                "optimizer": {"state": {0: {"exp_avg": torch.randn(100, 8)}}}, "step": 3900}, run / "ckpt.pt")
    runs, kept = str(tmp_path / "runs"), tmp_path / "kept"
    assert keep_results.main([runs, str(kept)]) == 0
    assert not (kept / "vit" / "seed2" / "ckpt.pt").exists()
    assert keep_results.main([runs, str(kept), "--weights", "vit/seed2"]) == 0
    ck = read_weights(str(kept / "vit" / "seed2" / "ckpt.pt"), "--teacher")
    assert set(ck) == {"model", "args"} and ck["args"] == {"model": "vit", "seed": 2} and is_rvits_checkpoint(ck)
    assert all(torch.equal(ck["model"][k], v) for k, v in model.items()) and set(ck["model"]) == set(model)
    (run / "done.json").unlink()  # unfinished: refused, nothing written
    capsys.readouterr()
    assert keep_results.main([runs, str(tmp_path / "other"), "--weights", "vit/seed2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--weights vit/seed2" in err and not (tmp_path / "other").exists()


def test_fig2_claims_only_measures_what_the_registered_claims_read_seed_by_seed(tmp_path, monkeypatch):
    """--claims-only (claimed()): the linear probe at each depth a claim reads and the segmentation probe at L, no
    other probe and depth; seeds in order; a cached probe is not measured again."""
    import probe
    calls = []

    def fake_cli(argv):
        out, depth, task = argv[argv.index("--out-dir") + 1], int(argv[argv.index("--depth") + 1]), argv[3][11:]
        calls.append((os.path.basename(os.path.dirname(out)), task, depth, out[-1]))
        with open(os.path.join(out, f"probe_{task}_depth{depth}.json"), "w") as f:
            json.dump({"top1": 1.0, "miou": 1.0}, f)
        return 0
    monkeypatch.setattr(probe, "cli", fake_cli)
    for seed in (1, 0):
        fig2_run(tmp_path, "revit-e4-fig2-elastic", seed, {6: 30.0} if seed == 0 else {})
        fig2_run(tmp_path, "revit-smear-fig2-elastic", seed, {})
    runs = summarize_fig2.load_runs(str(tmp_path))
    summarize_fig2.measure(runs, "data", ("linear", "seg", "depth"), only=summarize_fig2.claimed())
    e4 = {(t, d) for a, t, d, s in calls if a == "revit-e4-fig2-elastic" and s == "1"}
    assert e4 == {("linear", 4), ("linear", 6), ("linear", 8), ("linear", 12), ("seg", 6)}
    smear = {(t, d) for a, t, d, s in calls if a == "revit-smear-fig2-elastic" and s == "0"}
    assert smear == {("linear", 6), ("linear", 12), ("seg", 6)}
    assert ("revit-e4-fig2-elastic", "linear", 6, "0") not in calls  # cached
    assert [s for *_, s in calls] == sorted(s for *_, s in calls)  # seed 0's probes first
    assert len(calls) == 15


def test_the_replication_is_registered_on_fresh_seeds_no_study_ran_before():
    """Issue 77: the replication's claims name their seeds before any run, and no kept run of any study (any arm)
    used them, so each of its runs is new data, not a bit-exact rerun of a run known before."""
    rep = [c for c in claims.CLAIMS if c.study == "replication"]
    keys = {c.key for c in rep}
    assert {"replication-matched-flops", "replication-matched-params", "replication-ds-beyond-horizon",
            "replication-width-trend"} <= keys
    for c in rep:
        assert not c.exploratory and len(c.fresh_seeds) == c.seeds >= 3, c.key
    fresh = {s for c in rep for s in c.fresh_seeds}
    for study in set(claims.KEPT) - {"replication", "anytime-policy"}:
        used = {seed for _, seed, _, _ in claims.kept_runs(study)}
        assert not used & fresh, (study, used & fresh)
    # issue 80's exit-policy study reads the replication's own checkpoints after their runs (its train_done.json is
    # the replication run's done.json) and trains only arms the replication does not have
    import kept
    trained = {(ln["arm"], ln["seed"]): ln["files"]["done.json"] for ln in kept.read(os.path.join(ROOT, claims.KEPT["replication"]))}
    rep_arms = {a for a, _ in trained}
    for ln in kept.read(os.path.join(ROOT, claims.KEPT["anytime-policy"])):
        if ln["arm"] in rep_arms:
            assert json.loads(ln["files"]["train_done.json"]) == json.loads(trained[ln["arm"], ln["seed"]]), ln["dir"]
    seen = {seed for _, seed, _, _ in claims.kept_runs("replication")}
    assert seen <= fresh, seen - fresh


def test_loopvaes_competitive_claim_is_judged_on_its_fresh_seeds_only_both_ways():
    """Issue 77: the Transformer core's "competitive" (a "~" claim, +-0.3 dB) reads only seeds 3-5; the seeds 0-2 that
    predate it never enter, whatever they say."""
    import summarize_loopvae

    def runs(gaps, seeds):
        return {"vit-global": [{"seed": s, "psnr": 20.0 + g, "cpu": "X"} for s, g in zip(seeds, gaps)],
                "vit-none": [{"seed": s, "psnr": 20.0, "cpu": "X"} for s in seeds]}

    def said(r):
        return next(row[3] for row in summarize_loopvae.claims(r, None) if row[0].startswith("1'."))
    old = runs([-2.0, -2.1, -1.9], (0, 1, 2))  # far apart on seeds before the claim: not its data
    assert said(old) == "not run"
    near = runs([0.01, -0.02, 0.03], (3, 4, 5))
    far = runs([-1.0, -1.1, -0.9], (3, 4, 5))
    mix = {k: old[k] + near[k] for k in old}
    assert said(near).startswith("agree") and said(mix).startswith("agree") and said(far).startswith("disagree")
