"""Tests for srvit.py (Soft Mixture-of-Recursions) and the mimetic / structured attention inits.

CPU only, tiny configurations (the init checks use the sizes the structured-init procedure is stated for).
Run: python -m pytest -q test_srvit_init.py
`python test_srvit_init.py` prints how the structured init's hit rate falls with head_dim.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import bvit
import inits
import odevit
import revit
import srvit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
TINY = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=4)


def images(b=3, size=16):
    return torch.randn(b, 3, size, size, generator=torch.Generator().manual_seed(1))


def tiny_sr(**kw):
    torch.manual_seed(0)
    return srvit.SRViT(**{**TINY, "depth": 2, "recursions": 3, **kw}).eval()


def states(model, x, recursions):
    """Reference: the R recursion outputs h_1..h_R, all stored."""
    h, out = model.embed(x), []
    for _ in range(recursions):
        for blk in model.blocks:
            h = blk(h)
        out.append(h)
    return out


def randomize_router(model):
    with torch.no_grad():
        for p in model.router.parameters():
            p.copy_(torch.randn_like(p))


# ----------------------------------------------------------------------------- srvit.py
@pytest.mark.parametrize("class_token", [True, False])
def test_one_recursion_is_the_plain_vit(class_token):
    torch.manual_seed(0)
    vit = bvit.BViT(**TINY, depth=3, num_blocks=3, class_token=class_token).eval()
    sr = srvit.SRViT(**TINY, depth=3, recursions=1, class_token=class_token).eval()
    sr.load_state_dict(vit.state_dict(), strict=True)  # same names, no router at R = 1
    x, y = images(), torch.tensor([1, 5, 9])
    assert torch.equal(sr(x), vit(x))
    assert torch.equal(sr(x, y)[1], vit(x, y)[1])


def test_streaming_mixture_equals_stored_then_softmaxed():
    g = torch.Generator().manual_seed(0)
    R, B, T, D = 6, 2, 5, 8
    hs = torch.randn(R, B, T, D, generator=g)
    # large, spread scores, rising and falling, so the running max is replaced and rescaled often
    ss = 30 * torch.randn(R, B, T, 1, generator=g) + torch.linspace(-50, 50, R)[:, None, None, None]
    ss[:, 1] = ss[:, 1].flip(0)
    mix = srvit.StreamingMixture()
    for h, s in zip(hs, ss):
        mix.add(h, s)
    a = ss.softmax(dim=0)  # (R, B, T, 1)
    assert torch.allclose(mix.result(), (a * hs).sum(0), atol=1e-5)
    assert torch.allclose(mix.weights(), a.squeeze(-1).permute(1, 2, 0), atol=1e-6)


@pytest.mark.parametrize("depth", [None, 2, 5])  # call-time depth = recursions; 5 > R reuses router 3
def test_model_output_is_the_token_wise_softmax_mixture_of_all_recursions(depth):
    m = tiny_sr()
    randomize_router(m)
    x = images()
    R = depth or m.recursions
    hs = states(m, x, R)
    s = torch.cat([F.linear(m.router.norms[min(r, 2)](h), m.router.weight[min(r, 2), None])
                   for r, h in enumerate(hs)], dim=-1)  # (B, T, R)
    a = s.softmax(dim=-1)
    o = sum(a[..., r, None] * h for r, h in enumerate(hs))
    assert torch.allclose(m(x, depth=depth), m.classify(o), atol=1e-5)
    assert m.mix_weights.shape == (3, 17, R) and torch.allclose(m.mix_weights, a, atol=1e-6)


def test_router_starts_uniform_and_learns():
    m = tiny_sr(recursions=4).train()
    x, y = images(), torch.tensor([0, 1, 2])
    logits, loss = m(x, y)
    assert torch.equal(m.mix_weights, torch.full_like(m.mix_weights, 0.25))
    assert m.log_extras() == {"mix_weights": [0.25] * 4}
    assert torch.allclose(logits, m.classify(sum(states(m, x, 4)) / 4), atol=1e-5)
    loss.backward()
    assert m.router.weight.grad.abs().sum() > 0  # the zero router is not stuck


@pytest.mark.parametrize("R", [1, 2, 4])
def test_parameter_overhead_is_3DR(R):
    torch.manual_seed(0)
    vit = bvit.BViT(**TINY, depth=2, num_blocks=2)
    sr = srvit.SRViT(**TINY, depth=2, recursions=R)
    assert sr.num_params() - vit.num_params() == (3 * 32 * R if R > 1 else 0)  # LN_r (2D) + w_r (D)


def test_flop_count_matches_torch_flop_counter():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    for kw in (dict(recursions=1), dict(recursions=3, class_token=False, mlp_ratio=2.0)):
        m = tiny_sr(**kw)
        with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH):
            m(images(b=1))
        assert m.flops_per_image() == fc.get_total_flops()
    assert m.flops_per_image(depth=6) > m.flops_per_image()


def test_soft_targets_equal_hard_targets_and_bad_input_raises():
    m = tiny_sr()
    x, y = images(), torch.tensor([3, 1, 7])
    assert torch.allclose(m(x, y)[1], m(x, F.one_hot(y, 10).float())[1], atol=1e-6)
    b = tiny_sr(loss="bce")  # DeiT III's binary cross-entropy, as in bvit/revit (--bce)
    logits, loss = b(x, y)
    assert torch.allclose(loss, F.binary_cross_entropy_with_logits(logits, F.one_hot(y, 10).float()))
    with pytest.raises(ValueError, match="recursions"):
        m(x, depth=0)
    with pytest.raises(ValueError, match="patch_size"):
        tiny_sr(img_size=18)
    for cls in (srvit.SRViT, bvit.BViT):
        with pytest.raises(ValueError, match="init"):
            cls(**TINY, init="xavier")


# ----------------------------------------------------------------------------- attention inits
def head_forms(attn):
    """Per head W_q^T W_k (h, d, d) and the value-output map W_v^T W_proj^T (d, d)."""
    d, h = attn.proj.weight.shape[0], attn.num_heads
    wq, wk, wv = attn.qkv.weight.detach().view(3, h, d // h, d).unbind(0)
    return wq.mT @ wk, wv.reshape(d, d).T @ attn.proj.weight.detach().T


def diag_offdiag(a):
    n = a.shape[-1]
    diag = a.diagonal(dim1=-2, dim2=-1).mean(-1)
    return diag, (a.sum((-2, -1)) - diag * n) / (n * n - n)


def hit_rates(model, grid):
    """Fraction of interior query tokens whose argmax key, with LN(pos_embed) fed through the first
    block's Q and K, is at the head's assigned 3x3 offset: one rate per head."""
    attn, h = model.blocks[0].attn, model.num_heads
    pos = model.pos_embed[0, int(model.cls_token is not None):]
    with torch.no_grad():
        q, k, _ = attn.qkv(model.blocks[0].norm1(pos)).view(grid * grid, 3, h, -1).unbind(1)  # (N, h, hd)
        key = torch.einsum("nhd,mhd->hnm", q, k).argmax(-1)  # (h, N)
    rates = []
    for i in range(h):
        o = [4, 1, 5, 3, 7, 0, 2, 6, 8][i % 9]  # the structured-init code's offset order
        hits = [key[i, r * grid + c].item() == (r + o // 3 - 1) * grid + c + o % 3 - 1
                for r in range(1, grid - 1) for c in range(1, grid - 1)]
        rates.append(sum(hits) / len(hits))
    return rates


CIFAR_TI = dict(img_size=32, patch_size=4, num_classes=10, embed_dim=192, num_heads=3, depth=2)


@pytest.mark.parametrize("make", [lambda **kw: bvit.BViT(num_blocks=1, **kw),
                                  lambda **kw: srvit.SRViT(recursions=2, **kw),
                                  lambda **kw: revit.ReViT(experts=2, **kw),
                                  lambda **kw: odevit.ODEViT(**kw)], ids=["bvit", "srvit", "revit", "odevit"])
def test_structured_init_heads_attend_at_their_offsets(make):
    torch.manual_seed(0)
    m = make(**CIFAR_TI, init=inits.structured)  # 8x8 tokens, head_dim 64
    assert min(hit_rates(m, 8)) >= 0.9
    assert 0.25 < m.pos_embed.std() < 0.5  # the position embedding was scaled by 18 (std 0.36)
    torch.manual_seed(0)
    plain = make(**CIFAR_TI)
    assert max(hit_rates(plain, 8)) < 0.5  # the default init does not do it by chance
    _, vo = head_forms(m.blocks[0].attn)
    assert abs(diag_offdiag(vo)[0] + 0.4) < 0.05


@pytest.mark.parametrize("make", [lambda **kw: bvit.BViT(num_blocks=2, **kw),
                                  lambda **kw: srvit.SRViT(recursions=2, **kw),
                                  lambda **kw: revit.ReViT(experts=2, **kw),
                                  lambda **kw: odevit.ODEViT(**kw)], ids=["bvit", "srvit", "revit", "odevit"])
def test_mimetic_init_products(make):
    torch.manual_seed(0)
    m = make(**CIFAR_TI, init=inits.mimetic)
    for blk in m.blocks:
        qk, vo = head_forms(blk.attn)
        diag, off = diag_offdiag(qk)
        assert (diag > 0.2).all() and (off.abs() < 0.02).all() and (diag > 10 * off.abs()).all()
        vdiag, voff = diag_offdiag(vo)
        assert abs(vdiag + 0.4) < 0.05 and abs(voff) < 0.01
    if len(m.blocks) > 1:  # each distinct block gets its own draw (reViT has one shared block)
        assert not torch.equal(m.blocks[0].attn.qkv.weight, m.blocks[1].attn.qkv.weight)
    torch.manual_seed(0)
    qk, vo = head_forms(make(**CIFAR_TI).blocks[0].attn)
    assert diag_offdiag(qk)[0].abs().max() < 0.01 and abs(diag_offdiag(vo)[0]) < 0.01  # default: ~0


# ----------------------------------------------------------------------------- the base init
MAKERS = {"bvit": lambda **kw: bvit.BViT(num_blocks=2, **kw), "srvit": lambda **kw: srvit.SRViT(recursions=2, **kw),
          "revit": lambda **kw: revit.ReViT(experts=2, **kw), "odevit": lambda **kw: odevit.ODEViT(**kw)}
BASE_SIZES = dict(img_size=32, patch_size=4, num_classes=100, embed_dim=96, num_heads=3, depth=2)


def uniform_like_pytorch(name, t, fan_in):
    """t ~ U(+-1/sqrt(fan_in)), as nn.Linear / nn.Conv2d draw weights and biases: inside the bound, the
    extremes near it, the std bound/sqrt(3) within 6 standard errors of a sample std (~0.45/sqrt(n) for a
    uniform), no zeros."""
    bound, n = 1 / fan_in ** 0.5, t.numel()
    assert t.abs().max() <= bound, name
    assert t.abs().max() > bound * (1 - 10 / n), name  # n draws reach within ~bound/n of the edge
    assert abs(t.std().item() / (bound / 3 ** 0.5) - 1) < 6 * 0.45 / n ** 0.5 + 0.01, name
    assert (t != 0).all(), name


@pytest.mark.parametrize("name", list(MAKERS))
def test_the_pytorch_base_is_pytorchs_default_init_layer_by_layer(name):
    """init_base="pytorch" (the structured-init paper's baseline, its weight_init=skip): every Linear and
    Conv2d weight AND bias ~ U(+-1/sqrt(fan_in)), reViT's stacked experts as E dense Linears, LayerNorm ones
    and zeros, position embedding N(0, 0.02^2), class token 0; only the models' own zero inits (routers) stay.
    The timm base, for contrast: zero biases, weights of std 0.02."""
    torch.manual_seed(0)
    m = MAKERS[name](**BASE_SIZES, init_base="pytorch")
    seen = 0
    for mod_name, mod in m.named_modules():
        if mod_name.startswith("router"):
            continue  # the models' own choice on either base (uniform mixture / uniform 1/E gates)
        if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)):
            fan_in = mod.weight[0].numel()
            uniform_like_pytorch(f"{mod_name}.weight", mod.weight.detach(), fan_in)
            uniform_like_pytorch(f"{mod_name}.bias", mod.bias.detach(), fan_in)
            seen += 1
        elif isinstance(mod, torch.nn.LayerNorm):
            assert torch.equal(mod.weight, torch.ones_like(mod.weight)) and torch.equal(mod.bias, torch.zeros_like(mod.bias))
    assert seen == {"bvit": 10, "srvit": 10, "revit": 4, "odevit": 6}[name]  # patch embed, qkv/proj/fc1/fc2, head
    if name == "revit":  # (E, out, in) experts: each one a dense FFN's nn.Linear draw
        mlp = m.blocks[0].mlp
        for e in range(2):
            for fc in (mlp.fc1, mlp.fc2):
                uniform_like_pytorch(f"expert {e}", fc.weight[e].detach(), fc.weight.shape[-1])
                uniform_like_pytorch(f"expert {e} bias", fc.bias[e].detach(), fc.weight.shape[-1])
        assert not torch.equal(mlp.fc1.weight[0], mlp.fc1.weight[1])  # independent draws (A.1)
    assert abs(m.pos_embed.std().item() / 0.02 - 1) < 0.05 and abs(m.pos_embed.mean().item()) < 0.002
    assert torch.equal(m.cls_token, torch.zeros_like(m.cls_token))  # as the official code builds it
    torch.manual_seed(0)
    timm_base = MAKERS[name](**BASE_SIZES)
    assert not timm_base.head.bias.any() and abs(timm_base.head.weight.std().item() - 0.02) < 0.002


@pytest.mark.parametrize("name", list(MAKERS))
def test_the_structured_attention_is_the_same_on_either_base(name, monkeypatch):
    """The attention init is applied after the base and nothing of the base touches it: each distinct
    block's qkv and proj weights are exactly what init_attention_ gives for the position embedding and the
    random state it was called with, and they still attend at their offsets (8x8 tokens, head_dim 64);
    the biases keep the base's (nonzero on the PyTorch base: the official code leaves them)."""
    mod = {"bvit": bvit, "srvit": srvit, "revit": revit, "odevit": odevit}[name]
    real, calls = inits.init_attention_, []

    def spy(attn, init, pos, grid):
        calls.append((torch.get_rng_state(), pos.detach().clone()))
        real(attn, init, pos, grid)
    monkeypatch.setattr(inits, "init_attention_", spy)
    for base in ("timm", "pytorch"):
        calls.clear()
        torch.manual_seed(0)
        m = MAKERS[name](**CIFAR_TI, init=inits.structured, init_base=base)
        assert len(calls) == len(m.blocks)
        for blk, (state, pos) in zip(m.blocks, calls):
            fresh = mod.Attention(192, 3)
            torch.set_rng_state(state)
            real(fresh, "structured", pos, 8)
            assert torch.equal(fresh.qkv.weight, blk.attn.qkv.weight) and torch.equal(fresh.proj.weight, blk.attn.proj.weight)
            assert bool(blk.attn.qkv.bias.any()) == (base == "pytorch")
        assert min(hit_rates(m, 8)) >= 0.9 and 0.25 < m.pos_embed.std() < 0.5, base


@pytest.mark.parametrize("base", ["timm", "pytorch"])
def test_mimetic_products_hold_on_either_base(base):
    torch.manual_seed(0)
    qk, vo = head_forms(bvit.BViT(num_blocks=1, **CIFAR_TI, init=inits.mimetic, init_base=base).blocks[0].attn)
    diag, off = diag_offdiag(qk)
    assert (diag > 0.2).all() and (off.abs() < 0.02).all() and abs(diag_offdiag(vo)[0] + 0.4) < 0.05


def test_the_init_base_flag_reaches_the_model_and_is_refused_where_it_would_not_hold(capsys):
    from training import flags, registry
    common = ["--model", "vit", "--embed-dim", "32", "--num-heads", "2", "--depth", "2"]
    for base, biased in (("timm", False), ("pytorch", True)):
        model = registry.build_model(flags.resolved([*common, "--init-base", base], 32), 32, 100)
        assert bool(model.head.bias.any()) == biased and model.pos_embed.std() < 0.03
    for argv, says in (([*common, "--init-base", "xavier"], "--init-base"),
                       (["--model", "revit", "--routing", "deepseek", "--init-base", "pytorch"], "--routing deepseek")):
        with pytest.raises(SystemExit) as e:
            flags.resolved(argv, 32)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and says in err[0], err
    with pytest.raises(ValueError, match="init_base"):
        srvit.SRViT(**TINY, init_base="xavier")


# ----------------------------------------------------------------------------- train.py
@pytest.mark.slow
def test_train_smoke_srvit_with_structured_init(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--model", "srvit", "--recursions", "2",
           "--init", "structured", "--data", "synthetic", "--workers", "0", "--val-subset", "64",
           "--max-steps", "3", "--embed-dim", "32", "--num-heads", "2", "--depth", "1",
           "--batch-size", "16", "--eval-batch-size", "64", "--device", "cpu",
           "--eval-depths", "1,3", "--out-dir", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    with open(out / "log.jsonl") as f:
        log = [json.loads(line) for line in f]
    assert log[0]["step"] == 3 and len(log[0]["mix_weights"]) == 2
    assert [d["depth"] for d in log[1:]] == [1, 3]
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["args"]["model"] == "srvit" and ck["args"]["init"] == "structured"
    assert "router.weight" in ck["model"] and ck["model"]["pos_embed"].std() > 0.2  # init reached it


# ----------------------------------------------------------------------------- report
def hit_rate_table(seeds=3):
    """Structured init at 8x8 tokens (img 32, patch 4): hit rate of interior queries per head_dim,
    (a) embed_dim 192 with more heads, (b) 3 heads with a narrower embed_dim (BViT, 3 seeds)."""
    print("head_dim | D=192: heads  mean  min-head | heads=3: D  mean  min-head")
    for hd in (64, 32, 16, 8, 4):
        row = []
        for dim, heads, label in ((192, 192 // hd, 192 // hd), (3 * hd, 3, 3 * hd)):
            rates = []
            for s in range(seeds):
                torch.manual_seed(s)
                kw = {**CIFAR_TI, "embed_dim": dim, "num_heads": heads}
                rates += hit_rates(bvit.BViT(**kw, init=inits.structured), 8)
            row.append((label, sum(rates) / len(rates), min(rates)))
        print(f"{hd:8d} | {row[0][0]:12d} {row[0][1]:5.3f} {row[0][2]:8.3f} |"
              f" {row[1][0]:10d} {row[1][1]:5.3f} {row[1][2]:8.3f}")


if __name__ == "__main__":
    hit_rate_table()
