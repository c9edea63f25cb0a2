"""Tests for odevit.py (the block as a neural ODE, Training Crossroads) and train.py's --eval-only depth evaluation.

CPU only, tiny configurations. Run: python -m pytest -q test_odevit.py
"""
import importlib.util
import json

import pytest
import torch
import torch.nn.functional as F

import bvit
import odevit

TINY = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=4)
ORDERS = {"euler": 1, "midpoint": 2, "heun": 2, "rk4": 4}


def tiny(**kw):
    torch.manual_seed(0)
    return odevit.ODEViT(**{**TINY, **kw}).eval()


def images(b=3, size=16):
    return torch.randn(b, 3, size, size, generator=torch.Generator().manual_seed(1))


def heun_by_hand(m, z, h, steps, field="subtracted"):
    """Heun's method written out for the model's block, as a reference."""
    v = (lambda y: m.blocks[0](y) - y) if field == "subtracted" else m.blocks[0]
    for _ in range(steps):
        k1 = v(z)
        k2 = v(z + h * k1)
        z = z + h / 2 * (k1 + k2)
    return z


# ----------------------------------------------------------------------------- odeint
def test_euler_step_one_is_bvit():
    torch.manual_seed(0)
    ref = bvit.BViT(**TINY, depth=6, stages=3).eval()
    m = odevit.ODEViT(**TINY, depth=6, solver="euler", horizon=6.0, stages=3).eval()
    m.load_state_dict(ref.state_dict(), strict=True)  # parameter names are identical
    x, y = images(), torch.tensor([1, 5, 9])
    for d in (6, 9):  # trained depth and beyond it (extend="time" keeps h = 1)
        assert torch.equal(m(x, depth=d), ref(x, depth=d))
    assert torch.equal(m(x, y)[1], ref(x, y)[1])  # stage-wise loss too, bit for bit


def test_linear_ode_convergence_orders():
    # dz/dt = A z, z(T) = expm(A T) z0; error ~ C h^p, so p = slope of log(err) vs log(steps)
    g = torch.Generator().manual_seed(0)
    A = torch.randn(4, 4, generator=g, dtype=torch.float64) / 2
    z0 = torch.randn(4, 3, generator=g, dtype=torch.float64)
    exact = torch.linalg.matrix_exp(A) @ z0
    ns = torch.tensor([8.0, 16.0, 32.0, 64.0], dtype=torch.float64)  # h exact in binary
    for method, order in ORDERS.items():
        for subtracted in (False, True):  # dz/dt = (A + I) z - z is the same ODE
            f = (lambda t, z: (A + torch.eye(4, dtype=A.dtype)) @ z) if subtracted else (lambda t, z: A @ z)
            err = torch.stack([(odevit.odeint(f, z0, 0.0, 1.0, int(n), method, subtracted=subtracted)
                                - exact).norm() for n in ns])
            X = torch.stack([ns.log(), torch.ones_like(ns)], 1)
            p = -torch.linalg.lstsq(X, err.log()[:, None]).solution[0, 0].item()
            assert abs(p - order) < 0.3, (method, subtracted, p)


def test_odeint_calls_f_with_float32_time_on_the_grid():
    seen = []

    def f(t, z):
        seen.append(t)
        return -z

    odevit.odeint(f, torch.ones(2, dtype=torch.float64), 0.0, 1.0, 2, "rk4")
    assert all(t.dtype == torch.float32 and t.ndim == 0 for t in seen)
    assert [t.item() for t in seen] == [0.0, 0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 1.0]


@pytest.mark.parametrize("method", list(ORDERS))
def test_nfe_per_step(method):
    calls = []
    odevit.odeint(lambda t, z: calls.append(1) or -z, torch.ones(3), 0.0, 1.0, 3, method)
    per_step = {"euler": 1, "midpoint": 2, "heun": 2, "rk4": 4}[method]
    assert len(calls) == 3 * per_step
    m = tiny(depth=3, solver=method)
    m(images())
    assert m.nfe == 3 * per_step
    m(images(), depth=5)
    assert m.nfe == 5 * per_step
    # the analytic FLOP count charges every block evaluation (as torch's counter sees them)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH):
        m(images(b=1), depth=2)
    assert m.flops_per_image(depth=2) == fc.get_total_flops()


# ----------------------------------------------------------------------------- ODEViT
def test_blackbox_field_differs_from_subtracted():
    sub, box = tiny(depth=2, horizon=1.0), tiny(depth=2, horizon=1.0, field="blackbox")
    box.load_state_dict(sub.state_dict())
    x = images()
    assert not torch.allclose(sub(x), box(x), atol=1e-3)
    # blackbox Euler with h = 1/2: z <- z + F(z) / 2
    z = box.embed(x)
    for _ in range(2):
        z = z + 0.5 * box.blocks[0](z)
    assert torch.allclose(box(x), box.classify(z), atol=1e-6)


