"""The papers' claims rvits never tested before (issue 64): registered in lab/claims.py before their runs, their
arms (lab/arms.py) that differ from their partners only where the claim says, the runners know them, a contrast claim
("X - Y", the "!~" kind) is judged through the one rule, and lab/summarize_untested.py gives each claim its
verdict on constructed run folders, both ways, with "signature fails" beside it where its signature fails. CPU only, no training."""
import json
import os
import subprocess
import sys
import types

import pytest

import arms

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "lab"))
import claims  # noqa: E402
import gpu_study  # noqa: E402
import summarize_untested  # noqa: E402
from training import flags  # noqa: E402,F401  (its torch import at collection, not in the first test that runs a tool)

OURS = [c for c in claims.CLAIMS if c.registered == claims.ISSUE64]


def test_issue_64s_claims_are_registered_before_their_runs_in_the_papers_words():
    assert {c.key for c in OURS} == {"crossroads-blackbox-costs", "crossroads-blackbox-costs-few",
                                      "crossroads-rk4-gain-not-uniform", "crossroads-heun-gain-not-uniform",
                                      "bvit-width-trend-mini", "bvit-width-trend-gpu"}
    assert claims.ISSUE64 == "2026-12-04 17:53 257165c"
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
                assert f"c100-{study}-{name}" in arms.ARMS, (c.key, name)
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
    mini = lambda arm: arms.ARMS[f"c100-mini-{arm}"][1]  # noqa: E731
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
            a, b = (arms.ARMS[f"c100-{family}-{arm}"][1] for arm in (f"{model}-{narrow}", model))
            assert a["embed_dim"] == int(narrow[1:]) and a["num_heads"] == 3 and b.get("embed_dim", 192) == wide
            assert {k: v for k, v in a.items() if k not in ("embed_dim", "num_heads", "size")} == \
                   {k: v for k, v in b.items() if k not in ("embed_dim", "num_heads", "size")}
    for arm in ("odevit-blackbox", "odevit-euler-nfe4", "odevit-heun-nfe4", "odevit-rk4-nfe4", "vit-d48", "bvit-d48"):
        assert float(arms.TIMES[f"c100-mini-{arm}"][0].removeprefix("est. ").split()[0]) <= 45  # fits a CPU study run (measured: 7-17 min)


def test_the_runners_know_the_new_arms(tmp_path):
    """reproduce_mini.sh accepts them one by one and as ARMS=untested (refused only for the missing DATA, before
    anything runs); the GPU study queues its width pair after the other groups."""
    script = os.path.join(ROOT, "lab", "reproduce_mini.sh")
    for arms in ("untested", "odevit-blackbox vit-d48 odevit-rk4-nfe4"):
        env = dict(os.environ, OUT=str(tmp_path / "mini"), ARMS=arms, DATA=str(tmp_path / "none"))
        r = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "DATA=" in r.stderr and "ARMS" not in r.stderr, r.stderr
    assert gpu_study.GROUPS[-1] == ["vit-d96", "bvit-d96"] and {"vit-d96", "bvit-d96"} <= set(gpu_study.ARMS)


# ----------------------------------------------------------------------------- the summarizer
BY_KEY = {c.key: c for c in OURS}
SCORES = {"vit": [60.0, 61.0, 59.0], "bvit": [58.0, 59.1, 56.9],            # the gap at D=96: 2, 1.9, 2.1
          "vit-d48": [50.0, 51.0, 49.0], "bvit-d48": [44.0, 45.2, 42.8],     # the gap at D=48: 6, 5.8, 6.2
          "odevit-euler": [50.0, 51.0, 52.0], "odevit-blackbox": [47.0, 48.2, 48.8],  # a cost of 3, 2.8, 3.2
          "odevit-rk4": [53.0, 54.1, 54.9], "odevit-heun": [50.1, 50.9, 52.0],        # gains 3, 3.1, 2.9 and ~0
          "odevit-euler-nfe4": [45.0, 46.0, 47.0], "odevit-rk4-nfe4": [45.0, 46.0, 47.1],
          "odevit-heun-nfe4": [45.0, 46.1, 47.0]}


