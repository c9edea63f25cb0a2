"""The study arms the lab runs through train.py --config (issue 78: the lab's table of arms, lab/arms.py): each arm's
file resolves to its own flags and trains, the arms' recipes and pairs are matched, an arm's args.json names it, and
a kept run's args.json (which recorded its arm as "preset") still loads. CPU only, in-process train.cli calls."""
import json
import math
import os
import subprocess
import sys
import tempfile

import pytest

import bench
import revit_moe
import train
from arms import ARMS, FIG2_L, MINI as MINI_RECIPE, TIMES, fig2_arms, kept_config, write_config
from test_presets import TINY, build as build_preset, config
from test_train import fake_cifar
from training import registry
from training.flags import get_parser, parse_args, resolve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = tempfile.mkdtemp(prefix="rvits-arms-")  # this process's arm files (write_config), named after each arm
# (the c100-gpu-* arms train two steps each in test_reproduce.py's gpu_study.sh dry run, and a c100-mini-loopvae-*
# arm in test_loopvae_train.py)
CIFAR_ARMS = [n for n in ARMS if n.startswith("c100-mini-") and "-loopvae-" not in n] + ["c100-gpu-bvit-ti"]


def as_config(name):
    """train.py's flags that run arm `name` as the lab runs it: --config FILE, FILE named after the arm."""
    return ["--config", write_config(name, FILES)]


def build(name, **over):
    """The arm's model as train.py builds it (CIFAR: 32 px, 100 classes)."""
    return build_preset(name, argv=as_config(name), **over)


def test_every_arms_file_resolves_to_its_own_flags_and_its_run_names_the_arm(capsys):
    """Each arm through --config resolves to exactly its flags (what --preset NAME gave before issue 78), and
    --print-config (what args.json records) names the arm's file, not a preset."""
    import train_loopvae
    from loopvae_train import flags as lvflags
    from arms import entry
    parsers = {"train.py": (get_parser(), train.cli), "train_loopvae.py": (lvflags.get_parser(), train_loopvae.cli)}
    for name, (what, flags) in ARMS.items():
        parser, cli = parsers[entry(name)]  # (LoopVAE's arms: train_loopvae.py's flags)
        dests = set(vars(parser.parse_args([])))
        assert set(flags) <= dests, (name, set(flags) - dests)  # a typo would be refused, not ignored
        assert what and TIMES[name] and name.startswith(("c100-mini-", "c100-gpu-"))
        cfg = config(capsys, *as_config(name), cli=cli)
        assert cfg["preset"] is None and os.path.basename(cfg["config"]) == f"{name}.json", name
        # resolve() may fill what a flag left out (a None eval_depths stays None; --size's width): never change one given
        assert {k: cfg[k] for k in flags if flags[k] is not None} == {k: v for k, v in flags.items() if v is not None}, name


def test_the_arms_cli_writes_the_file_and_names_the_entry_point(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "lab", "arms.py"), "c100-mini-bvit", "--dir", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.split() == ["train.py", str(tmp_path / "c100-mini-bvit.json")]
    assert json.loads((tmp_path / "c100-mini-bvit.json").read_text()) == ARMS["c100-mini-bvit"][1]
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "lab", "arms.py"), "c100-mini-nosuch"], capture_output=True,
                         text=True, cwd=ROOT)
    assert bad.returncode == 2 and "not an arm" in bad.stderr and "Traceback" not in bad.stderr


def test_a_kept_runs_args_json_with_its_arm_as_preset_loads_as_a_config(tmp_path):
    """Runs before issue 78 recorded the arm as "preset": c100-mini-...; kept_config drops that name (the file holds
    every flag) and keeps a product preset's."""
    from training import flags
    saved = {**ARMS["c100-mini-bvit"][1], "preset": "c100-mini-bvit", "seed": 1}
    (tmp_path / "args.json").write_text(json.dumps(kept_config(saved)))
    args = flags.resolved(["--config", str(tmp_path / "args.json")])
    assert (args.preset, args.embed_dim, args.seed, args.lr) == (None, 96, 1, 2e-3)
    assert kept_config({"preset": "c100-bvit-ti"}) == {"preset": "c100-bvit-ti"}


