"""Tests for revit_moe.py (reViT's comparison baselines, paper 4.3 / appendix B and B.1): each test is
one claim the comparison relies on. CPU only, tiny models (D=32, 2 heads, 16x16 images, patch 4).
Run: OMP_NUM_THREADS=1 python -m pytest -q test_revit_moe.py
"""
import json

import pytest
import torch
import torch.nn.functional as F

import bvit
import revit
from revit_moe import ROUTINGS, ReViTMoE

torch.set_num_threads(1)
TINY = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=2)
CONTENT = ("smear", "lory", "token", "mixture")


def tiny(routing="depth", programmed=True, **kw):
    """A tiny model in eval mode; programmed=True gives the router and the biases random values, so
    the gates really depend on the input (at init the soft gates are exactly uniform)."""
    torch.manual_seed(0)
    m = ReViTMoE(**{**TINY, "depth": 3, "experts": 3, "routing": routing, **kw}).eval()
    if programmed:
        with torch.no_grad():
            if m.router is not None and routing != "depth":
                m.router.weight.normal_(0, 1.0)
            for p in m.blocks[0].mlp.tensors():
                if p.ndim == 2:
                    p.normal_(0, 0.1)
    return m


def images(b=3, size=16):
    return torch.randn(b, 3, size, size, generator=torch.Generator().manual_seed(1))


def copy_tied(src, dst):
    """Load a one-block bViT's weights into a model with stacked experts (experts axis added)."""
    sd = {k: v[None] if ".mlp." in k else v for k, v in src.state_dict().items()}
    missing, unexpected = dst.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.startswith(("router", "blocks.0.lora")) for k in missing), missing


# ----------------------------------------------------------------------------- reductions
def test_depth_routing_default_is_revit_bit_for_bit():
    kw = dict(**TINY, depth=4, experts=3, layer_scale=0.1, drop_path_rate=0.1, depth_dropout=0.3)
    torch.manual_seed(0)
    ref = revit.ReViT(**kw)
    torch.manual_seed(0)
    m = ReViTMoE(**kw)
    assert list(m.state_dict()) == list(ref.state_dict())  # same keys, same order
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), ref.state_dict().values()))
    x, y = images(b=6), torch.arange(6)
    outs = []
    for model in (ref, m):
        torch.manual_seed(5)  # same depth-dropout and drop-path draws
        logits, loss = model.train()(x, y)
        loss.backward()
        outs.append((logits, loss, [p.grad for p in model.parameters()], model.aux))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert all(torch.equal(a, b) for a, b in zip(outs[0][2], outs[1][2]))
    assert outs[0][3].keys() == outs[1][3].keys()
    assert torch.equal(ref.eval()(x, depth=7)[0], m.eval()(x, depth=7)[0])
    assert m.flops_per_image() == ref.flops_per_image() and m.num_params() == ref.num_params()
    assert m.log_extras() == ref.log_extras() and torch.equal(m.gates(5), ref.gates(5))
    assert torch.equal(m.materialize(5)(x)[0], ref.materialize(5)(x)[0])


@pytest.mark.parametrize("routing,class_token", [("smear", True), ("lory", True), ("mixture", True),
                                                 ("smear", False)])
def test_one_expert_is_tied_block(routing, class_token):
    torch.manual_seed(0)
    ref = bvit.BViT(**TINY, depth=3, num_blocks=1, layer_scale=0.1, class_token=class_token).eval()
    with torch.no_grad():  # non-trivial biases and norms, so a dropped term would show
        for n, p in ref.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    m = ReViTMoE(**TINY, depth=3, experts=1, routing=routing, layer_scale=0.1, class_token=class_token).eval()
    copy_tied(ref, m)
    assert m.router is None
    x, y = images(), torch.tensor([1, 5, 9])
    for depth in (3, 5):
        assert torch.allclose(m(x, depth=depth)[0], ref(x, depth=depth)[0], atol=1e-6)
    assert torch.allclose(m(x, y)[1], ref(x, y)[1], atol=1e-6)
    assert set(m.aux) == {"ce_loss"}  # no regularizers for E = 1, as reViT


