"""Speed ratios of rvits against peers measured in the same run (no absolute timings asserted).

    python bench.py --device cpu            # small configs, < 3 minutes on 2 cores
    python bench.py --device cuda --json OUT/bench.json   # real sizes

Keys (SPEC section 5, issue "Speed"):
  vit_vs_timm_train_eager / _compiled   our untied ViT vs timm's VisionTransformer, same config,
                                        training images/s (ours / timm; > 1 means we are faster)
  bvit_compile_time_d48_over_d12        time to the first compiled training step, depth 48 / 12
  revit_dynamic_over_materialized_b1/_b64  inference latency of dynamic reViT / its materialized model
  loader_over_model_img_per_s           CIFAR loader images/s / the model's training images/s
  bf16_matmul_tflops                    (CUDA) measured dense bf16 rate, 8192^3 matmul (absolute)
  mfu_bvit_b16_bf16                     (CUDA) model FLOPs utilization of bViT-B/16 bf16 training,
                                        against bf16_matmul_tflops of this run; _datasheet: against
                                        NVIDIA's dense bf16 figure (both printed)
  merged_ffn_reference_over_triton_eval_b64  (CUDA) kernels.py's Triton merged FFN vs its reference,
                                        inference (where the models use it)
  revit_elastic_grouped_over_fused_train_b64 / _eval_b64  (CUDA) reViT-S/16 elastic-depth step:
                                        the grouped path over the fused kernel, a training step
                                        (fwd + bwd) and inference; revit.fused_ffn_wins takes the
                                        kernel in inference only, right if train < 1 < eval
  imagefolder_img_per_s                 image-folder loader, CPU workers (PIL), 224 px (absolute)
  gpu_decode_loader_over_model_img_per_s  (CUDA) DeviceDecodeLoader images/s / bViT's training images/s
  train_mem_d48_over_d12 / _grad_ckpt   peak memory of one bViT training step at depth 48 / 12,
                                        without and with --grad-checkpoint (MiB in the note)
Timing: warm-up steps first (they pay compilation), synchronize, median of timed repeats. On CUDA the
GPU-only keys run first; --json is rewritten after every key, so a run cut short keeps its results.
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


def loader_img_per_s(loader, device, warmup, batches):
    """Images/s delivered by a training loader (first batches not timed)."""
    loader.sampler.set_epoch(0)
    it, seen = iter(loader), 0
    for _ in range(warmup):
        next(it)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(batches):
        x, _ = next(it)
        seen += x.shape[0]
    sync(device)
    return seen / (time.perf_counter() - t0)


def bvit_img_per_s(cfg, img, device, amp, warmup, repeats):
    """Training images/s of bViT at the bench config on `img` px images."""
    m = bvit.BViT(num_blocks=1, depth=cfg["depth"], img_size=img, patch_size=4 if img <= 64 else 16,
                  num_classes=100, embed_dim=cfg["dim"], num_heads=cfg["heads"]).to(device)
    step = train_step_fn(m, cfg["batch"], img, 100, device, amp, True)
    return cfg["batch"] / timed(step, device, warmup, repeats)


def loader_ratio(cfg, device, amp, warmup, repeats, workers):
    """Images/s of the CIFAR training loader train.py would pick here, over the training images/s
    of bViT at the bench config (random uint8 CIFAR-shaped data: speed does not depend on pixels)."""
    n = 50_000
    imgs = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8)
    t = data.build_transform(True, 32, data.CIFAR_MEAN, data.CIFAR_STD, "cifar100")
    ds = data.TensorImages(imgs, torch.randint(0, 100, (n,)), t)
    import argparse  # the same choice as train.py: one rule, data.batched_loader
    run = argparse.Namespace(data="cifar100", cpu_loader=False, randaug=0, three_augment=False, workers=workers,
                             img_size=None)
    if data.batched_loader(run, device):
        loader = data.DeviceCIFARLoader(ds, cfg["batch"], True, device=device)
    else:
        loader = data.build_loader(ds, cfg["batch"], True, workers=workers)
    loader_ips = loader_img_per_s(loader, device, warmup, repeats * 4)
    model_ips = bvit_img_per_s(cfg, 32, device, amp, warmup, repeats)
    return loader_ips / model_ips, loader_ips, model_ips


def imagefolder_loaders(cfg, device, amp, warmup, repeats, workers, img=224):
    """Image-folder training at `img` px (RandomResizedCrop + flip) on 64 synthetic 500x375 JPEGs
    (a typical ImageNet size), each listed 40 times: images/s of the CPU path (PIL decoding in
    `workers` processes) and, on CUDA, of data.DeviceDecodeLoader over bViT's training images/s."""
    import tempfile
    from PIL import Image
    out = {}
    with tempfile.TemporaryDirectory() as root:
        rng = torch.Generator().manual_seed(0)
        samples = []
        for k in range(64):  # smooth random images, so JPEG sizes are realistic (not noise)
            x = F.interpolate(torch.rand(1, 3, 12, 16, generator=rng), size=(375, 500), mode="bicubic")
            path = os.path.join(root, f"{k}.jpg")
            Image.fromarray((x[0].clamp(0, 1) * 255).byte().permute(1, 2, 0).numpy()).save(path, quality=90)
            samples.append((path, k % 10))
        t = data.build_transform(True, img, data.IMAGENET_MEAN, data.IMAGENET_STD, "imagenet")
        files = data.ImageFiles(samples * 40, [str(c) for c in range(10)], t, img)
        batch, n = min(cfg["batch"], 64), repeats * 2
        cpu = data.build_loader(files, batch, True, workers=workers)
        out["cpu"] = loader_img_per_s(cpu, torch.device("cpu"), warmup, n)
        if device.type == "cuda":
            gpu = data.DeviceDecodeLoader(files, batch, workers=workers, device=device)
            out["gpu"] = loader_img_per_s(gpu, device, warmup, n)
            out["model"] = bvit_img_per_s(cfg, img, device, amp, warmup, repeats)
    return out