def growth_steps(growth, depth=8):
    """analyze.py's steps.json whose token norm grows by `growth` (relative) from step 1 to the last."""
    return {"steps": [{"step": k, "act_norm": 10.0 * (1 + growth * (k - 1) / (depth - 1))} for k in range(1, depth + 1)]}


def cka_file(cka18, depth=8):
    """analyze.py's cka.json whose step-1 / step-8 CKA is `cka18` (others 1 on the diagonal, 0.95 elsewhere)."""
    m = [[1.0 if i == j else 0.95 for j in range(depth + 1)] for i in range(depth + 1)]
    m[1][8] = m[8][1] = cka18
    return {"layers": ["embed"] + [f"step {k}" for k in range(1, depth + 1)], "cka": m}


def make_run(root, arm, seed, top1, cached=(), date="2026-12-05 09:00", cpu="AMD EPYC", ckpt=False):
    """A finished run folder as reproduce_mini.sh leaves it (model.txt: as kept), with analyze.py's files `cached`."""
    d = root / arm / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "done.json").write_text(json.dumps({"wall_s": 60, "commit": "fffffff", "commit_date": date, "cpu": cpu}))
    (d / "args.json").write_text(json.dumps({"model": arm.split("-")[0], "seed": seed, "depth": 8}))
    (d / "log.jsonl").write_text("".join(json.dumps({"epoch": e, "val_acc1": top1 - 1 + e}) + "\n" for e in (0, 1)))
    (d / "model.txt").write_text(f"{arm.split('-')[0]}: 0.100 M params, 0.010 GFLOPs/img\n")
    for name, obj in dict(cached).items():
        (d / name).write_text(json.dumps(obj))
    if ckpt:
        (d / "ckpt.pt").write_bytes(b"")
    return d


def study(root, scores=SCORES, growth=(3.0, 0.5), cka=(0.6, 0.7), cached=True, skip=()):
    """Every arm's 3 seeds; the black-box and state-subtracted arms' norm growth `growth`, the two bViT arms' CKA
    `cka` cached (unless not `cached`); `skip`: (arm, seed) not run."""
    sig = {"odevit-blackbox": ("steps.json", growth_steps(growth[0])), "odevit-euler": ("steps.json", growth_steps(growth[1])),
           "bvit-d48": ("cka.json", cka_file(cka[0])), "bvit": ("cka.json", cka_file(cka[1]))}
    for arm, top1s in scores.items():
        for seed, top1 in enumerate(top1s):
            if (arm, seed) not in skip:
                make_run(root, arm, seed, top1, [sig[arm]] if cached and arm in sig else ())
    return summarize_untested.load_runs(str(root))


def verdict(key, runs):
    """The claim's verdict in words, less the reading of a signature that holds (the cases below change one thing)."""
    return summarize_untested.judge(BY_KEY[key], runs)[4].replace(" (signature holds)", "")


def shifted(arm, diffs, scores=SCORES, to="odevit-euler"):
    """SCORES with `arm` at `to`'s per-seed scores minus `diffs`."""
    return {**scores, arm: [x - d for x, d in zip(scores[to], diffs)]}


@pytest.mark.parametrize("cost, costs, few", [([3.0, 2.8, 3.2], "agree", "agree"),        # a cost of few points
                                             ([8.0, 7.8, 8.2], "agree", "disagree"),     # more than few (5)
                                             ([-3.0, -2.8, -3.2], "disagree", "agree"),  # the black box wins
                                             ([1.0, -1.0, 0.2], "cannot tell", "agree")])
def test_the_black_box_fields_cost_comes_out_either_way(tmp_path, cost, costs, few):
    runs = study(tmp_path, shifted("odevit-blackbox", cost))
    assert (verdict("crossroads-blackbox-costs", runs), verdict("crossroads-blackbox-costs-few", runs)) == (costs, few)
    a, b, mean, half, _, said = summarize_untested.judge(BY_KEY["crossroads-blackbox-costs"], runs)
    assert a == SCORES["odevit-euler"] and mean == pytest.approx(sum(cost) / 3) and half > 0
    assert said == "norm growth 1-8: +3.00 vs +0.50 (>= 2x)"