def test_bench_times_the_gpu_studys_bvit_and_ledgers_its_loopvae_arms(capsys):
    """bench.py (the product) cannot import the lab: its GPU_BVIT recipe and LoopVAE arms are written out there;
    they are the lab's c100-gpu-bvit-ti and c100-mini-loopvae-* arms."""
    assert config(capsys, *bench.GPU_BVIT) | {"preset": None, "config": None} == \
        config(capsys, *as_config("c100-gpu-bvit-ti")) | {"preset": None, "config": None}
    for arm, (share, loops, operator) in bench.LOOPVAE_ARMS.items():
        f = ARMS[f"c100-mini-loopvae-{arm}"][1]
        assert (f["share"], tuple(f["loops"]), f["operator"]) == (share, loops, operator), arm
    f = ARMS["c100-mini-loopvae-global"][1]
    assert bench.LOOPVAE_MINI == dict(width=f["embed_dim"], batch=f["batch_size"], num_groups=f["num_groups"],
                                      num_heads=f["num_heads"])


def test_gpu_study_arms_share_one_recipe_and_their_pairs_are_matched(capsys):
    """c100-gpu-*: the arms of the mini study and of reViT's comparisons on the c100-gpu-bvit-ti recipe
    at Ti width; only model flags differ; recurrent arms are evaluated at 0.5x-4x their depth."""
    import gpu_study
    arms = sorted({a.split("+")[0] for a in gpu_study.ARMS})
    assert sorted(n for n in ARMS if n.startswith("c100-gpu-")) == sorted(
        [f"c100-gpu-{a}" for a in arms] + ["c100-gpu-bvit-ti"])
    assert ARMS["c100-gpu-bvit-ti"][1] == ARMS["c100-gpu-bvit"][1]  # its first name
    model_flags = {"model", "eval_depths", "size", "embed_dim", "num_heads", "depth", "stages", "experts",
                   "depth_dropout", "recursions", "solver", "horizon", "routing", "lora_rank"}
    recipe = {k: v for k, v in ARMS["c100-gpu-bvit"][1].items() if k not in model_flags}
    assert recipe["epochs"] == 50 and recipe["randaug"] == 0.0 and recipe["batch_size"] == 512
    for arm in arms:
        flags = ARMS[f"c100-gpu-{arm}"][1]
        assert {k: v for k, v in flags.items() if k not in model_flags} == recipe, arm
        cfg = config(capsys, *as_config(f"c100-gpu-{arm}"))
        trained = cfg["recursions"] if cfg["model"] == "srvit" else cfg["depth"]
        if cfg["model"] == "vit":
            assert cfg["eval_depths"] is None
        else:
            assert cfg["eval_depths"] == sorted({max(1, int(f * trained)) for f in (0.5, 1, 2, 4)}), arm
    vit, bv = build("c100-gpu-vit"), build("c100-gpu-bvit")
    assert vit.flops_per_image() == bv.flops_per_image() and vit.embed_dim == bv.embed_dim == 192
    wide, narrow = build("c100-gpu-bvit-wide"), build("c100-gpu-vit-narrow")
    assert abs(wide.num_params() / narrow.num_params() - 1) < 0.05 and narrow.num_blocks == 12
    ode = [ARMS[f"c100-gpu-odevit-{s}"][1] for s in ("euler", "heun", "rk4")]
    assert [f["depth"] * {"euler": 1, "heun": 2, "rk4": 4}[f["solver"]] for f in ode] == [12, 12, 12]
    assert build("c100-gpu-srvit-r2").flops_per_image() == pytest.approx(bv.flops_per_image(), rel=0.01)
    for arm, base, change in [(f"revit-{r}", "revit-e4", {"routing": r}) for r in revit_moe.ROUTINGS[1:]] \
            + [("revit-lora", "revit-e1", {"lora_rank": 32})]:
        assert ARMS[f"c100-gpu-{arm}"][1] == {**ARMS[f"c100-gpu-{base}"][1], **change}, arm