def test_deep_supervision_on_the_time_grid_matches_hand_computation():
    # heun, 4 steps over T = 2 (h = 1/2), 2 stages read out at t = 1 and t = 2
    m = tiny(depth=4, solver="heun", horizon=2.0, stages=2)
    x, y = images(), torch.tensor([0, 4, 9])
    logits, loss = m(x, y)
    z1 = heun_by_hand(m, m.embed(x), 0.5, 2)
    z2 = heun_by_hand(m, z1, 0.5, 2)
    ce = [F.cross_entropy(m.classify(z), y) for z in (z1, z2)]
    assert torch.allclose(loss, (ce[0] + ce[1]) / 2, atol=1e-6)
    assert torch.allclose(logits, m.classify(z2), atol=1e-6)
    assert set(m.aux) == {"stage0_loss", "stage1_loss"} and m.nfe == 8


def test_extend_time_keeps_h_and_refine_keeps_horizon():
    m = tiny(depth=4, solver="heun", horizon=2.0)  # h = 1/2
    x = images()
    z0 = m.embed(x)
    longer = m.classify(heun_by_hand(m, z0, 0.5, 8))  # T' = 4
    finer = m.classify(heun_by_hand(m, z0, 0.25, 8))  # T = 2
    assert m.time_grid(8) == (4.0, 0.5) and m.time_grid(8, "refine") == (2.0, 0.25)
    assert torch.allclose(m(x, depth=8), longer, atol=1e-5)
    assert torch.allclose(m(x, depth=8, extend="refine"), finer, atol=1e-5)
    m.extend = "refine"
    assert torch.allclose(m(x, depth=8), finer, atol=1e-5)
    assert not torch.allclose(longer, finer, atol=1e-3)
    # at the trained depth the two views coincide
    assert torch.equal(m(x), m(x, extend="time"))


def test_autocast_only_inside_the_field(monkeypatch):
    m = tiny(depth=2, solver="midpoint")
    dtypes, solver_amp = [], []
    real = odevit.odeint
    monkeypatch.setattr(odevit, "odeint", lambda *a, **k: solver_amp.append(
        torch.is_autocast_enabled("cpu")) or real(*a, **k))
    m.blocks[0].register_forward_hook(lambda mod, i, o: dtypes.append((i[0].dtype, torch.is_autocast_enabled("cpu"))))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = m(images())
    assert torch.isfinite(logits.float()).all()
    assert dtypes and all(d == (torch.float32, True) for d in dtypes)  # fp32 state, autocast in f
    assert solver_amp == [False]  # the solver's arithmetic runs outside autocast


def test_params_and_bad_arguments():
    torch.manual_seed(0)
    assert tiny(depth=3).num_params() == bvit.BViT(**TINY, depth=3).num_params()
    assert tiny(steps=3, solver="rk4").steps == 3 and odevit.odevit_s(num_classes=100).embed_dim == 384
    for kw, says in [(dict(solver="rk5"), "solver"), (dict(field="x"), "field"),
                     (dict(extend="x"), "extend"), (dict(depth=4, steps=3), "steps"),
                     (dict(depth=4, stages=3), "stages"), (dict(horizon=0.0), "horizon")]:
        with pytest.raises(ValueError, match=says):
            tiny(**kw)


# ----------------------------------------------------------------------------- train.py
def test_eval_only_resume_writes_depth_table(tmp_path, capsys):
    import train  # in-process (train.cli) rather than a subprocess: saves the imports' seconds
    out = tmp_path / "run"
    common = ["--data", "synthetic", "--workers", "0", "--val-subset", "64", "--eval-batch-size", "64",
              "--device", "cpu", "--out-dir", str(out)]
    assert train.cli(common + ["--model", "odevit", "--solver", "heun", "--depth", "2", "--horizon", "1",
                               "--embed-dim", "32", "--num-heads", "2", "--batch-size", "16",
                               "--max-steps", "2"]) == 0
    with open(out / "log.jsonl") as f:
        trained = json.loads(f.readline())
    ckpt, log = (out / "ckpt.pt").read_bytes(), (out / "log.jsonl").read_bytes()
    capsys.readouterr()
    # same out-dir as the training run: must neither refuse nor touch ckpt.pt; the model flags
    # come from the checkpoint (no --model given), --extend from the command line
    assert train.cli(common + ["--eval-only", "--resume", str(out / "ckpt.pt"), "--eval-depths", "1,2,4",
                               "--extend", "refine"]) == 0
    assert (out / "ckpt.pt").read_bytes() == ckpt and (out / "log.jsonl").read_bytes() == log
    with open(out / "depth_eval.json") as f:
        res = json.load(f)
    rows = res["results"]
    assert [row["depth"] for row in rows] == [1, 2, 4] and [row["nfe"] for row in rows] == [2, 4, 8]
    assert res["model"] == "odevit" and res["extend"] == "refine" and res["trained_depth"] == 2
    assert rows[1]["val_acc1"] == pytest.approx(trained["val_acc1"])  # trained depth: same accuracy
    assert rows[1]["val_loss"] == pytest.approx(trained["val_loss"], rel=1e-5)
    assert all(0 <= row["val_acc1"] <= 100 for row in rows)
    if importlib.util.find_spec("matplotlib"):  # optional: the plot only when it is installed
        assert (out / "depth_eval.png").stat().st_size > 0
    table = capsys.readouterr().out
    assert "acc@1" in table and f"{rows[2]['val_acc1']:.2f}" in table  # the printed table
    assert train.cli(common + ["--eval-only"]) == 2
    assert "--resume" in capsys.readouterr().err
