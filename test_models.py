"""The models' own tests: the mathematics of each model file (the training loop's: tests/test_loop.py).

CPU only, tiny configurations, no dataset.
Run: python -m pytest -q test_models.py
"""
import ast
import inspect
import os

import pytest
import torch
import torch.nn.functional as F

import bvit
import inits
import odevit
import revit
import srvit

ROOT = os.path.dirname(os.path.abspath(__file__))

TINY = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=4)


def tiny(**kw):
    torch.manual_seed(0)
    return bvit.BViT(**{**TINY, **kw}).eval()


def images(b=3, size=16):
    return torch.randn(b, 3, size, size, generator=torch.Generator().manual_seed(1))


def run_blocks(model, x, block_ids):
    """Reference forward: embed, apply the given blocks in order, classify."""
    z = model.embed(x)
    for b in block_ids:
        z = model.blocks[b](z)
    return model.classify(z)


# ----------------------------------------------------------------------------- bvit.py
def test_shapes_and_loss_contract():
    m = tiny(depth=4)
    logits = m(images())  # timm's contract: the logits alone without targets
    assert torch.is_tensor(logits) and logits.shape == (3, 10)
    logits, loss = m(images(), targets=torch.tensor([1, 2, 3]))
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_recurrent_block_is_one_storage_and_params_do_not_grow_with_depth():
    m2, m12 = tiny(depth=2), tiny(depth=12)
    assert len(m12.blocks) == 1 and m12.phase_map() == [0] * 12
    assert m2.num_params() == m12.num_params()
    # every step runs the very same tensors: the model is the block applied 12 times
    x = images()
    assert torch.allclose(m12(x), run_blocks(m12, x, [0] * 12), atol=1e-6)


def test_param_count_formula():
    D, H, C, p, N, nb = 32, 128, 10, 4, 16, 3
    block = 2 * 2 * D + (3 * D * D + 3 * D) + (D * D + D) + (D * H + H) + (H * D + D)
    expected = (3 * p * p * D + D) + D + (N + 1) * D + nb * block + 2 * D + (D * C + C)
    assert tiny(depth=6, num_blocks=nb).num_params() == expected


def test_depth_override_uses_the_same_weights():
    m = tiny(depth=4)
    x = images()
    for d in (1, 3, 9):
        assert torch.allclose(m(x, depth=d), run_blocks(m, x, [0] * d), atol=1e-6)


def test_phase_map_four_blocks():
    m = tiny(depth=12, num_blocks=4)
    assert m.phase_map() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert m.phase_map(8) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert m.phase_map(6) == [0, 0, 1, 2, 2, 3]
    x = images()
    assert torch.allclose(m(x, depth=8), run_blocks(m, x, [0, 0, 1, 1, 2, 2, 3, 3]), atol=1e-6)
    # untied (num_blocks == depth): block k at step k, the plain ViT
    assert tiny(depth=5, num_blocks=5).phase_map() == [0, 1, 2, 3, 4]


def test_deep_supervision_loss_is_the_mean_of_stage_cross_entropies():
    m = tiny(depth=6, stages=3)
    x, y = images(), torch.tensor([0, 4, 9])
    logits, loss = m(x, y)
    z, ces = m.embed(x), []
    for k in range(6):
        z = m.blocks[0](z)
        if k in (1, 3, 5):
            ces.append(F.cross_entropy(m.classify(z), y))
    assert torch.allclose(loss, torch.stack(ces).mean(), atol=1e-6)
    assert torch.allclose(logits, m(x))  # returned logits are the last step's
    assert set(m.aux) == {"stage0_loss", "stage1_loss", "stage2_loss"}


def test_soft_targets_equal_hard_targets():
    m = tiny(depth=2, stages=2)
    x, y = images(), torch.tensor([3, 1, 7])
    assert torch.allclose(m(x, y)[1], m(x, F.one_hot(y, 10).float())[1], atol=1e-6)


def test_flop_count_matches_torch_flop_counter():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    for kw in (dict(depth=3), dict(depth=4, class_token=False, mlp_ratio=2.0)):
        m = tiny(**kw)
        # the math backend runs attention as two bmm's, which the counter sees on CPU
        with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH):
            m(images(b=1))
        assert m.flops_per_image() == fc.get_total_flops()
    assert m.flops_per_image(depth=8) > m.flops_per_image()


