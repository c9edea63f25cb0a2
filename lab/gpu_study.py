"""The CIFAR-100 study at GPU scale (c100-gpu-*): every run without a result, within one GPU window.

lab/gpu_study.sh is the command; lab/docs/results.md "CIFAR-100 on one GPU" shows the outcome.

    bash lab/gpu_study.sh                  # on the GPU machine (gpu_data/ carried), OUT set there
    bash lab/gpu_study.sh --dry-run        # any CPU, every arm shrunk to a few steps (test suite)
    python lab/summarize_gpu.py --add OUT/results.jsonl --results lab/docs/results.md   # back here, after

What it does, in order:
1. Reads the finished runs: lab/results/gpu/results.jsonl (committed; one line per run) and
   OUT/results.jsonl (this window's); an (arm, seed) found there is not run again.
2. Picks how many runs share the GPU: a small model leaves most of an H200 idle, so it measures the
   aggregate training img/s of 1 and 4 concurrent copies of the c100-gpu-bvit step (PROBE_COUNTS:
   few, since each copy compiles; each round within PROBE_LIMIT_S, every copy releasing its compile
   workers) and takes the fewest copies within 10 % of the best (OUT/concurrency.jsonl, which
   summarize_gpu.py --add keeps in lab/results/gpu/); a later window on the same GPU reuses it instead of
   measuring again. JOBS=N runs N at once (measuring only N copies, if that was never measured). A
   probe that fails or overruns costs its limit: the study then runs one at a time (FALLBACK_IMG_S).
3. Runs the queue in the order of the claims (each group for every seed before the next group):
   the matched-FLOPs, matched-parameters and deep-supervision arms, then solvers, reViT E, SR-ViT R
   and the init control, then reViT's comparisons, then the distilled arm (after its teacher, the
   vit arm of the same seed), then bViT's width trend (vit-d96, bvit-d96; issue 64). A run starts only if its estimated time fits what is left of the
   budget; the estimate is the arm's own measured img/s when a run of it has finished, else the
   probe's per-run img/s scaled by FLOPs, times 1.25, plus 60 s (compilation, depth evaluations).
   Each run compiles its whole training forward where that graph holds at most
   MAX_GRAPH_APPLICATIONS block applications, else its blocks (`--compile-scope blocks`: odevit
   with rk4). Each run is a process group of its own (scripts/child.py): one still going at
   max(RUN_LIMIT_FACTOR x its estimate, MIN_RUN_LIMIT_S) is stopped, and at the end of the budget
   every run still going is (SIGTERM, then ABRT and KILL within seconds; a partial run is not kept).
4. Appends one line per finished run to OUT/results.jsonl (arm, seed, preset, every depth's top-1
   and top-5, epochs, img/s, compile seconds (epoch 0 over a steady epoch) and scope, wall, commit,
   torch, GPU) and writes OUT/summary.md (the summarizer
   over the committed and the new results) and OUT/study.log. Run folders stay in WORK.

Environment: OUT (gpu_study_out), WORK (/tmp/rvits_gpu_study), GPU_DATA (gpu_data), BUDGET_S (500:
a 9-minute window less the machine's start), SEEDS ("0 1"), ARMS (all, in claim order), JOBS
(measured), RESULTS (lab/results/gpu), COMMIT (git's HEAD if known), PYTHON (this interpreter).
Exit status 0 when every started run finished, 1 otherwise, 2 for bad input.
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))  # (child.py)
sys.path.insert(0, os.path.join(ROOT, "lab"))
import child  # noqa: E402
from provenance import commit, cpu_model  # noqa: E402  (what results are stamped with)

# The arms in the order of the claims (lab/summarize_gpu.py CLAIMS): groups run for every seed
# before the next group. ARM+structured: the preset with --init structured (the init claim's arm);
# ARM+feature: the preset distilled from the vit arm of the same seed (final features).
GROUPS = [["vit", "bvit", "bvit-wide", "vit-narrow", "bvit-ds"],
          ["odevit-euler", "odevit-heun", "odevit-rk4", "revit-e1", "revit-e4", "srvit-r1", "srvit-r2",
           "vit+structured"],
          ["revit-lory", "revit-smear", "revit-deepseek", "revit-qwen3", "revit-moeut", "revit-remoe", "revit-softmoe",
           "revit-lora"],
          ["revit-e4+feature"],
          ["vit-d96", "bvit-d96"]]  # bViT's width trend (issue 64): the gap at D=96 beside D=192's (vit, bvit)
ARMS = [arm for group in GROUPS for arm in group]
PROBE_PRESET = "c100-gpu-bvit"
# The concurrency probe: few copies (each one compiles), each round bounded (dry run: CPU, no compile)
PROBE_COUNTS = (1, 4)
PROBE_LIMIT_S = {False: 150.0, True: 60.0}
# Without a probe (it failed): one run at a time at the img/s of c100-gpu-bvit-ti on the first H200
# run (2026-11-30, f937315, median of 50 epochs: 13.9k; the study's estimates scale it by FLOPs)
FALLBACK_IMG_S = 13_900.0
# Compile scope per arm: the whole training forward (train.py's auto) only where its one graph has at
# most this many block applications; above it, compiled blocks (a whole-model compile grows with the
# applications: 67 s per-block vs 163 s whole model at 12, 911 s at 48, measured on a CPU; the first
# H200 run compiled the regional bViT in ~15 s)
MAX_GRAPH_APPLICATIONS = 24
RUN_LIMIT_FACTOR, MIN_RUN_LIMIT_S = 2.0, 120.0  # a run still going at max(2x its estimate, 120 s) is stopped
EPOCHS = 50  # of every c100-gpu-* preset (presets.GPU)
MARGIN, OVERHEAD_S = 1.25, 60.0
# --dry-run: every arm at this size for a few steps on the CPU (it checks the script, not the GPU)
TINY = ["--embed-dim", "16", "--num-heads", "2", "--batch-size", "16", "--max-steps", "2", "--val-subset", "32",
        "--eval-batch-size", "32", "--workers", "0", "--device", "cpu", "--amp", "none"]


def fail(msg):
    sys.stderr.write(f"gpu_study.sh: error: {msg}\n")
    sys.exit(2)


def preset_of(arm):
    return "c100-gpu-" + arm.split("+")[0]


def arm_flags(arm, seed, work):
    """train.py flags of one run beyond its preset: ARM+structured, ARM+feature (teacher)."""
    if "+" not in arm:
        return []
    kind = arm.split("+")[1]
    if kind == "feature":
        return ["--teacher", os.path.join(work, "vit", f"seed{seed}", "ckpt.pt"), "--distill", "feature"]
    return ["--init", kind]


def read_results(*paths):
    """Result lines (dicts) of the given results.jsonl files that exist, in order."""
    out = []
    for path in paths:
        if os.path.isfile(path):
            with open(path) as f:
                out += [json.loads(line) for line in f if line.strip()]
    return out


def queue(arms, seeds, done):
    """[(arm, seed)] still to run, in claim order: each group for every seed before the next."""
    order = [(arm, seed) for group in GROUPS for seed in seeds for arm in group if arm in arms]
    return [(arm, seed) for arm, seed in order if (arm, seed) not in done]


def estimate_s(arm, per_run_img_s, gflops, measured, epochs, images=50_000):
    """Seconds one run of `arm` is expected to take: epochs x images / its img/s (its own measured
    img/s if a run of it finished, else the probe's per-run img/s scaled by FLOPs; never faster
    than the probe model), x MARGIN, + OVERHEAD_S."""
    rate = measured.get(arm) or per_run_img_s * min(1.0, gflops[PROBE_PRESET] / gflops[preset_of(arm)])
    return MARGIN * epochs * images / rate + OVERHEAD_S


def next_fitting(todo, estimates, left_s, blocked=()):
    """Index in `todo` of the first run whose estimate fits in `left_s` seconds and that is not
    blocked (a distilled arm whose teacher has not finished), or None: a run that cannot finish
    inside the budget is not started."""
    for i, job in enumerate(todo):
        if job not in blocked and estimates[job] <= left_s:
            return i
    return None


def preset_model(preset):
    """(model GFLOPs per image (forward, analytic: flops_per_image), block applications in one training
    forward) of a preset."""
    from training import flags, registry
    args = flags.resolved(["--preset", preset], 32)
    model = registry.build_model(args, 32, 100)
    # steps (recursions for srvit, solver steps for odevit) x block applications per step (the body's layers,
    # the solver's evaluations; 1 for bvit, vit, revit)
    return model.flops_per_image() / 1e9, registry.trained_depth(args) * model.blocks_per_step


def scope_flags(applications):
    """train.py flags of the compile scope for a model with `applications` block applications per
    forward (MAX_GRAPH_APPLICATIONS): none (auto: the whole forward) or --compile-scope blocks."""
    return [] if applications <= MAX_GRAPH_APPLICATIONS else ["--compile-scope", "blocks"]


def probe_worker(seconds, dry):
    """One probe process: the c100-gpu-bvit training step as train.py runs it (bench.py's
    cifar_preset_step); prints its img/s over `seconds` after warm-up. It compiles, so it releases
    inductor's compile workers before it returns (kernels.py: else a cold first compile hangs at exit)."""
    import torch
    import bench
    import kernels
    device = torch.device("cpu" if dry else "cuda")
    flags = ["--embed-dim", "16", "--num-heads", "2", "--depth", "2", "--batch-size", "16"] if dry else []
    try:
        step, batch, _ = bench.cifar_preset_step(PROBE_PRESET, flags, None if dry else "model", device, not dry)
        for _ in range(2 if dry else 15):
            step()
        bench.sync(device)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(1 if dry else 10):
                step()
            bench.sync(device)
            n += batch * (1 if dry else 10)
        print(json.dumps({"img_per_s": n / (time.perf_counter() - t0)}), flush=True)
    finally:
        kernels.release_compile_workers()


