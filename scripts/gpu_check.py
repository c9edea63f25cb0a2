"""Proof that the compiled training path is the one that runs, and each speed idea side by side:
the first measurement of a GPU window (scripts/gpu_run.py runs it right after the environment).

    python3 scripts/gpu_check.py --json OUT/gpu_check.json          # CUDA: c100-gpu-bvit-ti at batch 512
    python scripts/gpu_check.py --dry-run                            # any CPU: tiny width, compiled

The step is bench.cifar_preset_step: c100-gpu-bvit-ti's training step as train.py runs it (fused
AdamW, MixUp/CutMix, smoothing, clipping, the GPU-resident loader). Each path is built, its first
step timed (compilation: first step minus a steady one), then `--steps` steps timed (median of
rounds, one sync per round). In this order, so that what matters comes first:
1. eager, blocks (kernels.py "blocks": compiled blocks, eager loop), model (the whole training
   forward as one graph; on CUDA replayed as a CUDA graph). For "model" also, over `--steps` steps:
   inductor's CUDA-graph skip count (must be 0: a skip means the graph does not replay), graphs
   compiled after the first step (recompiles, must be 0), host-device syncs per step counted under
   torch.cuda.set_sync_debug_mode("warn") (must be 0), and a profiler summary (top kernels by
   device time, the share of the wall time the device was busy: the rest are host gaps).
2. Upper bounds of ideas, on the compiled "model" path without a new compilation: no optimizer
   (forward + backward only: the most a compiled, capturable optimizer step could win), no
   MixUp/CutMix, one fixed batch (the most moving augmentation into the graph could win).
3. Variants that need their own compilation, while the budget lasts: bf16 residual stream
   (bench.bf16_residual_stream), max-autotune (autotuned matmuls, CUDA graphs).
Each path is one JSON line in `--json` as soon as it is measured (a run stopped at its limit keeps
what it measured) and one row of the table printed last. Exit status 1 when the "model" path
skipped CUDA graphs, recompiled or synced on CUDA (the check failed: say so loudly), else 0.
"""
import json
import os
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import bench  # noqa: E402
import kernels  # noqa: E402
from training import flags as run_flags  # noqa: E402  (the number types of train.py's flags)

PRESET = "c100-gpu-bvit-ti"  # (bench.GPU_BVIT: the lab's arm of that name)
TINY = ["--embed-dim", "16", "--num-heads", "2", "--depth", "2", "--batch-size", "16"]  # --dry-run
# name: (cifar_preset_step keywords, its compile time in units of the longest one measured before:
# 0 = the same graph as "model", found in inductor's cache; max-autotune also times every matmul's
# candidate kernels, a guess of 4x)
PATHS = {
    "eager": (dict(scope=None), 0),
    "blocks": (dict(scope="blocks"), 1),
    "model": (dict(scope="model"), 1),
    "model_no_optimizer": (dict(scope="model", optimizer=False), 0),
    "model_no_mix": (dict(scope="model", mix=False), 0),
    "model_fixed_batch": (dict(scope="model", mix=False, loader=False), 0),
    "model_bf16_residual": (dict(scope="model", bf16_residual=True), 1),
    "model_max_autotune": (dict(scope="model", mode="max-autotune"), 4),
}


def graphs():
    """Graphs dynamo has compiled in this process so far."""
    return counters["stats"]["unique_graphs"]


