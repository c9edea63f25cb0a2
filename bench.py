"""Speed ratios of rvits against peers measured in the same run (no absolute timings asserted).

    python bench.py --device cpu            # small configs, < 3 minutes on 2 cores
    python bench.py --device cuda --json OUT/bench.json   # real sizes

Keys (SPEC section 5, issue "Speed"):
  vit_vs_timm_train_eager / _compiled   our untied ViT vs timm's VisionTransformer, same config,
                                        training images/s (ours / timm; > 1 means we are faster)
  bvit_compile_time_d48_over_d12        time to the first compiled training step, depth 48 / 12
  revit_dynamic_over_materialized_b1/_b64  inference latency of dynamic reViT / its materialized model
  loader_over_model_img_per_s           CIFAR loader images/s / the model's training images/s
  mfu_bvit_b16_bf16                     (CUDA) model FLOPs utilization of bViT-B/16 bf16 training
  merged_ffn_reference_over_triton_b64  (CUDA) kernels.py's Triton merged FFN vs its reference
Timing: warm-up steps first (they pay compilation), synchronize, median of timed repeats.
"""
import argparse
import json
import os
import statistics
import time

# Compilation is measured from scratch: no inductor on-disk caches (set before torch is imported).
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import bvit  # noqa: E402
import data  # noqa: E402

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense, from NVIDIA datasheets


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, warmup=3, repeats=10):
    """Median seconds of fn() over `repeats` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def train_step_fn(model, batch, img, classes, device, amp, ours):
    """One AdamW training step on fixed random data, as a closure."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    x = torch.randn(batch, 3, img, img, device=device)
    y = torch.randint(0, classes, (batch,), device=device)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)

    def step():
        with ctx:
            loss = model(x, y)[1] if ours else F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def compile_model(m):
    """Regional compilation where the model offers it (each block once), else whole-model."""
    if hasattr(m, "compile_regions"):
        m.compile_regions()
        return m
    return torch.compile(m)


def vit_vs_timm(cfg, device, amp, compiled, warmup, repeats):
    import timm
    kw = dict(img_size=cfg["img"], patch_size=cfg["patch"], num_classes=cfg["classes"],
              embed_dim=cfg["dim"], depth=cfg["depth"], num_heads=cfg["heads"])
    ours = bvit.BViT(num_blocks=cfg["depth"], **kw).to(device)
    ref = timm.models.vision_transformer.VisionTransformer(**kw).to(device)
    if compiled:
        torch._dynamo.reset()
        ours, ref = compile_model(ours), torch.compile(ref)
    t_ours = timed(train_step_fn(ours, cfg["batch"], cfg["img"], cfg["classes"], device, amp, True),
                   device, warmup, repeats)
    t_ref = timed(train_step_fn(ref, cfg["batch"], cfg["img"], cfg["classes"], device, amp, False),
                  device, warmup, repeats)
    return t_ref / t_ours, cfg["batch"] / t_ours, cfg["batch"] / t_ref


def compile_time(cfg, depth, device, amp):
    """Compilation seconds: the first compiled training step minus a steady-state step (the first
    step also computes `depth` steps, which is not compilation). Caches are off (see main)."""
    torch._dynamo.reset()
    m = bvit.BViT(num_blocks=1, depth=depth, img_size=cfg["img"], patch_size=cfg["patch"],
                  num_classes=cfg["classes"], embed_dim=cfg["dim"], num_heads=cfg["heads"]).to(device)
    step = train_step_fn(compile_model(m), cfg["batch"], cfg["img"], cfg["classes"], device, amp, True)
    sync(device)
    t0 = time.perf_counter()
    step()
    sync(device)
    first = time.perf_counter() - t0
    return first - timed(step, device, warmup=1, repeats=3)


@torch.no_grad()
def revit_latency(cfg, batch, device, amp, warmup, repeats):
    import revit
    m = revit.ReViT(experts=4, depth=cfg["depth"], img_size=cfg["img"], patch_size=cfg["patch"],
                    num_classes=cfg["classes"], embed_dim=cfg["dim"], num_heads=cfg["heads"]).to(device).eval()
    dense = m.materialize(cfg["depth"]).to(device).eval()
    x = torch.randn(batch, 3, cfg["img"], cfg["img"], device=device)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)

    def run(model):
        with ctx:
            model(x)
    return timed(lambda: run(m), device, warmup, repeats) / timed(lambda: run(dense), device, warmup, repeats)


def loader_ratio(cfg, device, amp, warmup, repeats, workers):
    """Images/s of the CIFAR training loader train.py would pick here, over the training images/s
    of bViT at the bench config (random uint8 CIFAR-shaped data: speed does not depend on pixels)."""
    n = 50_000
    imgs = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8)
    t = data.build_transform(True, 32, data.CIFAR_MEAN, data.CIFAR_STD, "cifar100")
    ds = data.TensorImages(imgs, torch.randint(0, 100, (n,)), t)
    import argparse
    import train  # the same choice as train.py: one rule, train.batched_loader
    run = argparse.Namespace(data="cifar100", cpu_loader=False, randaug=0, three_augment=False, workers=workers)
    if train.batched_loader(run, device):
        loader = data.DeviceCIFARLoader(ds, cfg["batch"], True, device=device)
    else:
        loader = data.build_loader(ds, cfg["batch"], True, workers=workers)
    loader.sampler.set_epoch(0)
    it, seen = iter(loader), 0
    for _ in range(warmup):
        next(it)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats * 4):
        x, _ = next(it)
        seen += x.shape[0]
    sync(device)
    loader_ips = seen / (time.perf_counter() - t0)
    m = bvit.BViT(num_blocks=1, depth=cfg["depth"], img_size=32, patch_size=4, num_classes=100,
                  embed_dim=cfg["dim"], num_heads=cfg["heads"]).to(device)
    model_ips = cfg["batch"] / timed(train_step_fn(m, cfg["batch"], 32, 100, device, amp, True), device,
                                     warmup, repeats)
    return loader_ips / model_ips, loader_ips, model_ips