def measure_concurrency(python, dry, log, counts=PROBE_COUNTS, limit_s=None):
    """{copies: aggregate img/s} of `copies` probe processes started together. Each round of copies
    has `limit_s` seconds (PROBE_LIMIT_S[dry]) in all: a copy still running then is stopped
    (scripts/child.py) and the round fails (RuntimeError), costing its limit and no more."""
    limit_s = PROBE_LIMIT_S[dry] if limit_s is None else limit_s
    rates = {}
    for k in counts:
        cmd = [python, os.path.abspath(__file__), "--probe-worker", "1" if dry else "8"] + (["--dry-run"] if dry else [])
        outs = [[] for _ in range(k)]
        procs = [child.start(cmd, _Lines(outs[i]), cwd=ROOT) for i in range(k)]
        deadline = time.monotonic() + limit_s
        late = []
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                late.append(proc)
        for proc in late:
            child.stop(proc)
        for proc in procs:
            proc.reader.join(timeout=1.0)
        if late:
            raise RuntimeError(f"a probe of {k} concurrent runs did not finish in {limit_s:.0f} s ({len(late)} stopped)")
        if any(p.returncode for p in procs):
            raise RuntimeError(f"a probe of {k} concurrent runs failed (exit {[p.returncode for p in procs]})")
        rates[k] = sum(json.loads(next(ln for ln in reversed(o) if ln.startswith("{")))["img_per_s"] for o in outs)
        log(f"concurrency probe: {k} run(s) at once, {rates[k]:.0f} img/s in all")
    return rates


