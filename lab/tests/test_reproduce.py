"""The reproduction scripts (issue 11): the mini study's summary and verdicts, lab/reproduce_mini.sh
(runs, skips what is done), scripts/gpu_run.sh's CPU dry run, and the study at GPU scale
(lab/gpu_study.sh: dry run, budget, concurrency; lab/summarize_gpu.py), and lab/check_readme.py
(README's quick commands and numbers). CPU only, fake CIFAR data."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

import arms
from test_train import fake_cifar

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, os.path.join(ROOT, "scripts"))  # the tools: check_readme, the GPU window
sys.path.insert(0, os.path.join(ROOT, "lab"))  # the study runners and summarizers
import check_readme  # noqa: E402
import child  # noqa: E402
import gpu_check  # noqa: E402
import gpu_run  # noqa: E402
import gpu_study  # noqa: E402
import summarize_gpu  # noqa: E402
import summarize_mini  # noqa: E402
import kept  # noqa: E402
from training.flags import get_parser, parse_args, resolve
from training import registry


def fake_run(root, arm, seed, acc, depths=None, model="bvit", depth=8, recursions=4, gates=None):
    """A finished run folder as reproduce_mini.sh leaves it. depths: {evaluated depth: top-1}."""
    d = root / arm / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "train.log").write_text(f"preset x\n{model}: 0.365 M params, 0.032 GFLOPs/img, depth {depth}, ...\n")
    (d / "args.json").write_text(json.dumps({"seed": seed, "model": model, "depth": depth, "recursions": recursions}))
    rec = {"epoch": 0, "step": 10, "val_acc1": acc, "val_acc5": acc + 20, "epoch_time_s": 60.0, "img_per_s": 100.0}
    if gates:
        rec["gates"] = gates
    (d / "log.jsonl").write_text(json.dumps(rec) + "\n")
    if depths:
        rows = [{"depth": k, "val_acc1": v, "val_acc5": v + 20, "val_loss": 1.0, "nfe": k} for k, v in depths.items()]
        (d / "depth_eval.json").write_text(json.dumps({"results": rows}))
    (d / "done.json").write_text(json.dumps({"wall_s": 90, "cpu": "one CPU model"}))  # (pairs on one CPU model)


def test_summary_tables_relative_depths_and_verdicts(tmp_path):
    fake_run(tmp_path, "vit", 0, 33.0, model="vit")
    fake_run(tmp_path, "vit", 1, 34.0, model="vit")
    fake_run(tmp_path, "bvit", 0, 25.0, {4: 20.0, 8: 25.0, 16: 10.0, 32: 2.0})
    fake_run(tmp_path, "bvit", 1, 26.0, {4: 21.0, 8: 26.0, 16: 11.0, 32: 3.0})
    fake_run(tmp_path, "bvit-ds", 0, 24.0, {4: 22.0, 8: 24.0, 16: 20.0, 32: 15.0})
    fake_run(tmp_path, "srvit-r1", 0, 20.0, {1: 20.0, 2: 19.0, 4: 18.0}, model="srvit", depth=4, recursions=1)
    fake_run(tmp_path, "revit-e4", 0, 28.0, {8: 28.0}, gates=[[0.5, 0.5], [0.2, 0.8]])
    fake_run(tmp_path, "revit-smear", 0, 23.0, {8: 23.0}, model="revit")
    (tmp_path / "revit-e1" / "seed0").mkdir(parents=True)  # unfinished (no done.json): left out
    runs = summarize_mini.load_runs(str(tmp_path))
    assert list(runs) == ["vit", "bvit", "bvit-ds", "revit-e4", "srvit-r1", "revit-smear"]  # study order, finished
    assert runs["revit-smear"][0]["params_m"] == 0.365 and runs["revit-smear"][0]["gflops"] == 0.032
    assert runs["srvit-r1"][0]["depths"] == {1.0: 20.0, 2.0: 19.0, 4.0: 18.0}  # recursions, not layers
    assert runs["bvit"][1]["depths"][0.5] == 21.0 and runs["bvit"][1]["depths"][4.0] == 3.0
    blocks = summarize_mini.summary(runs)
    text = blocks["mini-table"] + blocks["mini-verdicts"]
    assert "| vit | 2 | 8 |" in text and "33.50 ± 0.50" in text and "25.50 ± 0.50" in text
    # the registered claims (lab/claims.py) by the one rule: +8 on both seeds, a zero-width interval
    assert "| matched FLOPs: the untied ViT beats bViT | Training Crossroads, abstract | vit | bvit | 1x | +8.00 | 0.00 | " \
        "agree (2 of 3 seeds) |" in text
    assert "| bvit-wide | vit-narrow | 1x | | | not run |" in text
    # bvit-ds has one seed: one pair resolves nothing, and its signature (the first readout's loss) is not logged here
    assert "| bvit-ds | bvit | 4x | +13.00 | - | cannot tell (signature not measured, gate fixed after the runs) " \
        "(1 of 3 seeds) |" in text  # (issue 77: its gate, 0c232fb, came after the kept runs that judge it)
    assert "90 % t-interval" in text and "the 10,000 test images" in text and "revit-smear" not in text  # its own table
    moe = blocks["moe-table"]  # the comparison arms with their reference, revit-e4
    assert f"| revit-smear | {summarize_mini.MOE['revit-smear']} | 1 | 0.365 | 0.032 |" in moe
    # "SMEAR lands near reViT E=4" (Table 3), 5 points below it on one seed: cannot tell; Lory not run
    assert "| revit-e4 | revit-smear | 1x | +5.00 | - | cannot tell (signature not measured, gate fixed after the runs) " \
        "(1 of 3 seeds) |" in moe
    assert "| revit-e4 | revit-lory | 1x | | | not run |" in moe


INIT_CASES = {  # top-1 of seeds 0 and 1: (init-pytorch, init-mimetic, init-structured) -> verdicts of (a), (b)
    "agree": (([25.0, 26.0], [29.0, 30.1], [30.0, 31.0]), ("agree", "agree")),  # (b): mimetic behind by 1.0 and 0.9
    "disagree": (([30.0, 31.0], [30.0, 31.1], [25.0, 26.0]), ("disagree", "disagree")),  # (b): mimetic ahead by 5
    "cannot tell": (([29.5, 30.5], [30.0, 32.0], [30.5, 30.0]), ("cannot tell", "cannot tell")),  # seeds disagree
}


@pytest.mark.parametrize("case", list(INIT_CASES))
def test_the_structured_init_claims_come_out_either_way(tmp_path, case):
    """Issue 50's claims (lab/claims.py): (a) structured beats PyTorch's default init (">"), (b) structured is not
    worse than mimetic ("<=": mimetic does not beat it by more than 0.5), both on the c100-mini-init-* arms, seeds
    paired, by the one rule."""
    accs, want = INIT_CASES[case]
    for arm, acc in zip(("init-pytorch", "init-mimetic", "init-structured"), accs):
        for seed, a in enumerate(acc):
            fake_run(tmp_path, arm, seed, a, model="vit")
    claims = [c for c in summarize_mini.registry.CLAIMS if c.study == "init"]
    assert [(c.a, c.b, c.kind, c.margin) for c in claims] == [("init-structured", "init-pytorch", ">", None),
                                                             ("init-mimetic", "init-structured", "<=", 0.5)]
    runs = summarize_mini.load_runs(str(tmp_path))
    assert list(runs) == ["init-pytorch", "init-mimetic", "init-structured"]  # the study's order
    verdicts = summarize_mini.summary(runs)["mini-verdicts"]
    for c, v in zip(claims, want):
        row = next(ln for ln in verdicts.splitlines() if ln.startswith(f"| {c.words}"))
        assert f"| {v} (2 of 3 seeds) |" in row and f"| {c.a} | {c.b} | 1x |" in row, row  # (+ the parts fixed late)
    assert "| vit | vit+default |" not in verdicts  # the 4x4-grid, timm-base claim is gone
    assert "| init-structured | 2 | 8 |" in summarize_mini.summary(runs)["mini-table"]


@pytest.mark.slow
def test_reproduce_mini_runs_each_arm_once_and_summarizes(tmp_path):
    data_dir = fake_cifar(tmp_path / "data", n_train=32, n_test=16)
    env = dict(os.environ, OUT=str(tmp_path / "mini"), SEEDS="0", ARMS="bvit srvit-r1", JOBS="2", DATA=data_dir,
               EXTRA="--max-steps 1 --batch-size 8 --val-subset 16 --eval-batch-size 16 --embed-dim 16 --num-heads 2")
    script = os.path.join(ROOT, "lab", "reproduce_mini.sh")
    r = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "done bvit seed 0: top-1 " in r.stdout and "done srvit-r1 seed 0: top-1 " in r.stdout
    assert re.search(r"done \S+ seed 0: top-1 [0-9.]+ %, 0 min; [01] run\(s\) left", r.stdout), r.stdout
    summary = (tmp_path / "mini" / "summary.md").read_text()
    assert "| bvit | 1 | 8 |" in summary and "| srvit-r1 | 1 | 1 |" in summary
    done = json.loads((tmp_path / "mini" / "bvit" / "seed0" / "done.json").read_text())
    assert done["commit"] and done["cpu"] and " commit, CPU |" in summary  # where each number was measured
    assert f"{done['commit']} {done['cpu']} |" in summary
    assert "the first 16 test images" in summary and "SHORTENED" in summary  # never the protocol
    r = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "skip bvit seed 0 (done)" in r.stdout and "0 run(s) to do" in r.stdout
    # a call killed with its run (a session's end) left running.json: its time counts, to train.log's last line
    d, now = tmp_path / "mini" / "vit-narrow" / "seed0", int(time.time())
    d.mkdir(parents=True)
    (d / "running.json").write_text(json.dumps({"started": now - 1000, "prior": 50}))
    (d / "train.log").write_text("killed\n")
    os.utime(d / "train.log", (now - 400, now - 400))
    r = subprocess.run(["bash", script], env=dict(env, ARMS="vit-narrow"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads((d / "done.json").read_text())["wall_s"] >= 650 and not (d / "running.json").exists()
    for bad in ("nosuch", "bvit+nosuch"):  # one line, exit 2, nothing started
        r = subprocess.run(["bash", script], env=dict(env, ARMS=bad), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "ARMS" in r.stderr
    r = subprocess.run(["bash", script], env=dict(env, ARMS="bvit+feature"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "starts from the vit arm of seed 0, which has not finished" in r.stderr
    assert not (tmp_path / "mini" / "bvit+feature").exists()  # refused before anything ran
    r = subprocess.run(["bash", script], env=dict(env, ARMS="bvit+feature vit bvit+feature-only", JOBS="2"),
                       capture_output=True, text=True, timeout=300)  # distilled from the vit arm of the same seed
    assert r.returncode == 0, r.stderr
    for arm in ("bvit+feature", "bvit+feature-only"):
        assert f"distilling from {tmp_path}/mini/vit/seed0/ckpt.pt (feature)" in (
            tmp_path / "mini" / arm / "seed0" / "train.log").read_text()
    task_weight = lambda arm: json.loads((tmp_path / "mini" / arm / "seed0" / "args.json").read_text())["task_weight"]
    assert task_weight("bvit+feature") == 1.0 and task_weight("bvit+feature-only") == 0.0  # features alone
    r = subprocess.run(["bash", script], env=dict(env, DATA=str(tmp_path / "none")), capture_output=True, text=True)
    assert r.returncode == 2 and "DATA=" in r.stderr
    for arms in ("init", "init-pytorch init-structured"):  # the init claims' arms are known (refused only for DATA)
        r = subprocess.run(["bash", script], env=dict(env, ARMS=arms, DATA=str(tmp_path / "none")), capture_output=True,
                           text=True)
        assert r.returncode == 2 and "DATA=" in r.stderr and "ARMS" not in r.stderr, r.stderr
    r = subprocess.run(["bash", script], env=dict(env, ARMS="bvit-ds", EXTRA="--lr -1"), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1 and "FAILED bvit-ds seed 0" in r.stderr  # a failed run fails the script


def test_a_second_call_on_the_same_folder_leaves_the_run_another_call_is_running(tmp_path):
    """Two calls of reproduce_mini.sh on one OUT (a lane started beside a running call): a run whose folder another
    process has locked (training/checkpoints.py lock_out_dir) is skipped untouched, and is not counted as failed."""
    import fcntl
    data_dir = fake_cifar(tmp_path / "data", n_train=32, n_test=16)
    d = tmp_path / "mini" / "bvit" / "seed0"
    d.mkdir(parents=True)
    env = dict(os.environ, OUT=str(tmp_path / "mini"), SEEDS="0", ARMS="bvit", JOBS="1", DATA=data_dir)
    with open(d / ".lock", "a+") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by this process, as a running train.py holds it
        r = subprocess.run(["bash", os.path.join(ROOT, "lab", "reproduce_mini.sh")], env=env, capture_output=True,
                           text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"skip bvit seed 0 (another call is running it: {d})" in r.stdout
    assert sorted(os.listdir(d)) == [".lock"]  # no running.json, partial.json or train.log of this call


def test_two_calls_reaching_one_run_at_once_run_it_once(tmp_path):
    """Two calls of reproduce_mini.sh that reach the same run at the same moment, before either's train.py holds the
    folder's .lock: the one holding the run's .claim (flock) runs it; the other skips it without writing into its
    folder and does not count it as failed (before, both started it: the second train.py refused the lock, and its
    call wrote partial.json and a train.log line into the first's folder and failed)."""
    import fcntl
    data_dir = fake_cifar(tmp_path / "data", n_train=32, n_test=16)
    d = tmp_path / "mini" / "bvit" / "seed0"
    d.mkdir(parents=True)
    env = dict(os.environ, OUT=str(tmp_path / "mini"), SEEDS="0", ARMS="bvit", JOBS="1", DATA=data_dir)
    with open(d / ".claim", "a+") as claim:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held, as the other call's run_one holds it
        r = subprocess.run(["bash", os.path.join(ROOT, "lab", "reproduce_mini.sh")], env=env, capture_output=True,
                           text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"skip bvit seed 0 (another call is running it: {d})" in r.stdout
    assert sorted(os.listdir(d)) == [".claim"]


@pytest.mark.slow
def test_reproduce_mini_fig2_trains_the_teacher_then_both_students_of_it_then_their_elastic_stages(tmp_path):
    """ARMS=fig2 (the reViT paper's Fig. 2): vit, the two students distilled from that seed's vit (not seed 0's,
    which the presets name), then each student's elastic stage from that student, with the same teacher; an elastic
    stage whose student has not finished is refused before anything runs."""
    data_dir = fake_cifar(tmp_path / "data", n_train=32, n_test=16)
    out = tmp_path / "fig2"
    env = dict(os.environ, OUT=str(out), SEEDS="1", ARMS="fig2", JOBS="2", DATA=data_dir, EXTRA="--max-steps 1 "
               "--batch-size 8 --val-subset 16 --eval-batch-size 16 --embed-dim 16 --num-heads 2 --eval-depths 6")
    script = os.path.join(ROOT, "lab", "reproduce_mini.sh")
    r = subprocess.run(["bash", script], env=dict(env, ARMS="revit-smear-fig2-elastic"), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "starts from the revit-smear-fig2 arm of seed 1" in r.stderr, r.stderr
    r = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "5 run(s) to do" in r.stdout and r.stdout.index("done vit seed 1") < r.stdout.index("done revit-e4-fig2 seed 1")
    args = lambda arm: json.loads((out / arm / "seed1" / "args.json").read_text())  # noqa: E731
    teacher = f"{out}/vit/seed1/ckpt.pt"
    for gate, routing in (("e4", "depth"), ("smear", "smear")):
        student, elastic = args(f"revit-{gate}-fig2"), args(f"revit-{gate}-fig2-elastic")
        assert (student["teacher"], student["task_weight"], student["routing"], student["depth_dropout"]) == \
            (teacher, 0.0, routing, 0.0)
        assert (elastic["teacher"], elastic["task_weight"], elastic["routing"], elastic["depth_dropout"]) == \
            (teacher, 0.0, routing, 0.3)
        assert elastic["finetune"] == f"{out}/revit-{gate}-fig2/seed1/ckpt.pt"


@pytest.mark.slow
def test_summarize_refuses_an_empty_folder_and_skips_a_damaged_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        summarize_mini.main(str(tmp_path))
    assert e.value.code == 2 and "no finished run" in capsys.readouterr().err
    fake_run(tmp_path, "bvit", 0, 25.0, {4: 20.0, 8: 25.0})
    fake_run(tmp_path, "bvit", 1, 26.0, {4: 20.0, 8: 26.0})
    (tmp_path / "bvit" / "seed1" / "depth_eval.json").write_text("{trunc")
    runs = summarize_mini.load_runs(str(tmp_path))
    assert len(runs["bvit"]) == 1 and "skipping" in capsys.readouterr().out
    assert "90 % t-interval" in summarize_mini.summary(runs)["mini-verdicts"]


@pytest.mark.slow
def test_gpu_run_dry_run_compiles_at_tiny_width_and_passes_with_only_the_repository_and_gpu_data(tmp_path):
    """The window on a CPU: the check of the compiled path (gpu_check: eager, blocks and the whole model,
    compiled), the CIFAR preset, the 224-px smoke; each step's status, seconds and exit delay in
    summary.md; at most 8 small files come back."""
    script = os.path.join(ROOT, "scripts", "gpu_run.sh")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), WORK=str(tmp_path / "work"), GPU_DATA=fake_cifar(tmp_path / "gpu_data"),
               OMP_NUM_THREADS="1")
    r = subprocess.run(["bash", script, "--dry-run"], env=env, capture_output=True, text=True, timeout=560)
    summary = (out / "summary.md").read_text()
    assert r.returncode == 0, summary + (out / "gpu_run.log").read_text()[-3000:]
    for name in ("env", "gpu_check", "cifar", "smoke_224"):
        assert re.search(rf"- {name}: ok \(exit 0, \d+ s, exit delay [\d.]+ s\)", summary), (name, summary)
    assert "inductor names {" in summary and "False" not in summary.split("inductor names")[1].split("\n")[0]
    assert "model path: 0 CUDA-graph skips, 0 recompiles" in summary
    assert re.search(r"\n  blocks +\d+ ", summary) and "c100-gpu-bvit-ti: 1 epoch(s)" in summary
    assert "depth 48: top-1" in summary and "smoke srvit: first step" in (out / "gpu_run.log").read_text()
    back = sorted(os.listdir(out))
    assert back == ["cifar_log.jsonl", "gpu_check.json", "gpu_run.log", "summary.md"]  # <= 8 files return
    assert {json.loads(ln)["path"] for ln in (out / "gpu_check.json").read_text().splitlines()} == {
        "eager", "blocks", "model"}


@pytest.mark.slow
def test_the_window_fits_its_limit_and_every_wait_inside_a_step_fits_the_step():
    """The real plan: the step limits, each with the most a stop adds (scripts/child.py), fit WINDOW_S,
    which fits a 570 s command; the figures that matter come first; a step's own budget (gpu_check
    --budget-s) ends before its limit; 224-px smoke steps compile blocks, not the whole model."""
    steps = gpu_run.plan(False, "python3", "OUT", "WORK", "gpu_data", "c100-gpu-bvit-ti")
    names = [name for name, _, _ in steps]
    assert names[:3] == ["env", "gpu_check", "cifar"]
    assert sum(limit + child.STOP_S for _, limit, _ in steps) + 30 + child.STOP_S <= gpu_run.WINDOW_S <= 550  # + unpack
    for name, limit, cmd in steps:
        if "--budget-s" in cmd:
            assert float(cmd[cmd.index("--budget-s") + 1]) + 15 <= limit, name
    import gpu_smoke
    src = open(gpu_smoke.__file__).read()
    assert 'compile_for_training(model, "blocks", device)' in src


@pytest.mark.slow
def test_a_child_that_never_exits_costs_its_limit_and_no_more_and_takes_its_children_along(tmp_path):
    """scripts/child.py, which runs every step of a GPU window and every study run: a stand-in child
    that ignores SIGTERM and has started a grandchild, past its limit, is stopped within the limit +
    child.STOP_S, its stack is dumped (SIGABRT, faulthandler), and the grandchild goes with it."""
    import time
    code = ("import faulthandler, signal, subprocess, sys, time; faulthandler.enable(); "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('GRANDCHILD', g.pid, flush=True); time.sleep(60)")
    log = open(tmp_path / "log", "w")
    t0 = time.monotonic()
    r = child.run([sys.executable, "-c", code], 2.0, log)
    took = time.monotonic() - t0
    log.close()
    text = (tmp_path / "log").read_text()
    assert r["status"] == "TIMED OUT" and r["rc"] == 124 and r["exit_delay_s"] is None
    assert 2.0 <= took <= 2.0 + child.STOP_S + 10, took  # (slack for a loaded machine; unenforced: 60 s)
    assert "Fatal Python error: Aborted" in text  # where it hung: every thread's stack
    grandchild = int(text.split("GRANDCHILD")[1].split()[0])
    time.sleep(0.2)  # (the kernel reaps the killed grandchild)
    assert not os.path.exists(f"/proc/{grandchild}") or open(f"/proc/{grandchild}/stat").read().split(")")[1].split()[0] == "Z"
    r = child.run([sys.executable, "-c", "print('done')"], 30.0)
    assert r["status"] == "ok" and r["last_line"] == "done" and r["exit_delay_s"] < 5


@pytest.mark.slow
def test_a_concurrency_probe_that_hangs_costs_its_limit_and_the_study_goes_on(tmp_path):
    """gpu_study's probe started compiled children with no limit (communicate() without a timeout):
    a child that never exits held the whole window. Now a round of probes has a limit and a failed
    probe is an error the study recovers from (one run at a time)."""
    import time
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")  # a stand-in interpreter whose probe never ends
    fake.chmod(0o755)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish in 2 s"):
        gpu_study.measure_concurrency(str(fake), True, print, counts=(2,), limit_s=2.0)
    assert time.monotonic() - t0 <= 2.0 + child.STOP_S + 10  # (slack for a loaded machine; unenforced: 60 s)
    assert gpu_study.PROBE_COUNTS == (1, 4)  # few copies: each one compiles


@pytest.mark.slow
def test_study_arms_compile_the_whole_forward_only_where_its_graph_is_short():
    """Every study arm has 12 block applications (6 for srvit-r1: matched FLOPs), as c100-gpu-bvit-ti,
    whose whole-model compile gpu_check.py measures first in the window; a longer graph (e.g. SR-ViT
    12 x 4: 911 s to compile whole on a CPU) would compile its blocks."""
    apps = {arm: gpu_study.preset_model(gpu_study.preset_of(arm))[1] for arm in gpu_study.ARMS}
    assert set(apps.values()) == {6, 12} and apps["odevit-rk4"] == 12 and apps["srvit-r1"] == 6
    assert all(gpu_study.scope_flags(n) == [] for n in apps.values())
    assert gpu_study.scope_flags(48) == ["--compile-scope", "blocks"]


@pytest.mark.slow
def test_gpu_check_fails_loudly_when_the_whole_model_graph_skips_recompiles_or_syncs():
    good = {"cudagraph_skips": 0, "recompiles": 0, "syncs_per_step": 0.0}
    assert gpu_check.failures(good, cuda=True) == [] and gpu_check.failures({**good, "cudagraph_skips": 2}, False) == []
    bad = gpu_check.failures({"cudagraph_skips": 1, "recompiles": 2, "syncs_per_step": 1.0, "sync_places": ["a.py:3"]},
                             cuda=True)
    assert len(bad) == 3 and "CUDA-graph skip" in bad[0] and "recompiles" in bad[1] and "syncs" in bad[2]


@pytest.mark.slow
@pytest.mark.parametrize("script", ["lab/reproduce_mini.sh", "scripts/gpu_run.sh", "lab/gpu_study.sh"])
def test_scripts_parse(script):
    assert subprocess.run(["bash", "-n", os.path.join(ROOT, script)]).returncode == 0


@pytest.mark.slow
def test_summarize_writes_its_tables_between_the_readme_markers(tmp_path, capsys):
    runs = tmp_path / "runs"
    fake_run(runs, "vit", 0, 33.0, model="vit")
    fake_run(runs, "bvit", 0, 25.0, {4: 20.0, 8: 25.0, 16: 10.0, 32: 2.0})
    (tmp_path / "docs").mkdir()
    readme = tmp_path / "docs" / "results.md"  # the results page (--results lab/docs/results.md)
    readme.write_text("intro\n<!-- mini-table -->\nold table\n<!-- /mini-table -->\nprose\n"
                      "<!-- mini-verdicts -->\nold verdicts\n<!-- /mini-verdicts -->\n"
                      "<!-- moe-table -->\nold\n<!-- /moe-table -->\nend\n")
    summarize_mini.main(str(runs), str(readme))
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro\n<!-- mini-table -->\nTop-1 (%)") and text.endswith("end\n")
    if os.path.exists(runs / "depth.png"):  # (matplotlib installed) the figure beside the page, in docs/
        assert (tmp_path / "docs" / "mini_depth.png").exists() and not (tmp_path / "docs" / "docs").exists()
    table = text.split("<!-- mini-table -->")[1].split("<!-- /mini-table -->")[0]
    assert "| vit | 1 | 8 |" in table and "| claim |" not in table and "\nprose\n" in text
    assert "| matched FLOPs" in text.split("<!-- mini-verdicts -->")[1]
    assert "| SMEAR lands near reViT E=4" in text.split("<!-- moe-table -->")[1]
    fake_run(runs, "bvit", 1, 24.0, {8: 24.0})
    args = json.loads((runs / "bvit" / "seed1" / "args.json").read_text())
    (runs / "bvit" / "seed1" / "args.json").write_text(json.dumps({**args, "max_steps": 5}))
    before = readme.read_text()
    with pytest.raises(SystemExit) as e:  # a smoke run never overwrites the measured tables
        summarize_mini.main(str(runs), str(readme))
    assert e.value.code == 2 and "bvit seed 1 ran shortened" in capsys.readouterr().err
    assert readme.read_text() == before
    shutil.rmtree(runs / "bvit" / "seed1")
    docs = tmp_path / "models.md"  # the comparison table in another file (--docs), the others in --results
    docs.write_text("x\n<!-- moe-table -->\n<!-- /moe-table -->\n")
    readme.write_text("<!-- mini-table -->\n<!-- /mini-table -->\n<!-- mini-verdicts -->\n<!-- /mini-verdicts -->\n")
    summarize_mini.main(str(runs), str(readme), str(docs))
    assert "| SMEAR lands near reViT E=4" in docs.read_text() and "| matched FLOPs" in readme.read_text()
    assert "SMEAR" not in readme.read_text()
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit) as e:
        summarize_mini.main(str(runs), str(readme))
    assert e.value.code == 2 and "markers" in capsys.readouterr().err
    # --blocks: one study's folder (reViT's arms alone) writes its block and leaves the others' tables alone
    readme.write_text("<!-- mini-table -->\nkept\n<!-- /mini-table -->\n<!-- moe-table -->\n<!-- /moe-table -->\n")
    (runs / "depth.png").write_bytes(b"the reViT folder's figure")
    (tmp_path / "docs" / "mini_depth.png").write_bytes(b"the study's figure")
    summarize_mini.main(str(runs), str(readme), None, ["moe-table"])
    text = readme.read_text()
    assert "\nkept\n" in text and "| SMEAR lands near reViT E=4" in text
    assert (tmp_path / "docs" / "mini_depth.png").read_bytes() == b"the study's figure"  # not the other folder's
    with pytest.raises(SystemExit) as e:
        summarize_mini.main(str(runs), str(readme), None, ["moe"])
    assert e.value.code == 2 and "--blocks moe: allowed: mini-table" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the study at GPU scale
# one arm of each model family (and distillation, which needs its teacher's run first);
# test_every_gpu_study_arm_resolves_to_a_valid_run checks the others' commands without training them
DRY_ARMS = ["vit", "bvit", "odevit-rk4", "revit-e4", "srvit-r2", "revit-e4+feature"]


@pytest.mark.slow
def test_gpu_study_dry_run_runs_each_kind_of_arm_once_then_skips_what_is_done(tmp_path):
    """One arm of each kind shrunk to 2 CPU steps: each gives a result line with every field the
    summary needs, the distilled arm trains after its teacher, at most 8 small files come back, and
    a second call with those results committed runs nothing."""
    script = os.path.join(ROOT, "lab", "gpu_study.sh")
    results = tmp_path / "results"
    results.mkdir()
    env = dict(os.environ, OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"), RESULTS=str(results),
               GPU_DATA=fake_cifar(tmp_path / "gpu_data"), SEEDS="0", JOBS="2", COMMIT="abc1234",
               ARMS=" ".join(DRY_ARMS))
    r = subprocess.run(["bash", script, "--dry-run"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [json.loads(ln) for ln in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert sorted(ln["arm"] for ln in lines) == sorted(DRY_ARMS)
    for ln in lines:
        assert ln["commit"] == "abc1234" and ln["gpu"] == "cpu" and ln["epochs"] == 1 and ln["seed"] == 0
        assert str(ln["trained_depth"]) in ln["depths"] and ln["img_per_s"] > 0 and ln["params_m"] > 0
    by_arm = {ln["arm"]: ln for ln in lines}
    assert set(by_arm["bvit"]["depths"]) == {"6", "12", "24", "48"} and set(by_arm["srvit-r2"]["depths"]) == {"1", "2", "4", "8"}
    log = (tmp_path / "out" / "study.log").read_text()
    assert log.index("done vit seed 0") < log.index("start revit-e4+feature seed 0")  # the teacher first
    back = sorted(f for f in os.listdir(tmp_path / "out") if not f.endswith(".png"))  # (figures: with matplotlib)
    assert back == ["concurrency.jsonl", "results.jsonl", "study.log", "summary.md"]  # (JOBS=2: 2 copies measured)
    assert len(os.listdir(tmp_path / "out")) <= 8  # what comes back from the GPU machine
    assert "| bvit | 1 | 12 |" in (tmp_path / "out" / "summary.md").read_text()
    shutil.copy(tmp_path / "out" / "results.jsonl", results / "results.jsonl")  # committed
    r = subprocess.run(["bash", script, "--dry-run"], env=dict(env, OUT=str(tmp_path / "out2")), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and f"{len(DRY_ARMS)} run(s) already done, 0 to do" in r.stdout, r.stdout[-2000:]
    bad = subprocess.run(["bash", script, "--dry-run"], env=dict(env, ARMS="vit bogus"), capture_output=True, text=True)
    assert bad.returncode == 2 and "ARMS: unknown arm(s) bogus" in bad.stderr


def test_every_gpu_study_arm_resolves_to_a_valid_run(tmp_path):
    """Each of the 19 arms' train.py flags (the arm's --config file, seed, arm flags) parse and resolve, and build a model
    of the preset's size: what the dry run would catch for the arms it does not train."""
    for arm in gpu_study.ARMS:
        p = get_parser()  # (a --config file sets the parser's defaults)
        flags = ["--config", arms.write_config(gpu_study.preset_of(arm), str(tmp_path)), "--seed", "1",
                 *gpu_study.arm_flags(arm, 1, str(tmp_path))]
        args = resolve(parse_args(p, flags), p, 32)
        assert args.epochs == gpu_study.EPOCHS and args.batch_size == 512, arm
        assert registry.build_model(args, 32, 100).num_params() > 1e5, arm


def test_gpu_study_starts_only_runs_that_fit_the_budget_in_claim_order():
    done = {("vit", 0)}
    todo = gpu_study.queue(["vit", "bvit", "odevit-rk4", "revit-e4+feature"], [0, 1], done)
    assert todo == [("bvit", 0), ("vit", 1), ("bvit", 1), ("odevit-rk4", 0), ("odevit-rk4", 1),
                    ("revit-e4+feature", 0), ("revit-e4+feature", 1)]  # each group for every seed first
    est = dict.fromkeys(todo, 100.0)
    est[("bvit", 0)] = 400.0
    assert gpu_study.next_fitting(todo, est, 500.0) == 0
    assert gpu_study.next_fitting(todo, est, 300.0) == 1  # bvit seed 0 would not finish: not started
    assert gpu_study.next_fitting(todo, est, 99.0) is None  # nothing fits: nothing starts
    blocked = {("bvit", 0), ("vit", 1), ("bvit", 1), ("odevit-rk4", 0), ("odevit-rk4", 1)}
    assert gpu_study.next_fitting(todo, est, 500.0, blocked) == 5
    gflops = {"c100-gpu-bvit": 0.73, "c100-gpu-bvit-wide": 2.92, "c100-gpu-srvit-r1": 0.365}
    per_run = 10_000.0  # img/s of one run of the probe model at the chosen concurrency
    wide = gpu_study.estimate_s("bvit-wide", per_run, gflops, {}, 50)
    assert wide == pytest.approx(1.25 * 50 * 50_000 / 2_500 + 60)  # 4x the FLOPs: a quarter of the rate
    assert gpu_study.estimate_s("srvit-r1", per_run, gflops, {}, 50) == pytest.approx(1.25 * 250 + 60)  # never faster
    assert gpu_study.estimate_s("bvit-wide", per_run, gflops, {"bvit-wide": 5_000.0}, 50) < wide  # measured wins


@pytest.mark.slow
def test_gpu_study_concurrency_probe_measures_and_picks_the_fewest_runs_near_the_best():
    assert gpu_study.choose_jobs({1: 10_000, 2: 18_000, 4: 30_000, 8: 31_000}) == 4
    assert gpu_study.choose_jobs({1: 10_000, 2: 9_000}) == 1
    said = []
    rates = gpu_study.measure_concurrency(sys.executable, True, said.append, counts=(1, 2))
    assert set(rates) == {1, 2} and all(v > 0 for v in rates.values()) and len(said) == 2


def gpu_line(arm, seed, top1, depth=12, **kw):
    depths = {str(int(depth * f)): [top1 - 10 * abs(f - 1), top1 + 25] for f in (0.5, 1, 2, 4)} if arm != "vit" else \
        {"12": [top1, top1 + 25]}
    return {"arm": arm, "seed": seed, "preset": f"c100-gpu-{arm}", "trained_depth": depth, "depths": depths,
            "epochs": 50, "max_steps": None, "val_subset": None, "img_per_s": 40_000.0, "train_s": 80.0,
            "wall_s": 120.0, "params_m": 0.5, "gflops": 0.73, "gates": None, "commit": "abc1234",
            "torch": "2.11.0", "gpu": "NVIDIA H200", "date": "2026-12-01", "command": "bash lab/gpu_study.sh", **kw}


@pytest.mark.slow
def test_summarize_gpu_tables_verdicts_added_runs_and_readme(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "results.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in [
        gpu_line("vit", 0, 56.0), gpu_line("vit", 1, 57.0), gpu_line("bvit", 0, 52.0), gpu_line("bvit", 1, 51.0)]))
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps(gpu_line("bvit", 0, 99.0)) + "\n" + json.dumps(gpu_line("bvit-ds", 0, 50.0)) + "\n")
    readme = tmp_path / "results.md"
    readme.write_text("a\n<!-- gpu-table -->\nold\n<!-- /gpu-table -->\nb\n<!-- gpu-verdicts -->\nold\n<!-- /gpu-verdicts -->\n")
    assert summarize_gpu.main([str(results), "--add", str(new), "--results", str(readme)]) == 0
    saved = [json.loads(ln) for ln in (results / "results.jsonl").read_text().splitlines()]
    assert [(ln["arm"], ln["seed"]) for ln in saved][-1] == ("bvit-ds", 0) and len(saved) == 5  # bvit 0 kept once
    text = readme.read_text()
    table = text.split("<!-- gpu-table -->")[1].split("<!-- /gpu-table -->")[0]
    assert "| vit | 2 | 12 |  | 56.50 ± 0.50 |" in table and "| bvit | 2 | 12 | 46.50 ± 0.50 | 51.50 ± 0.50 |" in table
    assert "| srvit-r2 |" not in table and "Not run yet (21 arms): bvit-wide," in table and "abc1234 H200" in table
    verdicts = text.split("<!-- gpu-verdicts -->")[1]
    assert "| matched FLOPs: the untied ViT beats bViT | Training Crossroads, abstract | vit | bvit | 1x | +5.00 | 6.31 | " \
        "cannot tell (2 of 3 seeds) |" in verdicts  # paired differences +6 and +4: two seeds resolve 6.31
    assert "revit-e1" not in verdicts and "more claim(s) wait for an arm not run yet" in verdicts
    assert "vit+structured" not in verdicts and "18 more claim(s) wait" in verdicts  # (the init claim among them)
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps(gpu_line("vit-narrow", 0, 40.0, max_steps=2)) + "\n")
    before = readme.read_text()
    assert summarize_gpu.main([str(results), "--add", str(short), "--no-save", "--results", str(readme)]) == 2
    assert readme.read_text() == before and "shortened" in capsys.readouterr().err
    assert summarize_gpu.main([str(results), "--add", str(short)]) == 0  # a dry run's line is never kept
    assert len((results / "results.jsonl").read_text().splitlines()) == 5
    assert summarize_gpu.main([str(tmp_path / "nowhere"), "--results", str(readme)]) == 2
    assert readme.read_text() == before and "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_the_repository_stands_alone_citing_papers_not_files_outside_it():
    """Code and docs cite papers (title, arXiv id, section) and the repository's own files, never the
    project documents that do not travel with it (the interface spec, research notes)."""
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    outside = ("SPEC", "notes.md", "papers/")
    found = []
    for path in tracked:
        if path.endswith((".py", ".md", ".sh")) and path != os.path.relpath(os.path.abspath(__file__), ROOT):
            for n, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1):
                if any(word in line for word in outside):
                    found.append(f"{path}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_gpu_study_retrains_a_finished_teacher_for_a_distilled_arm_and_needs_cuda(tmp_path):
    """A distilled arm whose teacher (the vit run of its seed) finished in an earlier window: its
    checkpoint is not on the fresh machine, so the job trains the teacher first."""
    script = os.path.join(ROOT, "lab", "gpu_study.sh")
    results = tmp_path / "results"
    results.mkdir()
    (results / "results.jsonl").write_text(json.dumps(dict(gpu_line("vit", 0, 50.0), gpu="cpu")) + "\n")
    env = dict(os.environ, OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"), RESULTS=str(results),
               GPU_DATA=fake_cifar(tmp_path / "gpu_data"), SEEDS="0", JOBS="1", ARMS="vit revit-e4+feature")
    r = subprocess.run(["bash", script, "--dry-run"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "start revit-e4+feature seed 0 (after retraining its teacher)" in r.stdout, r.stdout
    lines = [json.loads(ln) for ln in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [ln["arm"] for ln in lines] == ["revit-e4+feature"]
    if not torch.cuda.is_available():
        r = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            "gpu_study.sh: error: no CUDA device: the study trains on a GPU; --dry-run runs every arm shrunk on the CPU"]


@pytest.mark.slow
def test_check_readme_finds_each_command_and_number_in_readme_and_docs():
    """The quick commands (in README.md and docs/models.md) parse as train.py commands, and every
    number the check compares is a number in a table of the file FILES names (README's first run,
    lab/docs/results.md's short runs, docs/models.md's tables): this fails when the tables or commands
    move without the check."""
    docs = {name: check_readme.document(check_readme.path_of(name)) for name in check_readme.files_of(check_readme.RUNS)}
    assert set(docs) == {"README.md", os.path.join("lab", "docs", "results.md"), os.path.join("docs", "models.md")}
    for run in check_readme.RUNS:
        argv = check_readme.command(docs[run.file], run, "DATA")
        flags = argv[argv.index("train.py") + 1:]
        assert flags[flags.index("--data-dir") + 1] == "DATA" and "--out-dir" not in flags
        parse_args(get_parser(), flags)  # README's flags are train.py's
        assert check_readme.processes(argv) == (2 if "ddp" in run.name or "revit" in run.name else 1)
    for name, heading, row, column, _ in check_readme.CELLS:
        lines = docs[check_readme.FILES[heading]]
        i, j = check_readme.locate(lines, heading, row, column)
        cell = check_readme.cells_of(lines[i])[j]
        assert re.fullmatch(r"[0-9]+\.[0-9]+|[0-9]+ min [0-9]+ s.*|.*CPU.*", cell), (name, row, column, cell)
        # the run's commit and CPU, in the file of each of its numbers
        assert any(line.startswith(f"<!-- check:{name} -->") for line in lines), (name, heading)
    assert sum(r.minutes for r in check_readme.RUNS if r.quick) <= 15  # the quick set's budget
    with pytest.raises(check_readme.ReadmeError, match="no such file"):
        check_readme.document(os.path.join(ROOT, "docs", "nosuch.md"))


@pytest.mark.slow
def test_check_readme_lists_and_writes_back_finished_runs(tmp_path, capsys):
    """A finished run in WORK is reused (no training here); --readme writes its numbers and provenance
    into the cells of README (the first run) and lab/docs/results.md beside it (the short runs); a shortened
    run never goes into README; bad names are one line, exit 2."""
    readme, results = tmp_path / "README.md", tmp_path / "lab" / "docs" / "results.md"
    shutil.copy(os.path.join(ROOT, "README.md"), readme)
    (tmp_path / "lab" / "docs").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "lab", "docs", "results.md"), results)
    lines = readme.read_text().split("\n")
    run = next(r for r in check_readme.RUNS if r.name == "bvit-300")
    argv = check_readme.command(lines, run, str(tmp_path / "data"))
    out = tmp_path / "work" / "bvit-300"
    out.mkdir(parents=True)
    (out / "log.jsonl").write_text(json.dumps({"epoch": 0, "val_acc1": 8.5, "val_acc5": 26.25}) + "\n")
    where = {"commit": "abc1234", "cpu": "Some CPU", "cores": 2, "processes": 1, "date": "2026-12-01"}
    (out / "check.json").write_text(json.dumps({"argv": argv[1:], "seconds": 301.0, "where": where}))
    (tmp_path / "data" / "cifar-100-python").mkdir(parents=True)
    (tmp_path / "data" / "cifar-100-python" / "train").write_text("")
    code = check_readme.main(["--only", "bvit-300", "--data", str(tmp_path / "data"), "--work", str(tmp_path / "work"),
                              "--readme", str(readme)])
    printed = capsys.readouterr().out
    old = check_readme.cells_of(lines[check_readme.locate(lines, check_readme.FIRST, "bViT D=128", "top-1")[0]])[3]
    assert code == 0 and "reused" in printed
    assert f"top-1: written {old}, now 8.50 {8.5 - float(old):+.2f}" in printed
    text, short = readme.read_text(), results.read_text()
    assert "| bViT D=128 h=4 p=4, 6 steps (0.23 M params) | 2-core CPU, 1 process | 5 min 01 s | 8.50 | 26.25 |" in text
    assert "| 2-core CPU, 1 process | 5 min 01 s | 8.50 | 26.25 |" in short
    for page in (text, short):
        assert "<!-- check:bvit-300 -->Measured (bvit-300): commit abc1234, Some CPU, 2 cores, 1 process, 2026-12-01 " \
               "(`python lab/check_readme.py --only bvit-300`)." in page
    listing = (tmp_path / "work" / "check_readme.md").read_text()
    assert "| bvit-300 | README.md: bViT D=128 h=4 p=4, 6 steps (0.23 M params) / top-1 |" in listing
    assert f"| bvit-300 | {os.path.join('lab', 'docs', 'results.md')}: bViT D=128 h=4 p=4, 6 steps (0.23 M params) / top-1 |" in listing
    assert "| 8.50 |" in listing
    where = {"cores": 2, "processes": 2, "load": 4.1}  # other jobs on the cores: the wall time says so
    assert check_readme.hardware([], 60.0, where) == "2-core CPU, 2 processes, shared: load 4.1"
    assert check_readme.hardware([], 60.0, dict(where, load=2.0)) == "2-core CPU, 2 processes"
    for bad, what in ((["--only", "nosuch"], "--only"), (["--readme", "R.md", "--extra", "--max-steps 2"], "--extra")):
        with pytest.raises(SystemExit) as e:
            check_readme.main(bad)
        err = capsys.readouterr().err
        assert e.value.code == 2 and what in err and len(err.strip().splitlines()) == 1  # one line, no usage


def heading_anchors(text):
    """The anchors GitHub gives a markdown file's headings: lower case, punctuation dropped, spaces
    to hyphens, '-1', '-2' ... for repeats. Lines in code blocks are not headings."""
    anchors, seen, fenced = set(), {}, False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6} (.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.slow
def test_readme_and_docs_links_reach_files_and_headings_that_exist():
    """Every relative link and image of README.md and docs/*.md (inline or `[name]: target`) names a file
    of the repository and, after '#', a heading of that file; README keeps CI's test command and stays a
    front page (issue 51): at most 150 lines of at most 160 characters (the provenance lines that
    check_readme.py writes whole excepted), the file map before line 60, every file it names there."""
    pages = ["README.md", os.path.join("lab", "README.md")] + [os.path.join(d, f) for d in ("docs", os.path.join("lab", "docs"))
                                                                for f in sorted(os.listdir(os.path.join(ROOT, d))) if f.endswith(".md")]
    assert len(pages) > 5
    broken = []
    for page in pages:
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose) + re.findall(r"^\[[^\]]+\]: (\S+)$", prose, re.M):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), file)) if file else os.path.join(ROOT, page)
            if not os.path.exists(path):
                broken.append(f"{page}: {target} (no file)")
            elif anchor and anchor not in heading_anchors(open(path, encoding="utf-8").read()):
                broken.append(f"{page}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    first = readme.split("```bash\n")[1].split("```")[0]  # the first commands a reader copies
    assert first.startswith("pip install torch==") and "--index-url https://download.pytorch.org/whl/cpu" in first
    assert "\npip install -r requirements-dev.txt" in first  # (after the CPU-only torch, for a laptop)
    pins = [ln for ln in open(os.path.join(ROOT, "requirements.txt")).read().splitlines() if ln.startswith("torch")]
    assert first.splitlines()[0].split("  #")[0].split()[2:4] == pins  # the same versions as requirements.txt
    assert "\nRVITS_DATA=../shared/data python -m pytest -q -n 2\n```" in readme  # .ci/run runs this command
    assert "python -m pytest -q -n 2\n" in open(os.path.join(ROOT, ".ci", "run")).read()
    lines = readme.split("\n")
    assert len(lines) <= 150, "a front page; the results are in lab/docs/results.md, the manuals in docs/"
    long = [i + 1 for i, ln in enumerate(lines) if len(ln) > 160 and not ln.startswith("<!-- check:")]
    assert not long, f"README lines over 160 characters: {long}"
    files = lines.index("## The files, in reading order")
    assert files < 60, "the file map comes before line 60"
    named = re.findall(r"^\| `([^`]+)`(?:, `([^`]+)`)? \|", "\n".join(lines[files:]), re.M)
    named = [name for pair in named for name in pair if name]
    assert len(named) > 15 and all(os.path.exists(os.path.join(ROOT, n)) for n in named), named


# ----------------------------------------------------------------------------- LoopVAE's study
def fake_loopvae_run(root, arm, seed, psnr, last_pass_loses=0.5, monotone=1.0, per_image=False, gain=False):
    d = root / f"loopvae-{arm}" / f"seed{seed}"
    d.mkdir(parents=True)
    steps = arms.ARMS[f"c100-mini-loopvae-{arm}"][1]["max_steps"]  # the arm's protocol (gan: 200)
    (d / "args.json").write_text(json.dumps({"seed": seed, "max_steps": steps, "val_subset": None}))
    (d / "log.jsonl").write_text(json.dumps({"epoch": 0, "val_psnr": psnr, "val_ssim": 0.5, "val_l1": 0.2,
                                             "val_out_of_range": 0.02}) + "\n")
    (d / "done.json").write_text(json.dumps({"wall_s": 1200, "commit": "abc1234", "cpu": "AMD EPYC"}))
    if arm == "unlooped" or arm.startswith("vit-"):  # (no interventions measured)
        return
    stages = {"enc_f4": 2, "enc_f8": 4, "dec_f4": 2, "dec_f2": 4}
    up = lambda n: [psnr - 2 * (n - 1 - k) for k in range(n)]
    loops = {"stages": stages, "num_images": 256, "full": {"psnr": psnr},
             "prefix": {s: up(n) for s, n in stages.items()}, "monotone": {s: monotone for s in stages},
             "prefix_out_of_range": {s: [0.3 - 0.05 * k for k in range(n - 1)] + [0.02] for s, n in stages.items()},
             "bypass": {s: [3.0] * (n - 1) + [last_pass_loses] for s, n in stages.items()},
             "most_sensitive": {s: 0 for s in stages}, "update": {s: [0.3] * (n - 1) + [0.05] for s, n in stages.items()}}
    if per_image:  # 4 images, each near its stage's mean (+-0.1 dB); `gain`: one image gains from one bypass
        jitter = [-0.1, 0.0, 0.05, 0.05]
        bypass = {s: [[b + j for j in jitter] for b in loops["bypass"][s]] for s in stages}
        bypass["enc_f2"] = [[1.0 + j for j in jitter]]  # a single-pass stage: counted too
        if gain:
            bypass["dec_f2"][1][0] = -0.3
        loops["bypass"]["enc_f2"] = [1.0]
        loops["per_image"] = {"bypass": bypass}
    (d / "loops.json").write_text(json.dumps(loops))


@pytest.mark.parametrize("case", ["agree", "disagree"])
def test_summarize_loopvae_per_image_and_scale_free_rules_come_out_either_way(tmp_path, case):
    """Claims 3, 4 and 6 (issue 38) on synthetic results: per-image bypass counts, the most sensitive pass
    called only beyond the seed spread, the smallest-update pass's rank among its stage's costs, and the
    latency ratio against the MAC ratio, each where it agrees and where it disagrees."""
    import summarize_loopvae as sl
    root, agree = tmp_path / "runs", case == "agree"
    for seed in (0, 1):
        for arm in sl.LOOPED:  # agree: the last pass (the smallest update) loses 5 dB, more than the others' 3
            fake_loopvae_run(root, arm, seed, 19.0 + 0.1 * seed, last_pass_loses=5.0 + 0.1 * seed if agree else 0.5,
                             per_image=True, gain=not agree)
    runs = sl.load_runs(str(root))
    for arm in sl.LOOPED:
        for r in runs[arm]:
            r["loops"] = json.loads(open(os.path.join(r["dir"], "loops.json")).read())
    four = ["enc_f8", "dec_f2"]
    claim, _, here, v = sl.bypass_row(sl.looped(runs), runs, four)
    # 6 runs x (2+4+2+4 stage passes + 1 single-pass) x 4 images = 312 image-pass bypasses
    assert ("312 of 312" if agree else "306 of 312") in here  # disagree: one image of each run gains
    assert ("the last pass most sensitive in 48 of 48" if agree else "in 0 of 48") in here
    assert v == ("agree that every bypass loses, disagree that the last is not the most sensitive" if agree else
                 "disagree that every bypass loses, agree that the last is not the most sensitive")
    _, _, here, v = sl.small_update_row(runs, four)
    assert v == ("agree" if agree else "disagree") and f"{6 if agree else 0} of 6 arm-stages agree" in here
    one_seed = {arm: rs[:1] for arm, rs in runs.items()}  # no seed spread: no stage can be told apart
    assert sl.small_update_row(one_seed, four)[3] == "cannot tell"
    led = lambda macs, ms: dict(macs=macs, eval_ms_b8=ms, params=1, img_per_s=1.0)
    _, _, here, v = sl.cost_row(led(2e6, 30.0 if agree else 15.0), led(1e6, 10.0))
    assert v == ("agree" if agree else "disagree") and "eval forward latency (batch 8)" in here
    assert sl.cost_row(led(2e6, 21.0), led(1e6, 10.0))[3] == "cannot tell"  # 2.1x vs 2.0x: within the margin


def test_loopvae_sharing_claims_are_gated_on_the_loop_updates():
    """The sharing claims' signature (lab/claims.py: each pass updates the features, relative update > 1 %,
    loops.json): the rule speaks either way, the signature's reading beside it: at work, not at work, or not
    measured."""
    import claims as registry
    import summarize_loopvae as sl
    claim = next(c for c in registry.CLAIMS if c.key == "loopvae-sharing-scale")
    run = lambda smallest: {"loops": {"update": {"enc_f4": [0.3, smallest], "dec_f2": [0.2, 0.3]}}}
    a, b = [19.0, 19.2, 19.1], [18.0, 18.2, 18.1]  # a ahead by 1 dB on every seed
    assert sl.loop_signature([run(0.05), run(0.07), {}]) == {"loop_update_min": pytest.approx(0.06)}
    late = ", gate fixed after the runs"  # (registered at 4a9b6d4, its gate at dc5417f: after the kept runs)
    assert registry.judge(claim, a, b, None, sl.loop_signature([run(0.05)]))[2] == f"agree (mechanism at work{late})"
    assert registry.judge(claim, a, b, None, sl.loop_signature([run(0.001)]))[2] == \
        f"agree (mechanism not at work: smallest loop update 0.00 < 0.01{late})"  # (issue 77: beside, never instead)
    assert registry.judge(claim, a, b, None, sl.loop_signature([{}]))[2] == f"agree (signature not measured{late})"


@pytest.mark.slow
def test_summarize_loopvae_gives_each_claim_its_verdict_and_writes_between_the_markers(tmp_path, monkeypatch, capsys):
    import summarize_loopvae
    root = tmp_path / "runs"
    for seed, (g, s, n) in enumerate([(19.0, 18.0, 18.9), (19.2, 18.2, 19.3)]):
        fake_loopvae_run(root, "global", seed, g, monotone=1.0 if seed else 0.9)
        fake_loopvae_run(root, "scale", seed, s)
        fake_loopvae_run(root, "none", seed, n, last_pass_loses=0.2)
        fake_loopvae_run(root, "unlooped", seed, 18.5)
    for seed in (0, 1):  # Stage 2: its smallest-update pass costs 5 dB, more than the others' 3
        fake_loopvae_run(root, "gan", seed, 19.0, monotone=0.5, last_pass_loses=5.0 + 0.1 * seed)
    fake_loopvae_run(root, "vit-global", 0, 20.0)  # the Transformer core: one seed each, so no spread
    fake_loopvae_run(root, "vit-none", 0, 19.0)
    arm = lambda params, macs, ips: dict(params=params, core_params=params // 2, stored_blocks=4, applications=28,
                                         macs=macs, img_per_s=ips, step_mib=100)
    (root / "ledger.json").write_text(json.dumps({"info": {"loopvae_ledger": {
        "global": arm(200, 20e6, 10.0), "scale": arm(500, 20e6, 10.0), "none": arm(1000, 20e6, 10.0),
        "unlooped": arm(490, 11e6, 25.0)}}}))
    monkeypatch.setattr(summarize_loopvae, "figures", lambda runs, root: None)  # no checkpoint to draw from
    readme = tmp_path / "results.md"
    readme.write_text("# x\n<!-- loopvae-claims -->\nold\n<!-- /loopvae-claims -->\nprose\n")
    summarize_loopvae.main([str(root), "--results", str(readme)])
    rows = {ln.split(" | ")[0][2:4]: ln for ln in readme.read_text().splitlines() if ln.startswith("| ")}
    claims = [ln for ln in readme.read_text().splitlines() if ln.startswith("| 1. sharing")]
    assert "CNN core" in claims[0] and "Transformer core, ImageNet-256" in claims[0]  # what each side measured
    assert "19.10 ± 0.10 vs 18.10 ± 0.10 dB (+1.00, resolves 0.00) | agree (mechanism at work, gate fixed after the " \
        "runs) (2 of 3 seeds)" in claims[0]  # +1 on both
    assert claims[1].endswith("| cannot tell (mechanism at work, gate fixed after the runs) (2 of 3 seeds) |")  # +0.1 and -0.1: the interval straddles 0
    assert "Transformer core: global (4 blocks) beats none" in claims[2] and "20.00 vs 19.00 dB" in claims[2]
    assert claims[2].endswith("| cannot tell (signature not measured, gate fixed after the runs) (1 of 3 seeds) |")  # one pair resolves nothing;
    # (the Transformer arms have no loops.json: their loop updates, the sharing claims' signature, are not measured)
    assert "Stage 1 (6 runs)" in rows["2."] and "90%-100%" in rows["2."]
    assert rows["2."].endswith("| Stage 1: agree on the mean, not on every image; Stage 2 (2 runs): agree on the mean, "
                               "not on every image |")
    assert "not measured per image" in rows["3."] and "Stage 1: not judged; Stage 2 (2 runs): not judged" in rows["3."]
    # the smallest-update pass (the last: 5 %) costs less than every larger-update pass in every arm-stage;
    # in the Stage-2 run it costs more (5 dB against 3)
    assert "0 of 6 arm-stages agree" in rows["4."] and rows["4."].endswith("| Stage 1: disagree; Stage 2 (2 runs): agree |")
    assert rows["5."].endswith("| Stage 1: agree; Stage 2 (2 runs): agree |")
    assert "30.0 ± 0.0 / 25.0 ± 0.0 / 20.0 ± 0.0 % vs 2.0 ± 0.0 % full" in rows["5."]
    assert "1.82x the MACs, 2.50x the training step time (this ledger has no eval latency)" in rows["6."]
    assert "by construction" in rows["6."] and rows["6."].endswith("| agree |")  # 2.50 > 1.82 x 1.1
    assert "19.10 ± 0.10 vs 18.50 ± 0.00 dB (+0.60, resolves 0.63) in 2.50x" in rows["6b"]  # global better at equal steps
    assert rows["6b"].startswith("| 6b. at matched quality") and rows["6b"].endswith("| cannot tell (2 of 3 seeds) |")
    ledger = json.loads((root / "ledger.json").read_text())["info"]["loopvae_ledger"]
    runs = summarize_loopvae.load_runs(str(root))
    ahead = [dict(r, psnr=20.1) for r in runs["unlooped"]]  # the unlooped arm ahead of global: it gets there first
    assert summarize_loopvae.matched_quality_row(runs["global"], ahead, ledger)[3].startswith("agree")
    far = [dict(r, psnr=17.0) for r in runs["unlooped"]]  # global ahead by 2.1 and 2.3 dB, beyond 0.3: disagree
    assert summarize_loopvae.matched_quality_row(runs["global"], far, ledger)[3].startswith("disagree")
    assert "\nold\n" not in readme.read_text() and readme.read_text().endswith("prose\n")
    summary = (root / "summary.md").read_text()
    assert "| `c100-mini-loopvae-none` | 2 | 19.10 ± 0.20 |" in summary and "| `c100-mini-loopvae-gan` | 2 |" in summary
    assert "Claims 2-5 on the Stage-2 checkpoints (`c100-mini-loopvae-gan`, 2 seed(s)" in summary
    with pytest.raises(SystemExit) as e:
        summarize_loopvae.main([str(tmp_path / "nothing")])
    assert e.value.code == 2 and "ARMS=loopvae bash lab/reproduce_mini.sh" in capsys.readouterr().err



def marked_block(text, name):
    """What a summarizer wrote between `text`'s <!-- name --> markers (summarize_mini.write_blocks)."""
    return text.split(f"<!-- {name} -->\n", 1)[1].split(f"\n<!-- /{name} -->", 1)[0]


@pytest.mark.slow
def test_kept_results_leave_checkpoints_out_and_rebuild_readmes_loopvae_tables(tmp_path, monkeypatch, capsys):
    """keep_results.py copies finished runs without checkpoints; summarize_loopvae on the kept study
    (lab/results/loopvae) gives lab/docs/results.md's and docs/models.md's tables as they stand."""
    import keep_results
    import summarize_loopvae
    runs = tmp_path / "runs"
    for name in ("done.json", "log.jsonl", "loops.json", "ckpt.pt", "train.log", "running.json", ".lock"):
        (runs / "loopvae-global" / "seed0").mkdir(parents=True, exist_ok=True)
        (runs / "loopvae-global" / "seed0" / name).write_text("{}")
    (runs / "loopvae-none" / "seed0").mkdir(parents=True)
    (runs / "loopvae-none" / "seed0" / "ckpt.pt").write_text("")  # unfinished: no done.json
    (runs / "ledger.json").write_text("{}")
    (runs / "loopvae-global" / "seed0" / "depth_eval.png").write_bytes(b"\x89PNG")  # a run's figure: drawn again
    assert keep_results.keep(str(runs), str(tmp_path / "kept")) == ["loopvae-global/seed0"]
    lines = kept.read(str(tmp_path / "kept"))  # one line per run (lab/kept.py)
    assert [ln["dir"] for ln in lines] == ["loopvae-global/seed0"]
    assert sorted(lines[0]["files"]) == ["done.json", "log.jsonl", "loops.json"]
    assert sorted(os.listdir(tmp_path / "kept")) == ["ledger.json", "runs.jsonl"]
    (runs / "revit-e4" / "seed0").mkdir(parents=True)  # a classifier's run: its model line is kept (model.txt)
    for name, text in (("done.json", "{}"), ("train.log", "preset: x\nrevit: 0.365 M params, 0.032 GFLOPs/img, depth 8\nstep 1\n")):
        (runs / "revit-e4" / "seed0" / name).write_text(text)
    keep_results.keep(str(runs), str(tmp_path / "kept2"))
    kept.unpack(str(tmp_path / "kept2"), str(tmp_path / "kept2-unpacked"))
    assert (tmp_path / "kept2-unpacked" / "revit-e4" / "seed0" / "model.txt").read_text() == "revit: 0.365 M params, 0.032 GFLOPs/img, depth 8\n"
    assert keep_results.main([str(tmp_path / "nothing"), str(tmp_path / "k")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    study = tmp_path / "loopvae"
    kept.unpack(os.path.join(ROOT, "lab", "results", "loopvae"), str(study))  # the compact runs, unpacked
    monkeypatch.setattr(summarize_loopvae, "figures", lambda runs, root: None)
    summarize_loopvae.main([str(study)])  # every measurement cached: no checkpoint, no timing
    summary, found = (study / "summary.md").read_text(), 0
    for doc in (os.path.join("lab", "docs", "results.md"), os.path.join("docs", "models.md")):
        text = open(os.path.join(ROOT, doc)).read()
        for name in ("loopvae-claims", "loopvae-details"):
            if f"<!-- {name} -->" in text:
                block = marked_block(text, name)
                assert block in summary, f"{doc}'s {name} table is not what lab/results/loopvae gives"
                found += 1
    assert found == 2  # the claims in lab/docs/results.md, the details in docs/models.md


# ----------------------------------------------------------------------------- reViT's second regime (issue 39)
def fake_teacher_study(root, agree):
    """Finished teacher and student runs with cached probes and alignments, for the four claims to come out
    `agree` (True) or disagree (False)."""
    import summarize_teacher as st
    for seed in (0, 1):
        for arm in st.ARMS:
            d = root / arm / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "done.json").write_text("{}")
            top1 = {st.TEACHER: 30.0, st.E1: 25.0, st.E4: (29.5 if agree else 24.0)}[arm] + 0.2 * seed
            (d / "probe_linear.json").write_text(json.dumps({"top1": top1}))
            (d / "probe_seg.json").write_text(json.dumps({"miou": 10.0 + seed}))
            (d / "probe_depth.json").write_text(json.dumps({"linear": {"rmse": 0.4}, "mlp": {"rmse": 0.3}}))
            if arm == st.TEACHER:
                continue
            e4 = arm == st.E4
            rho = (0.99 if agree else 0.90) if e4 else 0.95
            mad = (0.5 if agree else 2.0) if e4 else 1.2
            align = {"rho": rho + 0.001 * seed, "mad": mad + 0.01 * seed, "teacher_cka": 0.8}
            if e4:  # deletions: CKA 0.75 against random draws around 0.6 (agree) or 0.9 (disagree)
                centre = 0.6 if agree else 0.9
                align["deletions"] = [{"expert": e, "teacher_cka": 0.75, "random": [centre - 0.01, centre + 0.01]}
                                      for e in range(4)]
                others = [0.5] * 23 if agree else [0.5] * 22 + [0.85]  # disagree: one permutation better
                align["permutations"] = [{"teacher_cka": 0.8}] + [{"teacher_cka": v} for v in others]
            (d / "alignment.json").write_text(json.dumps(align))


@pytest.mark.slow
@pytest.mark.parametrize("agree", [True, False])
def test_the_second_regimes_claims_come_out_either_way(tmp_path, agree):
    import summarize_teacher as st
    fake_teacher_study(tmp_path, agree)
    rows = st.claims(st.load_runs(str(tmp_path)))
    assert [r[0][:3] for r in rows] == ["(a)", "(b)", "(c)", "(d)"]
    assert [r[3].split(" (")[0] for r in rows] == ["agree" if agree else "disagree"] * 4, rows  # (less its notes)
    assert ("8 of 8 deletions cost less" if agree else "0 of 8 deletions cost less, 8 more") in rows[2][2]
    assert ("46 of 46 permutations lower" if agree else "44 of 46 permutations lower") in rows[3][2]
    readme, docs = tmp_path / "results.md", tmp_path / "models.md"
    readme.write_text("<!-- teacher-claims -->\nold\n<!-- /teacher-claims -->\n")
    docs.write_text("x\n<!-- teacher-details -->\n<!-- /teacher-details -->\ny\n")
    st.main([str(tmp_path), "--no-measure", "--results", str(readme), "--docs", str(docs)])
    text = (tmp_path / "teacher.md").read_text()
    assert "| `revit-e4+feature-only` | 2 |" in text and "not ADE20k or NYUv2" in text
    assert rows[0][1] in readme.read_text() and "Seeds: vit 2, revit-e1+feature-only 2" in readme.read_text()
    assert "| `revit-e4+feature-only` | 2 |" in docs.read_text() and "old" not in readme.read_text()
    assert docs.read_text().startswith("x\n") and docs.read_text().endswith("y\n")


def test_the_second_regimes_claims_cannot_tell_within_the_noise_and_say_what_was_not_run(tmp_path):
    import summarize_teacher as st
    fake_teacher_study(tmp_path, True)
    for seed in (0, 1):  # E=4 at 95 % of the teacher, within the seeds' spread
        (tmp_path / st.E4 / f"seed{seed}" / "probe_linear.json").write_text(json.dumps({"top1": 28.5 + 0.4 * seed}))
    runs = st.load_runs(str(tmp_path))
    assert st.claims(runs)[0][3].startswith("cannot tell")
    runs.pop(st.E1)
    assert st.claims(runs)[1][3] == "not run"


def test_docs_mini_and_moe_blocks_are_what_the_kept_runs_give(tmp_path):
    """lab/docs/results.md's mini-table and mini-verdicts (lab/results/mini with lab/results/init) and docs/models.md's moe-table
    (lab/results/revit) are summarize_mini.py's blocks over those kept folders, as the pages' prose names them: a rebuild
    from the wrong folders (the moe-table from lab/results/mini, whose only reViT arm is revit-e4-elastic) fails here."""
    def blocks(*names):
        runs = {}
        for name in names:
            study = kept.unpack(os.path.join(ROOT, "lab", "results", name), str(tmp_path / name))
            for arm, rs in summarize_mini.load_runs(study).items():
                runs.setdefault(arm, []).extend(rs)
        return summarize_mini.summary(runs)
    mini, revit = blocks("mini", "init"), blocks("revit")
    results = open(os.path.join(ROOT, "lab", "docs", "results.md"), encoding="utf-8").read()
    models = open(os.path.join(ROOT, "docs", "models.md"), encoding="utf-8").read()
    assert marked_block(results, "mini-table") == mini["mini-table"].strip()
    assert marked_block(results, "mini-verdicts") == mini["mini-verdicts"].strip()
    assert marked_block(models, "moe-table") == revit["moe-table"].strip()
    assert "revit-lory" in marked_block(models, "moe-table")


@pytest.mark.slow
def test_readmes_teacher_and_anytime_tables_are_what_the_kept_runs_give(tmp_path, monkeypatch):
    """lab/results/revit-teacher and lab/results/mini (lab/keep_results.py): the second regime's and anytime
    inference's summaries rebuilt from the kept files (every measurement cached) are lab/docs/results.md's and
    docs/models.md's blocks as they stand."""
    import summarize_anytime
    import summarize_teacher
    teacher, mini = tmp_path / "revit-teacher", tmp_path / "mini"
    kept.unpack(os.path.join(ROOT, "lab", "results", "revit-teacher"), str(teacher))  # the compact runs, unpacked
    kept.unpack(os.path.join(ROOT, "lab", "results", "mini"), str(mini))
    monkeypatch.setattr(summarize_anytime, "figure", lambda runs, root: None)
    summarize_teacher.main([str(teacher), "--no-measure"])
    summarize_anytime.main([str(mini), "--no-measure"])
    made = (teacher / "teacher.md").read_text() + (mini / "anytime.md").read_text()
    found = 0
    for doc, names in ((os.path.join("lab", "docs", "results.md"), ("teacher-claims", "anytime")), (os.path.join("docs", "models.md"), ("teacher-details",))):
        text = open(os.path.join(ROOT, doc)).read()
        for name in names:
            block = marked_block(text, name)
            assert block in made, f"{doc}'s {name} block is not what the kept runs give"
            found += 1
    assert found == 3


# ----------------------------------------------------------------------------- anytime inference (issue 40)
def fake_anytime_run(root, arm, seed, fraction, gain, se=0.1):
    d = root / arm / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "done.json").write_text("{}")
    op = {"threshold": 0.5, "applications": 8 * fraction, "top1": 30.0, "fraction_of_trained": fraction}
    rules = {r: {"operating_point": op if r == "confidence" else None, "best_gain_over_fixed": gain - (r != "kl"),
                 "curve": []} for r in ("confidence", "kl", "update", "second-order")}
    heldout = {"rule": "kl", "threshold": 0.01, "gain": gain, "se": se}  # claim (b) reads only this
    (d / "anytime.json").write_text(json.dumps({"rules": rules, "heldout": heldout, "blocks_per_step": 1, "full_top1": 30.0,
                                                "num_images": 2000,
                                                "behaviour": "drifts", "fixed": [], "oracle": {}}))
    (d / "bench_anytime.json").write_text(json.dumps({"anytime_confidence_over_fixed_img_per_s": 1.6}))


@pytest.mark.parametrize("agree", [True, False])
def test_the_anytime_claims_come_out_either_way(tmp_path, agree):
    import summarize_anytime as sa
    for seed in (0, 1):
        for arm in sa.ARMS:  # agree: bvit-ds needs 40-42 % of its applications, every arm gains 2 points
            fake_anytime_run(tmp_path, arm, seed, (0.40 if agree else 0.80) + 0.02 * seed,
                             (2.0 if agree else -2.0) + 0.1 * seed)
    rows = sa.claims(sa.load_runs(str(tmp_path)))
    assert [r[2].split(" (")[0] for r in rows] == ["agree" if agree else "disagree"] * 2, rows  # (less its notes)
    assert ("41.00 ± 1.00 %" if agree else "81.00 ± 1.00 %") in rows[0][1]
    table = sa.rule_table(sa.load_runs(str(tmp_path)))
    assert "| `bvit-ds` | 2 | 30.00 ± 0.00 |" in table and "never within 0.5" in table and "1.60 ± 0.00x img/s" in table


def test_the_anytime_claims_cannot_tell_within_the_noise(tmp_path):
    import summarize_anytime as sa
    for seed, frac in ((0, 0.5), (1, 0.7)):  # 60 % +- 10: within the spread
        fake_anytime_run(tmp_path, "bvit-ds", seed, frac, 1.0)
    rows = sa.claims(sa.load_runs(str(tmp_path)))
    assert rows[0][2].startswith("cannot tell") and rows[1][2] == "agree, on 1 of 5 arms so far"  # (b): "every arm"
    assert "; bvit not run" in rows[1][1]
    fake_anytime_run(tmp_path, "bvit", 0, 0.5, 1.0)  # one seed resolves nothing: (b) cannot tell
    assert sa.claims(sa.load_runs(str(tmp_path)))[1][2] == "cannot tell, on 2 of 5 arms so far"
    for seed in (0, 1):  # an arm that loses on both seeds decides "every arm" at once
        fake_anytime_run(tmp_path, "srvit-r2", seed, 0.5, -30.0 - seed)
    assert sa.claims(sa.load_runs(str(tmp_path)))[1][2] == "disagree"


def test_the_anytime_gain_is_judged_against_its_sampling_noise_over_images(tmp_path):
    import summarize_anytime as sa
    for seed, gain in ((0, 1.0), (1, 1.1)):  # the seeds agree closely, but each gain is +-2 on its images
        fake_anytime_run(tmp_path, "bvit", seed, 0.5, gain, se=2.0)
    row = sa.claims(sa.load_runs(str(tmp_path)))[1]
    assert row[2] == "cannot tell, on 1 of 5 arms so far" and "resolves 3.14" in row[1], row  # 0.32 + 2 sqrt(2 * 2^2) / 2
    for seed, gain in ((0, 1.0), (1, 1.1)):
        fake_anytime_run(tmp_path, "bvit-ds", seed, 0.5, gain, se=0.2)  # the same gains, measured on more images
    row = sa.claims(sa.load_runs(str(tmp_path)))[1]
    assert "bvit-ds 1.05 ± 0.05 points (kl; resolves 0.60: agree (2 of 3 seeds))" in row[1], row