@pytest.mark.parametrize("name", CIFAR_ARMS)
def test_each_cifar_arm_trains_one_step_through_its_config_file(name, tmp_path):
    out = tmp_path / "out"
    data_dir = fake_cifar(tmp_path / "data")
    depth = ["--depth", str(ARMS[name][1].get("stages", 3))]  # stages must divide the depth
    src = []
    if "-fig2" in name:  # a Fig. 2 student: first its teacher
        assert train.cli([*as_config("c100-mini-vit"), "--data-dir", data_dir, "--out-dir", str(tmp_path / "vit"),
                          *TINY, *depth]) == 0
        src = ["--teacher", str(tmp_path / "vit")]
    if name.endswith(("-elastic", "-cont")):  # a continuation: first the fixed-depth run it starts from
        base = name.rsplit("-", 1)[0]
        assert train.cli([*as_config(base), "--data-dir", data_dir, "--out-dir", str(tmp_path / "src"), *TINY,
                          *depth, *src]) == 0
        src += ["--finetune", str(tmp_path / "src")]
    assert train.cli([*as_config(name), "--data-dir", data_dir, "--out-dir", str(out), *TINY, *depth, *src]) == 0
    saved = json.loads((out / "args.json").read_text())
    assert saved["config"].endswith(f"{name}.json") and saved["preset"] is None and saved["embed_dim"] == 16
    assert saved["randaug"] == (0.0 if "-mini-" in name or "-gpu-" in name else 9.0)
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert recs[0]["step"] == 1 and math.isfinite(recs[0]["train_loss"])
    assert [r["depth"] for r in recs[1:]] == (saved["eval_depths"] or [])  # beyond the horizon



MINI = ["vit", "bvit", "bvit-wide", "vit-narrow", "bvit-ds", "odevit-euler", "odevit-heun", "odevit-rk4",
        "revit-e1", "revit-e4", "srvit-r1", "srvit-r2",
        "revit-lory", "revit-smear", "revit-deepseek", "revit-qwen3", "revit-moeut", "revit-remoe", "revit-softmoe",
        "revit-lora"]  # reViT's comparisons (Table 3 at U = 1, appendix B; Table 10)
ELASTIC = ["revit-e1-elastic", "revit-e1-cont", "revit-e4-elastic", "revit-e4-cont"]  # reViT's second stage
INIT = ["init-pytorch", "init-mimetic", "init-structured"]  # the structured-init claims (issue 50)
UNTESTED = ["odevit-blackbox", "odevit-euler-nfe4", "odevit-heun-nfe4", "odevit-rk4-nfe4", "vit-d48", "bvit-d48"]  # issue 64
FIG2 = ["revit-e4-fig2", "revit-smear-fig2", "revit-e4-fig2-elastic", "revit-smear-fig2-elastic"]  # reViT's Fig. 2
SEARCH = ["revit-search-e2", "revit-search-long", "revit-search-wide", "revit-search-p4", "revit-search-router"]  # E=4 engagement (issue 63)


def test_every_supervised_revit_arm_trains_at_fixed_depth_and_every_elastic_one_continues_a_fixed_depth_run(capsys):
    """reViT paper, Table 6 (the supervised recipe of Tables 1, 3, 5, 10) lists no depth dropout; A.2-A.3
    apply per-image depth dropout 0.3 to trained models afterwards. So: train.py's default is fixed depth, no
    supervised preset sets depth dropout, and each elastic arm (and its control) is a --finetune of the
    fixed-depth run of its own arm, with that arm's model."""
    revit = [n for n, (_, f) in ARMS.items() if f.get("model") == "revit" or "-revit-" in n]
    assert len(revit) > 20
    for name in revit:
        cfg = config(capsys, *as_config(name))
        if name.endswith(("-elastic", "-cont")):
            src = name.rsplit("-", 1)[0]  # c100-mini-revit-e4
            assert cfg["finetune"] == f"runs/mini/{src.split('c100-mini-')[1]}/seed0", name
            assert cfg["depth_dropout"] == (0.3 if name.endswith("-elastic") else 0.0), name
            base = ARMS[src][1]
            assert config(capsys, *as_config(src))["depth_dropout"] == 0.0 and base["experts"] == cfg["experts"]
            assert cfg["epochs"] < base["epochs"] and cfg["lr"] < base["lr"], name  # a continuation
        else:
            assert cfg["depth_dropout"] == 0.0 and not cfg["finetune"], name
    assert sorted(n for n in revit if n.endswith(("-elastic", "-cont"))) == sorted(
        f"c100-mini-{a}" for a in ELASTIC + FIG2 if a.endswith("-elastic") or a in ELASTIC)


