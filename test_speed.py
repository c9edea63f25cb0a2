"""Tests for the fast paths (issue: speed): the Triton merged-expert FFN against its reference
(on CPU under TRITON_INTERPRET=1), the GPU-resident CIFAR loader (run here on the CPU device),
and regional compilation without recompiles. CUDA-only checks skip on CPU."""
import os
import subprocess
import sys

import pytest
import torch

import data

ROOT = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------- kernels.py
KERNEL_CHECK = r"""
import torch, kernels
assert kernels.triton_usable(torch.zeros(1)), "TRITON_INTERPRET=1 should enable the kernel on CPU"
launches = []  # every Triton layer launch: (x dtype, weight dtype)
real_linear = kernels._merged_linear
kernels._merged_linear = lambda x, g, w, *a, **k: launches.append((x.dtype, w.dtype)) or real_linear(x, g, w, *a, **k)
torch.manual_seed(0)
B, T, D, H, E = 3, 37, 24, 72, 4   # T, H not multiples of the tiles: masks are exercised
x = torch.randn(B, T, D, requires_grad=True)
g = torch.softmax(torch.randn(B, E), 1).requires_grad_()
ws = [torch.randn(E, H, D), torch.randn(E, H), torch.randn(E, D, H), torch.randn(E, D)]
ws = [w.requires_grad_() for w in ws]
y = kernels.merged_ffn(x, g, *ws)
r = kernels.merged_ffn_reference(x, g, *ws)
assert y.shape == (B, T, D) and len(launches) == 2
assert torch.allclose(y, r, atol=1e-4, rtol=1e-4), (y - r).abs().max()
gy = torch.randn_like(y)
for a, b in zip(torch.autograd.grad(y, [x, g, *ws], gy), torch.autograd.grad(r, [x, g, *ws], gy)):
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
# the reference itself against a per-image loop of dense FFNs
for b in range(B):
    W1, b1, W2, b2 = (torch.tensordot(g[b], w, dims=1) for w in ws)
    ref = torch.nn.functional.gelu(x[b] @ W1.T + b1) @ W2.T + b2
    assert torch.allclose(r[b], ref, atol=1e-4, rtol=1e-4)
# every autotuned tile shape (the GPU's configs, run here by the interpreter) at T = 197
xl = torch.randn(2, 197, D)
for cfg in kernels.CONFIGS:
    h = kernels._merged_linear(xl, g[:2].detach(), ws[0].detach(), ws[1].detach(), True, cfg)
    W1 = torch.einsum("be,ehd->bhd", g[:2].detach(), ws[0].detach())
    want = torch.nn.functional.gelu(torch.baddbmm((g[:2].detach() @ ws[1].detach())[:, None], xl, W1.mT))
    assert torch.allclose(h, want, atol=1e-4, rtol=1e-4), (cfg, (h - want).abs().max())
# bf16 autocast: the kernel gets bf16 inputs (fp32 gates), returns bf16; the backward recomputes under
# the same autocast (interpreter: bf16 rounding truncates, hence the loose tolerance)
launches.clear()
with torch.autocast("cpu", dtype=torch.bfloat16):
    y = kernels.merged_ffn(x, g, *ws)
    r = kernels.merged_ffn_reference(x, g, *ws)
assert launches == [(torch.bfloat16, torch.bfloat16)] * 2 and y.dtype == r.dtype == torch.bfloat16
scale = r.float().abs().max()
assert (y.float() - r.float()).abs().max() < 4e-2 * scale, (y.float() - r.float()).abs().max() / scale
gy = torch.randn_like(y)
for a, b in zip(torch.autograd.grad(y, [x, g, *ws], gy), torch.autograd.grad(r, [x, g, *ws], gy)):
    assert a.dtype == torch.float32 and torch.equal(a, b)  # the same recompute, bit for bit
# bf16 experts with fp32 gates (reViT's elastic step on a model.to(bfloat16)): forward and backward
wb = [w.detach().bfloat16().requires_grad_() for w in ws]
xb = x.detach().bfloat16().requires_grad_()
y = kernels.merged_ffn(xb, g, *wb)
y.float().sum().backward()
assert y.dtype == torch.bfloat16 and g.grad.dtype == torch.float32 and all(w.grad.dtype == torch.bfloat16 for w in wb)
# reViT: training takes the grouped path (no launch), inference the kernel, and they agree
import revit
m = revit.ReViT(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=4, depth=5,
                experts=3, depth_dropout=0.4).train()
with torch.no_grad():
    for p in m.router.parameters():
        p.normal_()  # non-uniform gates
xi, yi = torch.randn(6, 3, 16, 16), torch.arange(6)
keep = revit.sample_keep(6, 5, 0.4)
launches.clear()
m(xi, yi, keep=keep)[1].backward()
assert launches == [], "a training step should not launch the kernel"
with torch.no_grad():
    fused = m.eval()(xi, keep=keep)[0]
    assert len(launches) == 2 * int(keep.any(0).sum())  # two layers per step that some image keeps
    kernel, revit.merged_ffn = revit.merged_ffn, None  # force the grouped plain-PyTorch path
    grouped = m(xi, keep=keep)[0]
    revit.merged_ffn = kernel
assert torch.allclose(fused, grouped, atol=1e-4), (fused - grouped).abs().max()
# a bf16 elastic-depth reViT trains (its first version failed in the kernel's backward)
m = m.train().to(torch.bfloat16)
m(xi.bfloat16(), yi)[1].backward()
assert all(p.grad is not None and p.grad.isfinite().all() for p in m.parameters())
with torch.no_grad():
    launches.clear()
    assert m.eval()(xi.bfloat16(), keep=keep)[0].dtype == torch.bfloat16 and launches
print("ok")
"""


