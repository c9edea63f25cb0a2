"""Speed ratios of rvits against peers measured in the same run (no absolute timings asserted).

    python bench.py --device cpu            # small configs, a few minutes on 2 cores
    python bench.py --device cuda --json OUT/bench.json   # real sizes

Keys, in the order they run (each in its own try: one that fails is printed and listed under
"errors" in the JSON, and the others still run):
  matmul_tflops                         measured dense matmul rate (bf16 8192^3 on CUDA, fp32 1024^3 on
                                        the CPU): the peak the MFU keys divide by (absolute)
  cifar_preset_img_per_s                c100-gpu-bvit-ti's training step as train.py --compile runs it
                                        in one process (the whole-model path, kernels.py), img/s
                                        (absolute; on the CPU at a smaller width, depth and batch)
  mfu_cifar_preset                      its model FLOPs (forward + 2x backward) over matmul_tflops
  cifar_preset_new_over_old             its img/s over train.py's step up to commit f937315
                                        (compiled blocks, a host sync per step); goal on CUDA >= 3
  cifar_preset_blocks_nosync_over_old   compiled blocks without the host sync over the same: the part
                                        of the gain that is the sync alone
  compiled_exit_delay_s                 seconds from a first-time train.py --compile process's last
                                        line to its exit (goal <= 5; kernels.release_compile_workers);
                                        not exited 30 s after its start: "did not finish in 30 s" under
                                        "errors", no figure
  mfu_bvit_b16_bf16 / _datasheet        (CUDA) bViT-B/16 bf16 training TFLOP/s over matmul_tflops of
                                        this run / over NVIDIA's dense bf16 figure
  vit_vs_timm_train_eager / _compiled   our untied ViT vs timm's VisionTransformer, same config,
                                        training images/s (ours / timm; > 1 means we are faster)
  {bvit,revit}_model_compile_d48_over_d12  compile time of the first training step, depth 48 / 12, on the
                                        whole-model path (train.py --compile: one graph, each step a nested
                                        compile region; goal <= 1.2); CPU seconds on the CPU (compile_seconds)
  bvit_blocks_compile_d48_over_d12      the same on the regional path (--compile-scope blocks; up to
                                        commit 6162896 the key bvit_compile_time_d48_over_d12)
  block_{while_loop,unrolled}_compile_d48_over_d12  (--only loop_compile) the same for one bViT block's
                                        training call stepped by torch.while_loop / a Python loop; the note:
                                        gradients vs eager, and on CUDA whether the call syncs the host
  revit_dynamic_over_materialized_b1/_b64  inference latency of dynamic reViT / its materialized model
  loader_over_model_img_per_s           CIFAR loader images/s / the model's training images/s
  imagefolder_img_per_s                 image-folder loader, CPU workers (PIL), 224 px (absolute)
  gpu_decode_loader_over_model_img_per_s  (CUDA) DeviceDecodeLoader images/s / bViT's training images/s
  train_mem_d48_over_d12 / _grad_ckpt   peak memory of one bViT training step at depth 48 / 12,
                                        without and with --grad-checkpoint (MiB in the note)
  loopvae_{global,scale,none}_over_unlooped_img_per_s  LoopVAE's cost ledger (sec. 4.7): training img/s
                                        of each sharing scope over the unlooped hierarchy, side by side
                                        (the JSON's info.loopvae_ledger: parameters, blocks, applications,
                                        MACs, img/s, step memory per arm; lab/summarize_loopvae.py)
  loopvae_global_over_unlooped_step_mem  peak step memory of the global scope over the unlooped one
On the CPU the default set leaves out cifar_preset, timm_compiled and loopvae (CPU_ON_REQUEST), and every
default set loop_compile (ON_REQUEST); --only runs them. Timing: warm-up steps first (they pay compilation), synchronize, median of timed repeats (training
loops: many steps per timing and one sync, as train.py queues them). --json is rewritten after
every key, so a run cut short keeps its results. --only NAME,... runs some measurements only
(MEASUREMENTS: matmul, cifar_preset, exit_delay, mfu_b16, timm_eager, ...). Exit status: 0, 1 when a
measurement failed (its FAILED line says why; the others still ran), 2 for bad input.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F

import bvit
import data
import kernels

ROOT = os.path.dirname(os.path.abspath(__file__))

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense, from NVIDIA datasheets


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, warmup=3, repeats=10, calls=1):
    """Median seconds per fn() call, over `repeats` timings of `calls` calls each (one sync per
    timing: with calls > 1 the host may queue work ahead of the device, as a training loop does),
    after `warmup` calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times) if times else None


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


