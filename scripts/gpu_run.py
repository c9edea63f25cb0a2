"""The one command for a GPU window (one H200, at most WINDOW_S = 545 s): the figures that matter
first, every step under its own limit, and the window's end as a hard deadline.

    cp -r ../shared/data/cifar-100-device gpu_data/      # here, once (gpu_data/ is git-ignored)
    device run, carry gpu_data:  PYTHONUNBUFFERED=1 bash scripts/gpu_run.sh     (OUT is set there)
    bash scripts/gpu_run.sh --dry-run      # any CPU: every step at tiny width, compiled (test suite)

The steps (PLAN), in order:
1. env: torch, torchvision, CUDA, the GPU, and which private inductor names kernels.py relies on
   exist in this torch (kernels.inductor_names).
2. unpack_cifar: CIFAR-100 from gpu_data/cifar-100-device (when not unpacked yet).
3. gpu_check: scripts/gpu_check.py, the whole-model CUDA-graph path of c100-gpu-bvit-ti proven
   (CUDA-graph skips, recompiles, syncs per step, profiler summary), img/s of eager vs blocks vs
   whole model, then the speed ideas side by side.
4. cifar: one full c100-gpu-bvit-ti run (50 epochs, --compile: the whole-model path), log back.
5. compile_ratio: bench.py's compile times at depth 48 over 12 (`--only compile_times`): bViT and reViT
   on the whole-model path (each step a nested compile region, CUDA graphs), then bViT's regional path.
6. cuda_tests: the CUDA tests of the suite.
7. smoke_224: each model's compiled (blocks) bf16 training step at 224 px (scripts/gpu_smoke.py).
Every step runs under scripts/child.py: a step over its limit is stopped (TERM, ABRT with the stacks
in the log, KILL: at most child.STOP_S seconds more) and the window goes on; a step's limit is cut
to what is left of WINDOW_S, and a step with under 15 s left is skipped. For each step summary.md
says its status, seconds and exit delay (its last output line to its exit: a compiled process must
exit right after it, kernels.release_compile_workers).

What comes back (at most 8 files): OUT/summary.md, OUT/gpu_run.log (every step's output),
OUT/gpu_check.json, OUT/cifar_log.jsonl, OUT/bench_compile.json. Checkpoints and run folders stay in WORK on the machine.
Environment: OUT (gpu_run_out), WORK (/tmp/rvits_gpu_run), GPU_DATA (gpu_data), PRESET
(c100-gpu-bvit-ti), WINDOW_S (545), SKIP (step names, comma-separated: e.g. "cifar" when the window
also runs lab/gpu_study.sh), CHECK_BUDGET_S (gpu_check's --budget-s, 110), PYTHON (this interpreter). Exit status 0 when every step
passed, 1 otherwise.
"""
import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import child  # noqa: E402
import gpu_check  # noqa: E402

WINDOW_S = 545.0  # a 570 s command limit, less the interpreter's start and the copy back
MIN_STEP_S = 15.0
ENV = ("import sys, torch, torchvision; sys.path.insert(0, '.'); import kernels; "
       "print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'cuda', torch.version.cuda, "
       "torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'); "
       "print('inductor names', kernels.inductor_names())")
TINY = ["--embed-dim", "16", "--num-heads", "2", "--depth", "2", "--batch-size", "16", "--val-subset", "32",
        "--eval-batch-size", "32", "--workers", "0"]


def plan(dry, py, out, work, data, preset, check_budget=110.0):
    """[(name, limit seconds, command)] of the window, in order. The real limits: measured times of the
    first H200 run (2026-11-30) with room: a cold regional compile of bViT took ~15 s there, 50 epochs
    of c100-gpu-bvit-ti 198 s on the old path (so the run may stop at its limit with a checkpoint); the
    window of 2026-12-04: gpu_check 71 s at --budget-s 90, cuda_tests 16 s, smoke_224 30 s, and the
    whole-model path at 53k img/s (50 epochs: ~50 s after its ~30 s compile)."""
    check = [py, "scripts/gpu_check.py", "--json", os.path.join(out, "gpu_check.json")]
    cifar = [py, "train.py", "--preset", preset, "--data-dir", data, "--out-dir", os.path.join(work, "cifar")]
    smoke = [py, "scripts/gpu_smoke.py"]
    if dry:  # the CPU at tiny width; gpu_check compiles (fp32 there), so the compiled path and its exit run
        return [("env", 60, [py, "-c", ENV]),
                ("gpu_check", 240, check + ["--dry-run", "--steps", "2", "--rounds", "1", "--budget-s", "200",
                                            "--paths", "eager,blocks,model"]),
                ("cifar", 120, cifar + TINY + ["--epochs", "1", "--warmup-epochs", "0", "--max-steps", "2", "--device", "cpu",
                                                    "--amp", "none"]),
                ("smoke_224", 120, smoke + ["--dry-run"])]
    return [("env", 30, [py, "-c", ENV]),
            ("gpu_check", check_budget + 20, check + ["--budget-s", f"{check_budget:.0f}"]),
            ("cifar", 130, cifar + ["--compile", "--device", "cuda", "--amp", "bf16"]),
            ("compile_ratio", 100, [py, "bench.py", "--device", "cuda", "--only", "compile_times", "--json",
                                    os.path.join(out, "bench_compile.json")]),
            ("cuda_tests", 30, [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/test_speed.py",
                                "test_models.py", "tests/test_loop.py", "-k", "cuda or bf16"]),
            ("smoke_224", 60, smoke)]


