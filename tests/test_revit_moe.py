"""Tests for revit_moe.py (reViT's comparison baselines, paper 4.3 / appendix B and B.1): each test is
one claim the comparison relies on, most of them a baseline's defining rule on constructed inputs.
CPU only, tiny models (D=32, 2 heads, 16x16 images, patch 4: 16 patch tokens + the class token).
Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_revit_moe.py
"""
import json

import pytest
import torch
import torch.nn.functional as F

import bvit
import revit
import revit_moe
from revit_moe import ROUTINGS, ReViTMoE

torch.set_num_threads(1)
TINY = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=2)
CONTENT = ROUTINGS[1:]  # every baseline routing
NO_AUX = ("smear", "deepseek", "qwen3", "moeut", "softmoe")  # appendix B: no auxiliary loss (module docstring)


def tiny(routing="depth", programmed=True, **kw):
    """A tiny model in eval mode; programmed=True gives the router, the biases (and DeepSeek-V3's
    selection bias, Soft-MoE's scale) random values, so the gates really depend on the input (at
    init the soft merges' gates are exactly uniform)."""
    torch.manual_seed(0)
    m = ReViTMoE(**{**TINY, "depth": 3, "experts": 4, "routing": routing, **kw}).eval()
    if programmed:
        with torch.no_grad():
            if m.router is not None and routing != "depth":
                m.router.weight.normal_(0, 1.0)
            blk = m.blocks[0]
            for p in (*blk.mlp.tensors(), *(blk.shared_mlp.tensors() if routing == "deepseek" else ())):
                if p.ndim == 2:
                    p.normal_(0, 0.1)
            if routing == "deepseek":
                m.expert_bias.normal_(0, 0.3)
            if routing == "softmoe":
                m.slot_scale.fill_(4.0)
    return m


def images(b=3, size=16):
    return torch.randn(b, 3, size, size, generator=torch.Generator().manual_seed(1))


def copy_tied(src, dst):
    """Load a one-block bViT's weights into a model with stacked experts (experts axis added)."""
    sd = {k: v[None] if ".mlp." in k else v for k, v in src.state_dict().items()}
    missing, unexpected = dst.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.startswith(("router", "blocks.0.lora")) for k in missing), missing


def constant_ffn_input(m, logits):
    """Make every token's FFN input h = norm2(x) the all-ones vector (norm2's weight 0, bias 1), so
    that the router's logits are `logits` (E,) for every token of every step: W_r = logits / D."""
    blk = m.blocks[0]
    with torch.no_grad():
        blk.norm2.weight.zero_()
        blk.norm2.bias.fill_(1.0)
        m.router.weight.copy_(torch.tensor(logits)[:, None].expand(-1, m.embed_dim) / m.embed_dim)


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
    assert torch.equal(ref.eval()(x, depth=7), m.eval()(x, depth=7))
    assert m.flops_per_image() == ref.flops_per_image() and m.num_params() == ref.num_params()
    assert m.log_extras() == ref.log_extras() and torch.equal(m.gates(5), ref.gates(5))
    assert torch.equal(m.materialize(5)(x), ref.materialize(5)(x))


@pytest.mark.parametrize("routing,class_token", [("smear", True), ("lory", True), ("smear", False)])
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
        assert torch.allclose(m(x, depth=depth), ref(x, depth=depth), atol=1e-6)
    assert torch.allclose(m(x, y)[1], ref(x, y)[1], atol=1e-6)
    assert set(m.aux) == {"ce_loss"}  # no regularizers for E = 1, as reViT


