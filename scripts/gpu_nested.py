"""Does hierarchical compilation (torch.compiler.nested_compile_region) keep the whole-model compile flat
in depth on this torch and device? A probe for the GPU window (scripts/gpu_run.py step "nested"):
each model's Block.forward marked as a nested compile region, the whole training forward compiled as
one graph (torch.compile, CUDA graphs on CUDA as train.py's --compile), the first training step timed
(compilation included) at depth 12 and 48, and the loss checked against eager at the same weights.

    python3 scripts/gpu_nested.py                   # CUDA: c100-gpu width (D=192), batch 256, bf16
    python scripts/gpu_nested.py --dry-run          # any CPU: tiny width, fp32, no CUDA graphs

One line per (model, depth, marked): first-step seconds, steady ms/step, |loss - eager loss|, or the
error in one line. Inductor's caches are off (TORCHINDUCTOR_FORCE_DISABLE_CACHES) so each compile is cold.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import bvit  # noqa: E402
import revit  # noqa: E402


def build(name, depth, dry):
    width = dict(embed_dim=16, num_heads=2) if dry else dict(embed_dim=192, num_heads=3)
    common = dict(img_size=32, patch_size=4, num_classes=100, depth=depth, **width)
    torch.manual_seed(0)
    return bvit.BViT(**common) if name == "bvit" else revit.ReViT(experts=4, **common)


def probe(name, depth, marked, dry, device):
    cls = bvit.Block if name == "bvit" else revit.Block
    plain = cls.forward
    if marked:
        cls.forward = torch.compiler.nested_compile_region(plain)
    try:
        torch._dynamo.reset()
        model = build(name, depth, dry).to(device)
        x = torch.randn(8 if dry else 256, 3, 32, 32, device=device)
        y = torch.randint(0, 100, (x.shape[0],), device=device)
        ctx = torch.autocast(device.type, dtype=torch.bfloat16, enabled=not dry)
        model.eval()  # no drop path draws: the compiled and the eager loss are comparable
        with ctx, torch.no_grad():
            ref = model(x, y)[1].float().item()
        model.train()
        fwd = torch.compile(model, mode=None if dry else "reduce-overhead")

        def step():
            with ctx:
                loss = fwd(x, y)[1]
            loss.backward()
            model.zero_grad(set_to_none=True)
            return loss

        t = time.perf_counter()
        step()
        torch.cuda.synchronize() if device.type == "cuda" else None
        first = time.perf_counter() - t
        for _ in range(3):
            step()
        torch.cuda.synchronize() if device.type == "cuda" else None
        t = time.perf_counter()
        for _ in range(10):
            step()
        torch.cuda.synchronize() if device.type == "cuda" else None
        steady = (time.perf_counter() - t) / 10
        model.eval()
        with ctx, torch.no_grad():
            got = fwd(x, y)[1].float().item()
        print(f"nested {name} depth {depth} marked {marked}: first step {first:.1f} s, steady {1e3 * steady:.1f} ms, "
              f"|loss - eager| {abs(got - ref):.2e}", flush=True)
    except Exception as e:  # noqa: BLE001  (a probe: one line per failure, the next one runs)
        print(f"nested {name} depth {depth} marked {marked}: FAILED {type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''}", flush=True)
    finally:
        cls.forward = plain


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="tiny width on the CPU")
    a = p.parse_args()
    device = torch.device("cpu" if a.dry_run or not torch.cuda.is_available() else "cuda")
    print(f"nested: torch {torch.__version__}, {device}, "
          f"nested_compile_region {'present' if hasattr(torch.compiler, 'nested_compile_region') else 'ABSENT'}",
          flush=True)
    for name, depth, marked in [("bvit", 12, True), ("bvit", 48, True), ("revit", 12, True), ("revit", 48, True),
                                ("bvit", 12, False)]:
        probe(name, depth, marked, a.dry_run, device)


if __name__ == "__main__":
    main()