def test_the_black_box_claims_say_their_signature_fails_beside_the_verdict_when_its_norm_grows_less(tmp_path):
    """Issue 77: a failed signature never replaces the rule's verdict; it is read beside it."""
    held = study(tmp_path / "held")
    runs = study(tmp_path / "failed", growth=(0.9, 0.5))  # 0.9 < 2 x 0.5
    for key in ("crossroads-blackbox-costs", "crossroads-blackbox-costs-few"):
        assert verdict(key, runs) == verdict(key, held) + " (signature fails)", key
    assert verdict("crossroads-rk4-gain-not-uniform", runs) == "agree"  # (no signature: not gated)
    assert summarize_untested.blackbox_engaged([growth_steps(1.0)] * 3, [growth_steps(0.5)] * 3)[0] is True  # 2x holds
    assert summarize_untested.norm_growth(growth_steps(1.0, depth=4)) is None  # no step 8


@pytest.mark.parametrize("gains, want", [([3.0, 3.1, 2.9], "agree"),       # NFE 8's gain 3 points above NFE 4's
                                         ([0.1, -0.1, 0.0], "disagree"),   # the same gain at both NFEs
                                         ([2.0, -1.0, 0.5], "cannot tell")])
def test_a_not_uniform_gain_agrees_when_the_gains_differ_and_disagrees_when_equal(tmp_path, gains, want):
    """The gain of RK4 (Heun) over Euler at NFE 8 against the same gain at NFE 4: "!~" with a 1-point margin."""
    four = [r - e for r, e in zip(SCORES["odevit-rk4-nfe4"], SCORES["odevit-euler-nfe4"])]
    scores = shifted("odevit-rk4", [-g - f for g, f in zip(gains, four)])  # rk4 = euler + NFE 4's gain + gains
    scores = shifted("odevit-heun", [-g - f for g, f in zip(gains, four)], scores)
    runs = study(tmp_path, scores)
    assert verdict("crossroads-rk4-gain-not-uniform", runs) == verdict("crossroads-heun-gain-not-uniform", runs) == want


@pytest.mark.parametrize("d48, want", [([6.0, 5.8, 6.2], "agree"), ([1.0, 0.8, 1.2], "disagree"),
                                       ([4.0, 0.0, 2.0], "cannot tell")])
def test_bvits_width_trend_comes_out_either_way_and_needs_its_steps_to_differ(tmp_path, d48, want):
    """The ViT-minus-bViT gap at D=48 above the gap at D=96 (2 points); "signature fails" beside the verdict when a bViT
    arm's steps are alike (self-CKA of step 1 and step 8 at 0.9 or above)."""
    runs = study(tmp_path, shifted("bvit-d48", d48, to="vit-d48"))
    assert verdict("bvit-width-trend-mini", runs) == want
    assert summarize_untested.judge(BY_KEY["bvit-width-trend-mini"], runs)[5] == "CKA(1, 8): bvit-d48 0.60, bvit 0.70 (< 0.9)"
    for r in runs["bvit"]:
        r["cka"] = cka_file(0.95)
    assert verdict("bvit-width-trend-mini", runs) == f"{want} (signature fails)"


def test_pairs_are_made_by_seed_number_and_fewer_seeds_are_said(tmp_path):
    """Without odevit-blackbox seed 1, its claims pair seeds 0 and 2 of both arms (never by position), and say so."""
    runs = study(tmp_path, skip={("odevit-blackbox", 1)})
    a, b, *_ = summarize_untested.judge(BY_KEY["crossroads-blackbox-costs"], runs)
    assert a == [50.0, 52.0] and b == [47.0, 48.8]
    assert verdict("crossroads-blackbox-costs", runs) == "agree (2 of 3 seeds)"
    runs = study(tmp_path / "one", {k: v[:1] for k, v in SCORES.items()})
    assert verdict("bvit-width-trend-mini", runs) == "cannot tell (1 of 3 seeds)"
    assert verdict("crossroads-blackbox-costs", {}) == "not run"