def test_mini_protocol_pairs_are_matched_and_every_recurrent_arm_is_evaluated_from_half_to_4x(capsys):
    classifiers = [n for n in ARMS if n.startswith("c100-mini-") and "-loopvae-" not in n]  # (LoopVAE's:
    assert sorted(classifiers) == sorted(f"c100-mini-{a}" for a in MINI + UNTESTED + ELASTIC + INIT + FIG2 + SEARCH)  # test_loopvae_train.py)
    recipe = {k: v for k, v in ARMS["c100-mini-vit"][1].items() if k not in ("model", "eval_depths")}
    for arm in MINI + UNTESTED:  # one recipe: only model flags differ
        flags = ARMS[f"c100-mini-{arm}"][1]
        model_flags = {"model", "eval_depths", "embed_dim", "num_heads", "depth", "stages", "experts",
                       "depth_dropout", "recursions", "solver", "horizon", "routing", "lora_rank", "field"}
        assert {k: v for k, v in flags.items() if k not in model_flags} == \
               {k: v for k, v in recipe.items() if k not in model_flags}, arm
        # the mini recipe fixes every optimization flag, so a changed train.py default cannot move it
        assert {"lr", "min_lr", "weight_decay", "warmup_epochs", "clip_grad", "label_smoothing", "epochs",
                "batch_size", "init", "workers", "save_every"} <= set(flags)
        cfg = config(capsys, *as_config(f"c100-mini-{arm}"))
        trained = cfg["recursions"] if cfg["model"] == "srvit" else cfg["depth"]
        if cfg["model"] == "vit":
            assert cfg["eval_depths"] is None  # untied: no depth to vary
        else:
            want = [f * trained for f in (0.5, 1, 2, 4) if f * trained >= 1]
            assert cfg["eval_depths"] == want, arm
    vit, bv = build("c100-mini-vit"), build("c100-mini-bvit")
    assert vit.flops_per_image() == bv.flops_per_image() and vit.num_params() > 6 * bv.num_params()
    wide, narrow = build("c100-mini-bvit-wide"), build("c100-mini-vit-narrow")
    assert wide.embed_dim > bv.embed_dim > narrow.embed_dim and narrow.num_blocks == 8
    assert abs(wide.num_params() / narrow.num_params() - 1) < 0.05
    ode = [ARMS[f"c100-mini-odevit-{s}"][1] for s in ("euler", "heun", "rk4")]
    assert [f["depth"] * {"euler": 1, "heun": 2, "rk4": 4}[f["solver"]] for f in ode] == [8, 8, 8]
    assert {f["horizon"] for f in ode} == {8.0}
    r1, r2 = build("c100-mini-srvit-r1"), build("c100-mini-srvit-r2")
    assert r1.num_params() < r2.num_params() < 1.01 * r1.num_params()  # + the router only
    assert ARMS["c100-mini-bvit-ds"][1]["stages"] == 4
    for arm, base, change in [(f"revit-{r}", "revit-e4", {"routing": r}) for r in revit_moe.ROUTINGS[1:]] \
            + [("revit-lora", "revit-e1", {"lora_rank": 16})]:  # the reViT arm with one flag changed
        assert ARMS[f"c100-mini-{arm}"][1] == {**ARMS[f"c100-mini-{base}"][1], **change}, arm