def steady_seconds(step, device, steps, rounds):
    """Median seconds per step over `rounds` rounds of `steps` steps, one sync per round."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        bench.sync(device)
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times)


def count_syncs(step, device, steps):
    """(host-device synchronizations per step, counted as the warnings of
    torch.cuda.set_sync_debug_mode("warn"), the first 5 places that warned as "file:line") on CUDA;
    (None, []) elsewhere."""
    if device.type != "cuda":
        return None, []
    bench.sync(device)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(steps):
                step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    bench.sync(device)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    return len(syncs) / steps, sorted({f"{w.filename}:{w.lineno}" for w in syncs})[:5]


def profile(step, device, steps, top=8):
    """A profiler summary of `steps` steps: the top kernels (or CPU ops) by time, and on CUDA the share
    of the wall time the device was busy (the rest: host gaps)."""
    from torch.profiler import ProfilerActivity
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    bench.sync(device)
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        bench.sync(device)
    wall_us = (time.perf_counter() - t0) * 1e6
    events = prof.key_averages()
    if device.type == "cuda":
        device_us = lambda e: getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)  # noqa: E731
        kernels_ = [e for e in events if device_us(e) > 0]
        busy = sum(device_us(e) for e in kernels_)
        kernels_.sort(key=device_us, reverse=True)
        return {"device_busy": round(busy / wall_us, 3), "wall_ms_per_step": round(wall_us / steps / 1e3, 3),
                "top": [[e.key[:80], round(device_us(e) / steps, 1), e.count // steps] for e in kernels_[:top]]}
    ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    return {"device_busy": None, "wall_ms_per_step": round(wall_us / steps / 1e3, 3),
            "top": [[e.key[:80], round(e.self_cpu_time_total / steps, 1), e.count // steps] for e in ops[:top]]}


def measure(name, device, flags, steps, rounds, out):
    """Build path `name`, time its first step and its steady steps; on "model" also the checks.
    Returns its result dict (also appended to `out`, a JSON-lines file, if given)."""
    kw, _ = PATHS[name]
    amp = device.type == "cuda"  # bf16 autocast as the study trains; fp32 on the CPU (a dry run: compiles faster)
    torch.compiler.reset()
    counters.clear()
    step, batch, flops = bench.cifar_preset_step(bench.GPU_BVIT, flags, device=device, amp=amp, **kw)
    bench.sync(device)
    t0 = time.perf_counter()
    step()  # compiles (the backward too)
    bench.sync(device)
    first = time.perf_counter() - t0
    for _ in range(2):  # CUDA graphs: recorded on the first replays after warm-up
        step()
    bench.sync(device)
    before = graphs()
    per_step = steady_seconds(step, device, steps, rounds)
    res = {"path": name, "img_per_s": round(batch / per_step, 1), "ms_per_step": round(per_step * 1e3, 3),
           "compile_s": round(max(0.0, first - per_step), 1), "batch": batch,
           "tflops": round(3 * flops * batch / per_step / 1e12, 2)}
    if name == "model":
        res["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
        res["recompiles"] = graphs() - before
        try:  # the img/s above is kept whatever the debug tools do
            res["syncs_per_step"], res["sync_places"] = count_syncs(step, device, steps)
            res["recompiles"] = graphs() - before  # the sync-counted steps included
            res["profile"] = profile(step, device, min(steps, 5))
        except Exception as e:  # noqa: BLE001
            res["check_error"] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
    print(json.dumps(res), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(res) + "\n")
    return res


def table(rows):
    """The lines of the side-by-side table of measured paths (result dicts), and the model path's checks."""
    base = next((r for r in rows if r["path"] == "model"), None)
    lines = [f"{'path':22s} {'img/s':>9s} {'ms/step':>8s} {'compile s':>9s} {'x model':>7s}"]
    for r in rows:
        ratio = f"{r['img_per_s'] / base['img_per_s']:.3f}" if base else "-"
        lines.append(f"{r['path']:22s} {r['img_per_s']:9.0f} {r['ms_per_step']:8.2f} {r['compile_s']:9.1f} {ratio:>7s}")
    if base:
        profile = base.get("profile", {})
        lines.append(f"model path: {base['cudagraph_skips']} CUDA-graph skips, {base['recompiles']} recompiles, "
                     f"{base.get('syncs_per_step')} syncs per step, device busy {profile.get('device_busy')}, top kernel "
                     f"{(profile.get('top') or [['-']])[0][0]}" + (f"; {base['check_error']}" if "check_error" in base else ""))
    return lines


def failures(res, cuda):
    """What the "model" path did that it must not (CUDA only): a list of lines."""
    if not cuda:
        return []
    bad = []
    if res.get("cudagraph_skips"):
        bad.append(f"{res['cudagraph_skips']} CUDA-graph skip(s): the whole-model graph does not replay")
    if res.get("recompiles"):
        bad.append(f"{res['recompiles']} graph(s) compiled after the first step (recompiles)")
    if res.get("syncs_per_step"):
        bad.append(f"{res['syncs_per_step']:.2f} host-device syncs per step (at {', '.join(res['sync_places'])})")
    if "check_error" in res:
        bad.append(f"the sync count or the profiler failed: {res['check_error']}")
    return bad


def main(argv=None):
    p = run_flags.Parser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny width, fp32 (compiles: checks the script; "
                   "model_bf16_residual needs bf16 autocast, so not there)")
    p.add_argument("--steps", type=run_flags.positive(int), default=20, help="steps per timed round (default: 20)")
    p.add_argument("--rounds", type=run_flags.positive(int), default=3, help="timed rounds per path (default: 3)")
    p.add_argument("--budget-s", type=run_flags.positive(float), default=150.0, help="a path is started only if its estimated "
                   "time fits in what is left (default: 150)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of: {', '.join(PATHS)}")
    p.add_argument("--json", help="append one line per path to this file")
    a = p.parse_args(argv)
    names = a.paths.split(",")
    unknown = [n for n in names if n not in PATHS]
    if unknown:
        p.error(f"--paths: unknown {', '.join(unknown)}; allowed: {', '.join(PATHS)}")
    cuda = not a.dry_run
    if cuda and not torch.cuda.is_available():
        p.error("no CUDA device; --dry-run runs the check on the CPU at tiny width")
    device = torch.device("cuda" if cuda else "cpu")
    flags = TINY if a.dry_run else []
    start, results, compile_s = time.time(), [], 0.0
    try:
        for name in names:
            left = a.budget_s - (time.time() - start)
            needs = 1.5 * PATHS[name][1] * compile_s  # from the paths measured before
            if results and left < needs + 10:
                print(f"{name}: not run, {left:.0f} s left of --budget-s (needs ~{needs + 10:.0f} s)", flush=True)
                continue
            try:
                res = measure(name, device, flags, a.steps, a.rounds, a.json)
            except Exception as e:  # noqa: BLE001 -- one failed path must not cost the others
                print(f"{name}: FAILED {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}",
                      flush=True)
                continue
            results.append(res)
            compile_s = max(compile_s, res["compile_s"])
    finally:
        kernels.release_compile_workers()  # this process compiled: it exits right after its last line
    print("\n" + "\n".join(table(results)))
    base = next((r for r in results if r["path"] == "model"), None)
    if base is None:
        print("FAILED: the whole-model path did not run", flush=True)
        return 1
    bad = failures(base, cuda)
    for line in bad:
        print(f"FAILED: {line}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