def check_lines(path):
    """summary.md lines of gpu_check.json (what it measured before it ended, however it ended)."""
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except OSError:
        return ["  no gpu_check.json: no path was measured"]
    return [f"  {line}" for line in gpu_check.table(rows)]


def cifar_lines(path, preset):
    """summary.md lines of a CIFAR run's log.jsonl."""
    try:
        with open(path) as f:
            recs = [json.loads(line) for line in f if line.strip()]
    except OSError:
        return ["  no log.jsonl: the CIFAR run did not finish an epoch"]
    ep = [r for r in recs if "epoch" in r]
    lines = []
    if ep:
        rates = sorted(r["img_per_s"] for r in ep[1:]) or [ep[-1]["img_per_s"]]
        lines.append(f"  {preset}: {len(ep)} epoch(s), step {ep[-1]['step']}, top-1 {ep[-1]['val_acc1']:.2f} %, "
                     f"top-5 {ep[-1]['val_acc5']:.2f} %, {sum(r['epoch_time_s'] for r in ep):.0f} s training, "
                     f"median {rates[len(rates) // 2]:.0f} img/s (epoch 0: {ep[0]['epoch_time_s']:.1f} s, "
                     "compilation included)")
    lines += [f"  depth {r['depth']}: top-1 {r['val_acc1']:.2f} %" for r in recs if "depth" in r]
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="every step at tiny width on the CPU")
    a = p.parse_args(argv)
    env = os.environ
    out, work = env.get("OUT", "gpu_run_out"), env.get("WORK", "/tmp/rvits_gpu_run")
    data, preset = env.get("GPU_DATA", "gpu_data"), env.get("PRESET", "c100-gpu-bvit-ti")
    py = env.get("PYTHON", sys.executable)
    try:
        window = float(env.get("WINDOW_S", WINDOW_S))
        check_budget = float(env.get("CHECK_BUDGET_S", 110.0))
    except ValueError:
        print("gpu_run.sh: error: WINDOW_S and CHECK_BUDGET_S are numbers of seconds", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    start = time.monotonic()
    summary_path = os.path.join(out, "summary.md")
    with open(summary_path, "w") as f:
        f.write(f"# scripts/gpu_run.sh {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
                f"{' (dry run)' if a.dry_run else ''}, window {window:.0f} s\n")

    def say(line):
        print(line, flush=True)
        with open(summary_path, "a") as f:
            f.write(line + "\n")

    steps = plan(a.dry_run, py, out, work, data, preset, check_budget)
    skip = [name for name in env.get("SKIP", "").split(",") if name]
    unknown = sorted(set(skip) - {name for name, _, _ in steps})
    if unknown:
        print(f"gpu_run.sh: error: SKIP names no step {', '.join(unknown)}; "
              f"the steps: {', '.join(name for name, _, _ in steps)}", file=sys.stderr)
        return 2
    steps = [step for step in steps if step[0] not in skip]
    if not os.path.isfile(os.path.join(data, "cifar-100-python", "train")):
        packed = os.path.join(data, "cifar-100-device")
        if os.path.isdir(packed):
            steps.insert(1, ("unpack_cifar", 30, [py, os.path.join(packed, "cifar100_pack.py"), "unpack", packed, data]))
        else:
            say(f"- unpack_cifar: FAILED: neither {data}/cifar-100-python nor {packed}; copy "
                "../shared/data/cifar-100-device into gpu_data/ and carry it")
    shutil.rmtree(os.path.join(work, "cifar"), ignore_errors=True)  # a warm machine may hold an earlier try
    child_env = {**env, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}  # ABRT: every thread's stack
    failed = 0
    with open(os.path.join(out, "gpu_run.log"), "w") as log:
        for name, limit, cmd in steps:
            left = window - (time.monotonic() - start) - child.STOP_S
            if left < MIN_STEP_S:
                say(f"- {name}: SKIPPED ({left + child.STOP_S:.0f} s of the window left)")
                failed += 1
                continue
            limit = min(limit, left)
            log.write(f"=== {name} (limit {limit:.0f} s): {' '.join(cmd)}\n")
            log.flush()
            r = child.run(cmd, limit, log, child_env, ROOT)
            delay = "" if r["exit_delay_s"] is None else f", exit delay {r['exit_delay_s']:.1f} s"
            say(f"- {name}: {r['status']} (exit {r['rc']}, {r['seconds']:.0f} s{delay})")
            if r["rc"]:
                failed += 1
                say(f"  last line: {r['last_line']}")
            if name == "env":
                with open(log.name) as f:
                    say("".join(f"  {ln}" for ln in f if ln.startswith(("torch ", "inductor names"))).rstrip())
            if name == "gpu_check":
                for line in check_lines(os.path.join(out, "gpu_check.json")):
                    say(line)
            if name == "cifar":
                if os.path.isfile(os.path.join(work, "cifar", "log.jsonl")):
                    shutil.copy(os.path.join(work, "cifar", "log.jsonl"), os.path.join(out, "cifar_log.jsonl"))
                for line in cifar_lines(os.path.join(out, "cifar_log.jsonl"), preset):
                    say(line)
    say(f"status {1 if failed else 0}: {failed} step(s) failed, timed out or skipped; "
        f"{time.monotonic() - start:.0f} s in all; every step's output in {out}/gpu_run.log")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