@torch.no_grad()
def merged_ffn_ratio(device, warmup, repeats, B=64, T=197, D=384, E=4):
    """(CUDA) Inference time of the reference per-image merged FFN over the Triton one, at reViT-S/16
    shapes in bf16 (> 1 means the kernel is faster)."""
    import kernels
    dt = torch.bfloat16
    x = torch.randn(B, T, D, device=device, dtype=dt)
    g = torch.softmax(torch.randn(B, E, device=device), 1)
    ws = [torch.randn(E, 4 * D, D, device=device, dtype=dt) * 0.02, torch.zeros(E, 4 * D, device=device, dtype=dt),
          torch.randn(E, D, 4 * D, device=device, dtype=dt) * 0.02, torch.zeros(E, D, device=device, dtype=dt)]
    return (timed(lambda: kernels.merged_ffn_reference(x, g, *ws), device, warmup, repeats)
            / timed(lambda: kernels.merged_ffn(x, g, *ws), device, warmup, repeats))


def revit_elastic_paths(cfg, device, warmup, repeats, batch=64, p=0.3):
    """(CUDA) reViT elastic-depth forward at the bench config with one drop mask (probability p),
    bf16 autocast: time of the grouped path over the fused kernel's, in a training step (forward +
    backward) and in inference. Returns {"train": ratio, "eval": ratio}; > 1: the kernel is faster."""
    import revit
    from unittest import mock
    m = revit.ReViT(experts=4, depth_dropout=p, depth=cfg["depth"], img_size=cfg["img"], patch_size=cfg["patch"],
                    num_classes=cfg["classes"], embed_dim=cfg["dim"], num_heads=cfg["heads"]).to(device)
    x = torch.randn(batch, 3, cfg["img"], cfg["img"], device=device)
    y = torch.randint(0, cfg["classes"], (batch,), device=device)
    keep = revit.sample_keep(batch, cfg["depth"], p)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16)

    def train_step():
        with ctx:
            loss = m.train()(x, y, keep=keep)[1]
        loss.backward()
        m.zero_grad(set_to_none=True)

    @torch.no_grad()
    def infer():
        with ctx:
            m.eval()(x, keep=keep)
    out = {}
    for mode, fn in (("train", train_step), ("eval", infer)):
        t = {}
        for path, fused in (("grouped", False), ("fused", True)):  # force the path, whatever the rule says
            with mock.patch.object(revit, "fused_ffn_wins", lambda z, fused=fused: fused):
                t[path] = timed(fn, device, warmup, repeats)
        out[mode] = t["grouped"] / t["fused"]
    return out


