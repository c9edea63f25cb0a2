"""Each model's compiled bf16 training step at ImageNet size (224 px, size S, batch 64, synthetic
images), in one process: the first step's seconds (compilation) and the steady img/s per model.

    python3 scripts/gpu_smoke.py              # CUDA, compiled blocks (kernels.py scope "blocks")
    python scripts/gpu_smoke.py --dry-run     # any CPU: 32 px, tiny width, eager

Scope "blocks" on purpose: each distinct block compiles once whatever the depth, so the four models
compile in seconds each; the whole-model scope is measured where it pays, on the CIFAR preset
(scripts/gpu_check.py). A model that fails is one line and the next one runs; exit status 1 if any
failed. Step 5 of scripts/gpu_run.py.
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import bench  # noqa: E402
import kernels  # noqa: E402
from training import flags, registry  # noqa: E402

MODELS = ("bvit", "revit", "odevit", "srvit")


def smoke(model_name, device, dry, steps=3):
    """(first-step seconds, steady img/s) of one model's bf16 training step."""
    argv = ["--model", model_name] + (["--embed-dim", "16", "--num-heads", "2", "--depth", "2", "--batch-size", "4"]
                                      if dry else ["--size", "s", "--img-size", "224", "--patch-size", "16",
                                                   "--batch-size", "64"])
    img = 32 if dry else 224
    args = flags.resolved(argv, img)
    torch.manual_seed(0)
    model = registry.build_model(args, img, 1000).to(device)
    forward = model if dry else kernels.compile_for_training(model, "blocks", device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(args.batch_size, 3, img, img, device=device)
    y = torch.randint(0, 1000, (args.batch_size,), device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = forward(x, y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    step()
    bench.sync(device)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    bench.sync(device)
    return first, steps * args.batch_size / (time.perf_counter() - t0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="32 px, tiny width, eager, on the CPU")
    a = p.parse_args(argv)
    if not a.dry_run and not torch.cuda.is_available():
        p.error("no CUDA device; --dry-run runs the steps on the CPU")
    device = torch.device("cpu" if a.dry_run else "cuda")
    failed = []
    try:
        for name in MODELS:
            try:
                first, rate = smoke(name, device, a.dry_run)
                print(f"smoke {name}: first step {first:.1f} s (compilation included), {rate:.0f} img/s", flush=True)
            except Exception as e:  # noqa: BLE001 -- one model's failure must not cost the others
                failed.append(name)
                print(f"smoke {name}: FAILED {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}",
                      flush=True)
            torch.compiler.reset()
    finally:
        kernels.release_compile_workers()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
