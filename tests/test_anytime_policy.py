"""anytime.py (issue 80): the compacted exit path against each image run alone, Learn-then-Test's fixed-sequence
walk on loss tables whose answer is computed by hand, the guarantee on a simulated risk model over 200 draws,
the policy's refusals (another checkpoint, another model, another budget) and the command line's one-line errors."""
import json
import math

import pytest
import torch

import anytime
import bvit
import odevit
import revit
import srvit

KW = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=2)


def models():
    torch.manual_seed(0)
    r = revit.ReViT(depth=4, experts=3, **KW).eval()
    elastic = revit.ReViT(depth=4, experts=2, depth_dropout=0.3, **KW).eval()  # elastic depth: eval runs the grid
    for m in (r, elastic):
        with torch.no_grad():
            for prm in m.router.parameters():
                prm.normal_(0, 1.0)
    return {"bvit": bvit.BViT(depth=4, **KW).eval(), "revit": r, "revit-elastic": elastic,
            "srvit": srvit.SRViT(depth=1, recursions=4, **KW).eval(), "odevit": odevit.ODEViT(steps=4, **KW).eval()}


def policy_for(model, rule, threshold, budget):
    """A policy at a chosen threshold (no calibration): what calibrate returns, minus its certificate."""
    return anytime.Policy(rule=rule, threshold=threshold, eps=0.1, delta=0.1, budget=budget, loss="disagreement",
                          p_value="binomial", calibration={}, checkpoint_sha256=None,
                          weights_sha256=anytime.weights_sha256(model), certified=threshold is not None,
                          grid_index=None, grid_size=0)


@pytest.mark.parametrize("name", ["bvit", "revit", "revit-elastic", "srvit", "odevit"])
@pytest.mark.parametrize("rule", ["confidence", "kl"])
def test_the_compacted_batch_gives_each_image_the_logits_it_has_alone_at_its_exit_step(name, rule):
    m, budget = models()[name], 6
    torch.manual_seed(1)
    x = torch.randn(8, 3, 16, 16)
    tr = anytime.trace(m, x, budget)
    values = tr["conf" if rule == "confidence" else "kl"]  # a threshold at which images leave at different steps
    threshold = next(float(t) for t in values[~values.isnan()].sort().values
                     if len(set(anytime.exit_steps(tr, rule, float(t)).tolist())) > 2)
    logits, steps = policy_for(m, rule, threshold, budget)(m, x)
    assert len(set(steps.tolist())) > 2 and steps.min() >= 1 and steps.max() <= budget, steps
    assert torch.equal(steps, anytime.exit_steps(tr, rule, threshold) + 1)
    with torch.no_grad():
        for i in range(len(x)):
            state = m.begin(x[i:i + 1])
            for k in range(int(steps[i])):
                state = m.step(state, k, budget)
            alone = m.readout(state)[0]
            # (not bit for bit: a matrix product over 8 rows and over 1 may sum in another order on a CPU)
            assert torch.allclose(alone, logits[i], rtol=0, atol=1e-5), (i, (alone - logits[i]).abs().max())


def test_no_certified_threshold_runs_the_full_budget_and_says_so():
    m = models()["revit"]
    x = torch.randn(5, 3, 16, 16)
    policy = anytime.calibrate(m, [(x, torch.zeros(5, dtype=torch.long))], "confidence", risk=0.01, delta=0.1, budget=5)
    # 5 images cannot certify 1 %: even a loss of 0 has p = 0.99^5 = 0.95 > 0.1
    assert not policy.certified and policy.threshold is None and "no threshold certified" in repr(policy)
    logits, steps = policy(m, x)
    with torch.no_grad():
        assert torch.equal(logits, m(x, depth=5)) and (steps == 5).all()


# ----------------------------------------------------------------------------- Learn-then-Test by hand
def table(counts, n=100):
    """(n, T) 0-1 losses with counts[j] ones in column j."""
    t = torch.zeros(n, len(counts))
    for j, c in enumerate(counts):
        t[:c, j] = 1
    return t