def matmul_tflops(device, n=8192, calls=10, repeats=10):
    """(CUDA) Measured dense bf16 matmul rate in TFLOP/s: n x n x n products of random matrices,
    `calls` per timing (launch and sync overheads amortized), median of `repeats`."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)

    def run():
        for _ in range(calls):
            torch.matmul(a, b, out=c)
    return 2 * n ** 3 * calls / timed(run, device, warmup=2, repeats=repeats) / 1e12


def mfu_bvit_b16(device, warmup, repeats, batch=128):
    """(CUDA) bViT-B/16 bf16 training: achieved TFLOP/s (model FLOPs: forward + 2x backward)."""
    m = bvit.bvit_b(num_classes=1000).to(device)
    compile_model(m)
    dt = timed(train_step_fn(m, batch, 224, 1000, device, True, True), device, warmup, repeats)
    return 3 * m.flops_per_image() * batch / dt / 1e12


def _step_memory(cfg, depth, device, amp, ckpt):
    """Extra memory (MiB) one bViT training step needs over the model, optimizer-free: CUDA
    max_memory_allocated; CPU (a fresh process: freed memory is not reused) peak RSS during the
    step minus the RSS before it (Linux /proc)."""
    torch.manual_seed(0)
    m = bvit.BViT(img_size=cfg["img"], patch_size=cfg["patch"], num_classes=cfg["classes"], embed_dim=cfg["dim"],
                  depth=depth, num_heads=cfg["heads"]).to(device).set_grad_checkpointing(ckpt)
    x = torch.randn(cfg["batch"], 3, cfg["img"], cfg["img"], device=device)
    y = torch.randint(0, cfg["classes"], (cfg["batch"],), device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:  # Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kib("VmRSS") * 1024
    with torch.autocast(device.type, torch.bfloat16, enabled=amp):
        m(x, y)[1].backward()
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _status_kib("VmHWM") * 1024
    return (peak - before) / 2 ** 20


def _status_kib(key):
    return next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith(key + ":"))


def memory_ratios(cfg, device, amp):
    """Peak step memory at depth 12 and 48, without and with activation checkpointing: 4 values."""
    jobs = [(cfg, d, device, amp, c) for c in (False, True) for d in (12, 48)]
    if device.type == "cuda":
        return [_step_memory(*j) for j in jobs]
    import multiprocessing  # a fresh process per measurement: RSS peaks never go down
    # glibc's malloc would keep freed tensors' pages resident and count fragmentation; with a
    # fixed mmap threshold every large tensor is its own mapping, so the RSS follows the tensors.
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by the spawned processes at start
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        return pool.starmap(_step_memory, jobs)


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
    res, info = {}, dict(device=args.device, config=cfg, torch=torch.__version__)
    t_start = time.time()

    def report(key, value, note=""):
        res[key] = value
        print(f"{key:40s} {value:8.3f}  {note}", flush=True)
        if args.json:  # after every key: a run stopped by a time limit keeps what it measured
            info["seconds"] = time.time() - t_start
            with open(args.json, "w") as f:
                json.dump({**res, "info": info}, f, indent=1)

    if cuda:  # the GPU-only measurements first, the cheap ones before the compiled MFU step
        name = torch.cuda.get_device_name(device)
        measured, datasheet = matmul_tflops(device), next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
        info.update(gpu=name, bf16_matmul_tflops=measured, bf16_datasheet_tflops=datasheet)
        report("bf16_matmul_tflops", measured, f"8192^3 bf16 matmul measured on {name}")
        paths = revit_elastic_paths(cfg, device, 3, 10)
        for mode, note in (("train", "fwd+bwd: the rule takes grouped"), ("eval", "no grad: the rule takes fused")):
            report(f"revit_elastic_grouped_over_fused_{mode}_b64", paths[mode],
                   f"{note} (right if train < 1 < eval), depth {cfg['depth']}, E=4, p=0.3")
        report("merged_ffn_reference_over_triton_eval_b64", merged_ffn_ratio(device, warmup, repeats),
               "inference, B=64 T=197 D=384 E=4, bf16")
        tflops = mfu_bvit_b16(device, warmup, repeats)
        report("mfu_bvit_b16_bf16", tflops / measured, f"{tflops:.0f} TFLOP/s of {measured:.0f} measured")
        if datasheet:
            report("mfu_bvit_b16_bf16_datasheet", tflops / datasheet, f"{tflops:.0f} TFLOP/s of {datasheet:.0f} "
                   f"on NVIDIA's datasheet ({name})")
        else:
            print(f"mfu_bvit_b16_bf16_datasheet: no datasheet figure for {name}")
        torch._dynamo.reset()
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
    folder = imagefolder_loaders(cfg, device, amp, warmup, repeats, args.workers)
    report("imagefolder_img_per_s", folder["cpu"], f"{args.workers} CPU workers (PIL), 224 px RandomResizedCrop")
    if cuda:
        report("gpu_decode_loader_over_model_img_per_s", folder["gpu"] / folder["model"],
               f"loader {folder['gpu']:.0f} img/s (nvJPEG), bViT 224 px training {folder['model']:.0f} img/s")
    mem = memory_ratios(cfg, device, amp)
    report("train_mem_d48_over_d12", mem[1] / mem[0], f"{mem[0]:.0f} -> {mem[1]:.0f} MiB, bViT step")
    report("train_mem_d48_over_d12_grad_ckpt", mem[3] / mem[2], f"{mem[2]:.0f} -> {mem[3]:.0f} MiB, "
           f"--grad-checkpoint ({mem[1] / mem[3]:.1f}x less at depth 48)")
    print(f"total {time.time() - t_start:.0f} s on {args.device} ({torch.__version__})")

if __name__ == "__main__":
    main()