def vit_vs_timm(cfg, device, amp, compiled, warmup, repeats):
    import timm
    kw = dict(img_size=cfg["img"], patch_size=cfg["patch"], num_classes=cfg["classes"],
              embed_dim=cfg["dim"], depth=cfg["depth"], num_heads=cfg["heads"])
    ours = bvit.BViT(num_blocks=cfg["depth"], **kw).to(device)
    ref = timm.models.vision_transformer.VisionTransformer(**kw).to(device)
    if compiled:
        torch._dynamo.reset()
        ours, ref = kernels.compile_for_training(ours, "blocks"), torch.compile(ref)
    t_ours = timed(train_step_fn(ours, cfg["batch"], cfg["img"], cfg["classes"], device, amp, True),
                   device, warmup, repeats)
    t_ref = timed(train_step_fn(ref, cfg["batch"], cfg["img"], cfg["classes"], device, amp, False),
                  device, warmup, repeats)
    return t_ref / t_ours, cfg["batch"] / t_ours, cfg["batch"] / t_ref


def cpu_seconds():
    """CPU seconds of this process and its finished children (user + system, os.times)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def compile_seconds(name, depth, scope, cfg, device, amp):
    """Seconds the first compiled training step of `name` ("bvit", or "revit" with E = 4) at `depth` spends
    compiling in `scope` (kernels.compile_for_training: "model", the whole training forward, each step a
    nested compile region; "blocks", each block regionally): the first step minus a steady one, inductor's
    caches off. On CUDA wall seconds, compiled as train.py compiles (its worker pool); on the CPU the CPU
    seconds of this process and its children (the C++ compiler), compiled in-process (compile_threads=1):
    a CPU shared with other jobs stretches wall time by their load, not the CPU time a compilation takes."""
    import revit
    size = dict(depth=depth, img_size=cfg["img"], patch_size=cfg["patch"], num_classes=cfg["classes"],
                embed_dim=cfg["dim"], num_heads=cfg["heads"])
    with cold_compiles(device):
        torch.manual_seed(0)
        m = (bvit.BViT(**size) if name == "bvit" else revit.ReViT(experts=4, **size)).to(device)
        step = train_step_fn(kernels.compile_for_training(m, scope, device), cfg["batch"], cfg["img"], cfg["classes"],
                             device, amp, True)
        return first_minus_steady(step, device)


def cold_compiles(device):
    """inductor's caches off; on the CPU compiled in-process (compile_threads=1), so that the process's CPU
    seconds hold the C++ compiler's (compile_seconds). Resets dynamo on entry."""
    torch._dynamo.reset()
    return inductor_config.patch(force_disable_caches=True, **({} if device.type == "cuda" else {"compile_threads": 1}))


def first_minus_steady(call, device):
    """Seconds the first `call()` takes over a second one (what compiling cost): wall on CUDA, CPU seconds on the CPU."""
    clock = time.perf_counter if device.type == "cuda" else cpu_seconds
    sync(device)
    t0 = clock()
    call()
    sync(device)
    first = clock() - t0
    t0 = clock()
    call()
    sync(device)
    return first - (clock() - t0)


def loop_compile_seconds(depth, rolled, cfg, device):
    """Compile seconds (as compile_seconds: CUDA wall, CPU CPU-seconds; inductor's caches off) of one
    training call of a bViT block applied `depth` times, `rolled` as torch.while_loop (the loop kept in the
    graph, its body traced once) or unrolled (a Python loop, as the whole-model path traces it), compiled
    with fullgraph=True; and the gradients' largest difference from eager's, relative to their largest
    value. On CUDA also whether the compiled call reads a value back to the host (a host sync, which the
    whole-model path must not have): True / False; None on the CPU (issue 66, docs/speed.md)."""
    torch.manual_seed(0)
    block = bvit.Block(cfg["dim"], cfg["heads"]).to(device)
    x = torch.randn(cfg["batch"], 17, cfg["dim"], device=device)

    def loop(x):
        if rolled:  # (the count is carried on the device: a CPU scalar would keep CUDA graphs off)
            return torch.while_loop(lambda i, h: i < depth, lambda i, h: (i + 1, block(h)),
                                    (torch.zeros((), dtype=torch.long, device=device), x))[1]
        for _ in range(depth):
            x = block(x)
        return x

    def grads(fn):
        block.zero_grad(set_to_none=True)
        fn(x).float().square().mean().backward()
        return [q.grad.clone() for q in block.parameters()]

    with cold_compiles(device):
        compiled, got = torch.compile(loop, fullgraph=True), []
        seconds = first_minus_steady(lambda: got.append(grads(compiled)), device)
        syncs = None
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
            try:
                grads(compiled)
                syncs = False
            except RuntimeError:
                syncs = True
            finally:
                torch.cuda.set_sync_debug_mode("default")
        got = got[0]
    want = grads(loop)
    diff = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in zip(got, want))
    return seconds, diff, syncs


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