def test_bad_sizes_raise_value_error():
    with pytest.raises(ValueError, match="patch_size"):
        tiny(img_size=18)
    with pytest.raises(ValueError, match="num_heads"):
        tiny(num_heads=5)
    with pytest.raises(ValueError, match="stages"):
        tiny(depth=6, stages=4)
    with pytest.raises(ValueError, match="depth"):
        tiny(depth=4)(images(), depth=0)


@pytest.mark.parametrize("variant", ["cls", "gap", "layerscale", "dynamic"])
def test_untied_model_loads_timm_state_dict_and_matches_logits(variant):
    timm = pytest.importorskip("timm")
    kw = dict(img_size=32, patch_size=4, num_classes=10, embed_dim=64, depth=3, num_heads=4)
    tkw, ours = {}, {}
    if variant == "gap":  # timm's default GAP: no `norm` parameters, fc_norm after the mean
        tkw, ours = dict(class_token=False, global_pool="avg"), dict(class_token=False)
    if variant == "layerscale":
        tkw, ours = dict(init_values=0.1), dict(layer_scale=0.1)
    if variant == "dynamic":  # 48x24 images on a model built for 32x32: pos_embed resampled alike
        tkw = ours = dict(dynamic_img_size=True)
    torch.manual_seed(0)
    ref = timm.models.vision_transformer.VisionTransformer(**kw, **tkw).eval()
    m = bvit.BViT(**kw, num_blocks=3, **ours).eval()
    m.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 48, 24) if variant == "dynamic" else torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(m(x), ref(x), atol=1e-5)


def test_size_helpers():
    with torch.device("meta"):  # shapes only: no memory, no init cost
        assert bvit.bvit_s(num_classes=100).embed_dim == 384 and len(bvit.bvit_s().blocks) == 1
        assert len(bvit.vit_b().blocks) == 12 and bvit.vit_l().depth == 24
        assert bvit.vit_ti(img_size=32, patch_size=4).num_heads == 3
        assert bvit.vit_b().num_params() == 86_567_656  # timm's vit_base_patch16_224


# ----------------------------------------------------------------------------- all four models
# dynamic_img_size and set_grad_checkpointing, one tiny configuration per model (and revit's two paths)
ZOO = {"bvit": (bvit, dict(depth=4, stages=2)),
       "revit": (revit, dict(depth=4, experts=3, depth_dropout=0.3)),  # elastic depth in training
       "revit-grid": (revit, dict(depth=3, experts=2, depth_dropout=0.0)),
       "srvit": (srvit, dict(depth=2, recursions=2)),
       "odevit": (odevit, dict(depth=2, solver="heun"))}
CLASSES = {bvit: bvit.BViT, revit: revit.ReViT, srvit: srvit.SRViT, odevit: odevit.ODEViT}
BLOCK_CALLS = {"bvit": 4, "revit": 4, "revit-grid": 3, "srvit": 4, "odevit": 4}  # per forward


def build(name, **kw):
    torch.manual_seed(0)
    mod, base = ZOO[name]
    return CLASSES[mod](**{**TINY, **base, **kw})


@pytest.mark.parametrize("name", sorted(ZOO))
@torch.no_grad()
def test_a_model_takes_a_batch_gives_features_without_a_head_and_runs_in_its_own_half_dtype(name):
    """Issue 52, items 7 and 16, in every model file: an unbatched (C, H, W) image is refused naming the
    batch dimension (it used to fail deep inside with a size error); num_classes=0 has no head and returns
    the pooled features (B, D) the head reads (timm's convention), not empty logits; a model cast whole
    to bfloat16 or float16 runs in that dtype (SR-ViT's fp32 mixture sums used to meet bf16 weights)."""
    m = build(name).eval()
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\), got shape \(3, 16, 16\); add the batch dimension"):
        m(images()[0])
    x = images()
    bare = build(name, num_classes=0).eval()
    missing = bare.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("head.")}, strict=False)
    assert not missing.missing_keys and not missing.unexpected_keys  # the same model less its head
    feats = bare(x)
    assert feats.shape == (3, 32) and torch.allclose(m.head(feats), m(x), atol=1e-6)
    for dtype in (torch.bfloat16, torch.float16):
        out = build(name).eval().to(dtype)(x.to(dtype))
        assert out.dtype == dtype and torch.allclose(out.float(), m(x), atol=0.1), (dtype, name)