def test_token_with_zeroed_routed_experts_is_its_shared_expert():
    m = tiny("token", experts=4, depth=3)
    blk = m.blocks[0]
    assert blk.mlp.fc1.weight.shape == (4, 64, 32) and blk.shared_mlp.fc1.weight.shape == (1, 64, 32)  # ratio 2
    with torch.no_grad():
        blk.shared_mlp.fc2.bias.normal_(0, 0.1)
    x = images()
    full = m(x)[0]
    with torch.no_grad():
        blk.mlp.fc2.weight.zero_()
        blk.mlp.fc2.bias.zero_()
    ref = bvit.BViT(**TINY, depth=3, num_blocks=1, mlp_ratio=2.0).eval()
    sd = {k: v for k, v in m.state_dict().items() if not k.startswith(("router", "blocks.0.mlp", "blocks.0.shared"))}
    sd.update({f"blocks.0.mlp.{k}": v[0] for k, v in blk.shared_mlp.state_dict().items()})
    ref.load_state_dict(sd, strict=True)
    assert torch.allclose(m(x)[0], ref(x)[0], atol=1e-6)
    assert not torch.allclose(full, ref(x)[0], atol=1e-3)  # the routed experts did contribute


def test_token_with_one_routed_expert_is_one_ratio4_ffn():
    # shared + routed (gate 1 for E = 1) of hidden 2D each = one FFN of hidden 4D with both hidden
    # layers side by side: the "U = 1 = one dense FFN" claim of appendix B, exactly
    m = tiny("token", experts=1, depth=3)
    blk = m.blocks[0]
    with torch.no_grad():
        blk.shared_mlp.fc2.bias.normal_(0, 0.1)
    ref = revit.ReViT(**TINY, depth=3, experts=1, depth_dropout=0.0).eval()
    sd = {k: v for k, v in m.state_dict().items() if not k.startswith(("blocks.0.mlp", "blocks.0.shared"))}
    s, r = blk.shared_mlp, blk.mlp
    sd.update({"blocks.0.mlp.fc1.weight": torch.cat([s.fc1.weight, r.fc1.weight], 1),
               "blocks.0.mlp.fc1.bias": torch.cat([s.fc1.bias, r.fc1.bias], 1),
               "blocks.0.mlp.fc2.weight": torch.cat([s.fc2.weight, r.fc2.weight], 2),
               "blocks.0.mlp.fc2.bias": s.fc2.bias + r.fc2.bias})
    ref.load_state_dict(sd, strict=True)
    x = images()
    assert torch.allclose(m(x)[0], ref(x)[0], atol=1e-5)
    assert m.flops_per_image() == ref.flops_per_image()
    assert m.num_params() == ref.num_params() + 32  # the second fc2 bias


# ----------------------------------------------------------------------------- semantics by hand
def hand_forward(m, x, depth):
    """Each routing written out one image (and, for token-level routers, one token) at a time."""
    blk, E, out = m.blocks[0], m.experts, []
    experts = [[w[e] for w in blk.mlp.tensors()] for e in range(E)]
    for b in range(len(x)):
        s = m.embed(x[b:b + 1])[0]  # (N, D)
        for _ in range(depth):
            a = blk.norm1(s)
            xx = s + blk.attn(a[None])[0]
            h = blk.norm2(xx)
            if m.routing in ("smear", "lory"):
                g = torch.softmax(m.router.weight @ (h if m.routing == "smear" else a).mean(0), 0)
                y = ffn(h, *[sum(g[e] * experts[e][j] for e in range(E)) for j in range(4)])
            else:
                rows = []
                for hi in h:
                    p = torch.softmax(m.router.weight @ hi, 0)
                    if m.routing == "mixture":
                        rows.append(sum(p[e] * ffn(hi, *experts[e]) for e in range(E)))
                    else:
                        i = int(p.argmax())
                        rows.append(ffn(hi, *(w[0] for w in blk.shared_mlp.tensors())) + p[i] * ffn(hi, *experts[i]))
                y = torch.stack(rows)
            s = xx + y
        out.append(m.classify(s[None]))
    return torch.cat(out)


def ffn(x, w1, b1, w2, b2):
    return F.gelu(x @ w1.T + b1) @ w2.T + b2


@pytest.mark.parametrize("routing", CONTENT)
def test_each_routing_equals_its_definition_by_hand(routing):
    m = tiny(routing, experts=3, depth=3)
    x = images(b=2)
    got = m(x)[0]
    assert torch.allclose(got, hand_forward(m, x, 3), atol=1e-5)
    gates = torch.tensor(m.log_extras()["gates"])  # (L, E) mean gates, rows sum to 1, not uniform
    assert gates.shape == (3, 3) and torch.allclose(gates.sum(1), torch.ones(3), atol=1e-3)
    assert (gates - 1 / 3).abs().max() > 1e-2