def test_partner_runs_in_another_folder_are_read_with_the_study(tmp_path, capsys):
    """summarize_untested.py FOLDER OTHER reads both as one: the partner arms (vit, bvit) of a seed may lie in another
    study's folder (runs/seed2); summary.md goes to the first. Without OTHER the width claim has no pairs."""
    study(tmp_path / "untested", {k: v for k, v in SCORES.items() if k not in ("vit", "bvit")})
    study(tmp_path / "seed2", {k: SCORES[k] for k in ("vit", "bvit")})
    def width_row():
        text = (tmp_path / "untested" / "summary.md").read_text()
        return next(line for line in text.splitlines() if line.startswith("| bvit-width-trend-mini:"))
    summarize_untested.main([str(tmp_path / "untested"), "--no-measure"])
    assert width_row().endswith("| not run |")
    summarize_untested.main([str(tmp_path / "untested"), str(tmp_path / "seed2"), "--no-measure"])
    assert width_row().endswith("| agree (signature holds) |")  # vit - bvit read from seed2, bvit's CKA included
    assert not (tmp_path / "seed2" / "summary.md").exists()
    capsys.readouterr()


def test_a_run_in_two_folders_is_read_once_the_fresh_one_first(tmp_path):
    """A partner kept with both studies (lab/results/untested and lab/results/mini) counts once: the first folder's run;
    where the first folder's run predates the claims and the second's does not, the second's."""
    study(tmp_path / "untested")
    make_run(tmp_path / "mini", "vit", 0, 10.0)  # the same arm and seed again, another score: never read
    make_run(tmp_path / "mini", "bvit", 1, 10.0)
    runs = summarize_untested.read([str(tmp_path / "untested"), str(tmp_path / "mini")])
    assert [r["seed"] for r in runs["vit"]] == [0, 1, 2] and runs["vit"][0]["last"]["val_acc1"] == SCORES["vit"][0]
    assert verdict("bvit-width-trend-mini", runs) == "agree"
    (tmp_path / "old").mkdir()
    make_run(tmp_path / "old", "vit", 0, 10.0, date="2026-12-01 10:00")  # before the registration
    runs = summarize_untested.read([str(tmp_path / "old"), str(tmp_path / "untested")])
    assert runs["vit"][0]["last"]["val_acc1"] == SCORES["vit"][0] and len(runs["vit"]) == 3
    assert "Left out" not in summarize_untested.blocks(runs)


def test_a_run_made_before_the_registration_is_left_out(tmp_path):
    study(tmp_path, skip={("vit", 0)})
    make_run(tmp_path, "vit", 0, 60.0, date="2026-12-01 10:00")  # before 2026-12-04 17:27
    runs = summarize_untested.load_runs(str(tmp_path))
    assert verdict("bvit-width-trend-mini", runs) == "agree (2 of 3 seeds)"
    assert "Left out, made before the claims' registration: vit seed 0." in summarize_untested.blocks(runs)


def test_a_pair_on_two_cpu_models_is_widened(tmp_path):
    runs = study(tmp_path)
    half = summarize_untested.judge(BY_KEY["crossroads-blackbox-costs"], runs)[3]
    runs["odevit-blackbox"][0]["cpu"] = "Intel Xeon"
    assert summarize_untested.judge(BY_KEY["crossroads-blackbox-costs"], runs)[3] == pytest.approx(half + claims.HARDWARE_NOISE)