def endless(loader):
    """The batches of a training loader, epoch after epoch (a short benchmark set runs out)."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def loader_img_per_s(loader, device, warmup, batches):
    """Images/s delivered by a training loader (first batches not timed)."""
    it, seen = endless(loader), 0
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


def matmul_tflops(device, n=8192, calls=10, repeats=10, dtype=torch.bfloat16):
    """Measured dense matmul rate in TFLOP/s: n x n x n products of random matrices, `calls` per
    timing (launch and sync overheads amortized), median of `repeats`."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    c = torch.empty_like(a)
    return 2 * n ** 3 / timed(lambda: torch.matmul(a, b, out=c), device, 2, repeats, calls) / 1e12


def cifar_preset_step(preset, flags, scope, device, amp, host_sync=False, mode=None, bf16_residual=False,
                      optimizer=True, mix=True, loader=True):
    """One training step of a CIFAR preset as train.py runs it (its model, fused AdamW, MixUp/CutMix,
    label smoothing, clipping, the GPU-resident loader on random images), as a closure. flags: extra
    train.py flags (smaller sizes on CPU). scope: kernels.py compile scope, or None for eager; mode:
    torch.compile's mode for scope "model" (kernels.compile_for_training). host_sync: read the
    non-finite flag on the host every step, as train.py's step did up to commit f937315
    (`if torch.isfinite(gnorm)`). The speed variants of scripts/gpu_check.py: bf16_residual (each
    block's output stored in bf16, `bf16_residual_stream`); and, as upper bounds of what an idea can
    win, optimizer=False (forward and backward only), mix=False (no MixUp/CutMix; label smoothing
    keeps the targets' shape, so the compiled graph is the same), loader=False (one fixed batch).
    Returns (step, images per step, model FLOPs per image)."""
    from training import flags as run_flags, optim as run_optim, registry
    args = run_flags.resolved(["--preset", preset, *flags], 32)
    torch.manual_seed(0)
    model = registry.build_model(args, 32, 100).to(device)
    if bf16_residual:
        bf16_residual_stream(model)
    optim = torch.optim.AdamW(run_optim.param_groups(model, args.weight_decay), lr=args.lr, fused=True)
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    forward = model if scope is None else kernels.compile_for_training(model, scope, device, mode)
    targets = data.MixAndSmooth(args, 100, mix=mix)
    n = 4 * args.batch_size
    images = data.TensorImages(torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8), torch.randint(0, 100, (n,)), None)
    batches = endless(data.DeviceCIFARLoader(images, args.batch_size, True, device=device))
    fixed = next(batches)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)

    def step():
        x, y = targets(*(next(batches) if loader else fixed))
        with ctx:
            loss = forward(x, y)[1]
        loss.backward()
        if not optimizer:
            model.zero_grad(set_to_none=True)
            return
        bad = run_optim.optimizer_step(model, optim, scaler, args.clip_grad)
        if host_sync:
            bool(bad)
    return step, args.batch_size, model.flops_per_image()


def bf16_residual_stream(model):
    """Store the residual stream between blocks in bf16 (the parameters stay fp32 master weights): a
    forward hook casts each block's output, so that under autocast the tensors written and read at
    every step boundary (and saved for backward) take half the bytes. A speed variant of
    scripts/gpu_check.py (the step is memory-bound: issue 29's estimate); inside a block the sums
    stay fp32. Returns model."""
    for blk in model.blocks:
        blk.register_forward_hook(lambda module, inputs, out: out.to(torch.bfloat16))
    return model


PATHS = (("old", "blocks", True), ("blocks", "blocks", False), ("model", "model", False))