def test_triton_merged_ffn_equals_reference_under_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # read when kernels.py is imported
    r = subprocess.run([sys.executable, "-c", KERNEL_CHECK], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_merged_ffn_falls_back_to_reference_without_triton_device():
    import kernels
    if kernels.triton_usable(torch.zeros(1)):
        pytest.skip("TRITON_INTERPRET=1 is set in this process")
    x, g = torch.randn(2, 5, 8), torch.softmax(torch.randn(2, 3), 1)
    ws = [torch.randn(3, 16, 8), torch.randn(3, 16), torch.randn(3, 8, 16), torch.randn(3, 8)]
    assert torch.equal(kernels.merged_ffn(x, g, *ws), kernels.merged_ffn_reference(x, g, *ws))


def test_merged_ffn_reference_merges_fp32_gates_in_the_experts_bf16():
    """The reference is the kernel's backward: with bf16 experts (model.to(bfloat16)) and fp32 gates
    it merges in bf16, as revit.ExpertMlp.merge does, and its gradients keep each input's dtype."""
    import kernels
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8).bfloat16().requires_grad_()
    g = torch.softmax(torch.randn(2, 3), 1).requires_grad_()
    ws = [(torch.randn(3, 16, 8) * 0.2).bfloat16().requires_grad_(), torch.randn(3, 16).bfloat16().requires_grad_(),
          (torch.randn(3, 8, 16) * 0.2).bfloat16().requires_grad_(), torch.randn(3, 8).bfloat16().requires_grad_()]
    y = kernels.merged_ffn_reference(x, g, *ws)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and g.grad.dtype == torch.float32
    assert all(t.grad.dtype == torch.bfloat16 for t in (x, *ws))
    want = kernels.merged_ffn_reference(x.float(), g.bfloat16().float(), *(w.float() for w in ws))
    assert torch.allclose(y.float(), want, atol=5e-2, rtol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kernel_cuda_bf16_equals_reference():
    """The Triton merged FFN on the GPU in bf16 (the autotuner's choice and each config) against the
    reference computed in fp32 from the same bf16 tensors, at reViT-S/16 shapes; then bf16 autocast
    over fp32 tensors. bf16 tolerance (fp32 tl.dot would be TF32: 1e-4 would fail spuriously)."""
    import kernels
    torch.manual_seed(0)
    B, T, D, H, E, dev = 8, 197, 384, 1536, 4, "cuda"
    x = torch.randn(B, T, D, device=dev)
    g = torch.softmax(torch.randn(B, E, device=dev), 1)
    ws = [torch.randn(E, H, D, device=dev) * 0.02, torch.randn(E, H, device=dev) * 0.02,
          torch.randn(E, D, H, device=dev) * 0.02, torch.randn(E, D, device=dev) * 0.02]
    wb = [w.bfloat16() for w in ws]
    want = kernels.merged_ffn_reference(x.bfloat16().float(), g, *(w.float() for w in wb))
    with torch.no_grad():
        got = kernels.merged_ffn(x.bfloat16(), g, *wb)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)
    W1 = torch.einsum("be,ehd->bhd", g, wb[0].float())
    h_want = torch.nn.functional.gelu(torch.baddbmm((g @ wb[1].float())[:, None], x.bfloat16().float(), W1.mT))
    for cfg in kernels.CONFIGS:
        h = kernels._merged_linear(x.bfloat16(), g, wb[0], wb[1], True, cfg)
        torch.testing.assert_close(h.float(), h_want, atol=1e-2, rtol=1e-2, msg=lambda m: f"{cfg}: {m}")
    xg = x.clone().requires_grad_()
    with torch.autocast(dev, dtype=torch.bfloat16):
        got = kernels.merged_ffn(xg, g, *ws)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), kernels.merged_ffn_reference(x, g, *ws), atol=1e-2, rtol=1e-2)
    got.float().sum().backward()
    assert xg.grad.dtype == torch.float32 and xg.grad.isfinite().all()