def test_the_summary_measures_what_is_not_cached_and_says_what_it_cannot(tmp_path, monkeypatch, capsys):
    """Without cached signatures: --no-measure (or no checkpoint) gives " (signature not measured)"; with a checkpoint
    analyze.py is run once per run (a stand-in here), and its files are read the next time."""
    study(tmp_path, cached=False)
    results = tmp_path / "results.md"
    results.write_text("# x\n<!-- untested-claims -->\nold\n<!-- /untested-claims -->\nprose\n")
    summarize_untested.main([str(tmp_path), "--no-measure", "--results", str(results)])
    text = (tmp_path / "summary.md").read_text()
    assert text.count("agree (signature not measured)") == 3 and "| agree |" in text  # 3 gated claims, 2 not gated
    assert "old" not in results.read_text() and results.read_text().endswith("<!-- /untested-claims -->\nprose\n")
    assert "crossroads-heun-gain-not-uniform" in results.read_text()
    calls = []

    def analyze_cli(argv):  # analyze.py's files, a black-box growth 3.0 against 0.5, bViT CKAs 0.5
        out = argv[argv.index("--out-dir") + 1]
        calls.append(os.path.relpath(out, tmp_path))
        (tmp_path / out / "steps.json").write_text(json.dumps(growth_steps(3.0 if "blackbox" in out else 0.5)))
        (tmp_path / out / "cka.json").write_text(json.dumps(cka_file(0.5)))
        return 0
    monkeypatch.setitem(sys.modules, "analyze", types.SimpleNamespace(cli=analyze_cli))
    for arm in ("odevit-blackbox", "odevit-euler", "bvit-d48", "bvit", "vit"):
        for seed in range(3):
            (tmp_path / arm / f"seed{seed}" / "ckpt.pt").write_bytes(b"")
    summarize_untested.main([str(tmp_path), "--num-images", "16"])
    assert sorted(calls) == sorted(os.path.join(arm, f"seed{s}") for arm in ("odevit-blackbox", "odevit-euler",
                                                                              "bvit-d48", "bvit") for s in range(3))
    assert "not measured" not in (tmp_path / "summary.md").read_text()
    summarize_untested.main([str(tmp_path)])  # cached: analyze.py is not run again
    assert len(calls) == 12
    capsys.readouterr()


@pytest.mark.parametrize("argv, said", [(["MISSING"], "is not a directory"), (["EMPTY"], "no finished"),
                                        (["RUNS", "--num-images", "0"], "--num-images"),
                                        (["RUNS", "--results", "NOFILE"], "--results"),
                                        (["RUNS", "--results", "PLAIN"], "markers"),
                                        (["SHORT", "--results", "MARKED"], "ran shortened")])
def test_bad_input_is_one_line_and_exit_status_2(tmp_path, capsys, argv, said):
    study(tmp_path / "runs", {"vit": [60.0]})
    short = make_run(tmp_path / "short", "vit", 0, 60.0)
    (short / "args.json").write_text(json.dumps({"model": "vit", "seed": 0, "depth": 8, "max_steps": 2}))
    (tmp_path / "empty").mkdir()
    (tmp_path / "plain.md").write_text("no markers\n")
    (tmp_path / "marked.md").write_text("<!-- untested-claims -->\n<!-- /untested-claims -->\n")
    where = {"MISSING": tmp_path / "missing", "EMPTY": tmp_path / "empty", "RUNS": tmp_path / "runs",
             "SHORT": tmp_path / "short", "NOFILE": tmp_path / "none.md", "PLAIN": tmp_path / "plain.md",
             "MARKED": tmp_path / "marked.md"}
    with pytest.raises(SystemExit) as e:
        summarize_untested.main([str(where.get(x, x)) for x in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and said in err and err.startswith("summarize_untested.py: error:")


def test_docs_results_block_is_what_the_summarizer_writes_from_the_kept_runs(tmp_path):
    """lab/docs/results.md's <!-- untested-claims --> block: summarize_untested.py's, from lab/results/untested and the
    partners' seeds kept in lab/results/mini (the command lab/results/untested/README.md gives; the older partner runs are
    left out by the rule)."""
    import kept as compact
    kept = [compact.unpack(os.path.join(ROOT, claims.KEPT[s]), str(tmp_path / s)) for s in ("untested", "mini")]
    text = open(os.path.join(ROOT, "lab", "docs", "results.md")).read()
    block = text.split("<!-- untested-claims -->\n", 1)[1].split("\n<!-- /untested-claims -->", 1)[0]
    runs = summarize_untested.read([k for k in kept if os.path.isdir(k)])
    assert block == summarize_untested.blocks(runs).strip()
    assert all(f"{c.key}:" in block for c in summarize_untested.CLAIMS)