def cifar_preset_speed(preset, flags, device, amp, warmup, repeats, calls):
    """Training images/s of `preset`'s step on three paths: "old" = compiled blocks with a host sync
    per step (train.py at f937315), "blocks" = compiled blocks without it, "model" = the whole
    training forward as one graph (CUDA graphs on CUDA; kernels.py). The paths are built and warmed
    up first, then timed in turns, `repeats` rounds of `calls` steps each, so that a passing load
    on the machine hits every path alike. Returns ({path: img/s}, model FLOPs per image)."""
    runs = {path: cifar_preset_step(preset, flags, scope, device, amp, host_sync)
            for path, scope, host_sync in PATHS}
    for step, _, _ in runs.values():
        timed(step, device, warmup, 0)
    seconds = {path: [] for path in runs}
    for _ in range(repeats):
        for path, (step, _, _) in runs.items():
            seconds[path].append(timed(step, device, 0, 1, calls))
    batch, flops = runs["model"][1], runs["model"][2]
    return {path: batch / statistics.median(t) for path, t in seconds.items()}, flops


def compiled_exit_delay(device, timeout=30.0, cmd=None):
    """Seconds from the last output line of a first-time `train.py --compile` process (tiny model,
    synthetic data, 3 steps, inductor's caches off: it compiles, so its compile-worker pool starts)
    to its exit. Raises TimeoutError ("did not finish in 30 s") when it has not exited `timeout` seconds
    after it started: it is killed then, the measurement costs at most `timeout` and a second, and no
    figure is reported (the limit is not a measurement). cmd: another command (tests)."""
    import subprocess
    import tempfile
    import threading
    with tempfile.TemporaryDirectory() as out:
        cmd = cmd or [sys.executable, os.path.join(ROOT, "train.py"), "--data", "synthetic", "--embed-dim", "32",
                      "--num-heads", "2", "--depth", "2", "--batch-size", "8", "--max-steps", "3", "--val-subset",
                      "16", "--workers", "0", "--compile", "--device", device.type, "--out-dir", out]
        env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}  # compile jobs: the worker pool starts
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
        last = [time.perf_counter()]

        def read():
            for _ in proc.stdout:
                last[0] = time.perf_counter()
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"did not finish in {timeout:g} s (train.py --compile had not exited; killed at "
                               "the limit, so no delay was measured)") from None
        done = time.perf_counter()
        if proc.returncode:
            raise RuntimeError(f"train.py --compile exited with status {proc.returncode}")
        return max(0.0, done - last[0])


def mfu_bvit_b16(device, warmup, repeats, batch=128):
    """(CUDA) bViT-B/16 bf16 training: achieved TFLOP/s (model FLOPs: forward + 2x backward)."""
    m = bvit.bvit_b(num_classes=1000).to(device)
    kernels.compile_for_training(m, "blocks")  # regional, as train.py --compile-scope blocks
    dt = timed(train_step_fn(m, batch, 224, 1000, device, True, True), device, warmup, repeats)
    return 3 * m.flops_per_image() * batch / dt / 1e12


def _model(kind, kw):  # a picklable recipe: memory is measured in spawned processes
    if kind == "bvit":
        return bvit.BViT(**kw)
    import loopvae
    return loopvae.LoopVAE(**kw)


def _step_memory(kind, kw, batch, classes, device, amp, ckpt=False):
    """Extra memory (MiB) one training step (forward + backward, optimizer-free) of `_model(kind, kw)`
    needs over the model: CUDA max_memory_allocated; CPU (a fresh process: freed memory is not
    reused) peak RSS during the step minus the RSS before it (Linux /proc)."""
    torch.manual_seed(0)
    m = _model(kind, kw).to(device).set_grad_checkpointing(ckpt)
    x = torch.randn(batch, 3, kw["img_size"], kw["img_size"], device=device)
    y = torch.randint(0, classes, (batch,), device=device)
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


def step_memories(jobs, device):
    """_step_memory(*job) for each job: in this process on CUDA, each in a fresh process on the CPU."""
    if device.type == "cuda":
        return [_step_memory(*j) for j in jobs]
    import multiprocessing  # a fresh process per measurement: RSS peaks never go down
    # glibc's malloc would keep freed tensors' pages resident and count fragmentation; with a
    # fixed mmap threshold every large tensor is its own mapping, so the RSS follows the tensors.
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by the spawned processes at start
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        return pool.starmap(_step_memory, jobs)