def test_lory_routes_on_the_previous_state_smear_on_the_ffn_input():
    smear, lory = tiny("smear"), tiny("lory")
    lory.load_state_dict(smear.state_dict())
    x = images()
    assert not torch.allclose(smear(x)[0], lory(x)[0], atol=1e-4)
    # Lory's first step is routed by the embedding alone: its gate does not see the first attention
    z = lory.embed(x)
    g0 = torch.softmax(lory.blocks[0].norm1(z).mean(1) @ lory.router.weight.T, -1)
    assert torch.allclose(lory._last_logits[0].softmax(-1), g0, atol=1e-6)


# ----------------------------------------------------------------------------- LoRA (B.1)
def lora_model(depth=4, **kw):
    torch.manual_seed(0)
    return ReViTMoE(**{**TINY, "depth": depth, "experts": 1, "lora_rank": 2, "depth_dropout": 0.0, **kw}).eval()


def test_lora_at_init_is_the_tied_block():
    m = lora_model(layer_scale=0.1)
    torch.manual_seed(0)
    ref = revit.ReViT(**TINY, depth=4, experts=1, depth_dropout=0.0, layer_scale=0.1).eval()
    sd = m.state_dict()
    assert {k for k in sd if k not in ref.state_dict()} == {f"blocks.0.lora.{n}_{ab}" for n in
                                                            ("qkv", "proj", "fc1", "fc2") for ab in "AB"}
    assert all(torch.equal(v, sd[k]) for k, v in ref.state_dict().items())  # same seed: same base weights
    assert sd["blocks.0.lora.qkv_A"].shape == (4, 2, 32) and sd["blocks.0.lora.fc2_B"].shape == (4, 32, 2)
    assert sd["blocks.0.lora.fc1_A"].abs().min() > 0 and not sd["blocks.0.lora.fc1_B"].any()
    x = images()
    for depth in (4, 6):
        assert torch.allclose(m(x, depth=depth)[0], ref(x, depth=depth)[0], atol=1e-6)


def test_lora_adapters_differ_after_one_optimizer_step():
    m = lora_model().train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(images(b=4), torch.arange(4))[1].backward()
    opt.step()
    lo = m.blocks[0].lora
    for n in ("qkv", "proj", "fc1", "fc2"):
        delta = (lo[n + "_B"] @ lo[n + "_A"]).flatten(1)  # (L, out*in): step k's update B_k A_k
        assert delta.norm(dim=1).min() > 0, n
        assert all(not torch.allclose(delta[i], delta[j]) for i in range(4) for j in range(i + 1, 4)), n
    norms = m.log_extras()["lora_norms"]
    assert len(norms) == 4 and min(norms) > 0


def lora_hand_forward(m, x, adapters):
    """Step k runs the tied block with its weights W + B_j A_j folded, j = adapters[k]."""
    blk, lo, z = m.blocks[0], m.blocks[0].lora, m.embed(x)
    B, N, D = z.shape
    for j in adapters:
        w = {n: (getattr(blk.attn, n).weight if n in ("qkv", "proj") else getattr(blk.mlp, n).weight[0])
             + lo[n + "_B"][j] @ lo[n + "_A"][j] for n in ("qkv", "proj", "fc1", "fc2")}
        q, k, v = F.linear(blk.norm1(z), w["qkv"], blk.attn.qkv.bias).view(B, N, 3, 2, D // 2).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D)
        z = z + F.linear(att, w["proj"], blk.attn.proj.bias)
        h = F.gelu(F.linear(blk.norm2(z), w["fc1"], blk.mlp.fc1.bias[0]))
        z = z + F.linear(h, w["fc2"], blk.mlp.fc2.bias[0])
    return m.classify(z)


def test_lora_other_depth_uses_the_nearest_trained_adapter():
    m = lora_model(depth=4)
    with torch.no_grad():
        for n, p in m.blocks[0].lora.items():
            if n.endswith("_B"):
                p.normal_(0, 0.5)  # distinct adapters
    assert m.adapter_index(m.grid(4)).tolist() == [0, 1, 2, 3]  # the trained depth: adapter k
    assert m.adapter_index(m.grid(7)).tolist() == [0, 0, 1, 2, 2, 2, 3]  # t_k 3/6 rounds to even
    assert m.adapter_index(m.grid(2)).tolist() == [0, 3]
    assert m.adapter_index(m.grid(1)).tolist() == [0]
    x = images()
    for depth in (4, 7, 2):
        want = lora_hand_forward(m, x, m.adapter_index(m.grid(depth)).tolist())
        assert torch.allclose(m(x, depth=depth)[0], want, atol=1e-5), depth
    assert not torch.allclose(m(x, depth=4)[0], lora_hand_forward(m, x, [0, 0, 0, 0]), atol=1e-4)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="routing"):
        ReViTMoE(**TINY, routing="expert-choice")
    with pytest.raises(ValueError, match="experts=1"):
        ReViTMoE(**TINY, experts=4, lora_rank=2)
    with pytest.raises(ValueError, match="routing"):
        ReViTMoE(**TINY, experts=1, routing="smear", lora_rank=2)
    with pytest.raises(ValueError, match="depth"):
        tiny("smear").gates()
    with pytest.raises(ValueError, match="materializes"):
        tiny("token").materialize()
    with pytest.raises(ValueError, match="materializes"):
        lora_model().materialize()