def merged_ffn_ratio(device, warmup, repeats, B=64, T=197, D=384, E=4):
    """(CUDA) Training time (fwd + bwd) of the reference per-image merged FFN over the Triton one,
    at reViT-S/16 shapes in bf16 (> 1 means the kernel is faster)."""
    import kernels
    dt = torch.bfloat16
    x = torch.randn(B, T, D, device=device, dtype=dt, requires_grad=True)
    g = torch.softmax(torch.randn(B, E, device=device), 1)
    ws = [torch.randn(E, 4 * D, D, device=device, dtype=dt) * 0.02, torch.zeros(E, 4 * D, device=device, dtype=dt),
          torch.randn(E, D, 4 * D, device=device, dtype=dt) * 0.02, torch.zeros(E, D, device=device, dtype=dt)]
    ws = [w.requires_grad_() for w in ws]

    def run(fn):
        fn(x, g.to(dt), *ws).float().sum().backward()
    return (timed(lambda: run(kernels.merged_ffn_reference), device, warmup, repeats)
            / timed(lambda: run(kernels.merged_ffn), device, warmup, repeats))


def mfu_bvit_b16(device, warmup, repeats, batch=128):
    m = bvit.bvit_b(num_classes=1000).to(device)
    compile_model(m)
    dt = timed(train_step_fn(m, batch, 224, 1000, device, True, True), device, warmup, repeats)
    flops = 3 * m.flops_per_image() * batch / dt  # forward + backward (2x) per image
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    return (flops / 1e12 / peak if peak else None), flops / 1e12, name


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--json", help="also write the ratios to this JSON file")
    p.add_argument("--workers", type=int, default=2, help="CPU loader processes (CPU mode)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat, no compilation: checks "
                   "that the script runs (scripts/gpu_run.sh --dry-run), measures nothing")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    # CPU: small configs so that the whole run (4 compilations included) stays under 3 minutes.
    cfg = (dict(img=224, patch=16, classes=1000, dim=384, depth=12, heads=6, batch=128) if cuda else
           dict(img=32, patch=4, classes=100, dim=96, depth=4, heads=3, batch=32))
    warmup, repeats = (5, 20) if cuda else (2, 5)
    if args.smoke:
        cfg, warmup, repeats = dict(cfg, img=32, patch=8, dim=32, depth=2, heads=2, batch=4), 1, 1
    amp = cuda
    res, info = {}, {}
    t_start = time.time()

    def report(key, value, note=""):
        res[key] = value
        print(f"{key:40s} {value:8.3f}  {note}", flush=True)

    r, a, b = vit_vs_timm(cfg, device, amp, False, warmup, repeats)
    report("vit_vs_timm_train_eager", r, f"ours {a:.0f} img/s, timm {b:.0f} img/s")
    if not args.smoke:
        r, a, b = vit_vs_timm(cfg, device, amp, True, warmup, repeats)
        report("vit_vs_timm_train_compiled", r, f"ours {a:.0f} img/s, timm {b:.0f} img/s")
        c12, c48 = compile_time(cfg, 12, device, amp), compile_time(cfg, 48, device, amp)
        report("bvit_compile_time_d48_over_d12", c48 / c12, f"d12 {c12:.1f} s, d48 {c48:.1f} s")
        torch._dynamo.reset()
    for b in (1, 64):
        report(f"revit_dynamic_over_materialized_b{b}", revit_latency(cfg, b, device, amp, warmup, repeats),
               f"E=4, depth {cfg['depth']}, eval")
    r, li, mi = loader_ratio(dict(cfg, batch=256 if cuda else 64), device, amp, warmup, repeats, args.workers)
    report("loader_over_model_img_per_s", r, f"loader {li:.0f} img/s, bViT training {mi:.0f} img/s")
    if cuda:
        report("merged_ffn_reference_over_triton_b64", merged_ffn_ratio(device, warmup, repeats),
               "fwd+bwd, B=64 T=197 D=384 E=4, bf16")
        mfu, tflops, name = mfu_bvit_b16(device, warmup, repeats)
        info["gpu"] = name
        if mfu is not None:
            report("mfu_bvit_b16_bf16", mfu, f"{tflops:.0f} TFLOP/s on {name}")
        else:
            print(f"mfu_bvit_b16_bf16: unknown peak for {name}; {tflops:.0f} TFLOP/s achieved")
    info.update(device=args.device, config=cfg, torch=torch.__version__, seconds=time.time() - t_start)
    print(f"total {info['seconds']:.0f} s on {args.device} ({torch.__version__})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**res, "info": info}, f, indent=1)


if __name__ == "__main__":
    main()