def memory_ratios(cfg, device, amp):
    """Peak bViT step memory at depth 12 and 48, without and with activation checkpointing: 4 values."""
    kw = lambda d: dict(img_size=cfg["img"], patch_size=cfg["patch"], num_classes=cfg["classes"],
                        embed_dim=cfg["dim"], depth=d, num_heads=cfg["heads"])
    return step_memories([("bvit", kw(d), cfg["batch"], cfg["classes"], device, amp, c)
                          for c in (False, True) for d in (12, 48)], device)


def loopvae_ledger(device, amp, img, width, batch, warmup, repeats, paper=True, num_groups=32, num_heads=6):
    """LoopVAE's cost ledger (arXiv 2609.11516, sec. 4.7) for presets.LOOPVAE_ARMS (the three sharing
    scopes on one 28-application graph and the unlooped hierarchy, CNN operator; the Transformer-core
    arms of Table 2, `num_heads` heads), K = 4, at `width` channels in `num_groups` GroupNorm groups and
    `img` px (defaults: the paper's f8d16 configuration's). Per arm: stored parameters (all; the core
    alone), stored blocks and block applications per branch, analytic MACs/img
    (LoopVAE.macs_per_image), training img/s of one AdamW
    step at `batch` (measured side by side: the arms take turns for `repeats` rounds of 2 steps, the
    median round counts) and its peak step memory (MiB, step_memories); eval_ms_b8: the latency of an
    encode-decode forward in evaluation mode at batch 8, as the paper times it (sec. 4.7), in turns
    the same way. paper=True adds the analytic parameters and MACs of the paper's f8d16 configuration
    (width 384, 256 px) for each arm."""
    import loopvae
    import presets
    arms = {arm: dict(share=f["share"], loops=tuple(f["loops"]), operator=f.get("operator", "cnn"))
            for arm, (_, f) in presets.LOOPVAE_ARMS.items()}
    kws = {arm: dict(img_size=img, embed_dim=width, num_blocks=4, latent_dim=16, num_groups=num_groups,
                     num_heads=num_heads, **a)
           for arm, a in arms.items()}
    out, steps, forwards = {}, {}, {}
    for arm, kw in kws.items():
        torch.manual_seed(0)
        m = loopvae.LoopVAE(**kw).to(device).train()
        steps[arm] = train_step_fn(m, batch, img, 10, device, amp, True)
        e = loopvae.LoopVAE(**kw).to(device).eval()
        x8 = torch.randn(8, 3, img, img, device=device)

        def forward(e=e, x8=x8):
            with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                e.reconstruct(x8)
        forwards[arm] = forward
        out[arm] = dict(params=m.num_params(), core_params=m.num_params(core_only=True),
                        stored_blocks=len(m.encoder.core.blocks), applications=4 * sum(kw["loops"]),
                        macs=m.macs_per_image(), seconds=[], eval_seconds=[])
        if paper:
            big = (loopvae.loopvae_vit_f8d16 if arms[arm]["operator"] == "vit" else loopvae.loopvae_cnn_f8d16)(
                share=arms[arm]["share"], loops=arms[arm]["loops"])
            out[arm].update(paper_params=big.num_params(), paper_macs=big.macs_per_image())
    for arm in steps:
        timed(steps[arm], device, warmup, 0)
        timed(forwards[arm], device, warmup, 0)
    for _ in range(repeats):  # in turns: a slow patch of a shared machine falls on every arm
        for arm in steps:
            out[arm]["seconds"].append(timed(steps[arm], device, 0, 1, calls=2))
            out[arm]["eval_seconds"].append(timed(forwards[arm], device, 0, 1, calls=2))
    mems = step_memories([("loopvae", kw, batch, 10, device, amp) for kw in kws.values()], device)
    for (arm, r), mem in zip(out.items(), mems):
        r.update(img_per_s=batch / statistics.median(r.pop("seconds")), step_mib=mem,
                 eval_ms_b8=1000 * statistics.median(r.pop("eval_seconds")))
    return out


# The measurements of `run`, in the order they run (--only takes these names; the keys they report
# are in the module docstring).
# Left out of the CPU's default set (asked for by --only): the preset's paths and ours-vs-timm compiled come
# out ~1 on a CPU by construction (it runs each kernel as it is called: their keys are read on CUDA), and
# lab/summarize_loopvae.py runs the LoopVAE ledger itself (issue 66's goal: the default set <= 180 s on CPU-2).
CPU_ON_REQUEST = ("cifar_preset", "timm_compiled", "loopvae")
ON_REQUEST = ("loop_compile",)  # left out of every default set: a probe of torch's loop primitive (issue 66)
MEASUREMENTS = ("matmul", "cifar_preset", "exit_delay", "mfu_b16", "timm_eager", "timm_compiled", "compile_times",
               "loop_compile",
                "revit_dynamic", "loader", "folders", "memory", "loopvae")