def test_fixed_sequence_stops_at_the_first_threshold_it_cannot_certify():
    # n = 100, eps = 5 %, delta = 0.1, binomial p-value P(Bin(100, 0.05) <= k):
    # k = 0: 0.95^100 = 0.005921; k = 1: + 100 * 0.05 * 0.95^99 = 0.037081; k = 3: 0.257839 > 0.1: the walk
    # stops at column 3 and certifies columns 0-2, though column 5 (k = 0) would pass on its own
    last, ps = anytime.fixed_sequence(table([0, 0, 1, 3, 10, 0]), eps=0.05, delta=0.1)
    assert last == 2
    assert ps[:4] == pytest.approx([0.005921, 0.005921, 0.037081, 0.257839], abs=1e-6) and ps[4:] == [None, None]
    # too strict: at eps = 1 % even k = 0 gives 0.99^100 = 0.366 > 0.1: nothing certified
    assert anytime.fixed_sequence(table([0, 0, 1]), eps=0.01, delta=0.1)[0] is None
    # Hoeffding, exp(-2 n eps^2) = exp(-0.5) = 0.607 at k = 0: weaker than the binomial tail, nothing certified
    last, ps = anytime.fixed_sequence(table([0, 1]), eps=0.05, delta=0.1, method="hoeffding")
    assert last is None and ps[0] == pytest.approx(math.exp(-0.5))
    # Hoeffding-Bentkus, min(exp(-n h(k / n, eps)), e P(Bin(100, 0.05) <= k)), h(a, b) = a log(a / b) + (1 - a)
    # log((1 - a) / (1 - b)): k = 0: min(0.95^100, e 0.95^100) = 0.005921; k = 1: h = 0.024736, exp(-2.4736) =
    # 0.084280 (e * 0.037081 = 0.100797 is larger); k = 2: h = 0.012143, exp(-1.2143) = 0.296919 > 0.1: the walk
    # stops there, where the binomial tail (0.118263) stops too
    last, ps = anytime.fixed_sequence(table([0, 1, 2, 0]), eps=0.05, delta=0.1, method="hoeffding-bentkus")
    assert last == 1 and ps[:3] == pytest.approx([0.005921, 0.084280, 0.296919], abs=1e-6) and ps[3] is None
    assert anytime.fixed_sequence(table([0, 1, 2, 0]), eps=0.05, delta=0.1)[1][2] == pytest.approx(0.118263, abs=1e-6)


def test_bad_risk_delta_rule_and_p_value_are_one_clear_error():
    for kw, says in ((dict(eps=0, delta=0.1), "risk eps must be in (0, 1)"), (dict(eps=0.1, delta=1), "delta must be"),
                     (dict(eps=math.nan, delta=0.1), "risk eps"), (dict(eps=0.1, delta=0.1, method="t"), "unknown p-value")):
        with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
            anytime.fixed_sequence(table([0]), **kw)
    with pytest.raises(ValueError, match="exact for 0-1 losses only"):
        anytime.fixed_sequence(torch.full((4, 2), 0.5), 0.1, 0.1)
    assert anytime.fixed_sequence(torch.full((4, 2), 0.5), 0.1, 0.1, method="hoeffding")[0] is None  # bounded: fine
    m = models()["bvit"]
    with pytest.raises(ValueError, match="unknown exit rule"):
        anytime.calibrate(m, [], "entropy")
    with pytest.raises(ValueError, match="unknown loss"):
        anytime.calibrate(m, [], "kl", loss="mse")


# ----------------------------------------------------------------------------- the guarantee, simulated
def ltt_violations(trials, n, eps, delta, naive=False):
    """Violations of risk <= eps over `trials` calibration draws from a known risk model: image i's loss at
    threshold j is 1[u_i < r_j], u_i ~ U(0, 1), r_j = 0.002 j (j = 0..29), so threshold j's true risk is r_j
    and j >= 11 violate eps = 2 %. naive: the last threshold whose calibration mean is <= eps (no test)."""
    g = torch.Generator().manual_seed(0)
    risks = torch.arange(30, dtype=torch.float64) * 0.002
    bad = 0
    for _ in range(trials):
        losses = (torch.rand(n, 1, generator=g, dtype=torch.float64) < risks).float()  # (n, 30)
        if naive:
            ok = (losses.mean(0) <= eps).nonzero()
            j = int(ok.max()) if len(ok) else None
        else:
            j = anytime.fixed_sequence(losses, eps, delta)[0]
        bad += j is not None and risks[j] > eps + 1e-12
    return bad


def binomial_upper(trials, p, tail=0.001):
    """The smallest k with P(Bin(trials, p) > k) <= tail."""
    return next(k for k in range(trials + 1) if 1 - anytime.binomial_cdf(k, trials, p) <= tail)


def test_the_risk_holds_with_probability_one_minus_delta_over_200_calibration_draws():
    trials, delta = 200, 0.1
    bad = ltt_violations(trials, 1000, 0.02, delta)
    assert bad <= binomial_upper(trials, delta), bad  # 200 draws: violation rate <= delta within sampling error
    # the test can fail: choosing the threshold by its calibration mean alone violates eps in about half the draws
    naive = ltt_violations(trials, 1000, 0.02, delta, naive=True)
    assert naive > binomial_upper(trials, delta), naive