ANYTIME = {"vit": (bvit, dict(depth=3, num_blocks=3)), "bvit-phases": (bvit, dict(depth=4, num_blocks=2)),
           "revit": (revit, dict(depth=3, experts=3)),
           "srvit": (srvit, dict(depth=2, recursions=2)), "odevit-rk4": (odevit, dict(depth=2, solver="rk4")),
           "odevit-blackbox": (odevit, dict(depth=3, solver="euler", field="blackbox"))}


@pytest.mark.parametrize("name", sorted(ANYTIME))
@torch.no_grad()
def test_begin_step_readout_is_forward_bit_for_bit_at_every_depth(name):
    """The anytime interface (the same in every model file): begin, step k = 0..L-1, readout gives
    forward(x, depth=L) bit for bit, at the trained depth and beyond it (for the models that run there),
    reading out after every step; a state indexed by rows runs on as those images alone would."""
    torch.manual_seed(0)
    mod, kw = ANYTIME[name]
    m = CLASSES[mod](**{**TINY, **kw}).eval()
    if mod is revit:
        with torch.no_grad():  # steps with different gates
            for prm in m.router.parameters():
                prm.normal_(0, 1.0)
    x = images(4)
    trained = m.recursions if mod is srvit else m.steps if mod is odevit else m.depth
    for depth in ([trained] if name == "vit" else [1, trained, trained + 2]):
        state = m.begin(x)
        for k in range(depth):
            state = m.step(state, k, depth)
        assert torch.equal(m.readout(state), m(x, depth=depth)), depth
    state, rows = m.begin(x), torch.tensor([0, 2])
    state = m.step(state, 0, trained)
    kept = tuple(t[rows] for t in state) if isinstance(state, tuple) else state[rows]
    alone = m.step(m.begin(x[rows]), 0, trained)
    for k in range(1, trained):
        kept, alone = m.step(kept, k, trained), m.step(alone, k, trained)
    assert torch.allclose(m.readout(kept), m.readout(alone), atol=1e-5)
    assert m.blocks_per_step == {"srvit": 2, "odevit-rk4": 4}.get(name, 1)


def drop_rates(m):
    """The drop-path rate of each block application of one forward at the trained depth, in order."""
    if isinstance(m, bvit.BViT):
        return [m.blocks[b].drop_prob.item() for b in m.phase_map()]
    if isinstance(m, srvit.SRViT):
        return [blk.drop_prob.item() for _ in range(m.recursions) for blk in m.blocks]
    applications = m.steps * odevit.NFE_PER_STEP[m.solver] if isinstance(m, odevit.ODEViT) else m.depth
    return [m.blocks[0].drop_prob.item()] * applications  # one shared block (reViT, ODEViT)


