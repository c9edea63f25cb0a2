"""Anytime inference (issue 40): the exit path against the fixed-depth models, the rules on a constructed
recurrence whose exit steps are known in advance, and analyze.py --anytime."""
import json
import math

import pytest
import torch

import bvit
import revit
import revit_moe
import srvit
import train
from test_train import TINY, fake_cifar
from analysis import anytime

pytestmark = pytest.mark.slow  # (train.py runs: README's quick tier, -m "not slow", leaves them out)

KW = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=2)


def models():
    torch.manual_seed(0)
    r = revit.ReViT(depth=3, experts=3, **KW).eval()
    with torch.no_grad():
        for prm in r.router.parameters():
            prm.normal_(0, 1.0)
    return {"bvit": bvit.BViT(depth=3, **KW).eval(), "revit": r,
            "srvit": srvit.SRViT(depth=1, recursions=3, **KW).eval(),
            "smear": revit_moe.ReViTMoE(routing="smear", depth=3, experts=2, **KW).eval()}


@pytest.mark.parametrize("name", ["bvit", "revit", "srvit", "smear"])
def test_a_rule_that_never_fires_is_the_fixed_depth_model_and_one_that_always_fires_one_step(name):
    m, x = models()[name], torch.randn(6, 3, 16, 16)
    for budget in (3, 5):
        logits, steps = anytime.run(m, x, "confidence", 2.0, budget)  # a probability is never above 2
        with torch.no_grad():
            assert torch.equal(logits, m(x, depth=budget)) and (steps == budget - 1).all()
    logits, steps = anytime.run(m, x, "confidence", -1.0, 5)  # always above -1: every image stops at once
    with torch.no_grad():
        assert (steps == 0).all() and torch.equal(logits, m.readout(m.step(m.begin(x), 0, 5)))


@pytest.mark.parametrize("rule", anytime.RULES)
def test_the_shrinking_batch_predicts_as_each_image_run_alone_to_its_exit_step(rule):
    torch.manual_seed(1)
    m, x = models()["revit"], torch.randn(8, 3, 16, 16)
    tr = anytime.trace(m, x, 6)  # a threshold at which images stop at different steps
    values = tr[{"confidence": "conf", "second-order": "second"}.get(rule, rule)]
    threshold = next(float(t) for t in values[~values.isnan()].sort().values
                     if len(set(anytime.exit_steps(tr, rule, float(t)).tolist())) > 1)
    logits, steps = anytime.run(m, x, rule, threshold, 6)
    assert len(set(steps.tolist())) > 1, steps  # images leave at different steps
    with torch.no_grad():
        for i in range(len(x)):
            state = m.begin(x[i:i + 1])
            for k in range(int(steps[i]) + 1):
                state = m.step(state, k, 6)
            assert torch.allclose(m.readout(state)[0], logits[i], atol=1e-5)
    assert torch.equal(anytime.exit_steps(tr, rule, threshold), steps)


class Toy(torch.nn.Module):
    """A constructed recurrence: image i's state is h_k = a_i^(k+1) h_0 (one token, one channel, h_0 = 1),
    and its logits [log c_ik, 0] put probability c_ik / (1 + c_ik) on class 0, c_ik = k + 1 + i."""
    blocks_per_step = 1

    def __init__(self, a):
        super().__init__()
        self.a = torch.tensor(a).view(-1, 1, 1)

    def begin(self, x):
        return torch.ones(len(x), 1, 1)

    def step(self, h, k, depth=None):  # (traced only: every image runs every step)
        return h * self.a

    def readout(self, h):
        k = torch.log(h[:, 0, 0]) / torch.log(self.a[:, 0, 0])  # the step count k + 1
        c = k + torch.arange(len(h))
        return torch.stack([torch.log(c), torch.zeros_like(c)], 1)