def test_each_engagement_search_candidate_changes_one_thing_of_revit_e4_within_an_hour():
    """Issue 63: a supervised CPU recipe on which E=4's experts engage, searched within 60 CPU minutes per candidate."""
    base = ARMS["c100-mini-revit-e4"][1]
    for arm in SEARCH:
        flags = ARMS[f"c100-mini-{arm}"][1]
        changed = {k for k in set(flags) | set(base) if flags.get(k) != base.get(k)} - {"epochs", "warmup_epochs"}
        assert len(changed) <= 2 and (changed or flags["epochs"] != base["epochs"]), (arm, changed)  # (D and heads)
        assert float(TIMES[f"c100-mini-{arm}"][0].removeprefix("est. ").split()[0]) <= 60, arm


def test_fig2_arms_are_two_students_of_one_teacher_differing_only_in_the_gate_then_one_elastic_stage(capsys):
    """reViT paper, sec. 4.4 and A.2-A.3: both Fig. 2 variants are distilled from the same teacher's final features
    alone (task weight 0) at one fixed depth L divisible by 3, differ only in the gate (depth vs feature: smear), and
    then get the same elastic-depth stage (depth dropout 0.3) from their own run; every arm is evaluated at 2/3 L, L,
    4/3 L, 2 L (+ 1/2 L, 4 L)."""
    L = FIG2_L
    e4, smear = (ARMS[f"c100-mini-revit-{g}-fig2"][1] for g in ("e4", "smear"))
    assert {k: v for k, v in smear.items() if k != "routing"} == {k: v for k, v in e4.items() if k != "routing"}
    assert (e4["routing"], smear["routing"], e4["experts"], e4["depth"], L % 3) == ("depth", "smear", 4, L, 0)
    assert (e4["teacher"], e4["distill"], e4["task_weight"]) == ("runs/mini/vit/seed0", "feature", 0.0)
    assert {2 * L // 3, L, 4 * L // 3, 2 * L, L // 2, 4 * L} == set(e4["eval_depths"])
    for g in ("e4", "smear"):
        cfg = config(capsys, *as_config(f"c100-mini-revit-{g}-fig2-elastic"))
        student = ARMS[f"c100-mini-revit-{g}-fig2"][1]
        assert cfg["finetune"] == f"runs/mini/revit-{g}-fig2/seed0" and cfg["depth_dropout"] == 0.3
        assert (cfg["teacher"], cfg["task_weight"], cfg["routing"]) == (student["teacher"], 0.0, student["routing"])
    with pytest.raises(ValueError, match="divisible by 3"):
        fig2_arms("mini", MINI_RECIPE, 8)


def test_the_init_arms_are_the_mini_recipe_on_an_8x8_grid_and_the_pytorch_base_differing_only_in_attention(capsys):
    """c100-mini-init-*: an untied ViT at patch 4 (8 x 8 tokens, at least the issue's grid), 3 heads of 32 (where
    the structured init puts every head on its offset), the PyTorch base on every arm, 2 epochs, estimated at
    most ~20 minutes a run (pair); otherwise the mini recipe. The three arms differ only in --init."""
    mini = ARMS["c100-mini-vit"][1]
    arms = {a: ARMS[f"c100-mini-{a}"][1] for a in INIT}
    changed = {"patch_size", "epochs", "warmup_epochs", "init_base", "init"}
    for arm, flags in arms.items():
        assert {k: v for k, v in flags.items() if k not in changed} == {k: v for k, v in mini.items() if k not in changed}
        cfg = config(capsys, *as_config(f"c100-mini-{arm}"))
        assert (32 // cfg["patch_size"]) ** 2 >= 64 and cfg["embed_dim"] // cfg["num_heads"] == 32, arm
        assert (cfg["model"], cfg["init_base"], cfg["epochs"], cfg["drop_path"]) == ("vit", "pytorch", 2, 0.0), arm
        minutes = float(TIMES[f"c100-mini-{arm}"][0].removeprefix("est. ").split()[0])
        assert minutes <= 20, arm  # (measured: 13-17 min, lab/results/init)
    assert [arms[a]["init"] for a in INIT] == ["default", "mimetic", "structured"]
    p = get_parser()
    m = registry.build_model(resolve(parse_args(p, as_config("c100-mini-init-pytorch")), p, 32), 32, 100)
    assert m.head.bias.any() and m.blocks[0].attn.qkv.bias.any()  # PyTorch's defaults reached the model