def test_the_binomial_tail_is_exact_against_a_direct_sum():
    n, p = 37, 0.13
    direct = lambda k: sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k + 1))
    for k in (0, 3, 10, 36):
        assert anytime.binomial_cdf(k, n, p) == pytest.approx(direct(k), rel=1e-9)
    assert anytime.binomial_cdf(37, n, p) == 1.0 and anytime.binomial_cdf(-1, n, p) == 0.0


# ----------------------------------------------------------------------------- the policy's refusals
def test_a_policy_is_refused_for_another_checkpoint_model_or_budget(tmp_path):
    m = models()["bvit"]
    ck, other = tmp_path / "ckpt.pt", tmp_path / "other.pt"
    torch.save({"model": m.state_dict()}, ck)
    torch.save({"model": models()["revit"].state_dict()}, other)
    policy = policy_for(m, "confidence", 0.5, 4)
    policy.checkpoint_sha256 = anytime.file_sha256(ck)
    policy.save(tmp_path / "policy.json")
    saved = json.loads((tmp_path / "policy.json").read_text())
    assert {"rule", "threshold", "eps", "delta", "budget", "calibration", "p_value", "checkpoint_sha256"} <= set(saved)
    loaded = anytime.Policy.load(tmp_path / "policy.json", checkpoint=ck)
    x = torch.randn(3, 3, 16, 16)
    assert all(torch.equal(a, b) for a, b in zip(loaded(m, x), policy(m, x)))
    with pytest.raises(anytime.PolicyError, match="calibrate a policy for this checkpoint") as e:
        anytime.Policy.load(tmp_path / "policy.json", checkpoint=other)
    assert "\n" not in str(e.value)
    with pytest.raises(anytime.PolicyError, match="calibrate a policy for this model"):
        loaded(models()["revit"], x)
    with pytest.raises(anytime.PolicyError, match="budget 5: beyond the 4 steps"):
        loaded(m, x, budget=5)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(anytime.PolicyError, match="not an anytime policy"):
        anytime.Policy.load(tmp_path / "bad.json")


def test_bad_command_lines_are_one_line_and_exit_2(tmp_path, capsys):
    missing = str(tmp_path / "missing.pt")
    for argv, says in ((["calibrate", "--resume", missing, "--risk", "0", "--out", "p.json"], "--risk: must be in (0, 1)"),
                       (["calibrate", "--resume", missing, "--risk", "1.5", "--out", "p.json"], "--risk: must be in"),
                       (["calibrate", "--resume", missing, "--risk", "0.01", "--delta", "nan", "--out", "p.json"],
                        "--delta: expected a finite number"),
                       (["calibrate", "--resume", missing, "--risk", "0.01", "--budget", "0", "--out", "p.json"],
                        "--budget: must be > 0"),
                       (["calibrate", "--resume", missing, "--risk", "0.01", "--rule", "entropy", "--out", "p.json"],
                        "--rule: invalid choice"),
                       (["calibrate", "--resume", missing, "--risk", "0.01", "--out", str(tmp_path / "no" / "p.json")],
                        "--out"),
                       (["calibrate", "--resume", missing, "--risk", "0.01", "--out", str(tmp_path / "p.json")],
                        f"--resume {missing}: no such file"),
                       (["evaluate", "--resume", missing, "--policy", "p.json"], f"--resume {missing}")):
        try:
            code = anytime.cli(argv)
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and says in err[0], (argv, err)