@pytest.mark.parametrize("rate", [0.05, 0.1, 0.3])
@pytest.mark.parametrize("steps", [1, 2, 4, 8, 12])
def test_every_model_drops_at_the_untied_vits_mean_rate_and_each_block_at_its_steps_mean(rate, steps):
    """One drop-path rule (issue 50): over the `steps` block applications of a forward, each model's mean
    rate is the untied ViT's (timm's linspace(0, rate, steps)), and every block's rate is that schedule's
    mean over the applications it serves (a one-block bViT once ran at the full rate: twice the ViT's)."""
    kw = dict(TINY, drop_path_rate=rate)
    untied = torch.linspace(0, rate, steps).double()
    vit = bvit.BViT(**kw, depth=steps, num_blocks=steps)
    assert drop_rates(vit) == pytest.approx(untied.tolist(), abs=1e-7)  # DeiT/timm exactly
    models = {f"bvit-{n}": bvit.BViT(**kw, depth=steps, num_blocks=n) for n in (1, 2, 4) if n <= steps}
    models["revit"] = revit.ReViT(**kw, depth=steps, experts=2)
    for solver, per in odevit.NFE_PER_STEP.items():  # the same block applications: steps / per solver steps
        if steps % per == 0:
            models[f"odevit-{solver}"] = odevit.ODEViT(**kw, depth=steps // per, solver=solver)
    for body in (1, 2, 4):
        if steps % body == 0:
            models[f"srvit-{body}x{steps // body}"] = srvit.SRViT(**kw, depth=body, recursions=steps // body)
    for name, m in models.items():
        r = torch.tensor(drop_rates(m)).double()
        assert len(r) == steps and abs(r.mean() - untied.mean()) < 1e-7, name
        for v in r.unique():  # each distinct rate: one block's, over the applications it serves
            served = (r - v).abs() < 1e-9
            assert abs(untied[served].mean() - v) < 1e-7, (name, v.item())
    if steps > 1:
        assert models["bvit-1"].blocks[0].drop_prob.item() == pytest.approx(rate / 2)


# Each model file stands alone, so its small primitives are copies; a copy that drifts (one file's
# drop_path drawing masks another way) silently changes one model. Copies must stay textually equal.
MODEL_FILES = {"bvit.py": "BViT", "revit.py": "ReViT", "srvit.py": "SRViT", "odevit.py": "ODEViT",
               "revit_moe.py": "ReViTMoE"}
DIFFER_BY_DESIGN = {("revit.py", "Block"): "its FFN weights are arguments (the merged experts)",
                    **{(f, "_sized"): "each file's own named sizes" for f in ("bvit.py", "srvit.py", "odevit.py")}}
SHARED_METHODS = ("embed", "classify", "set_grad_checkpointing", "_step", "forward_features", "forward_head",
                  "no_weight_decay")  # of each model class


def definitions(path):
    """A model file's top-level functions, classes and assignments, and its model class's methods
    as "Class.name": name -> (first line, source text with decorators and comments)."""
    src = open(os.path.join(ROOT, path)).read()
    lines = src.splitlines()

    def text(node):
        first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        return first, "\n".join(lines[first - 1:node.end_lineno])
    out = {}
    for node in ast.parse(src).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = text(node)
        elif isinstance(node, ast.Assign):
            out.update({t.id: text(node) for t in node.targets if isinstance(t, ast.Name)})
        if isinstance(node, ast.ClassDef) and node.name == MODEL_FILES[path]:
            out.update({f"Model.{m.name}": text(m) for m in node.body if isinstance(m, ast.FunctionDef)})
    return out


def test_repeated_primitives_are_identical_in_every_model_file():
    defs = {f: definitions(f) for f in MODEL_FILES}
    copies = {}  # name -> {file: text}
    for f, d in defs.items():
        for name, (_, src) in d.items():
            if (f, name) not in DIFFER_BY_DESIGN and (not name.startswith("Model.") or name[6:] in SHARED_METHODS):
                copies.setdefault(name, {})[f] = src
    for name, by_file in copies.items():
        variants = {}
        for f, src in by_file.items():
            variants.setdefault(src, []).append(f)
        assert len(variants) == 1, f"{name} differs between the model files: {sorted(variants.values())}"
    repeated = {name for name, by_file in copies.items() if len(by_file) >= 3}
    assert {"drop_path", "shared_drop_rate", "LayerScale", "Attention", "Mlp", "Block", "classification_loss",
            "resample_pos_embed", "apply_step", "take_indices",
            *(f"Model.{m}" for m in SHARED_METHODS)} <= repeated  # not vacuous


def test_model_files_stay_short_and_bvit_reaches_its_forward_first():
    """Issue 78's targets: bvit.py at most 450 lines with BViT.forward before line 200, revit.py at most 600;
    the attention-init study lives in inits.py only (no model file defines init_attention_)."""
    length = {f: len(open(os.path.join(ROOT, f)).read().splitlines()) for f in MODEL_FILES}
    assert length["bvit.py"] <= 450 and length["revit.py"] <= 600, length
    assert definitions("bvit.py")["Model.forward"][0] < 200
    assert not any("init_attention_" in definitions(f) for f in MODEL_FILES)


def test_each_model_file_reaches_its_forward_before_its_optional_machinery():
    for f in MODEL_FILES:
        d = definitions(f)
        forward = d["Model.forward"][0]
        later = [n for n in ("init_attention_", "resample_pos_embed", "Model._init_weights", "Model.compile_regions",
                             "Model.flops_per_image") if n in d]
        assert len(later) >= 2 and all(d[n][0] > forward for n in later), (f, {n: d[n][0] for n in later}, forward)
    revit_defs = definitions("revit.py")
    assert revit_defs["to_device"][0] < revit_defs["Block"][0]  # defined before the block that calls it


@pytest.mark.parametrize("mod", [bvit, revit, srvit, odevit], ids=lambda m: m.__name__)
def test_resample_pos_embed(mod):
    pos = torch.randn(1, 1 + 16, 8)
    assert mod.resample_pos_embed(pos, (4, 4), 1) is pos  # same grid: unchanged
    flat = torch.cat([pos[:, :1], pos[:, 1:2].expand(1, 16, 8)], dim=1)  # constant over the 4x4 grid
    out = mod.resample_pos_embed(flat, (6, 3), 1)
    assert out.shape == (1, 1 + 18, 8) and torch.equal(out[:, 0], pos[:, 0])  # class row kept
    assert torch.allclose(out[:, 1:], flat[:, 1:2].expand(1, 18, 8), atol=1e-6)  # still constant
    assert mod.resample_pos_embed(pos[:, 1:], (8, 8), 0).shape == (1, 64, 8)
    with pytest.raises(ValueError, match="square"):
        mod.resample_pos_embed(pos[:, :15], (4, 4), 1)
    timm = pytest.importorskip("timm")
    assert torch.allclose(mod.resample_pos_embed(pos, (6, 3), 1),
                          timm.layers.resample_abs_pos_embed(pos, (6, 3), num_prefix_tokens=1), atol=1e-6)


@pytest.mark.parametrize("class_token", [True, False])
@pytest.mark.parametrize("name", ["bvit", "revit", "srvit", "odevit"])
def test_dynamic_img_size_equals_the_model_built_at_that_size(name, class_token):
    small = build(name, class_token=class_token, dynamic_img_size=True).eval()
    big = build(name, class_token=class_token, img_size=32).eval()
    state = small.state_dict()
    state["pos_embed"] = ZOO[name][0].resample_pos_embed(state["pos_embed"], (8, 8), int(class_token))
    big.load_state_dict(state, strict=True)
    fixed = build(name, class_token=class_token).eval()
    fixed.load_state_dict(small.state_dict(), strict=True)
    with torch.no_grad():
        assert torch.allclose(small(images(size=32)), big(images(size=32)), atol=1e-5)
        assert torch.equal(small(images()), fixed(images()))  # at its own size: no change
        assert small(torch.randn(2, 3, 24, 12)).shape == (2, 10)  # any grid, not only squares
    with pytest.raises(ValueError, match="dynamic_img_size"):
        fixed(images(size=32))
    with pytest.raises(ValueError, match="patch_size"):
        small(images(size=18))


def train_three_steps(name, checkpointing):
    """(loss, gradients) of the first step and the weights after 3 AdamW steps, drop path on."""
    m = build(name, drop_path_rate=0.2).train().set_grad_checkpointing(checkpointing)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x, y = images(b=8), torch.arange(8)
    torch.manual_seed(1)
    for step in range(3):
        opt.zero_grad()
        loss = m(x, y)[1]
        loss.backward()
        if step == 0:
            first = loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}
        opt.step()
    return first, m.state_dict()


@pytest.mark.parametrize("name", list(ZOO))
def test_grad_checkpointing_gives_the_same_loss_gradients_and_weights(name):
    (loss, grads), weights = train_three_steps(name, False)
    (loss_ck, grads_ck), weights_ck = train_three_steps(name, True)
    assert torch.equal(loss, loss_ck)
    for n in grads:
        assert torch.allclose(grads[n], grads_ck[n], atol=1e-6), n
    for n in weights:
        assert torch.allclose(weights[n], weights_ck[n], atol=1e-6), n


@pytest.mark.parametrize("name", list(ZOO))
def test_grad_checkpointing_wraps_each_block_call_in_training_only(name, monkeypatch):
    mod, calls = ZOO[name][0], []
    monkeypatch.setattr(mod, "checkpoint", lambda fn, *a, real=mod.checkpoint, **kw: calls.append(fn) or
                        real(fn, *a, **kw))
    m, x = build(name).set_grad_checkpointing(), images(b=8)
    ref = build(name).eval()(x)
    assert torch.equal(m.eval()(x), ref) and not calls  # eval: off
    with torch.no_grad():
        m.train()(x)
    assert not calls  # no gradient: off
    m(x).sum().backward()
    assert len(calls) == BLOCK_CALLS[name]


# ----------------------------------------------------------------------------- timm's features API (issue 65)
API = {"vit": (bvit, dict(depth=3, num_blocks=3)), "bvit-gap": (bvit, dict(depth=3, class_token=False)),
       "revit": (revit, dict(depth=3, experts=3)), "srvit": (srvit, dict(depth=2, recursions=2)),
       "odevit-heun": (odevit, dict(depth=2, solver="heun")),
       **{f"revit_moe-{r}": ("revit_moe", dict(depth=3, experts=2, routing=r)) for r in ("lory", "remoe", "qwen3")},
       "revit_moe-lora": ("revit_moe", dict(depth=3, experts=1, lora_rank=2))}


def token_states(m, x, indices=None, **kw):
    """forward_intermediates' states as the tokens (B, T, D), class token first (timm's NLC with its prefix put back)."""
    final, states = m.forward_intermediates(x, indices, output_fmt="NLC", return_prefix_tokens=True, **kw)
    return final, [torch.cat([s[1], s[0]], 1) if isinstance(s, tuple) else s for s in states]


def api_model(name, **kw):
    torch.manual_seed(0)
    mod, base = API[name]
    if mod == "revit_moe":
        import revit_moe
        return revit_moe.ReViTMoE(**{**TINY, **base, **kw}).eval()
    m = CLASSES[mod](**{**TINY, **base, **kw}).eval()
    if mod is revit:
        with torch.no_grad():  # steps with different gates
            for prm in m.router.parameters():
                prm.normal_(0, 1.0)
    return m


@pytest.mark.parametrize("name", sorted(API))
@torch.no_grad()
def test_the_features_api_is_the_forward_step_by_step_at_the_trained_depth_and_another(name):
    """Issue 65, item 1, one contract for every classifier: forward_intermediates' states are the anytime
    steps' states and its final tokens the normalized last state (SR-ViT: its mixture), forward_head of
    forward_features is forward's logits bit for bit, indices and norm pick and normalize as timm's, and
    reset_classifier / num_classes=0 give timm's heads; at the trained depth and 2 steps beyond it."""
    m, x = api_model(name), images(4)
    trained = getattr(m, "recursions", m.depth)
    for depth in (trained, trained + 2):
        final, states = token_states(m, x, depth=depth)
        logits = m(x, depth=depth)
        assert len(states) == depth and all(s.shape == final.shape == (4, 16 + (name != "bvit-gap"), 32)
                                            for s in states)
        assert torch.equal(m.forward_head(final), logits), depth
        assert torch.equal(m.forward_features(x, depth=depth), final)
        state = m.begin(x)
        for k in range(depth):  # the anytime steps' states (SR-ViT: the recursion's tokens h_r)
            state = m.step(state, k, depth)
            assert torch.equal(states[k], state[0] if name == "srvit" else state), (depth, k)
        if name != "srvit":
            assert torch.equal(final, m.norm(states[-1]))
        last2, ends = token_states(m, x, 2, depth=depth)[1], token_states(m, x, [0, -1], depth=depth)[1]
        assert all(torch.equal(a, b) for a, b in zip(last2 + ends, states[-2:] + [states[0], states[-1]]))
        normed = token_states(m, x, indices=[-1], norm=True, depth=depth)[1]
        assert len(last2) == 2 and len(ends) == 2 and torch.equal(normed[0], m.norm(states[-1]))
        early_final, early = token_states(m, x, [0], stop_early=True, depth=depth)  # timm: the run stops there
        assert torch.equal(early[0], states[0]) and (name == "srvit" or torch.equal(early_final, m.norm(states[0])))
        with pytest.raises(ValueError, match=f"steps 0..{depth - 1}"):
            m.forward_intermediates(x, [depth], depth=depth)
    pooled = m.forward_head(m.forward_features(x), pre_logits=True)
    assert pooled.shape == (4, 32) and torch.equal(m.head(pooled), m(x))
    assert m.no_weight_decay() <= {n for n, _ in m.named_parameters()} | {"cls_token"}
    m.reset_classifier(5)
    assert m(x).shape == (4, 5) and m.num_classes == 5
    m.reset_classifier(0)  # timm: no head, the pooled features
    assert torch.equal(m(x), pooled) and isinstance(m.head, torch.nn.Identity)


@torch.no_grad()
def test_the_features_api_is_timms_on_timms_weights():
    """Issue 79: the untied ViT with timm's weights answers timm's forward_intermediates calls with timm's tensors, for
    every combination of its arguments (indices an int, a list, None; prefix tokens; norm; stop_early; NCHW, NLC;
    intermediates_only; output_dict), positionally as timm's signature orders them; forward_features and forward_head
    are timm's. A second positional argument is `indices` (the last 2), never the depth."""
    timm = pytest.importorskip("timm")
    import itertools
    kw = dict(img_size=32, patch_size=8, num_classes=10, embed_dim=32, depth=3, num_heads=2)
    torch.manual_seed(0)
    ref = timm.models.vision_transformer.VisionTransformer(**kw).eval()
    m = bvit.BViT(**kw, num_blocks=3).eval()
    m.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 32)

    def same(a, b):
        if torch.is_tensor(a):
            return torch.is_tensor(b) and a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        return type(a) is type(b) and len(a) == len(b) and all(same(u, v) for u, v in zip(a, b))
    calls = 0
    for args in itertools.product([None, 2, 3, [0, 2], [-2], (1,)], *[[False, True]] * 3, ["NCHW", "NLC"],
                                  *[[False, True]] * 2):
        assert same(m.forward_intermediates(x, *args), ref.forward_intermediates(x, *args)), args
        calls += 1
    assert calls == 6 * 8 * 2 * 4
    assert same(m.forward_features(x), ref.forward_features(x))
    final = m.forward_features(x)
    assert same(m.forward_head(final, pre_logits=True), ref.forward_head(final, pre_logits=True))
    mine = inspect.signature(m.forward_intermediates).parameters
    theirs = inspect.signature(ref.forward_intermediates).parameters
    assert [p for p in mine if p != "depth"] == [p for p in theirs if p not in ("attn_mask", "is_causal")]
    assert mine["depth"].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(ValueError, match="output_fmt='NHWC'"):
        m.forward_intermediates(x, output_fmt="NHWC")