def test_each_rule_exits_where_it_says_on_a_constructed_recurrence():
    """Image i of 3, state a_i^(k+1), a = (0.5, 0.9, 0.99): relative update |a - 1| = 0.5, 0.1, 0.01 at every
    step; step size d_k = |a - 1| a^k, so |d_k - d_{k-1}| / d_{k-1} = |a - 1| as well; max probability
    (k + 1 + i) / (k + 2 + i)."""
    m = Toy([0.5, 0.9, 0.99])
    tr = anytime.trace(m, torch.ones(3), 6)
    assert tr["update"][:, 0].tolist() == pytest.approx([0.5, 0.1, 0.01], rel=1e-5)
    assert tr["second"][:, 1:].flatten().tolist() == pytest.approx([0.5] * 5 + [0.1] * 5 + [0.01] * 5, rel=1e-3)
    assert anytime.exit_steps(tr, "update", 0.2).tolist() == [5, 0, 0]  # 0.5 never below 0.2: the budget
    assert anytime.exit_steps(tr, "second-order", 0.05).tolist() == [5, 5, 1]  # from step 1 only
    # confidence (k + 1 + i) / (k + 2 + i) > 0.8: k + 1 + i > 4, i.e. k >= 4 - i
    assert anytime.exit_steps(tr, "confidence", 0.8).tolist() == [4, 3, 2]
    kl = tr["kl"]
    assert math.isnan(kl[0, 0]) and (kl[:, 1:] > 0).all()  # the predictions sharpen: KL > 0 after step 0
    tr["right"] = torch.tensor([[False, True, True, False, True, True], [True] * 6, [False] * 6])
    assert anytime.exit_steps(tr, "oracle", None).tolist() == [4, 0, 0]  # right from 4 on; 0; never right


def test_fixed_depth_at_a_mean_compute_is_the_mixture_of_the_two_depths_around_it():
    torch.manual_seed(0)
    fr = torch.rand(50, 4) < 0.5  # (B, L): depth d right
    col = fr.float().mean(0)
    for apps, want in ((1, col[0]), (3, col[2]), (4, col[3]), (2.25, 0.75 * col[1] + 0.25 * col[2]),
                       (0.5, col[0]), (9, col[3])):  # clamped outside depths 1..L
        assert math.isclose(float(anytime.fixed_at(fr, apps, 1).mean()), float(want), abs_tol=1e-6), apps
    assert torch.equal(anytime.fixed_at(fr, 6, 2), fr[:, 2].float())  # 2 blocks a step: 6 applications = depth 3


@pytest.mark.parametrize("holds", [True, False])
def test_the_heldout_gain_is_scored_on_images_it_was_not_chosen_on(holds):
    # 8 images, 2 steps; images 0-3 are confident at step 0 (a 0.5 threshold exits them there). Even images
    # choose: 0, 2 are right only at step 0 and 4, 6 only at step 1, so exiting gains 50 points over the
    # fixed-depth mixture at the same mean compute (1.5 steps). Odd images score: the same ("holds"), or the
    # other way round, where exiting loses 50 points.
    conf = torch.tensor([[0.9, 0.5]] * 4 + [[0.1, 0.5]] * 4)
    early, late = [True, False], [False, True]
    odd = (early, late) if holds else (late, early)
    right = torch.tensor([early, odd[0], early, odd[0], late, odd[1], late, odd[1]])
    h = anytime.heldout_gain({"conf": conf}, right, right, {"confidence": [0.5, 0.99]}, 1)
    assert (h["rule"], h["threshold"], h["chosen_gain"], h["images"]) == ("confidence", 0.5, 50.0, 4)
    assert math.isclose(h["gain"], 50.0 if holds else -50.0) and h["se"] == 0.0 and h["applications"] == 1.5


def test_bad_budgets_and_rules_are_one_clear_error():
    m = models()
    vit = bvit.BViT(depth=3, num_blocks=3, **KW).eval()
    with pytest.raises(ValueError, match="untied ViT has 3 blocks"):
        anytime.run(vit, torch.randn(2, 3, 16, 16), "kl", 0.1, 4)
    with pytest.raises(ValueError, match="budget must be >= 1"):
        anytime.trace(m["bvit"], torch.randn(2, 3, 16, 16), 0)
    with pytest.raises(ValueError, match="unknown exit rule"):
        anytime.run(m["bvit"], torch.randn(2, 3, 16, 16), "entropy", 0.1, 3)