@pytest.mark.slow  # (trains through train.py)
def test_calibrate_then_evaluate_a_checkpoint_and_refuse_another_ones_policy(tmp_path, capsys):
    import train
    from test_train import TINY, fake_cifar
    cifar = fake_cifar(tmp_path / "data", n_test=40)
    for run, seed in (("a", "0"), ("b", "1")):
        assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1", "--model", "bvit",
                                 "--seed", seed, "--out-dir", str(tmp_path / run)]) == 0
    capsys.readouterr()
    ck, other, pol = str(tmp_path / "a" / "ckpt.pt"), str(tmp_path / "b" / "ckpt.pt"), str(tmp_path / "policy.json")
    assert anytime.cli(["calibrate", "--resume", ck, "--risk", "0.2", "--delta", "0.2", "--out", pol]) == 0
    policy = json.loads(open(pol).read())
    assert policy["budget"] == 2 and policy["checkpoint_sha256"] == anytime.file_sha256(ck)
    assert policy["calibration"]["size"] == 20 and "torch.randperm(40, seed 0)" in policy["calibration"]["description"]
    assert "calibration images" in capsys.readouterr().out
    strict = str(tmp_path / "strict.json")  # 20 images cannot certify 0.1 %: the full budget, said
    assert anytime.cli(["calibrate", "--resume", ck, "--risk", "0.001", "--out", strict]) == 0
    assert "no threshold certified: every image runs the full budget of 2 steps" in capsys.readouterr().out
    assert json.loads(open(strict).read())["threshold"] is None
    out = tmp_path / "eval.json"
    assert anytime.cli(["evaluate", "--resume", str(tmp_path / "a"), "--policy", pol, "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["images"] == 20 and 1 <= res["mean_steps"] <= 2 and "[20:]" in res["evaluation"]
    capsys.readouterr()
    import hubconf  # torch.hub's from_run takes the policy: the model under it, or one line for another checkpoint
    exiting = hubconf.from_run(str(tmp_path / "a"), policy=pol)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        logits, steps = exiting(x)
    assert isinstance(exiting, anytime.Exiting) and torch.equal(steps, anytime.Policy.load(pol)(exiting.model, x)[1])
    assert torch.equal(logits, anytime.Policy.load(pol)(exiting.model, x)[0]) and 1 <= steps.min() <= steps.max() <= 2
    assert not exiting.training and not exiting.model.training  # (eval mode, as from_run promises)
    import export  # the hub's model exports with its own policy, or the bare model with the policy's file
    for program in (export.export_policy(exiting), export.export_policy(exiting.model, pol)):
        with torch.no_grad():
            assert all(torch.equal(a, b) for a, b in zip(program.module()(x), (logits, steps)))
    with pytest.raises(anytime.PolicyError, match="calibrate a policy for this checkpoint") as e:
        hubconf.from_run(str(tmp_path / "b"), policy=pol)
    assert "\n" not in str(e.value)
    for argv, says in ((["evaluate", "--resume", other, "--policy", pol], "calibrate a policy for this checkpoint"),
                       (["evaluate", "--resume", ck, "--policy", pol, "--budget", "3"], "--budget 3: the policy was "
                        "calibrated for 2 steps"),
                       (["evaluate", "--resume", ck, "--policy", pol, "--split-seed", "4"], "--split-seed 4"),
                       (["evaluate", "--resume", ck, "--policy", str(tmp_path / "none.json")], "cannot read it"),
                       (["calibrate", "--resume", ck, "--risk", "0.1", "--budget", "17", "--out", pol],
                        "--budget 17: at most 8x the trained depth (16 steps)"),
                       (["calibrate", "--resume", ck, "--risk", "0.1", "--calib-size", "40", "--out", pol],
                        "--calib-size must be in 1..39")):
        assert anytime.cli(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], (argv, err)


@pytest.mark.parametrize("name, rule", [(n, "confidence") for n in ("bvit", "revit", "revit-elastic", "srvit", "odevit")]
                         + [("bvit", "kl"), ("revit-elastic", "kl"), ("srvit", "update"), ("odevit", "second-order")])
def test_the_exported_policy_gives_the_eager_exit_paths_logits_and_steps(name, rule):
    """export.export_policy: the exit rule in the graph (torch.while_loop), each image's logits and step count as
    policy(model, x) gives them, at a batch size other than the export's."""
    import export
    m, budget = models()[name], 6
    torch.manual_seed(1)
    x = torch.randn(8, 3, 16, 16)
    tr = anytime.trace(m, x, budget)
    v = tr[{"confidence": "conf", "kl": "kl", "update": "update", "second-order": "second"}[rule]]
    v = v[~v.isnan()].sort().values
    # a threshold halfway between two values (none on a rounding edge) at which images leave at 3+ different steps
    threshold = next(t for t in ((v[1:] + v[:-1]) / 2).tolist() if len(set(anytime.exit_steps(tr, rule, t).tolist())) > 2)
    policy = policy_for(m, rule, threshold, budget)
    want_logits, want_steps = policy(m, x)
    program = export.export_policy(m, policy).module()
    with torch.no_grad():
        logits, steps = program(x)
    assert len(set(want_steps.tolist())) > 2 and torch.equal(steps, want_steps), (steps, want_steps)
    assert torch.allclose(logits, want_logits, rtol=0, atol=1e-5), (logits - want_logits).abs().max()


def test_an_exported_policy_without_a_threshold_runs_the_budget_and_another_models_is_refused():
    import export
    ms = models()
    m, x = ms["bvit"], torch.randn(3, 3, 16, 16)
    program = export.export_policy(m, policy_for(m, "confidence", None, 5)).module()
    with torch.no_grad():
        logits, steps = program(x)
        assert (steps == 5).all() and torch.allclose(logits, m(x, depth=5), rtol=0, atol=1e-5)
    with pytest.raises(anytime.PolicyError, match="calibrate a policy for this model"):
        export.export_policy(ms["revit"], policy_for(m, "confidence", 0.5, 5))