# ----------------------------------------------------------------------------- training contract
VARIANTS = [dict(routing=r) for r in ("depth",) + CONTENT] + [dict(experts=1, lora_rank=2)]


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: "lora" if "lora_rank" in kw else kw["routing"])
def test_every_parameter_gets_a_gradient(kw):
    m = tiny(programmed=False, **{"experts": 4, "depth": 4, "layer_scale": 0.1, "depth_dropout": 0.3, **kw}).train()
    x, y = images(b=8), torch.randint(10, (8,))
    torch.manual_seed(1)
    logits, loss = m(x, y)
    loss.backward()
    assert [n for n, p in m.named_parameters() if p.grad is None] == []
    if m.experts > 1:
        assert set(m.aux) == {"ce_loss", "bal_loss", "z_loss", "div_loss"}
        assert all(torch.isfinite(v) for v in m.aux.values())


def test_token_expert_without_tokens_still_gets_a_zero_gradient():
    m = tiny("token", experts=4, depth=3, lambda_bal=0.0, lambda_z=0.0, lambda_div=0.0).train()
    with torch.no_grad():  # logit_1 = -logit_0 and logit_3 = c * sum(h) = 0 (LayerNorm'd h): 3 never wins
        m.router.weight[1] = -m.router.weight[0]
        m.router.weight[3] = 1.0
    m(images(b=4), torch.arange(4))[1].backward()
    assert all(row[3] == 0 for row in m.log_extras()["expert_load"])
    g = m.blocks[0].mlp.fc1.weight.grad
    assert g is not None and not g[3].any() and g[0].any()


@pytest.mark.parametrize("routing", CONTENT)
def test_soft_gates_start_uniform_and_regularizers_add_up(routing):
    m = tiny(routing, programmed=False, experts=4, depth=3, lambda_bal=0.5, lambda_z=0.25, lambda_div=2.0)
    x, y = images(), torch.tensor([1, 2, 3])
    logits, loss = m(x, y)
    if routing != "token":  # zero-initialized router: every gate exactly 1/E, as reViT (A.1)
        assert torch.equal(torch.tensor(m.log_extras()["gates"]), torch.full((3, 4), 0.25))
        assert m.aux["bal_loss"].item() == pytest.approx(1.0, abs=1e-6)
        assert m.aux["z_loss"].item() == pytest.approx(torch.log(torch.tensor(4.0)).item() ** 2, rel=1e-6)
    else:  # Switch's balance, E sum_e f_e P_e, from the recorded logits of every step
        lg = torch.cat([l.reshape(-1, 4) for l in m._last_logits])
        f, P = F.one_hot(lg.argmax(-1), 4).float().mean(0), lg.softmax(-1).mean(0)
        assert m.aux["bal_loss"].item() == pytest.approx(4 * (f * P).sum().item(), rel=1e-6)
        assert len(set(lg.argmax(-1).tolist())) > 1  # the tokens do not all pick one expert at init
    ce = F.cross_entropy(logits, y)
    want = ce + 0.5 * m.aux["bal_loss"] + 0.25 * m.aux["z_loss"] + 2.0 * m.aux["div_loss"]
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)