def test_analyze_anytime_writes_the_curves_and_refuses_bad_budgets(tmp_path, capsys):
    import analyze
    cifar = fake_cifar(tmp_path / "data")
    d = TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1"]
    assert train.cli(d + ["--model", "bvit", "--out-dir", str(tmp_path / "b")]) == 0
    assert train.cli(d + ["--model", "vit", "--out-dir", str(tmp_path / "v")]) == 0
    capsys.readouterr()
    ck = str(tmp_path / "b" / "ckpt.pt")
    assert analyze.cli(["--resume", ck, "--anytime", "--out-dir", str(tmp_path / "a"), "--num-images", "16"]) == 0
    res = json.loads((tmp_path / "a" / "anytime.json").read_text())
    assert res["budget"] == 4 and res["trained_depth"] == 2 and len(res["fixed"]) == 4
    assert res["fixed"][1]["top1"] == res["full_top1"] and res["behaviour"] in ("converges", "cycles", "drifts")
    assert set(res["rules"]) == set(anytime.RULES) and len(res["per_step"]["update_per_image"]) == 16
    conf = res["rules"]["confidence"]["curve"]
    assert all(1 <= p["applications"] <= 4 for p in conf)
    assert conf[-1]["applications"] == 4 and conf[-1]["top1"] == res["fixed"][-1]["top1"]  # never fires: budget
    assert "full-depth top-1" in capsys.readouterr().out
    for argv, says in ((["--resume", str(tmp_path / "v" / "ckpt.pt"), "--budget", "3"], "untied ViT has 2 blocks"),
                       (["--resume", ck, "--budget", "1"], "below the trained depth 2"),
                       (["--resume", ck, "--budget", "17"], "at most 8x the trained depth (16 steps)"),
                       (["--resume", ck, "--budget", "4", "--no-anytime"], "add --anytime or drop --budget")):
        anytime_flag = [] if "--no-anytime" in argv else ["--anytime"]
        argv = [a for a in argv if a != "--no-anytime"]
        assert analyze.cli(argv + anytime_flag + ["--out-dir", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err


def test_bench_times_the_exit_path_against_fixed_depth_from_an_anytime_json(tmp_path, capsys):
    import argparse
    import analyze
    import bench_anytime
    cifar = fake_cifar(tmp_path / "data")
    run = tmp_path / "b"
    assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1", "--model", "bvit",
                             "--out-dir", str(run)]) == 0
    kept = tmp_path / "kept"  # a run kept without its checkpoint (lab/results/): refused, not a FAILED line and exit 0
    kept.mkdir()
    (kept / "anytime.json").write_text("{}")
    for argv, says in (([str(run)], "no anytime.json there"),  # analyze.py --anytime comes first
                       ([str(kept)], "no ckpt.pt there"),
                       ([str(tmp_path / "missing")], "no such folder")):
        with pytest.raises(SystemExit) as e:
            bench_anytime.main(["--device", "cpu", "--smoke", *argv])
        assert e.value.code == 2 and says in capsys.readouterr().err
    assert analyze.cli(["--resume", str(run / "ckpt.pt"), "--anytime", "--out-dir", str(run), "--num-images", "16"]) == 0
    out = tmp_path / "bench.json"
    args = argparse.Namespace(device="cpu", json=str(out), smoke=True, anytime=str(run))
    assert bench_anytime.run(args) == {}
    res = json.loads(out.read_text())
    assert not res["errors"] and any(k.startswith("anytime_") and k.endswith("_over_fixed_img_per_s") for k in res)
    spec = json.loads((run / "anytime.json").read_text())  # no rule has an operating point: the JSON says so
    for r in spec["rules"].values():
        r["operating_point"] = None
    (run / "anytime.json").write_text(json.dumps(spec))
    out.unlink()
    assert bench_anytime.run(args) == {}
    res = json.loads(out.read_text())
    assert not res["errors"] and not any(k.startswith("anytime_") for k in res)