# ----------------------------------------------------------------------------- U and Table 8
def test_every_routing_is_u_1_and_stores_table_8s_expert_parameters_at_s_width():
    # appendix B, Table 8, S column (millions, both projections and biases of every stored expert):
    # 4.7 for the ehr-4 banks of 4, DeepSeek-V3 3.0 (4 routed + 1 shared at ehr 2), ReMoE 1.2 (4 at ehr 1)
    table8 = {"depth": 4.7, "lory": 4.7, "smear": 4.7, "deepseek": 3.0, "qwen3": 4.7, "moeut": 4.7,
              "remoe": 1.2, "softmoe": 4.7}
    assert set(table8) == set(ROUTINGS)
    S = dict(img_size=224, patch_size=16, embed_dim=384, num_heads=6, depth=12, mlp_ratio=4.0, experts=4)
    for routing, millions in table8.items():
        m = ReViTMoE(routing=routing, **S)
        assert m.U == 1, routing
        assert round(m.expert_params() / 1e6, 1) == millions, (routing, m.expert_params())
    assert ReViTMoE(routing="softmoe", **S).router.weight.shape == (196, 384)  # 196 slots: 49 per expert
    # and at the tiny width; ReMoE's U grows with E (every expert runs), the others' does not
    for routing in ROUTINGS:
        assert tiny(routing, programmed=False).U == 1, routing
        assert tiny(routing, programmed=False, experts=8).U == (2 if routing == "remoe" else 1), routing


def test_flops_of_every_u1_routing_are_one_dense_ffn_plus_its_routing():
    T, D, H, L, N = 17, 32, 128, 3, 16
    dense = revit.ReViT(**TINY, depth=L, experts=1).flops_per_image()
    extra = {"lory": 4 * (2 * D * H + H + D) + 4 * D, "smear": 4 * (2 * D * H + H + D) + 4 * D,
             "deepseek": T * D * 4, "qwen3": T * D * 4, "moeut": T * D * 4, "remoe": T * D * 4,  # the router
             "softmoe": 3 * T * D * N + 2 * N * D * H - 2 * T * D * H}  # N slots, not T tokens, run an FFN
    for routing, more in extra.items():
        assert tiny(routing, programmed=False).flops_per_image() - dense == 2 * L * more, routing


# ----------------------------------------------------------------------------- semantics by hand
def ffn(x, w1, b1, w2, b2):
    return F.gelu(x @ w1.T + b1) @ w2.T + b2