# ----------------------------------------------------------------------------- GPU-resident loader
def indexed_images(n=50):
    """uint8 images whose pixels encode their index, labels = index."""
    imgs = torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    return data.TensorImages(imgs, torch.arange(n), data.build_transform(False, 32, data.CIFAR_MEAN,
                                                                          data.CIFAR_STD, "cifar100"))


def test_random_crop_flip_gives_a_padded_window_possibly_mirrored():
    x = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    out = data.random_crop_flip(x, 4, data.image_hash(torch.arange(6), 3, 0))
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    flips = 0
    for b in range(6):
        windows = [(padded[b, :, dy:dy + 32, dx:dx + 32], f) for dy in range(9) for dx in range(9)
                   for f in (False, True)]
        hits = [f for w, f in windows if torch.equal(out[b], w.flip(-1) if f else w)]
        assert hits, f"image {b} is not a crop of its padded copy"
        flips += hits[0]
    assert out.shape == x.shape
    h = data.image_hash(torch.arange(20000), 3, 0)  # offsets and flips cover their ranges evenly
    assert torch.bincount(h % 9, minlength=9).min() > 20000 / 9 * 0.9 and 0.45 < ((h // 81) % 2).float().mean() < 0.55


def test_device_loader_crops_do_not_depend_on_the_batch_split():
    ds = indexed_images(48)
    crops = {}
    for batch, world in ((8, 1), (4, 1), (4, 2)):  # one batch of 8 = two micro-batches = two ranks
        got = {}
        for rank in range(world):
            dev = data.DeviceCIFARLoader(ds, batch, True, rank, world, seed=5, device="cpu")
            dev.sampler.set_epoch(1)
            for x, y in dev:
                got.update({int(i): img for i, img in zip(y, x)})
        crops[(batch, world)] = got
    ref = crops[(8, 1)]
    for got in crops.values():
        assert set(got) == set(ref) and all(torch.equal(got[i], ref[i]) for i in ref)


def test_device_loader_matches_cpu_loader_order_shards_and_resumes():
    ds = indexed_images(50)
    for world in (1, 2):
        seen = []
        for rank in range(world):
            dev = data.DeviceCIFARLoader(ds, 4, True, rank, world, seed=7, device="cpu")
            cpu = data.build_loader(ds, 4, True, rank, world, seed=7, workers=0)
            for loader in (dev, cpu):
                loader.sampler.set_epoch(2)
                loader.sampler.set_start(0)
            a = [y for _, y in dev]
            assert [y.tolist() for y in a] == [y.tolist() for _, y in cpu]  # same order, same shard
            seen += torch.cat(a).tolist()
            # deterministic for a seed, and a mid-epoch start replays the rest exactly
            full = [x for x, _ in dev]
            dev.sampler.set_start(3 * 4)
            rest = [x for x, _ in dev]
            assert len(rest) == len(full) - 3 and all(torch.equal(p, q) for p, q in zip(full[3:], rest))
        assert len(seen) == len(set(seen))  # disjoint shards


def test_device_loader_eval_covers_every_image_once():
    ds = indexed_images(50)
    labels = []
    for rank in range(2):
        labels += torch.cat([y for _, y in data.DeviceCIFARLoader(ds, 8, False, rank, 2, device="cpu")]).tolist()
    assert sorted(labels) == list(range(50))
    x, _ = next(iter(data.DeviceCIFARLoader(ds, 8, False, device="cpu")))
    ref = torch.stack([ds[i][0] for i in range(8)])  # the CPU eval transform
    assert torch.allclose(x, ref, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_loader_on_cuda():
    ds = indexed_images(64)
    dev = data.DeviceCIFARLoader(ds, 16, True, device="cuda")
    dev.sampler.set_epoch(0)
    x, y = next(iter(dev))
    assert x.is_cuda and x.shape == (16, 3, 32, 32) and y.is_cuda


# ----------------------------------------------------------------------------- compiled paths
RECOMPILE_CHECK = r"""
import torch, bvit
torch.manual_seed(0)
x, y = torch.randn(2, 3, 16, 16), torch.tensor([1, 2])
kw = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=4, drop_path_rate=0.1)
models = {
    "vit (untied, per-block drop-path rates)": bvit.BViT(depth=4, num_blocks=4, **kw),
    "bvit": bvit.BViT(depth=3, num_blocks=1, stages=3, **kw),
    "bvit 4 phases": bvit.BViT(depth=8, num_blocks=4, **kw),
}
for name, m in models.items():
    torch._dynamo.reset()
    m.compile_regions(backend="aot_eager")  # guards, not code generation, decide recompiles
    for depth in (None, m.depth * 2, m.depth + 1):  # other depths and phase maps
        m(x, y, depth=depth if m.stages == 1 or depth is None else 6)[1].backward()
    print("COMPILED", name)
import revit
m = revit.ReViT(experts=4, depth=4, depth_dropout=0.0, **kw)
torch._dynamo.reset()
m.compile_regions(backend="aot_eager")
for depth in (None, 7, 2):  # a new depth is a new grid of merged weights, passed as tensors
    m(x, y, depth=depth)[1].backward()
print("COMPILED revit")
import srvit
m = srvit.SRViT(recursions=2, depth=2, **kw)
torch._dynamo.reset()
m.compile_regions(backend="aot_eager")
for depth in (None, 3, 1):  # call-time depth = recursions
    m(x, y, depth=depth)[1].backward()
print("COMPILED srvit")
import odevit
for solver in ("euler", "rk4"):
    m = odevit.ODEViT(solver=solver, depth=3, stages=1, **kw)
    torch._dynamo.reset()
    m.compile_regions(backend="aot_eager")
    for depth in (None, 6, 2):  # other step counts, horizons and time grids
        m(x, y, depth=depth)[1].backward()
print("COMPILED odevit")
"""


def test_regional_compilation_does_not_recompile_across_steps_blocks_or_depths():
    env = {**os.environ, "TORCH_LOGS": "recompiles"}
    r = subprocess.run([sys.executable, "-c", RECOMPILE_CHECK], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("COMPILED") == 6
    assert "Recompiling" not in r.stderr, r.stderr[-3000:]


def test_inductor_compiled_block_equals_eager():
    import bvit
    torch.manual_seed(0)
    m = bvit.BViT(img_size=8, patch_size=4, num_classes=5, embed_dim=16, num_heads=2, depth=3).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        ref = m(x)[0]
        torch._dynamo.reset()
        out = m.compile_regions()(x, depth=5)[0], m(x)[0]
    assert torch.allclose(out[1], ref, atol=1e-5)
    assert out[0].shape == ref.shape