@pytest.mark.parametrize("name", sorted(API))
@torch.no_grad()
def test_timms_evaluation_idiom_and_attributes_run_on_every_classifier(name):
    """Issue 79: code written for timm's VisionTransformer runs unchanged: model(x) is the logits (argmax,
    cross_entropy), resolve_data_config reads pretrained_cfg (not timm's fallback), num_features, get_classifier,
    reset_classifier(n, global_pool), and feature_info has one entry per step; NCHW states are the patch grid."""
    timm = pytest.importorskip("timm")
    m, x, y = api_model(name), images(4), torch.tensor([1, 2, 3, 4])
    logits = m(x)
    assert torch.is_tensor(logits) and logits.shape == (4, 10)
    assert torch.equal(m(x).argmax(-1), logits.argmax(-1))
    assert torch.equal(F.cross_entropy(m(x), y), F.cross_entropy(logits, y))
    assert torch.equal(m(x, y)[0], logits) and m(x, y)[1].ndim == 0  # the training loop's form is kept
    m.pretrained_cfg = m.default_cfg = {**m.pretrained_cfg, "mean": (0.5071, 0.4865, 0.4409)}  # as a CIFAR run's
    cfg = timm.data.resolve_data_config({}, model=m)
    assert cfg["input_size"] == (3, 16, 16) and cfg["mean"] == (0.5071, 0.4865, 0.4409), cfg
    assert m.num_features == m.head_hidden_size == 32 and m.get_classifier() is m.head
    steps = getattr(m, "recursions", None) or getattr(m, "steps", None) or m.depth
    assert len(m.feature_info) == steps and all(f["num_chs"] == 32 and f["reduction"] == 4 for f in m.feature_info)
    assert all(isinstance(m.get_submodule(f["module"]), torch.nn.Module) for f in m.feature_info)
    grid = m.forward_intermediates(x, 1, intermediates_only=True)  # NCHW: the patch grid, no class token
    assert len(grid) == 1 and grid[0].shape == (4, 32, 4, 4)
    m.reset_classifier(5, m.global_pool)
    assert m(x).shape == (4, 5) and m.num_classes == 5
    with pytest.raises(ValueError, match="global_pool='max'"):
        m.reset_classifier(5, "max")