def hand_forward(m, x, depth):
    """Each routing written out one image (and, for token-level routers, one token or slot) at a time."""
    blk, E, W, out = m.blocks[0], m.experts, m.router.weight, []
    experts = [[w[e] for w in blk.mlp.tensors()] for e in range(E)]
    for b in range(len(x)):
        s = m.embed(x[b:b + 1])[0]  # (T, D)
        for _ in range(depth):
            a = blk.norm1(s)
            xx = s + blk.attn(a[None])[0]
            h = blk.norm2(xx)
            if m.routing in ("smear", "lory"):
                g = torch.softmax(W @ (h if m.routing == "smear" else a).mean(0), 0)
                y = ffn(h, *[sum(g[e] * experts[e][j] for e in range(E)) for j in range(4)])
            elif m.routing == "softmoe":  # the class token (row 0) is dispatched like a patch token
                lg = m.slot_scale * (h / h.norm(dim=1, keepdim=True)) @ (W / W.norm(dim=1, keepdim=True)).T
                dispatch, combine = lg.softmax(0), lg.softmax(1)  # (T, S): over the tokens, over the slots
                per = W.shape[0] // E
                slots = torch.stack([ffn(dispatch[:, j] @ h, *experts[j // per]) for j in range(W.shape[0])])
                y = combine @ slots
            else:
                rows = []
                for hi in h:
                    lg = W @ hi
                    if m.routing == "qwen3":  # softmax, top-1, renormalized: p_i / p_i
                        p = lg.softmax(0)
                        i = int(p.argmax())
                        rows.append(p[i] / p[i] * ffn(hi, *experts[i]))
                    elif m.routing == "deepseek":  # argmax of s + b; gate s_i / s_i; + the shared expert
                        sc = lg.sigmoid()
                        i = int((sc + m.expert_bias).argmax())
                        rows.append(ffn(hi, *(w[0] for w in blk.shared_mlp.tensors())) + sc[i] / sc[i] * ffn(hi, *experts[i]))
                    elif m.routing == "moeut":  # sigma-MoE: gate sigmoid(l_i), not renormalized
                        sc = lg.sigmoid()
                        i = int(sc.argmax())
                        rows.append(sc[i] * ffn(hi, *experts[i]))
                    else:  # remoe: every expert, weighted by relu(W_r h)
                        rows.append(sum(lg.relu()[e] * ffn(hi, *experts[e]) for e in range(E)))
                y = torch.stack(rows)
            s = xx + y
        out.append(m.classify(s[None]))
    return torch.cat(out)


@pytest.mark.parametrize("routing", CONTENT)
def test_each_routing_equals_its_definition_by_hand(routing):
    m = tiny(routing, depth=3)
    x = images(b=2)
    assert torch.allclose(m(x), hand_forward(m, x, 3), atol=1e-5)
    gates = torch.tensor(m.log_extras()["gates"])  # (L, E) mean gates, not uniform
    assert gates.shape == (3, 4) and (gates - gates.mean(1, keepdim=True)).abs().max() > 1e-2
    if routing in ("smear", "lory", "deepseek", "qwen3", "softmoe"):  # a convex weight or a token share
        assert torch.allclose(gates.sum(1), torch.ones(3), atol=1e-3)


def test_lory_routes_on_the_previous_state_smear_on_the_ffn_input():
    smear, lory = tiny("smear"), tiny("lory")
    lory.load_state_dict(smear.state_dict())
    x = images()
    assert not torch.allclose(smear(x), lory(x), atol=1e-4)
    # Lory's first step is routed by the embedding alone: its gate does not see the first attention
    z = lory.embed(x)
    g0 = torch.softmax(lory.blocks[0].norm1(z).mean(1) @ lory.router.weight.T, -1)
    assert torch.allclose(lory._last_gates[0], g0, atol=1e-6)


# ----------------------------------------------------------------------------- the baselines' rules
def test_the_dispatch_gates_qwen3_renormalized_deepseek_normalized_unbiased_moeut_plain_sigmoid():
    lg = torch.tensor([[2.0, 0.0, -1.0, 0.5], [-1.0, 3.0, 0.0, 0.0], [0.1, 0.2, 0.3, -4.0]])  # (tokens, E)
    qwen3, moeut, deepseek = (tiny(r, programmed=False) for r in ("qwen3", "moeut", "deepseek"))
    top, gate = qwen3._select(lg)  # top-1 of the softmax, renormalized over the chosen: exactly 1
    assert top.tolist() == [0, 1, 2] and torch.equal(gate, torch.ones(3))
    top, gate = moeut._select(lg)  # sigma-MoE: the chosen expert's sigmoid, not renormalized
    assert top.tolist() == [0, 1, 2] and torch.allclose(gate, torch.tensor([2.0, 3.0, 0.3]).sigmoid())
    assert deepseek._select(lg)[0].tolist() == [0, 1, 2]  # bias 0: the top affinity
    deepseek.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 0.4]))  # selection only: s + b
    top, gate = deepseek._select(lg)
    assert top.tolist() == [3, 1, 2] and torch.equal(gate, torch.ones(3))  # s_i / s_i, not s_i + b_i


def test_deepseek_with_every_token_on_one_expert_is_one_ratio4_ffn_whatever_the_bias():
    # shared + routed expert i (gate exactly 1) of hidden 2D each = one FFN of hidden 4D with both hidden
    # layers side by side: appendix B's "U = 1 = one dense FFN", exactly; the bias picks i, and two
    # biases that pick the same expert give the same output (it never enters the gate value)
    m = tiny("deepseek")
    blk = m.blocks[0]
    assert blk.mlp.fc1.weight.shape == (4, 64, 32) and blk.shared_mlp.fc1.weight.shape == (1, 64, 32)  # ehr 2
    x = images()
    with torch.no_grad():
        m.expert_bias.copy_(torch.tensor([0.0, 0.0, 3.0, 0.0]))  # affinities are in (0, 1): expert 2 for all
        out = m(x)
        assert all(row == [0.0, 0.0, 1.0, 0.0] for row in m.log_extras()["gates"])
        m.expert_bias.copy_(torch.tensor([-5.0, 1.0, 8.0, 0.0]))
        assert torch.equal(m(x), out)
    ref = revit.ReViT(**TINY, depth=3, experts=1).eval()
    sd = {k: v for k, v in m.state_dict().items() if not k.startswith(("router", "expert_bias", "blocks.0.mlp",
                                                                       "blocks.0.shared"))}
    s, r = blk.shared_mlp, blk.mlp
    sd.update({"blocks.0.mlp.fc1.weight": torch.cat([s.fc1.weight, r.fc1.weight[2:3]], 1),
               "blocks.0.mlp.fc1.bias": torch.cat([s.fc1.bias, r.fc1.bias[2:3]], 1),
               "blocks.0.mlp.fc2.weight": torch.cat([s.fc2.weight, r.fc2.weight[2:3]], 2),
               "blocks.0.mlp.fc2.bias": s.fc2.bias + r.fc2.bias[2:3]})
    ref.load_state_dict(sd, strict=True)
    assert torch.allclose(out, ref(x), atol=1e-5)


@pytest.mark.parametrize("routing,learns", [("qwen3", False), ("deepseek", False), ("moeut", True)])
def test_a_renormalized_top1_gate_gives_its_router_exactly_no_gradient(routing, learns):
    m = tiny(routing).train()
    m(images(b=4), torch.arange(4))[1].backward()
    g = m.router.weight.grad
    assert g is not None and bool(g.any()) == learns


def test_deepseek_bias_moves_toward_balance_from_the_load_and_is_a_buffer():
    m = tiny("deepseek").train()
    with torch.no_grad():  # expert 0's affinity ~0.96 for every token (norm2's bias is the mean W_r[0] reads),
        m.blocks[0].norm2.bias.fill_(0.5)  # the others' 0.5 +- 0.15
        m.router.weight.normal_(0, 0.1)
        m.router.weight[0] = 0.2
        m.expert_bias.zero_()
    x = images(b=4)
    m(x)
    assert [row[0] for row in m.log_extras()["gates"]] == [1.0, 1.0, 1.0]  # all on expert 0
    m.after_step()
    assert m.expert_bias.tolist() == pytest.approx([-1e-3, 1e-3, 1e-3, 1e-3])  # gamma sign(mean - load)
    m.after_step()  # no forward since: nothing counted, no change
    assert m.expert_bias.tolist() == pytest.approx([-1e-3, 1e-3, 1e-3, 1e-3])
    m.bias_speed = 0.05
    loads = []
    for _ in range(30):
        m(x)
        loads.append(torch.tensor(m.log_extras()["gates"]).mean(0))  # (E,) token share over the steps
        m.after_step()
    late = torch.stack(loads[-10:]).mean(0)  # sign steps of a fixed size end in a cycle around balance
    assert loads[0][0] > 0.9 and late.max() < 0.4 and late.min() > 0.15, late
    assert "expert_bias" in m.state_dict() and "expert_bias" not in dict(m.named_parameters())
    assert m.eval()(x) is not None and m._stats is None  # an evaluation forward counts nothing


def test_deepseek_and_remoe_balance_on_the_global_batch_under_torch_distributed(monkeypatch):
    m = tiny("deepseek").train()
    with torch.no_grad():
        m.expert_bias.zero_()
    seen = []

    def all_reduce(t):  # another process whose tokens all chose expert 3
        seen.append(t.clone())
        t += torch.tensor([0.0, 0.0, 0.0, 1000.0])
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    m(images(b=2))
    m.after_step()
    assert len(seen) == 1 and seen[0].sum() == 3 * 2 * 17  # this process's tokens over the 3 steps
    assert m.expert_bias[3] == pytest.approx(-1e-3)  # overloaded in the global batch


def test_remoe_gates_are_exactly_relu_and_its_controller_raises_lambda_below_the_target_sparsity():
    m = tiny("remoe").train()
    x, y = images(b=2), torch.tensor([1, 2])
    lam0 = m.l1_lambda.item()
    assert lam0 == pytest.approx(1e-8) and "l1_lambda" in m.state_dict()
    m(x, y)
    h_gates = torch.cat([g.reshape(-1, 4) for g in m._last_gates])
    assert (h_gates == 0).any() and (h_gates > 0).any()
    constant_ffn_input(m, [0.8, 0.8, 0.8, 0.8])  # every gate relu(0.8) = 0.8 > 0: sparsity 0 < 0.75
    logits, loss = m(x, y)
    assert all(s == 0.0 for s in m.log_extras()["sparsity"])
    # ReMoE's load-balanced L1: f_e = E x (the tokens' active fraction) = 4, sum_e f_e g_e = 4 x 4 x 0.8
    assert m.aux["l1_loss"].item() == pytest.approx(12.8, rel=1e-6)
    assert loss.item() == pytest.approx(F.cross_entropy(logits, y).item() + lam0 * 12.8, rel=1e-6)
    m.after_step()
    assert m.l1_lambda.item() == pytest.approx(lam0 * 1.2)  # too dense: lambda x alpha
    constant_ffn_input(m, [-0.5, 0.3, -0.5, -0.5])  # one gate of 4 nonzero: sparsity 0.75, the target
    m(x, y)
    m.after_step()
    assert m.l1_lambda.item() == pytest.approx(lam0 * 1.2)  # at the target: unchanged
    constant_ffn_input(m, [-0.5, -0.5, -0.5, -0.5])  # every gate 0: sparsity 1 > 0.75
    m(x, y)
    assert m.log_extras()["sparsity"] == [1.0, 1.0, 1.0] and m.aux["l1_loss"].item() == 0.0
    m.after_step()
    m(x, y)
    m.after_step()
    assert m.l1_lambda.item() == pytest.approx(lam0 / 1.2)  # too sparse, twice: lambda / alpha^2
    assert m.log_extras()["l1_lambda"] == pytest.approx(lam0 / 1.2)


def test_remoe_controller_comes_back_from_a_long_sparse_phase():
    """lambda = lambda_0 alpha^(steps too dense - steps too sparse) (ReMoE sec. 3.3): 600 steps too sparse
    then 600 too dense bring it back to lambda_0 (a float32 lambda stops at 2.8e-45 after ~470 and stays there)."""
    m = tiny("remoe").train()
    for stats in ([1.0, 0.0],) * 600 + ([0.0, 1.0],) * 600:  # the zero and nonzero gates: sparsity 1, then 0
        m._stats = torch.tensor(stats)
        m.after_step()
    assert m.l1_lambda.item() == pytest.approx(1e-8, rel=1e-4)
    m._stats = torch.tensor([0.0, 1.0])
    m.after_step()
    assert m.aux_losses([torch.ones(1, 2, 4)])["l1"][0].dtype == torch.float32  # the loss stays float32
    assert m.l1_lambda.item() == pytest.approx(1.2e-8, rel=1e-4)


def test_softmoe_slots_are_the_patch_count_split_over_the_experts_and_the_router_is_l2_normalized():
    m = tiny("softmoe")
    assert m.router.weight.shape == (16, 32) and m.experts == 4  # 16 patch tokens: 4 slots per expert
    x = images()
    out = m(x)
    with torch.no_grad():
        m.router.weight.mul_(7.0)  # l2-normalized slot parameters: their scale does nothing
        assert torch.allclose(m(x), out, atol=1e-5)
        m.slot_scale.fill_(1.0)  # the learned scale does
        assert not torch.allclose(m(x), out, atol=1e-3)
    # constructed logits: slot j peaks (+50) on token 1 + j alone, so dispatch (softmax over the tokens)
    # hands slot j exactly token 1 + j, and combine (softmax over the slots) gives token 1 + j exactly
    # slot j's output, expert j // 4 on that token; token 0 (the class token, in no slot's peak) gets
    # the mean of the slots' outputs
    h, lg = torch.randn(2, 17, 32), torch.zeros(2, 17, 16)
    lg[:, 1:] = 50 * torch.eye(16)
    bank = m.blocks[0].mlp
    with torch.no_grad():
        y = revit_moe.soft_moe(bank, h, lg)
        want = torch.stack([ffn(h[:, 1 + j], *(w[j // 4] for w in bank.tensors())) for j in range(16)], 1)
    assert torch.allclose(y[:, 1:], want, atol=1e-5) and torch.allclose(y[:, 0], want.mean(1), atol=1e-5)
    with pytest.raises(ValueError, match="experts=3 must divide 16"):
        ReViTMoE(**TINY, experts=3, routing="softmoe")


@pytest.mark.parametrize("routing", NO_AUX)
def test_baselines_without_auxiliary_losses_train_on_the_task_loss_alone(routing):
    m = tiny(routing, lambda_bal=0.5, lambda_z=0.25, lambda_div=2.0).train()
    x, y = images(), torch.tensor([1, 2, 3])
    torch.manual_seed(0)
    logits, loss = m(x, y)
    assert torch.equal(loss, F.cross_entropy(logits.float(), y)) and set(m.aux) == {"ce_loss"}


@pytest.mark.parametrize("routing", ("lory", "smear"))
def test_soft_merges_start_uniform_and_lory_keeps_revits_three_losses(routing):
    m = tiny(routing, programmed=False, lambda_bal=0.5, lambda_z=0.25, lambda_div=2.0)
    x, y = images(), torch.tensor([1, 2, 3])
    logits, loss = m(x, y)
    assert torch.equal(torch.tensor(m.log_extras()["gates"]), torch.full((3, 4), 0.25))  # zero router (A.1)
    if routing == "lory":  # eq. 6 of a uniform gate: 0; eq. 8: (log E)^2; eq. 9 of the bank as reViT's
        assert m.aux["bal_loss"].item() == pytest.approx(0.0, abs=1e-6)
        assert m.aux["z_loss"].item() == pytest.approx(torch.log(torch.tensor(4.0)).item() ** 2, rel=1e-6)
        assert m.aux["div_loss"] == revit.router_losses(torch.zeros(1, 4), m.blocks[0].mlp)["div"]
        want = F.cross_entropy(logits, y) + 0.5 * m.aux["bal_loss"] + 0.25 * m.aux["z_loss"] + 2.0 * m.aux["div_loss"]
        assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    else:
        assert set(m.aux) == {"ce_loss"}


def test_lory_balance_is_eq6_on_each_image_and_step():
    m = tiny("lory")
    x = images()
    m(x, torch.tensor([1, 2, 3]))
    g = torch.cat(m._last_gates)  # (L B, E): each image's gate at each step
    want = (1 + (g * g.log()).sum(-1) / torch.log(torch.tensor(4.0))).mean()  # 1 - H(g) / log E
    assert m.aux["bal_loss"].item() == pytest.approx(want.item(), rel=1e-5) and want > 0.01


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
        assert torch.allclose(m(x, depth=depth), ref(x, depth=depth), atol=1e-6)


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
        assert torch.allclose(m(x, depth=depth), want, atol=1e-5), depth
    assert not torch.allclose(m(x, depth=4), lora_hand_forward(m, x, [0, 0, 0, 0]), atol=1e-4)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="routing"):
        ReViTMoE(**TINY, routing="token")
    with pytest.raises(ValueError, match="experts=1"):
        ReViTMoE(**TINY, experts=4, lora_rank=2)
    with pytest.raises(ValueError, match="routing"):
        ReViTMoE(**TINY, experts=1, routing="smear", lora_rank=2)
    for routing in ("deepseek", "qwen3", "moeut", "remoe", "softmoe"):
        with pytest.raises(ValueError, match="experts >= 2, got experts=1"):
            ReViTMoE(**TINY, experts=1, routing=routing)
    with pytest.raises(ValueError, match="depth"):
        tiny("smear").gates()
    with pytest.raises(ValueError, match="materializes"):
        tiny("qwen3").materialize()
    with pytest.raises(ValueError, match="materializes"):
        lora_model().materialize()


# ----------------------------------------------------------------------------- training contract
VARIANTS = [dict(routing=r) for r in ROUTINGS] + [dict(experts=1, lora_rank=2)]
AUX = {"lory": {"bal_loss", "z_loss", "div_loss"}, "remoe": {"l1_loss"}, "depth": {"bal_loss", "z_loss", "div_loss"}}


def variant_id(kw):
    return "lora" if "lora_rank" in kw else kw["routing"]


@pytest.mark.parametrize("kw", VARIANTS, ids=variant_id)
def test_every_parameter_gets_a_gradient(kw):
    m = tiny(programmed=False, **{"depth": 4, "layer_scale": 0.1, "depth_dropout": 0.3, **kw}).train()
    x, y = images(b=8), torch.randint(10, (8,))
    torch.manual_seed(1)
    logits, loss = m(x, y)
    loss.backward()
    assert [n for n, p in m.named_parameters() if p.grad is None] == []
    want = {"ce_loss"} | (AUX.get(kw.get("routing"), set()) if m.experts > 1 else set())
    assert set(m.aux) == want and all(torch.isfinite(v) for v in m.aux.values())


def test_dispatch_expert_without_tokens_still_gets_a_zero_gradient():
    m = tiny("qwen3").train()
    with torch.no_grad():  # logit_1 = -logit_0 and logit_3 = c * sum(h) = 0 (LayerNorm'd h): 3 never wins
        m.router.weight[1] = -m.router.weight[0]
        m.router.weight[3] = 1.0
    m(images(b=4), torch.arange(4))[1].backward()
    assert all(row[3] == 0 for row in m.log_extras()["gates"])
    g = m.blocks[0].mlp.fc1.weight.grad
    assert g is not None and not g[3].any() and g[0].any()


@pytest.mark.parametrize("kw", VARIANTS[1:], ids=variant_id)
def test_elastic_depth_image_keeping_n_steps_is_the_depth_n_model(kw):
    m = tiny(**{"depth": 5, **kw})
    if m.lora_rank:
        with torch.no_grad():
            for n, p in m.blocks[0].lora.items():
                p.normal_(0, 0.3) if n.endswith("_B") else None
    keep = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    x = images()
    out = m(x, keep=keep)
    for b, n in enumerate(keep.sum(1).tolist()):
        assert torch.allclose(out[b], m(x[b:b + 1], depth=n)[0], atol=1e-5)
    with pytest.raises(ValueError, match="keep"):
        m(x, keep=torch.zeros(3, 5, dtype=torch.bool))


@pytest.mark.parametrize("kw", VARIANTS[1:], ids=variant_id)
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


@pytest.mark.parametrize("kw", VARIANTS, ids=variant_id)
def test_flop_count_matches_torch_flop_counter(kw):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    m = tiny(**{"depth": 3, **kw})
    if m.default:  # reViT counts its materialized graph (its merging is per batch, see revit.py)
        m = m.materialize()
    with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH):
        m(images(b=1))
    assert m.flops_per_image() == fc.get_total_flops()


@pytest.mark.parametrize("kw", VARIANTS[1:], ids=variant_id)
def test_compile_regions_capture_whole_graphs(kw):
    import torch._dynamo
    torch._dynamo.reset()
    m = tiny(**kw)
    x = images()
    want = m(x)
    m.compile_regions(backend="eager")  # fullgraph: a graph break would raise
    assert torch.allclose(m(x), want, atol=1e-6)
    assert torch.allclose(m(x, depth=5), m.__class__.forward(m, x, depth=5), atol=1e-6)


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
        rec = json.loads((out / "log.jsonl").read_text().splitlines()[-1])
        if flags[1] == "deepseek":  # train.py calls after_step: the bias moved in 2 steps
            assert any(b != 0 for b in rec["expert_bias"]), rec
        if flags[1] == "remoe":
            assert rec["l1_lambda"] != pytest.approx(1e-8), rec
    assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--model", "revit", "--lora-rank", "2",
                             "--out-dir", str(tmp_path / "bad")]) == 2
    assert "experts" in capsys.readouterr().err
