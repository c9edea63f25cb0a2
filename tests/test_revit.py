"""Tests for revit.py (reViT, arXiv 2610.12448, section 3): each test is one claim of the paper or of revit.py's docstring.

CPU only, tiny configurations; the whole file runs in well under a minute.
Run: python -m pytest -q test_revit.py
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import bvit
import revit
from training.flags import get_parser
from training import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
torch.set_num_threads(1)  # tiny tensors: one thread beats two contended ones by far on a shared CPU
TINY = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=4)


def tiny(programmed=True, **kw):
    """A tiny reViT in eval mode. programmed=True gives the router and the expert biases random
    values, so the gates really depend on depth (at init they are exactly uniform)."""
    torch.manual_seed(0)
    m = revit.ReViT(**{**TINY, "depth": 4, "experts": 3, **kw}).eval()
    if programmed and m.router is not None:
        with torch.no_grad():
            m.router[2].weight.normal_(0, 2.0)
            m.router[2].bias.normal_(0, 1.0)
            m.blocks[0].mlp.fc1.bias.normal_(0, 0.1)
            m.blocks[0].mlp.fc2.bias.normal_(0, 0.1)
    return m


def images(b=3, size=16):
    return torch.randn(b, 3, size, size, generator=torch.Generator().manual_seed(1))


def hand_gates(m, t):
    """g(t) written out: softmax(W2 silu(W1 t + b1) + b2), for one float t -> (E,)."""
    h = F.silu(m.router[0].weight[:, 0] * t + m.router[0].bias)
    return torch.softmax(m.router[2].weight @ h + m.router[2].bias, dim=0)


def hand_merge(m, t):
    """sum_e g_e(t) * (expert e's w1, b1, w2, b2), as a Python loop over experts."""
    g = hand_gates(m, t)
    return [sum(g[e] * p[e] for e in range(m.experts)) for p in m.blocks[0].mlp.tensors()]


def naive_forward(m, x, keep):
    """Reference for elastic depth: one image at a time; its n retained steps run at coordinates
    j / (n - 1) with FFN weights merged by hand; dropped steps are skipped."""
    out = []
    for b in range(len(x)):
        z, steps = m.embed(x[b:b + 1]), keep[b].nonzero().flatten().tolist()
        for j, _ in enumerate(steps):
            z = m.blocks[0](z, *hand_merge(m, j / (len(steps) - 1) if len(steps) > 1 else 0.0))
        out.append(m.classify(z))
    return torch.cat(out)


# ----------------------------------------------------------------------------- the model
def test_one_expert_is_tied_block():
    torch.manual_seed(0)
    ref = bvit.BViT(**TINY, depth=4, num_blocks=1, layer_scale=0.1).eval()
    m = revit.ReViT(**TINY, depth=4, experts=1, layer_scale=0.1).eval()
    # the expert axis is the only difference in the state dict
    m.load_state_dict({k: v[None] if ".mlp." in k else v for k, v in ref.state_dict().items()}, strict=True)
    x, y = images(), torch.tensor([1, 5, 9])
    for depth in (4, 7):
        assert torch.allclose(m(x, depth=depth), ref(x, depth=depth), atol=1e-6)
    assert torch.allclose(m(x, y)[1], ref(x, y)[1], atol=1e-6)
    assert set(m.aux) == {"ce_loss"} and m.router is None  # no regularizers for E = 1
    assert m.num_params() == ref.num_params() and m.flops_per_image() == ref.flops_per_image()
    assert torch.equal(m.gates(5), torch.ones(5, 1))


@pytest.mark.parametrize("E", [2, 3, 4, 8])
def test_gates_are_uniform_at_init_and_balance_is_zero(E):
    m = tiny(programmed=False, experts=E, depth=6)
    assert torch.equal(m.gates(), torch.full((6, E), 1.0 / E))
    assert torch.equal(m.gates(11), torch.full((11, E), 1.0 / E))
    m(images(), torch.tensor([0, 1, 2]))
    assert m.aux["bal_loss"].item() == pytest.approx(0.0, abs=1e-6)  # eq. 6: 1 - H(uniform) / log E
    assert m.aux["z_loss"].item() == pytest.approx(math.log(E) ** 2, rel=1e-6)  # logsumexp(0) = log E


def test_merged_ffn_at_a_coordinate_is_the_convex_combination():
    m = tiny()
    t = 0.37
    g = hand_gates(m, t)
    assert not torch.allclose(g, torch.full_like(g, 1 / 3), atol=1e-2)  # the program is not trivial
    assert torch.allclose(m.route(torch.tensor([t])).softmax(-1)[0], g, atol=1e-6)
    merged = m.ffn_weights(torch.tensor([t]))
    for got, want in zip(merged, hand_merge(m, t)):
        assert torch.allclose(got[0], want, atol=1e-6)
    h = torch.randn(2, 5, 32)
    w1, b1, w2, b2 = hand_merge(m, t)
    want = (F.gelu(h @ w1.T + b1)) @ w2.T + b2
    assert torch.allclose(revit.ffn(h, *(w[0] for w in merged)), want, atol=1e-5)
    # the grid rows are the gates at t_k = k / (L - 1) and sum to 1
    gates = m.gates(5)
    assert torch.allclose(gates.sum(1), torch.ones(5), atol=1e-6)
    assert torch.allclose(gates[1], hand_gates(m, 0.25), atol=1e-6)
    assert torch.equal(m.grid(1), torch.zeros(1))


@pytest.mark.parametrize("L", [1, 4, 12, 16])
def test_materialized_equals_dynamic(L):
    m = tiny(depth=4)
    dense = m.materialize(L)
    assert not any(n.startswith("router") for n, _ in dense.named_parameters())
    assert dense.blocks[0].mlp.fc1.weight.shape[0] == L  # one dense FFN per step
    x = images()
    assert torch.allclose(dense(x), m(x, depth=L), atol=1e-6)
    with pytest.raises(ValueError, match="depth"):
        dense(x, depth=L + 1)


def test_grouped_per_image_path_equals_naive_loop():
    m = tiny(depth=5)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 1, 0, 1], [0, 0, 1, 0, 0], [1, 1, 0, 0, 1],
                         [0, 1, 1, 0, 1], [1, 0, 1, 0, 1]], dtype=torch.bool)
    x = images(b=6)
    got = m(x, keep=keep)
    want = naive_forward(m, x, keep)
    assert torch.allclose(got, want, atol=1e-5)
    # and the gradients agree (grouping, sorting and scattering are differentiable bookkeeping)
    grads = []
    for out in (got, want):
        m.zero_grad()
        (out * torch.arange(10.0)).sum().backward()
        grads.append([m.blocks[0].mlp.fc1.weight.grad.clone(), m.router[2].weight.grad.clone()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_dropped_steps_are_identity_and_retained_coordinates_evenly_spread():
    keep = torch.tensor([[1, 0, 1, 1, 0, 1], [0, 0, 0, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    c = revit.step_coords(keep)
    assert torch.allclose(c[0][keep[0]], torch.tensor([0, 1 / 3, 2 / 3, 1]))
    assert c[1][keep[1]].tolist() == [0.0]
    assert torch.equal(c[2], torch.arange(6) / 5)  # bit-identical to the depth-6 grid
    # an image that keeps n of L steps computes exactly the depth-n model
    m = tiny(depth=6)
    x = images()
    out = m(x, keep=keep)
    for b, n in enumerate(keep.sum(1).tolist()):
        assert torch.allclose(out[b], m(x[b:b + 1], depth=n)[0], atol=1e-5)
    # sampling: each step kept with probability 1 - p, and never an empty image
    torch.manual_seed(0)
    assert revit.sample_keep(20000, 6, 0.3).float().mean().item() == pytest.approx(0.7, abs=0.01)
    assert revit.sample_keep(2000, 6, 0.99).sum(1).min().item() == 1
    with pytest.raises(ValueError, match="keep"):
        m(x, keep=torch.tensor([[1, 1, 0, 0, 0, 0], [0] * 6, [1] * 6], dtype=torch.bool))
    with pytest.raises(ValueError, match="depth_dropout"):
        revit.ReViT(**TINY, depth_dropout=1.0)


def test_training_samples_a_drop_mask_per_image_and_evaluation_runs_the_full_grid():
    m = tiny(depth=6, depth_dropout=0.5)
    x = images(b=8)
    torch.manual_seed(3)
    trained = m.train()(x)
    torch.manual_seed(3)
    keep = revit.sample_keep(8, 6, 0.5)
    assert not keep.all() and keep.sum(1).unique().numel() > 1  # images really differ in depth
    m.eval()
    assert torch.allclose(trained, m(x, keep=keep), atol=1e-6)
    assert torch.allclose(m(x), m(x, keep=torch.ones(8, 6, dtype=torch.bool)), atol=1e-5)


def test_plain_revit_runs_every_step_in_training_and_train_py_trains_at_fixed_depth_too():
    m = tiny(depth=4)  # library default: the plain model, no elastic depth
    x = images()
    assert m.depth_dropout == 0.0 and m.trains_as_one_graph()
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    trained = m.train()(x)
    assert torch.equal(torch.rand(1), before)  # no step was sampled
    assert torch.allclose(trained, m.eval()(x), atol=1e-6)
    common = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, depth=4, num_heads=4)
    # train.py too: the supervised recipe trains at fixed depth (Table 6); elastic depth is a second stage
    assert registry.MODELS["revit"].build(get_parser().parse_args(["--model", "revit"]), common).depth_dropout == 0.0


def test_every_parameter_gets_a_gradient_in_a_training_step():
    m = tiny(programmed=False, depth=4, layer_scale=0.1, depth_dropout=0.3).train()
    x, y = images(b=8), torch.randint(10, (8,))
    m(x, y)[1].backward()
    zero = {n for n, p in m.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0}
    # at init the router's output layer is zero, so its hidden layer gets an exactly-zero gradient
    # (still a gradient: DDP needs no find_unused_parameters); after one step it moves
    assert zero == {"router.0.weight", "router.0.bias"}
    assert all(p.grad is not None for p in m.parameters())
    with torch.no_grad():  # one SGD step
        for p in m.parameters():
            p -= 0.1 * p.grad
    m.zero_grad()
    m(x, y)[1].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


def test_regularizer_values_by_hand():
    m = tiny(depth=5, lambda_bal=0.5, lambda_z=0.25, lambda_div=2.0)
    x, y = images(), torch.tensor([2, 4, 6])
    logits, loss = m(x, y)
    E, ts = 3, [k / 4 for k in range(5)]
    g = torch.stack([hand_gates(m, t) for t in ts])  # (L, E)
    bal = sum(1 + sum(g[k, e] * torch.log(g[k, e]) for e in range(E)) / math.log(E) for k in range(5)) / 5  # eq. 6
    raw = [m.router[2].weight @ F.silu(m.router[0].weight[:, 0] * t + m.router[0].bias) + m.router[2].bias
           for t in ts]
    z = sum(torch.log(torch.exp(r).sum()) ** 2 for r in raw) / len(ts)
    theta = [torch.cat([p[e].flatten() for p in m.blocks[0].mlp.tensors()]) for e in range(E)]
    pairs = [(a, b) for a in range(E) for b in range(a + 1, E)]  # eq. 9: e < e', the squared cosine
    div = sum((theta[a] @ theta[b] / (theta[a].norm() * theta[b].norm())) ** 2 for a, b in pairs) / len(pairs)
    for key, want in (("bal_loss", bal), ("z_loss", z), ("div_loss", div)):
        assert m.aux[key].item() == pytest.approx(want.item(), rel=1e-5, abs=1e-7), key
    assert bal.item() > 1e-3  # not at the uniform value: the test sees the gates
    ce = F.cross_entropy(logits, y)
    assert loss.item() == pytest.approx((ce + 0.5 * bal + 0.25 * z + 2.0 * div).item(), rel=1e-6)


@pytest.mark.parametrize("E", [2, 4])
def test_balance_is_eq6_on_constructed_gates_and_diversity_eq9_on_constructed_banks(E):
    """Section 3.2: a uniform gate costs 0 and a one-hot gate 1 under eq. 6 (the entropy balance, which
    favors soft mixtures; a Switch-style usage balance would rate a one-expert-per-step table as
    balanced), and orthogonal experts cost 0 and identical (or negated) ones 1 under eq. 9 (the squared
    cosine: anti-correlated experts do not score below orthogonal ones)."""
    m = tiny(experts=E, depth=E)
    with torch.no_grad():
        last = m.router[2]
        last.weight.zero_()
        last.bias.zero_()
        assert m.regularizers()["bal"].item() == pytest.approx(0.0, abs=1e-6)  # uniform at every step
        m.router[0].weight.zero_()
        m.router[0].bias.fill_(1.0)  # SiLU(1) > 0 in every hidden unit
        last.weight.zero_()
        last.weight[0].fill_(1e3)  # logit of expert 0: huge at every step -> one-hot
        assert m.regularizers()["bal"].item() == pytest.approx(1.0, abs=1e-6)
        bank = m.blocks[0].mlp.tensors()
        for p in bank:
            p.zero_()
        w1 = bank[0]  # (E, H, D): expert e holds a one at its own entry: orthogonal flattened experts
        for e in range(E):
            w1[e].view(-1)[e] = 1.0
        assert m.regularizers()["div"].item() == pytest.approx(0.0, abs=1e-7)
        for e in range(E):
            w1[e].view(-1)[:E] = 1.0 if e % 2 == 0 else -1.0  # identical up to sign: cos^2 = 1 for every pair
        assert m.regularizers()["div"].item() == pytest.approx(1.0, abs=1e-6)


def test_bf16_autocast_and_bf16_weights_run_every_path():
    m = tiny(depth=4).train()
    x, y = images(b=6), torch.arange(6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = m(x, y)  # elastic path: per-image merged FFNs
    loss.backward()
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    assert all(v.dtype == torch.float32 for v in m.aux.values())  # regularizers in fp32
    m.eval().bfloat16()
    assert torch.allclose(m.materialize(5)(x.bfloat16()).float(), m(x.bfloat16(), depth=5).float())


def test_bf16_weights_run_elastic_depth_in_training_and_inference():
    """model.to(bfloat16) with elastic depth: a training step, and inference with the same keep mask,
    where the merged FFNs take the experts' dtype (fp32 gates cast to bf16)."""
    m = tiny(depth=4, depth_dropout=0.5).train().to(torch.bfloat16)
    x, y = images(b=6).bfloat16(), torch.arange(6)
    logits, loss = m(x, y)
    loss.backward()
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 and p.grad.isfinite().all()
               for p in m.parameters())
    keep = revit.sample_keep(6, 4, 0.5)
    with torch.no_grad():
        out = m.eval()(x, keep=keep)
        ref = m.float()(x.float(), keep=keep)
    assert out.dtype == torch.bfloat16 and torch.allclose(out.float(), ref, atol=5e-2)


def test_flop_count_matches_torch_flop_counter_on_materialized_graph():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    m = tiny(depth=3)
    dense, x = m.materialize(), images(b=1)
    with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH):
        dense(x)
    assert m.flops_per_image() == fc.get_total_flops()
    # the dynamic model adds the merging, 2E(2DH + H + D) per step per batch, and the tiny router
    with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH):
        m(x)
    D, H, E, L = 32, 128, 3, 3
    merge, router = L * 2 * E * (2 * D * H + H + D), L * 2 * (16 + 16 * E)
    assert fc.get_total_flops() == m.flops_per_image() + merge + router


# ----------------------------------------------------------------------------- train.py
@pytest.mark.slow
def test_train_revit_logs_regularizers_and_gates(tmp_path):
    # one process keeps this fast; that DDP needs no find_unused_parameters is the gradient test
    out = tmp_path / "run"
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--model", "revit", "--experts", "3", "--depth-dropout", "0.3",
           "--data", "synthetic", "--embed-dim", "32", "--num-heads", "2", "--depth", "3",
           "--device", "cpu", "--workers", "0", "--val-subset", "64", "--eval-batch-size", "64",
           "--batch-size", "16", "--max-steps", "3", "--eval-depths", "2,5", "--out-dir", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    with open(out / "log.jsonl") as f:
        log = [json.loads(line) for line in f]
    epoch, depths = log[0], log[1:]
    assert epoch["step"] == 3
    for key in ("ce_loss", "bal_loss", "z_loss", "div_loss"):
        assert math.isfinite(epoch[key]), key
    assert 0.0 <= epoch["bal_loss"] <= 1.0  # eq. 6 lies in [0, 1]
    gates = torch.tensor(epoch["gates"])
    assert gates.shape == (3, 3) and torch.allclose(gates.sum(1), torch.ones(3), atol=1e-3)
    assert [d["depth"] for d in depths] == [2, 5]
    assert torch.load(out / "ckpt.pt", weights_only=True)["args"]["experts"] == 3


def test_train_flags_reach_the_model_and_bad_depth_dropout_is_named():
    common = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, depth=4, num_heads=4)
    args = get_parser().parse_args(["--model", "revit", "--experts", "2", "--depth-dropout", "0.1",
                                          "--lambda-bal", "0.5", "--lambda-z", "0.25", "--lambda-div", "2"])
    m = registry.MODELS["revit"].build(args, common)
    assert (m.experts, m.depth_dropout, m.lambdas) == (2, 0.1, (0.5, 0.25, 2.0))
    args = get_parser().parse_args(["--model", "revit", "--depth-dropout", "1.5"])
    with pytest.raises(ValueError, match="--depth-dropout"):
        registry.MODELS["revit"].build(args, common)