@pytest.mark.parametrize("kw", VARIANTS[1:], ids=lambda kw: "lora" if "lora_rank" in kw else kw["routing"])
def test_elastic_depth_image_keeping_n_steps_is_the_depth_n_model(kw):
    m = tiny(**{"depth": 5, **kw})
    if m.lora_rank:
        with torch.no_grad():
            for n, p in m.blocks[0].lora.items():
                p.normal_(0, 0.3) if n.endswith("_B") else None
    keep = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    x = images()
    out = m(x, keep=keep)[0]
    for b, n in enumerate(keep.sum(1).tolist()):
        assert torch.allclose(out[b], m(x[b:b + 1], depth=n)[0][0], atol=1e-5)
    with pytest.raises(ValueError, match="keep"):
        m(x, keep=torch.zeros(3, 5, dtype=torch.bool))


@pytest.mark.parametrize("kw", VARIANTS[1:], ids=lambda kw: "lora" if "lora_rank" in kw else kw["routing"])
def test_grad_checkpointing_is_bit_identical(kw):
    m = tiny(**{"depth": 3, "drop_path_rate": 0.2, "depth_dropout": 0.3, **kw}).train()
    x, y = images(b=6), torch.arange(6)
    runs = []
    for ckpt in (False, True):
        m.set_grad_checkpointing(ckpt)
        m.zero_grad()
        torch.manual_seed(2)
        loss = m(x, y)[1]
        loss.backward()
        runs.append([loss] + [p.grad.clone() for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: "lora" if "lora_rank" in kw else kw["routing"])
def test_flop_count_matches_torch_flop_counter(kw):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    m = tiny(**{"depth": 3, **kw})
    if m.default:  # reViT counts its materialized graph (its merging is per batch, see revit.py)
        m = m.materialize()
    with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH):
        m(images(b=1))
    assert m.flops_per_image() == fc.get_total_flops()


def test_token_flops_are_a_dense_ratio4_ffn_plus_router_and_mixture_grows_with_e():
    dense = revit.ReViT(**TINY, depth=3, experts=1)
    T, D, L = 17, 32, 3
    for E in (2, 4, 8):
        token = ReViTMoE(**TINY, depth=3, experts=E, routing="token")
        assert token.flops_per_image() - dense.flops_per_image() == 2 * L * T * D * E  # the router only
    mix = [ReViTMoE(**TINY, depth=3, experts=E, routing="mixture").flops_per_image() for E in (1, 2, 4)]
    assert mix[0] == dense.flops_per_image()
    assert mix[2] - mix[1] == 2 * L * (2 * 2 * T * D * 128 + 2 * T * D)  # 2 more FFNs + router columns
    assert ReViTMoE(**TINY, depth=3, experts=4, routing="depth").flops_per_image() == dense.flops_per_image()


@pytest.mark.parametrize("kw", [dict(routing="smear"), dict(routing="token"), dict(experts=1, lora_rank=2)],
                         ids=["smear", "token", "lora"])
def test_compile_regions_capture_whole_graphs(kw):
    import torch._dynamo
    torch._dynamo.reset()
    m = tiny(**kw)
    x = images()
    want = m(x)[0]
    m.compile_regions(backend="eager")  # fullgraph: a graph break would raise
    assert torch.allclose(m(x)[0], want, atol=1e-6)
    assert torch.allclose(m(x, depth=5)[0], m.__class__.forward(m, x, depth=5)[0], atol=1e-6)


def test_bf16_autocast_and_dynamic_img_size_run_every_routing():
    x, y = images(b=4, size=24), torch.arange(4)
    for kw in VARIANTS:
        m = tiny(**{"dynamic_img_size": True, **kw}).train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, loss = m(x, y)
        loss.backward()
        assert logits.shape == (4, 10) and torch.isfinite(loss), kw
        assert all(v.dtype == torch.float32 for v in m.aux.values()), kw


def test_every_routing_and_lora_trains_through_train_py(tmp_path, capsys):
    import train
    from test_train import TINY, fake_cifar
    cifar = fake_cifar(tmp_path / "data")
    runs = [["--routing", r] for r in ROUTINGS] + [["--lora-rank", "2", "--experts", "1"]]
    for flags in runs:
        out = tmp_path / "_".join(flags)
        assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--model", "revit", "--max-steps", "2",
                                 "--out-dir", str(out)] + flags) == 0, (flags, capsys.readouterr().err)
        saved = json.load(open(out / "args.json"))
        assert (saved["routing"], saved["lora_rank"]) == (flags[1], 0) if flags[0] == "--routing" else \
            saved["lora_rank"] == 2
    assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--model", "revit", "--lora-rank", "2",
                             "--out-dir", str(tmp_path / "bad")]) == 2
    assert "experts" in capsys.readouterr().err