class _Lines:
    """A write()-able that keeps the lines written to it in a list (a probe's output)."""

    def __init__(self, lines):
        self.lines = lines

    def write(self, text):
        self.lines += [ln for ln in text.splitlines() if ln.strip()]

    def flush(self):
        pass


def choose_jobs(rates):
    """The fewest concurrent runs whose aggregate img/s is within 10 % of the best."""
    best = max(rates.values())
    return min(k for k, r in rates.items() if r >= 0.9 * best)


def environment(python):
    """(torch version, GPU name or "cpu") of `python`."""
    code = "import torch; print(torch.__version__); print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout.split("\n")
    return out[0], out[1]


def result_line(arm, seed, run_dir, wall_s, meta):
    """The results.jsonl line of a finished run folder."""
    with open(os.path.join(run_dir, "args.json")) as f:
        args = json.load(f)
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    epochs = [r for r in recs if "epoch" in r]
    depths = {}
    path = os.path.join(run_dir, "depth_eval.json")
    if os.path.isfile(path):
        with open(path) as f:
            depths = {str(r["depth"]): [r["val_acc1"], r["val_acc5"]] for r in json.load(f)["results"]}
    from training.registry import trained_depth
    trained = trained_depth(args)  # in --eval-depths' unit: recursions for srvit, solver steps for odevit
    depths.setdefault(str(trained), [epochs[-1]["val_acc1"], epochs[-1]["val_acc5"]])
    with open(os.path.join(run_dir, "train.log")) as f:
        head = next(line for line in f if " M params, " in line)  # "bvit: 0.487 M params, 0.730 GFLOPs/img, ..."
    rates = [r["img_per_s"] for r in epochs[1:]] or [epochs[-1]["img_per_s"]]  # epoch 0 pays compilation
    later = sorted(r["epoch_time_s"] for r in epochs[1:])
    compile_s = epochs[0]["epoch_time_s"] - later[len(later) // 2] if later else None  # epoch 0 over a steady one
    return {"arm": arm, "seed": seed, "preset": args["preset"], "trained_depth": trained, "depths": depths,
            "epochs": len(epochs), "max_steps": args.get("max_steps"), "val_subset": args.get("val_subset"),
            "img_per_s": sorted(rates)[len(rates) // 2], "train_s": sum(r["epoch_time_s"] for r in epochs),
            "wall_s": round(wall_s, 1), "params_m": float(head.split(": ")[1].split(" M")[0]),
            "gflops": float(head.split("M params, ")[1].split(" GFLOPs")[0]),
            "compile_s": None if compile_s is None else round(compile_s, 1), "gates": epochs[-1].get("gates"),
            "compile_scope": args.get("compile_scope") or ("auto" if args.get("compile") else None),
            **meta}


def main(argv=None):
    from training import flags  # (the number types train.py's flags use)
    p = flags.Parser(prog="gpu_study.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="every arm shrunk to a few steps on the CPU")
    p.add_argument("--probe-worker", type=flags.positive(float), metavar="SECONDS", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.probe_worker:
        return probe_worker(a.probe_worker, a.dry_run)
    env = os.environ
    out, work = env.get("OUT", "gpu_study_out"), env.get("WORK", "/tmp/rvits_gpu_study")
    data_dir, results = env.get("GPU_DATA", "gpu_data"), env.get("RESULTS", os.path.join(ROOT, "lab", "results", "gpu"))
    python = env.get("PYTHON", sys.executable)
    try:
        budget = float(env.get("BUDGET_S", "500"))
        seeds = [int(s) for s in env.get("SEEDS", "0 1").split()]
        jobs = int(env["JOBS"]) if env.get("JOBS") else None
    except ValueError as e:
        fail(f"BUDGET_S, SEEDS and JOBS are numbers ({e})")
    if jobs is not None and jobs < 1:
        fail(f"JOBS={jobs}: at least 1 run at a time")
    arms = env.get("ARMS", " ".join(ARMS)).split()
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        fail(f"ARMS: unknown arm(s) {', '.join(unknown)}; allowed: {' '.join(ARMS)}")
    if not os.path.isfile(os.path.join(data_dir, "cifar-100-python", "train")):
        fail(f"no CIFAR-100 in GPU_DATA={data_dir} (expected {data_dir}/cifar-100-python/train; on the GPU "
             "machine unpack gpu_data/cifar-100-device first, as scripts/gpu_run.sh does)")
    os.makedirs(out, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    start = time.time()
    logf = open(os.path.join(out, "study.log"), "a")

    def log(msg):
        line = f"[{time.time() - start:6.0f} s] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    torch_version, gpu = environment(python)
    if gpu == "cpu" and not a.dry_run:
        fail("no CUDA device: the study trains on a GPU; --dry-run runs every arm shrunk on the CPU")
    meta = {"commit": commit(), "torch": torch_version, "gpu": gpu, "date": time.strftime("%Y-%m-%d"),
            "command": "bash lab/gpu_study.sh" + (" --dry-run" if a.dry_run else "")}
    new_path = os.path.join(out, "results.jsonl")
    finished = read_results(os.path.join(results, "results.jsonl"), new_path)
    done = {(r["arm"], r["seed"]) for r in finished if a.dry_run or not (r.get("max_steps") or r.get("val_subset"))}
    todo = queue(arms, seeds, done)
    log(f"gpu_study: {gpu}, torch {torch_version}, commit {meta['commit']}; {len(done)} run(s) already done, "
        f"{len(todo)} to do, budget {budget:.0f} s")
    if not todo:
        return summarize(python, results, new_path, out, log)

    # how many runs share the GPU: the aggregate img/s of 1, 2, 4, 8 concurrent runs, measured once per GPU
    known = read_results(os.path.join(results, "concurrency.jsonl"), os.path.join(out, "concurrency.jsonl"))
    same = [c for c in known if c["gpu"] == gpu and c.get("dry_run", False) == a.dry_run]
    rates = {int(k): v for c in same for k, v in c["img_per_s"].items()}
    wanted = (jobs,) if jobs else PROBE_COUNTS
    if all(k in rates for k in wanted):
        log(f"concurrency: measured before on this GPU ({', '.join(f'{k}: {rates[k]:.0f}' for k in wanted)} img/s)")
    else:
        try:
            rates.update(measure_concurrency(python, a.dry_run, log, [k for k in wanted if k not in rates]))
            with open(os.path.join(out, "concurrency.jsonl"), "a") as f:
                f.write(json.dumps({"gpu": gpu, "torch": torch_version, "commit": meta["commit"], "date": meta["date"],
                                    "img_per_s": {k: rates[k] for k in wanted}, "dry_run": a.dry_run}) + "\n")
        except RuntimeError as e:  # the study goes on: one run at a time, at the first run's pace
            log(f"concurrency probe FAILED ({e}); one run at a time at {FALLBACK_IMG_S:.0f} img/s per run")
            jobs, rates = 1, {1: FALLBACK_IMG_S}
            wanted = (1,)
    jobs = jobs or choose_jobs({k: rates[k] for k in wanted})
    per_run = rates[jobs] / jobs
    meta["jobs"] = jobs
    log(f"concurrency: {jobs} run(s) at once ({per_run:.0f} img/s each)")

    # estimates (seconds per run): from FLOPs per image and the measured img/s of finished arms
    measured = {r["arm"]: r["img_per_s"] for r in finished if r.get("gpu") == gpu and r.get("jobs", 1) == jobs}
    if a.dry_run:  # a few steps each: what the budget logic needs is an estimate, not a real one
        estimates = {job: 5.0 for job in todo}
    else:
        models = {preset: preset_model(preset) for preset in {PROBE_PRESET, *map(preset_of, arms), "c100-gpu-vit"}}
        gflops = {preset: g for preset, (g, _) in models.items()}
        estimates = {(arm, seed): estimate_s(arm, per_run, gflops, measured, EPOCHS) for arm, seed in todo}
    for arm, seed in todo:  # a distilled arm whose teacher's checkpoint is not on this machine retrains it
        if arm.endswith("+feature") and ("vit", seed) not in todo:
            estimates[(arm, seed)] += estimates.get(("vit", seed)) or (5.0 if a.dry_run else estimate_s(
                "vit", per_run, gflops, measured, EPOCHS))

    # the queue
    running, failed = {}, []  # proc -> (arm, seed, run_dir, t0)
    while todo or running:
        left = max(0.0, budget - (time.time() - start))
        # a distilled arm waits for its teacher only when this window trains it (else it retrains it)
        training_vit = {seed for arm, seed in todo if arm == "vit"} | {r[1] for r in running.values() if r[0] == "vit"}
        teacher_pending = {(arm, seed) for arm, seed in todo if arm.endswith("+feature") and seed in training_vit}
        while len(running) < jobs and todo:
            i = next_fitting(todo, estimates, left, teacher_pending)
            if i is None:
                break
            arm, seed = todo.pop(i)
            runs = [(arm, os.path.join(work, arm, f"seed{seed}"))]
            teacher = os.path.join(work, "vit", f"seed{seed}")
            if arm.endswith("+feature") and not os.path.isfile(os.path.join(teacher, "done")):
                runs.insert(0, ("vit", teacher))  # done in an earlier window: its checkpoint is not here
            script = []
            for name, run_dir in runs:
                shutil.rmtree(run_dir, ignore_errors=True)  # a partial run of an earlier window on this machine
                os.makedirs(run_dir)
                cmd = [python, os.path.join(ROOT, "train.py"), "--preset", preset_of(name), "--seed", str(seed),
                       "--data-dir", data_dir, "--out-dir", run_dir, *arm_flags(name, seed, work)]
                cmd += TINY if a.dry_run else ["--compile", *scope_flags(models[preset_of(name)][1]), "--device",
                                               "cuda", "--amp", "bf16"]
                log_path = os.path.join(run_dir, "train.log")
                script.append(" ".join(map(shlex.quote, cmd)) + f" > {shlex.quote(log_path)} 2>&1")
                if name != arm:  # the teacher: mark it done for the student's flags
                    script.append(f"touch {shlex.quote(os.path.join(run_dir, 'done'))}")
            log(f"start {arm} seed {seed}" + (" (after retraining its teacher)" if len(runs) > 1 else "")
                + f" (estimated {estimates[(arm, seed)]:.0f} s, {left:.0f} s left)")
            # a process group of its own (scripts/child.py): a stop reaches train.py and all it started
            proc = child.start(["bash", "-c", " && ".join(script)], cwd=ROOT,
                               env={**env, "OMP_NUM_THREADS": "1"} if a.dry_run else None)
            limit = max(RUN_LIMIT_FACTOR * estimates[(arm, seed)], MIN_RUN_LIMIT_S)  # a hung run costs this
            running[proc] = (arm, seed, runs[-1][1], time.time(), limit)
        if not running:
            if todo:
                log(f"not started, they would not finish in the {left:.0f} s left: "
                    + ", ".join(f"{arm} seed {seed} ({estimates[(arm, seed)]:.0f} s)" for arm, seed in todo))
            break
        for proc in [p for p, r in running.items() if p.poll() is None and time.time() - r[3] > r[4]]:
            arm, seed, _, t0, limit = running[proc]
            log(f"{arm} seed {seed}: over its limit ({limit:.0f} s, {RUN_LIMIT_FACTOR}x its estimate): stopping it")
            child.stop(proc)
        for proc in [p for p in running if p.poll() is not None]:
            arm, seed, run_dir, t0, _ = running.pop(proc)
            if proc.returncode:
                failed.append((arm, seed))
                with open(os.path.join(run_dir, "train.log")) as f:
                    last = (f.read().strip().splitlines() or [""])[-1][:300]
                log(f"FAILED {arm} seed {seed} (exit {proc.returncode}): {last}")
                continue
            line = result_line(arm, seed, run_dir, time.time() - t0, meta)
            with open(new_path, "a") as f:
                f.write(json.dumps(line) + "\n")
            open(os.path.join(run_dir, "done"), "w").close()
            measured.setdefault(arm, line["img_per_s"])
            top1 = line["depths"][str(line["trained_depth"])][0]
            log(f"done {arm} seed {seed}: top-1 {top1:.2f} %, {line['img_per_s']:.0f} img/s, {line['wall_s']:.0f} s; "
                f"{len(todo)} to do")
        if time.time() - start > budget and running:
            for proc, (arm, seed, *_) in running.items():
                log(f"budget spent: stopping {arm} seed {seed} (not kept)")
                child.stop(proc)  # TERM, then ABRT and KILL: bounded (scripts/child.py)
            failed += [(arm, seed) for arm, seed, *_ in running.values()]
            running = {}
            break
        time.sleep(0.5 if a.dry_run else 2)  # polling the runs (a script, not a test)
    rc = summarize(python, results, new_path, out, log)
    return 1 if failed else rc


def summarize(python, results, new_path, out, log):
    """OUT/summary.md: the summarizer over the committed results and this window's."""
    cmd = [python, os.path.join(ROOT, "lab", "summarize_gpu.py"), results, "--out", out, "--no-save"]
    cmd += ["--add", new_path] if os.path.isfile(new_path) else []
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    log("summary: " + (f"{out}/summary.md" if r.returncode == 0 else f"FAILED: {r.stderr.strip()[-300:]}"))
    return 0 if r.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