# ----------------------------------------------------------------------------- your own block (issue 65, item 2)
class ParallelBlock(bvit.Block):
    """A parallel block (GPT-J, PaLM, ViT-22B: attention and MLP read the same input), Block's parts kept."""

    def forward(self, x):
        dp = self.training and self.stochastic
        attn = bvit.drop_path(self.ls1(self.attn(self.norm1(x))), self.drop_prob, dp)
        return x + attn + bvit.drop_path(self.ls2(self.mlp(self.norm2(x))), self.drop_prob, dp)


class RMSNormBlock(revit.Block):
    """reViT's block with RMSNorm (Zhang & Sennrich 2019) in place of its two LayerNorms: another norm."""

    def __init__(self, dim, **kw):
        super().__init__(dim=dim, **kw)
        self.norm1, self.norm2 = torch.nn.RMSNorm(dim, eps=1e-6), torch.nn.RMSNorm(dim, eps=1e-6)


BLOCK_FN = {"bvit-phases": (bvit, dict(depth=4, num_blocks=2), ParallelBlock),
            "srvit": (srvit, dict(depth=2, recursions=2), ParallelBlock),
            "odevit": (odevit, dict(depth=2, solver="heun"), ParallelBlock),
            "revit": (revit, dict(depth=3, experts=2), RMSNormBlock)}