def main():
    from training import flags as run_flags  # (as in cifar_preset_step: the number types of train.py's flags)
    p = run_flags.Parser(prog="bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--json", help="also write the ratios to this JSON file (its folder is made if need be)")
    p.add_argument("--workers", type=run_flags.count, default=2, help="CPU loader processes (CPU mode)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat, no compilation: checks "
                   "that the script runs (tests/test_speed.py), measures nothing")
    p.add_argument("--only", help="comma-separated measurements to run, of: " + ", ".join(MEASUREMENTS))
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    if args.json:  # written after every key: its folder is made, and checked, before the first one
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            new = not os.path.exists(args.json)
            with open(args.json, "a"):
                pass
            if new:  # (no empty file left behind by a run that ends before its first key)
                os.remove(args.json)
        except OSError as e:
            p.error(f"--json {args.json} cannot be written ({e.strerror}); give a file in a folder you can write")
    unknown = set(args.only.split(",")) - set(MEASUREMENTS) if args.only else set()
    if unknown:
        p.error(f"--only: unknown measurement(s) {', '.join(sorted(unknown))}; allowed: {', '.join(MEASUREMENTS)}")
    try:
        return run(args)
    finally:
        kernels.release_compile_workers()  # a compiled benchmark exits right after its last line


def run(args):
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    # CPU: small configs so that the whole run (its compilations included) stays within minutes.
    cfg = (dict(img=224, patch=16, classes=1000, dim=384, depth=12, heads=6, batch=128) if cuda else
           dict(img=32, patch=4, classes=100, dim=96, depth=4, heads=3, batch=32))
    warmup, repeats = (5, 20) if cuda else (2, 5)
    # the CIFAR preset at its real size on CUDA; smaller on a CPU (same keys)
    preset_flags = [] if cuda else ["--embed-dim", "64", "--num-heads", "2", "--depth", "4", "--batch-size", "64"]
    if args.smoke:
        cfg, warmup, repeats = dict(cfg, img=32, patch=8, dim=32, depth=2, heads=2, batch=4), 1, 1
        preset_flags = ["--embed-dim", "16", "--num-heads", "2", "--depth", "2", "--batch-size", "8"]
    amp = cuda
    res, errors, info = {}, {}, dict(device=args.device, config=cfg, torch=torch.__version__)
    t_start = time.time()

    def write_json():  # after every key: a run stopped by a time limit keeps what it measured
        if args.json:
            info["seconds"] = time.time() - t_start
            with open(args.json, "w") as f:
                json.dump({**res, "errors": errors, "info": info}, f, indent=1)

    def report(key, value, note=""):
        res[key] = value
        print(f"{key:40s} {value:8.3f}  {note}", flush=True)
        write_json()

    def matmul():
        n, dt = (8192, torch.bfloat16) if cuda else (1024, torch.float32)
        if args.smoke:
            n = 256
        info["matmul_tflops"] = measured = matmul_tflops(device, n, dtype=dt)
        report("matmul_tflops", measured, f"{n}^3 {str(dt)[6:]} matmul measured on "
               + (torch.cuda.get_device_name(device) if cuda else "the CPU"))

    def cifar_preset():
        preset = "c100-gpu-bvit-ti"
        if args.smoke:  # the step runs (eager); nothing is measured
            step = cifar_preset_step(preset, preset_flags, None, device, amp)[0]
            timed(step, device, 1, 1)
            print(f"{'cifar_preset':40s}   ran (smoke: not measured)", flush=True)
            return
        speed, flops = cifar_preset_speed(preset, preset_flags, device, amp, *((15, 5, 20) if cuda else (3, 5, 3)))
        size = "" if cuda else f" at {' '.join(preset_flags)}"
        report("cifar_preset_img_per_s", speed["model"], f"{preset}{size}: train.py --compile (one process: the "
               f"whole-model path), {speed['model']:.0f} img/s")
        tflops = 3 * flops * speed["model"] / 1e12  # forward + 2x backward
        if "matmul_tflops" in info:
            report("mfu_cifar_preset", tflops / info["matmul_tflops"], f"{tflops:.3g} TFLOP/s of "
                   f"{info['matmul_tflops']:.3g} measured")
        cpu = "" if cuda else " (a CPU runs each kernel as it is called: no overlap to win, expect ~1)"
        report("cifar_preset_new_over_old", speed["model"] / speed["old"], f"whole model, no sync {speed['model']:.0f} "
               f"img/s over blocks + a host sync per step (train.py at f937315) {speed['old']:.0f} img/s{cpu}")
        report("cifar_preset_blocks_nosync_over_old", speed["blocks"] / speed["old"],
               f"the sync alone: blocks without it {speed['blocks']:.0f} img/s{cpu}")

    def exit_delay():
        report("compiled_exit_delay_s", compiled_exit_delay(device), "seconds from a first-time train.py "
               "--compile process's last line to its exit (goal <= 5)")

    def mfu_b16():
        tflops = mfu_bvit_b16(device, warmup, repeats)
        measured, name = info["matmul_tflops"], torch.cuda.get_device_name(device)
        report("mfu_bvit_b16_bf16", tflops / measured, f"{tflops:.0f} TFLOP/s of {measured:.0f} measured")
        datasheet = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
        if datasheet:
            report("mfu_bvit_b16_bf16_datasheet", tflops / datasheet, f"{tflops:.0f} TFLOP/s of {datasheet:.0f} "
                   f"on NVIDIA's datasheet ({name})")

    def timm_eager():
        r, a, b = vit_vs_timm(cfg, device, amp, False, warmup, repeats)
        report("vit_vs_timm_train_eager", r, f"ours {a:.0f} img/s, timm {b:.0f} img/s")

    def timm_compiled():
        r, a, b = vit_vs_timm(cfg, device, amp, True, warmup, repeats)
        report("vit_vs_timm_train_compiled", r, f"ours {a:.0f} img/s, timm {b:.0f} img/s")

    def compile_times():
        # the whole-model path (nested regions) first, the regional one beside it; at the CIFAR size on CUDA
        size = dict(cfg, img=32, patch=4, classes=100, dim=192, heads=3, batch=256) if cuda else dict(
            cfg, dim=16, heads=2, batch=8)
        unit = "wall s" if cuda else "CPU s"
        for name, scope in (("bvit", "model"), ("revit", "model"), ("bvit", "blocks")):
            c12, c48 = (compile_seconds(name, d, scope, size, device, amp) for d in (12, 48))
            report(f"{name}_{scope}_compile_d48_over_d12", c48 / c12, f"d12 {c12:.1f} {unit}, d48 {c48:.1f} {unit} "
                   f"(D={size['dim']}, batch {size['batch']})")

    def loop_compile():
        size = dict(dim=192, heads=3, batch=256) if cuda else dict(dim=16, heads=2, batch=8)
        unit = "wall s" if cuda else "CPU s"
        loop_compile_seconds(2, True, size, device)  # (pays the first compilation's one-time imports, discarded)
        for rolled, key in ((True, "block_while_loop"), (False, "block_unrolled")):
            (c12, e12, s12), (c48, e48, s48) = (loop_compile_seconds(d, rolled, size, device) for d in (12, 48))
            note = f"d12 {c12:.1f} {unit}, d48 {c48:.1f} {unit}; gradients vs eager {max(e12, e48):.1e} (relative)"
            report(f"{key}_compile_d48_over_d12", c48 / c12, note + ("" if s48 is None else f"; host syncs: {s48}"))

    def revit_dynamic():
        for b in (1, 64):
            report(f"revit_dynamic_over_materialized_b{b}", revit_latency(cfg, b, device, amp, warmup, repeats),
                   f"E=4, depth {cfg['depth']}, eval")

    def loader():
        r, li, mi = loader_ratio(dict(cfg, batch=256 if cuda else 64), device, amp, warmup, repeats, args.workers)
        report("loader_over_model_img_per_s", r, f"loader {li:.0f} img/s, bViT training {mi:.0f} img/s")

    def folders():
        folder = imagefolder_loaders(cfg, device, amp, warmup, repeats, args.workers)
        report("imagefolder_img_per_s", folder["cpu"], f"{args.workers} CPU workers (PIL), 224 px RandomResizedCrop")
        if cuda:
            report("gpu_decode_loader_over_model_img_per_s", folder["gpu"] / folder["model"],
                   f"loader {folder['gpu']:.0f} img/s (nvJPEG), bViT 224 px training {folder['model']:.0f} img/s")

    def memory():
        mem = memory_ratios(cfg, device, amp)
        report("train_mem_d48_over_d12", mem[1] / mem[0], f"{mem[0]:.0f} -> {mem[1]:.0f} MiB, bViT step")
        report("train_mem_d48_over_d12_grad_ckpt", mem[3] / mem[2], f"{mem[2]:.0f} -> {mem[3]:.0f} MiB, "
               f"--grad-checkpoint ({mem[1] / mem[3]:.1f}x less at depth 48)")

    def loopvae_costs():
        import presets
        # the paper's size and batch on CUDA (sec. 4.7: 256 px, batch 8); the mini presets' on the CPU
        mini = presets.LOOPVAE_MINI  # (the c100-mini-loopvae-* arms' architecture)
        size = dict(img=256, width=384, batch=8) if cuda else dict(
            img=32, width=mini["embed_dim"], batch=mini["batch_size"], num_groups=mini["num_groups"],
            num_heads=mini["num_heads"])
        if args.smoke:
            size = dict(img=16, width=32, batch=2, num_heads=4)
        info["loopvae_ledger"] = led = loopvae_ledger(device, amp, **size, warmup=warmup, repeats=repeats,
                                                      paper=not args.smoke)
        u = led["unlooped"]
        for arm in ("global", "scale", "none"):
            a = led[arm]
            report(f"loopvae_{arm}_over_unlooped_img_per_s", a["img_per_s"] / u["img_per_s"],
                   f"{a['img_per_s']:.1f} vs {u['img_per_s']:.1f} img/s; {a['params'] / u['params']:.2f}x the "
                   f"parameters, {a['macs'] / u['macs']:.2f}x the MACs ({size['img']} px, width {size['width']})")
        if u["step_mib"] > 0:  # (a tiny step on the CPU may not raise the peak RSS at all)
            report("loopvae_global_over_unlooped_step_mem", led["global"]["step_mib"] / u["step_mib"],
                   f"{led['global']['step_mib']:.0f} vs {u['step_mib']:.0f} MiB, batch {size['batch']}")
        else:
            print(f"{'loopvae_global_over_unlooped_step_mem':40s}   not measured: the unlooped step did not raise "
                  "the peak memory at this size", flush=True)

    # In this order: the GPU's peak and the CIFAR preset (issue: GPU speed) first. Each measurement
    # runs whatever happened to the ones before it: a failure is one line here and an entry under
    # "errors" in the JSON.
    measurements = [("matmul", matmul), ("cifar_preset", cifar_preset), ("exit_delay", exit_delay)]
    measurements += [("mfu_b16", mfu_b16)] if cuda else []
    measurements += [("timm_eager", timm_eager)]
    measurements += [] if args.smoke else [("timm_compiled", timm_compiled), ("compile_times", compile_times),
                                           ("loop_compile", loop_compile)]
    measurements += [("revit_dynamic", revit_dynamic), ("loader", loader), ("folders", folders), ("memory", memory),
                     ("loopvae", loopvae_costs)]
    if args.smoke:  # the smoke run checks the script without compiling: no compiled process either
        measurements.remove(("exit_delay", exit_delay))
    only = set(args.only.split(",")) if args.only else None
    if not only:  # the default sets (module docstring)
        measurements = [(name, fn) for name, fn in measurements
                        if name not in ON_REQUEST and (cuda or args.smoke or name not in CPU_ON_REQUEST)]
    info["seconds_each"] = spent = {}  # wall and CPU seconds of each measurement (the default set's budget)
    for name, fn in measurements:
        if only and name not in only:
            continue
        t0, c0 = time.time(), cpu_seconds()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- one failed measurement must not cost the others
            errors[name] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
            print(f"{name:40s}   FAILED  {errors[name]}", flush=True)
            write_json()
        finally:
            torch._dynamo.reset()
            spent[name] = dict(wall=round(time.time() - t0, 1), cpu=round(cpu_seconds() - c0, 1))
    write_json()  # (also when nothing was reported: e.g. no exit rule had an operating point)
    print("seconds (wall / CPU):", ", ".join(f"{k} {v['wall']:.0f} / {v['cpu']:.0f}" for k, v in spent.items()))
    print(f"total {time.time() - t_start:.0f} s on {args.device} ({torch.__version__})"
          + (f"; {len(errors)} measurement(s) failed: {', '.join(errors)}" if errors else ""))
    return errors


if __name__ == "__main__":
    sys.exit(1 if main() else 0)  # a failed measurement: exit status 1 (its line says why)