@pytest.mark.parametrize("name", sorted(BLOCK_FN))
def test_your_own_block_keeps_layer_scale_drop_path_init_and_compiles(name):
    """block_fn (timm's name) swaps the recurrent block without touching self.blocks: built with the model's
    LayerScale init and each block's drop-path rate, initialized by the model's init (the same weights,
    tensor for tensor, as the default block's at the same seed; mimetic attention included), and the
    block's regional compile (fullgraph) gives the eager outputs."""
    mod, kw, block_fn = BLOCK_FN[name]
    kw = {**TINY, **kw, "layer_scale": 0.1, "drop_path_rate": 0.2, "init": inits.mimetic}
    torch.manual_seed(0)
    ref = CLASSES[mod](**kw).eval()
    torch.manual_seed(0)
    m = CLASSES[mod](**kw, block_fn=block_fn).eval()
    assert all(type(b) is block_fn for b in m.blocks) and len(m.blocks) == len(ref.blocks)
    assert drop_rates(m) == drop_rates(ref) and all(b.stochastic for b in m.blocks)
    want = ref.state_dict()
    for k, v in m.state_dict().items():  # LayerScale at 0.1 and the model's init, parameter for parameter
        assert torch.equal(v, want[k]) if ".norm" not in k else v.shape == want[k].shape, k  # (RMSNorm: no bias)
    assert all(torch.equal(b.ls1.gamma, torch.full((32,), 0.1)) for b in m.blocks)
    x = images()
    eager = m(x)
    assert not torch.allclose(eager, ref(x))  # another block runs
    m.compile_regions(backend="eager")  # fullgraph: a graph break would raise
    with torch.no_grad():
        assert torch.allclose(m(x), eager, atol=1e-6)
    m.train()(x, torch.arange(3))[1].backward()  # drop path on: it trains
    assert all(p.grad is not None for n, p in m.named_parameters() if n.startswith("blocks."))


def test_a_block_without_attention_refuses_an_attention_init():
    class MlpOnly(torch.nn.Module):  # no attn: nothing for init="mimetic" to set
        def __init__(self, dim, **kw):
            super().__init__()
            self.mlp = bvit.Mlp(dim, dim)

        def forward(self, x):
            return x + self.mlp(x)
    assert bvit.BViT(**TINY, depth=2, block_fn=MlpOnly)(images()).shape == (3, 10)
    with pytest.raises(ValueError, match="init='mimetic' sets each block's attn.qkv.*MlpOnly"):
        bvit.BViT(**TINY, depth=2, block_fn=MlpOnly, init=inits.mimetic)
    import revit_moe
    with pytest.raises(ValueError, match="block_fn: routing='smear'"):
        revit_moe.ReViTMoE(**TINY, depth=2, experts=2, routing="smear", block_fn=RMSNormBlock)

