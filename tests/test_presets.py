"""Reproduction presets (issue 8): every preset resolves, explicit flags override it, the CIFAR study
arms train one step, the matched pairs are matched, and LAMB and the binary cross-entropy follow
their formulas. CPU only, in-process `train.cli` calls on a tiny fake CIFAR-100 folder."""
import json
import shlex
import math
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchvision.transforms import v2

import bvit
import data
import odevit
import presets
import revit
import revit_moe
import srvit
import train
import train_loopvae
from loopvae_train import flags as lvflags
from training.flags import get_parser, parse_args, resolve
from training import monitor, optim, registry
from test_train import fake_cifar

TINY = ["--embed-dim", "16", "--num-heads", "2", "--depth", "3", "--device", "cpu", "--workers", "0",
        "--batch-size", "8", "--max-steps", "1", "--val-subset", "16", "--eval-batch-size", "16"]
# (the c100-gpu-* study arms train two steps each in test_reproduce.py's gpu_study.sh dry run, and a
# c100-mini-loopvae-* arm in test_loopvae_train.py)
CIFAR_PRESETS = [n for n in presets.PRESETS if n.startswith("c100-") and "-loopvae-" not in n
                 and (not n.startswith("c100-gpu-") or n == "c100-gpu-bvit-ti")]


def config(capsys, *argv, cli=None):
    capsys.readouterr()
    assert (cli or train.cli)(["--print-config", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_presets_is_a_table_a_person_can_scan_and_filter(capsys):
    capsys.readouterr()
    assert train.cli(["--list-presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("NAME "))
    header = " ".join(lines[:head])
    assert "'pair' = two side by side" in header and "'alone'" in header and "training only" in header  # how timed
    rows = lines[head + 1:]
    assert [ln.split()[0] for ln in rows] == [n for n, (_, f) in presets.PRESETS.items() if f["model"] != "loopvae"] \
        and len(rows) >= 30  # (LoopVAE's: train_loopvae.py --list-presets, below)
    assert rows[0].startswith("cpu-first-bvit ") and max(len(ln) for ln in lines) <= 120
    for line, (name, (what, flags)) in zip(rows, presets.PRESETS.items()):  # name, model, params, times, what
        assert line.split()[1] == flags["model"] and " M  " in line, line
        assert f"  {presets.TIMES[name][0]}  " in line and what[:20] in line, line
    by_name = dict(zip(presets.PRESETS, rows))
    # figures as lab/docs/results.md measured them (mini table's wall min; the first H200 run) or estimated them
    assert "0.142 M" in by_name["c100-mini-bvit"] and "  25.7 min, pair  " in by_name["c100-mini-bvit"]
    assert "  3.3 min train  " in by_name["c100-gpu-bvit-ti"] and "  est. 32 h  " in by_name["in1k-revit-b16-e4"]
    assert all(presets.TIMES[n][0] != "?" for n in presets.PRESETS if n.startswith("c100-mini-"))
    assert train.cli(["--list-presets", "cpu"]) == 0  # the presets timed on a CPU: the laptop's choices
    table = lambda out: [ln for ln in out.splitlines()[out.splitlines().index(next(
        ln for ln in out.splitlines() if ln.startswith("NAME "))) + 1:]]
    cpu = [ln.split()[0] for ln in table(capsys.readouterr().out)]
    assert cpu[0] == "cpu-first-bvit" and all(presets.TIMES[n][0] != "?" for n in cpu) and "in1k-vit-b16" not in cpu
    assert train_loopvae.cli(["--list-presets", "loopvae"]) == 0  # LoopVAE's: its own script's
    listed = [ln.split()[0] for ln in table(capsys.readouterr().out)]
    assert listed == [n for n in presets.PRESETS if "loopvae" in n] and len(listed) >= 9
    assert train.cli(["--list-presets", "c100-mini-loopvae-gan"]) == 2  # train.py names the script
    assert "python train_loopvae.py --list-presets c100-mini-loopvae-gan" in capsys.readouterr().err
    assert train.cli(["--list-presets", "in1k-revit-b16-e4"]) == 0  # one preset in full
    full = capsys.readouterr().out
    assert "paper: ImageNet-1k top-1 83.0 (reViT Table 5, Table 1)" in full and "--experts 4" in full and "--opt adamw" in full
    assert train.cli(["--list-presets", "nosuch"]) == 2  # bad input: one line, exit 2
    assert "--list-presets 'nosuch': no preset matches" in capsys.readouterr().err


def test_the_first_preset_is_readmes_first_command(capsys):
    argv = "--model bvit --data cifar100 --embed-dim 128 --num-heads 4 --patch-size 4 --depth 6 --batch-size 64 " \
        "--max-steps 300 --device cpu".split()
    assert {**config(capsys, "--preset", "cpu-first-bvit"), "preset": None} == config(capsys, *argv)


def test_help_names_the_cpu_sized_presets_and_a_mini_run_does_not_recommend_itself(capsys):
    assert "c100-mini-*" in " ".join(get_parser().format_help().split())
    pace, steps = [(1, 0.0), (11, 100.0)], 100_000  # 10 s per step: days on a CPU
    for preset, model in [(None, "revit"), ("c100-gpu-revit-e4", "revit"), ("c100-mini-revit-e4", "revit"),
                          ("c100-mini-revit-smear", "revit"), (None, "bvit")]:
        line = monitor.estimate_line(SimpleNamespace(preset=preset, model=model), torch.device("cpu"), pace, steps)
        cpu = registry.MODELS[model].cpu_preset
        measured = "" if presets.TIMES[cpu][0].startswith("est.") else " as measured"  # (an estimate says so)
        says = f"--preset {cpu} is this model's CPU-sized protocol ({presets.TIMES[cpu][0]} on 2 cores{measured}"
        assert (says in line) == (preset is None or not preset.startswith("c100-mini-")), (preset, line)


def test_every_preset_resolves_to_its_own_flags(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the presets' relative paths (--stage2's run folder) as on a clean clone
    for name, (what, flags) in presets.PRESETS.items():
        tokenizer = flags["model"] == "loopvae"  # (train_loopvae.py's presets)
        dests = set(vars((lvflags.get_parser() if tokenizer else get_parser()).parse_args([])))
        assert set(flags) <= dests, (name, set(flags) - dests)  # a typo would be silently ignored
        assert what and ("study arm" in what) == name.startswith("c100-"), name
        cfg = config(capsys, "--preset", name, cli=train_loopvae.cli if tokenizer else None)
        assert cfg["preset"] == name and (cfg["model"] in registry.MODELS or tokenizer)
        same = lambda k, v: cfg[k] == v or (k == "stage2" and cfg[k] == os.path.join(v, "ckpt.pt"))  # a run folder
        assert all(same(k, v) for k, v in flags.items()), name  # (--stage2 DIR reads DIR/ckpt.pt once it exists)
        assert cfg["embed_dim"] % cfg["num_heads"] == 0
        assert cfg["img_size"] % (2 ** len(cfg["loops"]) if tokenizer else cfg["patch_size"]) == 0  # loopvae: no patches


# The reViT paper's Table 6 (arXiv 2610.12448, A.3): its supervised ImageNet-1k recipe, the same for S, B and L but
# the peak lr and L; the DINOv2 distillation takes the B column ("only the patch size and task objective differ").
TABLE6 = dict(opt="adamw", weight_decay=0.05, batch_size=2048, epochs=300, warmup_epochs=5.0, warmup_lr=1e-6,
              bce=True, label_smoothing=0.0, three_augment=True, color_jitter=0.3, randaug=0.0, mixup=0.8, cutmix=1.0,
              repeated_aug=3, img_size=224, eval_crop_ratio=1.0, lambda_bal=1e-2, lambda_z=1e-3, lambda_div=1e-3,
              depth_dropout=0.0)


def test_imagenet_presets_follow_table_6_or_deit3s_release_and_name_their_paper_number(capsys):
    """vit, bvit and revit: reViT's Table 6 (the recipe its Table 1 shares); -deit3: DeiT III's own release; srvit:
    the DeiT recipe."""
    for name, (what, flags) in presets.PRESETS.items():
        if name.startswith("in1k-srvit-"):  # the DeiT recipe (our reading of SoftMoR's R = 1 number, 79.83 ~ 79.8)
            cfg = config(capsys, "--preset", name)
            deit = {k: cfg[k] for k in ("opt", "lr", "batch_size", "weight_decay", "epochs", "warmup_epochs", "randaug",
                                         "mixup", "cutmix", "label_smoothing", "drop_path", "bce", "three_augment",
                                         "layer_scale", "clip_grad", "reprob", "repeated_aug")}
            assert deit == dict(opt="adamw", lr=5e-4 * 1024 / 512, batch_size=1024, weight_decay=0.05, epochs=300,
                                warmup_epochs=5.0, randaug=9.0, mixup=0.8, cutmix=1.0, label_smoothing=0.1,
                                drop_path=0.1, bce=False, three_augment=False, layer_scale=None, clip_grad=0.0,
                                reprob=0.25, repeated_aug=3), name
            assert "DeiT recipe (our reading)" in what and cfg["depth"] == 12 and cfg["size"] == "s", name
        elif name.startswith("in1k-"):
            cfg = config(capsys, "--preset", name)
            deit3 = (cfg["bce"], cfg["three_augment"], cfg["label_smoothing"], cfg["batch_size"])
            assert deit3 == (True, True, 0.0, 2048), name
            assert cfg["opt"] == ("lamb" if name.endswith("-deit3") else "adamw"), name
            assert cfg["depth"] == (24 if cfg["size"] == "l" else 12), name
            assert cfg["layer_scale"] and cfg["drop_path"] > 0, name
            assert cfg["patch_size"] == (14 if name.endswith("-dinov2") else 16), name
            if name.endswith("-deit3"):  # facebookresearch/deit README_revenge.md's ImageNet-1k commands
                size = cfg["size"]
                assert (cfg["lr"], cfg["drop_path"], cfg["img_size"]) == {
                    "s": (4e-3, 0.05, 224), "b": (3e-3, 0.2, 192), "l": (3e-3, 0.45, 192)}[size], name
                assert (cfg["weight_decay"], cfg["repeated_aug"], cfg["eval_crop_ratio"], cfg["warmup_lr"],
                        cfg["epochs"], cfg["clip_grad"], cfg["reprob"], cfg["color_jitter"]) == (
                    0.05, 3, 0.875, 1e-6, 800, 0.0, 0.0, 0.3), name
            if name.endswith("-dinov2"):  # reViT's second regime: the teacher's features alone, fixed depth
                assert (cfg["teacher"], cfg["distill"], cfg["task_weight"], cfg["depth_dropout"]) == (
                    "weights/vit_base_patch14_dinov2.pth", "feature", 0.0, 0.0), name
    aims = {"in1k-revit-b16-e4": "83.0", "in1k-revit-s16-e4": "78.2", "in1k-vit-b16": "82.8",
            "in1k-srvit-s16-r1": "79.83", "in1k-srvit-s16-r4": "82.48", "in1k-vit-s16": "79.9", "in1k-vit-l16": "84.1",
            "in1k-bvit-s16-k4": "78.0", "in1k-bvit-l16-k4": "83.7", "in1k-revit-s16-e3": "76.5",
            "in1k-revit-s16-e1": "70.6", "in1k-revit-l16-e8": "84.0", "in1k-vit-s16-deit3": "81.4"}
    for name, number in aims.items():
        assert number in presets.PAPER[name], name
    assert "no paper number" in presets.PAPER["in1k-bvit-b16"]
    for s in "sbl":
        assert [presets.PRESETS[f"in1k-revit-{s}16-e{e}"][1]["experts"] for e in (1, 2, 4, 8)] == [1, 2, 4, 8]
    assert [presets.PRESETS[f"in1k-srvit-s16-r{r}"][1]["recursions"] for r in (1, 2, 3, 4)] == [1, 2, 3, 4]


def test_every_table_1_row_is_table_6_and_the_rows_differ_only_in_the_model(capsys):
    """reViT A.3: "reViT, DeiT III, and Raptor use the same data, augmentation, optimizer, and epoch schedule" (its
    Table 6): in1k-vit-* (DeiT III), in1k-bvit-*-k4 (Raptor-like: 4 blocks in contiguous phases) and in1k-revit-*
    resolve to the same run but for the model's flags; bViT and Table 5's E=3 beside them."""
    model_flags = {"preset", "model", "num_blocks", "experts", "lambda_bal", "lambda_z", "lambda_div"}
    for size in "sbl":
        cfgs = {n: config(capsys, "--preset", f"in1k-{n}") for n in (f"vit-{size}16", f"bvit-{size}16",
                                                                     f"bvit-{size}16-k4", f"revit-{size}16-e4")}
        recipe = [{k: v for k, v in c.items() if k not in model_flags} for c in cfgs.values()]
        assert all(r == recipe[0] for r in recipe), size
        assert {k: recipe[0][k] for k in TABLE6 if k not in model_flags} == \
               {k: v for k, v in TABLE6.items() if k not in model_flags} and recipe[0]["opt"] == "adamw"
        k4 = build(f"in1k-bvit-{size}16-k4")
        assert k4.num_blocks == 4 and k4.phase_map() == [4 * k // k4.depth for k in range(k4.depth)]
        assert cfgs[f"revit-{size}16-e4"]["lambda_bal"] == 1e-2 and cfgs[f"vit-{size}16"]["num_blocks"] is None
    k4 = build("in1k-bvit-s16-k4", img_size=224, num_classes=1000)
    assert round(k4.num_params() / 1e6, 1) == 7.9  # Raptor-S k=4 in Table 1: 7.9 M (B: 29.9, L: 52.4)
    assert config(capsys, "--preset", "in1k-revit-s16-e3")["experts"] == 3


def test_the_recurrent_presets_drop_at_the_untied_vits_mean_rate(capsys):
    """Issue 50: the matched-FLOPs pair of Training Crossroads trains at the same stochastic depth per block
    application (bViT's one block at rate / 2, no longer the full rate), on the GPU and ImageNet recipes too."""
    def mean_rate(m):
        return sum(m.blocks[b].drop_prob.item() for b in m.phase_map()) / m.depth
    for vit, bv in (("c100-vit-ti", "c100-bvit-ti"), ("c100-gpu-vit", "c100-gpu-bvit")):
        rate = presets.PRESETS[vit][1]["drop_path"]
        assert rate > 0 and mean_rate(build(vit)) == pytest.approx(mean_rate(build(bv))) == pytest.approx(rate / 2)
        assert build(bv).blocks[0].drop_prob.item() == pytest.approx(rate / 2)
    sr, rate = build("in1k-srvit-s16-r4"), presets.PRESETS["in1k-srvit-s16-r4"][1]["drop_path"]
    rates = [blk.drop_prob.item() for blk in sr.blocks]  # layer i: applications i, 12 + i, 24 + i, 36 + i of 48
    assert rates == pytest.approx([rate * (i + 18) / 47 for i in range(12)]) and sum(rates) / 12 == pytest.approx(rate / 2)


def test_every_in1k_revit_preset_is_the_revit_papers_table_6(capsys):
    revit = [n for n in presets.PRESETS if n.startswith("in1k-revit-")]
    assert len(revit) == 16  # S, B, L x E = 1, 2, 4, 8, S at E=3 (Table 5) and the three DINOv2 students
    for name in revit:
        cfg = config(capsys, "--preset", name)
        assert {k: cfg[k] for k in TABLE6} == TABLE6, name
        assert cfg["lr"] == {"s": 4e-3, "b": 3e-3, "l": 3e-3}[cfg["size"]], name  # peak lr per size
        assert (cfg["model"], cfg["depth"], cfg["routing"]) == ("revit", 24 if cfg["size"] == "l" else 12, "depth"), name
        # where Table 6 is silent, our choice (presets.TABLE6's comment): kept from the DeiT III presets
        assert (cfg["layer_scale"], cfg["drop_path"], cfg["clip_grad"], cfg["min_lr"]) == (
            1e-4, presets.DEIT3_DROP_PATH[cfg["size"]], 1.0, 1e-5), name
    args = resolve(parse_args(get_parser(), ["--preset", "in1k-revit-s16-e4"]), get_parser(), 224)
    _, scheduler, _, _, warmup = train.optimizer_and_schedule(args, torch.nn.Linear(2, 2), None, [None] * 625)
    assert warmup == 5 * 625 and scheduler.get_last_lr()[0] == pytest.approx(1e-6, rel=1e-9)  # from 1e-6 ...
    f = optim.lr_lambda(100, 10, 4e-3, 1e-5, 1e-6)
    assert [4e-3 * f(s) for s in (0, 5, 10)] == pytest.approx([1e-6, 1e-6 + (4e-3 - 1e-6) / 2, 4e-3])  # ... to lr
    assert optim.lr_lambda(100, 10, 4e-3, 1e-5)(0) == 0.1  # without --warmup-lr: lr / warmup steps, as before


def test_a_run_no_longer_than_the_default_warmup_gets_5_percent_of_it_and_a_given_one_is_refused(capsys, tmp_path):
    """Issue 62, item 10: --epochs 3 with the default --warmup-epochs 5 was warmup from its first step to its
    last (the lr ended at its peak; the cosine and --min-lr never acted). The default becomes 5 % of such a
    run, as it is of the default run (5 of 100 epochs), and the run says so in one line; a --warmup-epochs
    given (or a preset's) that is not below --epochs is refused in one line; a longer run keeps 5 epochs."""
    assert [config(capsys, "--epochs", e)["warmup_epochs"] for e in ("3", "5", "6", "100")] == [0.15, 0.25, 5.0, 5.0]
    args = resolve(parse_args(get_parser(), ["--epochs", "3", "--min-lr", "1e-5"]), get_parser(), 32)
    optimizer, scheduler, _, total, warmup = train.optimizer_and_schedule(args, torch.nn.Linear(2, 2), None, [None] * 20)
    assert (total, warmup) == (60, 3)  # 5 % of 3 epochs of 20 steps
    lrs = []
    for _ in range(total):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert max(lrs) == lrs[warmup] == pytest.approx(1e-3) and lrs[-1] < 2e-5  # the peak after the warmup, then the cosine
    for argv in (["--epochs", "3", "--warmup-epochs", "5"], ["--epochs", "2", "--warmup-epochs", "2"]):
        assert train.cli(argv + ["--print-config"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--warmup-epochs {argv[3]} is not below --epochs {argv[1]}" in err, err
    out = tmp_path / "run"
    assert train.cli(TINY + ["--data", "synthetic", "--epochs", "1", "--max-steps", "20", "--out-dir", str(out)]) == 0
    said = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("note: warmup")]
    assert said == ["note: warmup 0.05 epochs (1 of 20 steps), 5 % of the run: the default --warmup-epochs 5 is not below "
                    "--epochs 1, and would make the whole run warmup; give --warmup-epochs to choose another"], said


def test_explicit_flags_override_the_preset(capsys):
    base = config(capsys, "--preset", "c100-bvit-ti")
    cfg = config(capsys, "--preset", "c100-bvit-ti", "--lr", "0.5", "--embed-dim", "96", "--opt", "lamb")
    assert (cfg["lr"], cfg["embed_dim"], cfg["opt"]) == (0.5, 96, "lamb") and base["lr"] == 1e-3
    assert {k: v for k, v in cfg.items() if k not in ("lr", "embed_dim", "opt")} == \
           {k: v for k, v in base.items() if k not in ("lr", "embed_dim", "opt")}
    cfg = config(capsys, "--preset", "in1k-vit-s16", "--no-three-augment", "--no-bce")
    assert (cfg["three_augment"], cfg["bce"], cfg["opt"]) == (False, False, "adamw")
    assert config(capsys, "--preset", "in1k-vit-s16", "--drop-path", "0")["drop_path"] == 0.0


def test_unknown_preset_is_one_short_line_with_the_close_names_and_where_the_list_is(capsys):
    """An unknown --preset: one line (not the list of every preset) naming the close names when there are some and
    --list-presets, exit 2."""
    capsys.readouterr()
    assert train.cli(["--preset", "nosuch"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--preset nosuch" in lines[0] and "--list-presets" in lines[0] and len(lines[0]) < 200
    assert "did you mean" not in lines[0]
    assert train.cli(["--preset", "c100-mini-vitt"]) == 2
    line = capsys.readouterr().err.strip()
    assert "did you mean c100-mini-vit or " in line and "\n" not in line


def build(name, **over):
    """The preset's model as train.py builds it (CIFAR: 32 px, 100 classes)."""
    p = get_parser()
    args = resolve(parse_args(p, ["--preset", name]), p, 32)
    common = dict(img_size=32, patch_size=args.patch_size, num_classes=100, embed_dim=args.embed_dim,
                  depth=args.depth, num_heads=args.num_heads, mlp_ratio=args.mlp_ratio,
                  class_token=not args.gap, layer_scale=args.layer_scale, drop_path_rate=args.drop_path)
    return registry.MODELS[args.model].build(args, {**common, **over})


def test_matched_pairs_match():
    wide, narrow = build("c100-bvit-s"), build("c100-vit-narrow")
    assert wide.embed_dim > narrow.embed_dim and wide.num_blocks == 1 and narrow.num_blocks == 12
    assert abs(wide.num_params() / narrow.num_params() - 1) < 0.05  # parameter memory within 5%
    tied, untied = build("c100-bvit-ti"), build("c100-vit-ti")
    assert tied.flops_per_image() == untied.flops_per_image() and untied.num_params() > 5 * tied.num_params()
    solvers = [presets.PRESETS[f"c100-odevit-{s}"][1] for s in ("euler-12", "heun-6", "rk4-3")]
    assert [f["depth"] * {"euler": 1, "heun": 2, "rk4": 4}[f["solver"]] for f in solvers] == [12, 12, 12]
    assert {f["horizon"] for f in solvers} == {12.0}


@pytest.mark.parametrize("name", CIFAR_PRESETS)
def test_each_cifar_preset_trains_one_step(name, tmp_path):
    out = tmp_path / "out"
    data_dir = fake_cifar(tmp_path / "data")
    depth = ["--depth", str(presets.PRESETS[name][1].get("stages", 3))]  # stages must divide the depth
    src = []
    if "-fig2" in name:  # a Fig. 2 student: first its teacher
        assert train.cli(["--preset", "c100-mini-vit", "--data-dir", data_dir, "--out-dir", str(tmp_path / "vit"),
                          *TINY, *depth]) == 0
        src = ["--teacher", str(tmp_path / "vit")]
    if name.endswith(("-elastic", "-cont")):  # a continuation: first the fixed-depth run it starts from
        base = name.rsplit("-", 1)[0]
        assert train.cli(["--preset", base, "--data-dir", data_dir, "--out-dir", str(tmp_path / "src"), *TINY,
                          *depth, *src]) == 0
        src += ["--finetune", str(tmp_path / "src")]
    assert train.cli(["--preset", name, "--data-dir", data_dir, "--out-dir", str(out), *TINY, *depth, *src]) == 0
    saved = json.loads((out / "args.json").read_text())
    assert saved["preset"] == name and saved["embed_dim"] == 16
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


def test_a_preset_that_continues_a_run_names_what_is_missing_and_refuses_another_seeds_silent_source(tmp_path,
                                                                                                    monkeypatch, capsys):
    """c100-mini-revit-eN-elastic / -cont and c100-mini-loopvae-gan continue seed 0's run (a path in the preset).
    Before that run exists, one line says to train it first; with --seed 1 the preset would silently continue
    seed 0's run, so it is refused unless that seed's own run is given (as lab/reproduce_mini.sh does)."""
    monkeypatch.chdir(tmp_path)
    for name, flag, cli in (("c100-mini-revit-e4-elastic", "--finetune", train.cli),
                            ("c100-mini-loopvae-gan", "--stage2", train_loopvae.cli)):
        for argv, says in (([], "which does not exist yet: train it first"), (["--seed", "1"], "seed 0's run")):
            assert cli(["--preset", name, "--device", "cpu", *argv]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and says in err[0] and flag in err[0], err
    cfg = config(capsys, "--preset", "c100-mini-revit-e4-elastic", "--seed", "1", "--finetune", "runs/mini/revit-e4/seed1")
    assert cfg["finetune"] == "runs/mini/revit-e4/seed1"


def test_every_supervised_revit_preset_trains_at_fixed_depth_and_every_elastic_one_continues_a_fixed_depth_run(capsys):
    """reViT paper, Table 6 (the supervised recipe of Tables 1, 3, 5, 10) lists no depth dropout; A.2-A.3
    apply per-image depth dropout 0.3 to trained models afterwards. So: train.py's default is fixed depth, no
    supervised preset sets depth dropout, and each elastic arm (and its control) is a --finetune of the
    fixed-depth run of its own arm, with that arm's model."""
    assert config(capsys, "--model", "revit")["depth_dropout"] == 0.0
    revit = [n for n, (_, f) in presets.PRESETS.items() if f.get("model") == "revit" or "-revit-" in n]
    assert len(revit) > 20
    for name in revit:
        cfg = config(capsys, "--preset", name)
        if name.endswith(("-elastic", "-cont")):
            src = name.rsplit("-", 1)[0]  # c100-mini-revit-e4
            assert cfg["finetune"] == f"runs/mini/{src.split('c100-mini-')[1]}/seed0", name
            assert cfg["depth_dropout"] == (0.3 if name.endswith("-elastic") else 0.0), name
            base = presets.PRESETS[src][1]
            assert config(capsys, "--preset", src)["depth_dropout"] == 0.0 and base["experts"] == cfg["experts"]
            assert cfg["epochs"] < base["epochs"] and cfg["lr"] < base["lr"], name  # a continuation
        else:
            assert cfg["depth_dropout"] == 0.0 and not cfg["finetune"], name
    assert sorted(n for n in revit if n.endswith(("-elastic", "-cont"))) == sorted(
        f"c100-mini-{a}" for a in ELASTIC + FIG2 if a.endswith("-elastic") or a in ELASTIC)


def test_mini_protocol_pairs_are_matched_and_every_recurrent_arm_is_evaluated_from_half_to_4x(capsys):
    classifiers = [n for n in presets.PRESETS if n.startswith("c100-mini-") and "-loopvae-" not in n]  # (LoopVAE's:
    assert sorted(classifiers) == sorted(f"c100-mini-{a}" for a in MINI + UNTESTED + ELASTIC + INIT + FIG2 + SEARCH)  # test_loopvae_train.py)
    recipe = {k: v for k, v in presets.PRESETS["c100-mini-vit"][1].items() if k not in ("model", "eval_depths")}
    for arm in MINI + UNTESTED:  # one recipe: only model flags differ
        flags = presets.PRESETS[f"c100-mini-{arm}"][1]
        model_flags = {"model", "eval_depths", "embed_dim", "num_heads", "depth", "stages", "experts",
                       "depth_dropout", "recursions", "solver", "horizon", "routing", "lora_rank", "field"}
        assert {k: v for k, v in flags.items() if k not in model_flags} == \
               {k: v for k, v in recipe.items() if k not in model_flags}, arm
        # the mini recipe fixes every optimization flag, so a changed train.py default cannot move it
        assert {"lr", "min_lr", "weight_decay", "warmup_epochs", "clip_grad", "label_smoothing", "epochs",
                "batch_size", "init", "workers", "save_every"} <= set(flags)
        cfg = config(capsys, "--preset", f"c100-mini-{arm}")
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
    ode = [presets.PRESETS[f"c100-mini-odevit-{s}"][1] for s in ("euler", "heun", "rk4")]
    assert [f["depth"] * {"euler": 1, "heun": 2, "rk4": 4}[f["solver"]] for f in ode] == [8, 8, 8]
    assert {f["horizon"] for f in ode} == {8.0}
    r1, r2 = build("c100-mini-srvit-r1"), build("c100-mini-srvit-r2")
    assert r1.num_params() < r2.num_params() < 1.01 * r1.num_params()  # + the router only
    assert presets.PRESETS["c100-mini-bvit-ds"][1]["stages"] == 4
    for arm, base, change in [(f"revit-{r}", "revit-e4", {"routing": r}) for r in revit_moe.ROUTINGS[1:]] \
            + [("revit-lora", "revit-e1", {"lora_rank": 16})]:  # the reViT arm with one flag changed
        assert presets.PRESETS[f"c100-mini-{arm}"][1] == {**presets.PRESETS[f"c100-mini-{base}"][1], **change}, arm


def test_each_engagement_search_candidate_changes_one_thing_of_revit_e4_within_an_hour():
    """Issue 63: a supervised CPU recipe on which E=4's experts engage, searched within 60 CPU minutes per candidate."""
    base = presets.PRESETS["c100-mini-revit-e4"][1]
    for arm in SEARCH:
        flags = presets.PRESETS[f"c100-mini-{arm}"][1]
        changed = {k for k in set(flags) | set(base) if flags.get(k) != base.get(k)} - {"epochs", "warmup_epochs"}
        assert len(changed) <= 2 and (changed or flags["epochs"] != base["epochs"]), (arm, changed)  # (D and heads)
        assert float(presets.TIMES[f"c100-mini-{arm}"][0].removeprefix("est. ").split()[0]) <= 60, arm


def test_fig2_arms_are_two_students_of_one_teacher_differing_only_in_the_gate_then_one_elastic_stage(capsys, tmp_path,
                                                                                                   monkeypatch):
    """reViT paper, sec. 4.4 and A.2-A.3: both Fig. 2 variants are distilled from the same teacher's final features
    alone (task weight 0) at one fixed depth L divisible by 3, differ only in the gate (depth vs feature: smear), and
    then get the same elastic-depth stage (depth dropout 0.3) from their own run; every arm is evaluated at 2/3 L, L,
    4/3 L, 2 L (+ 1/2 L, 4 L). A preset naming seed 0's teacher refuses another seed unless its own is given."""
    L = presets.FIG2_L
    e4, smear = (presets.PRESETS[f"c100-mini-revit-{g}-fig2"][1] for g in ("e4", "smear"))
    assert {k: v for k, v in smear.items() if k != "routing"} == {k: v for k, v in e4.items() if k != "routing"}
    assert (e4["routing"], smear["routing"], e4["experts"], e4["depth"], L % 3) == ("depth", "smear", 4, L, 0)
    assert (e4["teacher"], e4["distill"], e4["task_weight"]) == ("runs/mini/vit/seed0", "feature", 0.0)
    assert {2 * L // 3, L, 4 * L // 3, 2 * L, L // 2, 4 * L} == set(e4["eval_depths"])
    for g in ("e4", "smear"):
        cfg = config(capsys, "--preset", f"c100-mini-revit-{g}-fig2-elastic")
        student = presets.PRESETS[f"c100-mini-revit-{g}-fig2"][1]
        assert cfg["finetune"] == f"runs/mini/revit-{g}-fig2/seed0" and cfg["depth_dropout"] == 0.3
        assert (cfg["teacher"], cfg["task_weight"], cfg["routing"]) == (student["teacher"], 0.0, student["routing"])
    with pytest.raises(ValueError, match="divisible by 3"):
        presets.fig2_arms("mini", presets.MINI, 8)
    monkeypatch.chdir(tmp_path)
    assert train.cli(["--preset", "c100-mini-revit-e4-fig2", "--device", "cpu", "--seed", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seed 0's run" in err[0] and "--teacher" in err[0], err  # not a silent seed-0 teacher


def test_the_init_arms_are_the_mini_recipe_on_an_8x8_grid_and_the_pytorch_base_differing_only_in_attention(capsys):
    """c100-mini-init-*: an untied ViT at patch 4 (8 x 8 tokens, at least the issue's grid), 3 heads of 32 (where
    the structured init puts every head on its offset), the PyTorch base on every arm, 2 epochs, estimated at
    most ~20 minutes a run (pair); otherwise the mini recipe. The three arms differ only in --init."""
    mini = presets.PRESETS["c100-mini-vit"][1]
    arms = {a: presets.PRESETS[f"c100-mini-{a}"][1] for a in INIT}
    changed = {"patch_size", "epochs", "warmup_epochs", "init_base", "init"}
    for arm, flags in arms.items():
        assert {k: v for k, v in flags.items() if k not in changed} == {k: v for k, v in mini.items() if k not in changed}
        cfg = config(capsys, "--preset", f"c100-mini-{arm}")
        assert (32 // cfg["patch_size"]) ** 2 >= 64 and cfg["embed_dim"] // cfg["num_heads"] == 32, arm
        assert (cfg["model"], cfg["init_base"], cfg["epochs"], cfg["drop_path"]) == ("vit", "pytorch", 2, 0.0), arm
        minutes = float(presets.TIMES[f"c100-mini-{arm}"][0].removeprefix("est. ").split()[0])
        assert minutes <= 20, arm  # (measured: 13-17 min, lab/results/init)
    assert [arms[a]["init"] for a in INIT] == ["default", "mimetic", "structured"]
    p = get_parser()
    m = registry.build_model(resolve(parse_args(p, ["--preset", "c100-mini-init-pytorch"]), p, 32), 32, 100)
    assert m.head.bias.any() and m.blocks[0].attn.qkv.bias.any()  # PyTorch's defaults reached the model


def test_the_batched_loader_is_never_chosen_when_an_augmentation_needs_the_per_image_loader():
    p = get_parser()
    for dev in ("cpu", "cuda"):
        device = torch.device(dev)
        plain = parse_args(p, ["--workers", "0"])
        assert data.batched_loader(plain, device)
        for flag in (["--randaug", "9"], ["--three-augment"], ["--cpu-loader"], ["--img-size", "64"]):
            assert not data.batched_loader(parse_args(p, ["--workers", "0", *flag]), device), (dev, flag)
        assert not data.batched_loader(parse_args(p, ["--workers", "0", "--data", "synthetic"]), device)
    assert not data.batched_loader(parse_args(p, ["--workers", "2"]), torch.device("cpu"))
    assert data.batched_loader(parse_args(p, ["--workers", "2"]), torch.device("cuda"))
    gpu = parse_args(p, ["--preset", "c100-gpu-bvit-ti"])
    assert data.batched_loader(gpu, torch.device("cuda")) and not (gpu.randaug or gpu.three_augment)


def fake_imagenet(root, classes=2, per_class=4):
    """An ImageFolder tree train/ and val/ of random 40x48 PNG images."""
    from PIL import Image
    rng = np.random.RandomState(0)
    for split in ("train", "val"):
        for c in range(classes):
            (root / split / f"n{c:08d}").mkdir(parents=True)
            for i in range(per_class):
                img = Image.fromarray(rng.randint(0, 256, (40, 48, 3), dtype=np.uint8))
                img.save(root / split / f"n{c:08d}" / f"{i}.png")
    return str(root)


def test_an_imagenet_preset_trains_one_step_with_table_6s_sampler_and_crop(tmp_path, monkeypatch):
    out, seen = tmp_path / "out", {}
    real = data.build_loaders
    monkeypatch.setattr(data, "build_loaders", lambda *a: seen.setdefault("loaders", real(*a)))
    rc = train.cli(["--preset", "in1k-revit-s16-e4", "--data-dir", fake_imagenet(tmp_path / "in"),
                    "--img-size", "32", "--out-dir", str(out), *TINY, "--batch-size", "4"])
    assert rc == 0
    saved = json.loads((out / "args.json").read_text())
    assert (saved["opt"], saved["bce"], saved["three_augment"], saved["experts"]) == ("adamw", True, True, 4)
    loader, val = seen["loaders"]  # --repeated-aug 3 and --eval-crop-ratio 1.0 reach the run's data
    assert loader.sampler.repeats == 3 and len(loader.sampler) == 8  # (8 images: under 256, kept whole)
    ds = val.dataset
    while isinstance(ds, torch.utils.data.Subset):  # (this rank's shard of --val-subset)
        ds = ds.dataset
    resize = [op for op in ds.transform.transforms if type(op).__name__ == "Resize"]
    assert [op.size for op in resize] == [[32]]  # int(32 / 1.0), not int(32 / 0.875)
    rec = json.loads((out / "log.jsonl").read_text().splitlines()[0])
    assert rec["step"] == 1 and math.isfinite(rec["train_loss"]) and "bce_loss" in rec


def test_deit3_flags_reach_the_optimizer_the_loss_and_the_data(tmp_path, monkeypatch):
    seen = {}

    class Spy(bvit.BViT):
        def forward(self, x, targets=None, depth=None):
            seen.setdefault("targets", targets)  # the first training batch
            return super().forward(x, targets, depth)

    monkeypatch.setitem(registry.MODELS, "bvit", registry.Model(lambda args, common: seen.update(common) or Spy(**common)))
    real_lamb, real_data = optim.Lamb, data.build_datasets
    monkeypatch.setattr(optim, "Lamb", lambda *a, **k: seen.update(lamb=True) or real_lamb(*a, **k))
    monkeypatch.setattr(data, "build_datasets",
                        lambda *a, **k: seen.update(three_aug=k["three_aug"]) or real_data(*a, **k))
    rc = train.cli(["--model", "bvit", "--opt", "lamb", "--bce", "--three-augment", "--mixup", "0.8",
                    "--label-smoothing", "0", "--data-dir", fake_cifar(tmp_path / "data"),
                    "--out-dir", str(tmp_path / "o"), *TINY])
    assert rc == 0 and seen["loss"] == "bce" and seen["lamb"] and seen["three_aug"] is True
    t = seen["targets"]  # MixUp + --bce: every class in the mix is a positive (DeiT's code)
    assert t.shape == (8, 100) and set(t.unique().tolist()) == {0.0, 1.0} and t.sum(1).max() == 2


def test_color_jitter_is_3_augments_and_the_new_flags_refuse_what_they_cannot_do(tmp_path, capsys):
    p = get_parser()
    for flags, want in (([], (0.7, 1.3)), (["--color-jitter", "0.1"], (0.9, 1.1)), (["--color-jitter", "0"], None)):
        args = parse_args(p, ["--three-augment", "--data-dir", fake_cifar(tmp_path / f"d{len(flags)}"), *flags])
        ops = train.load_data(args, p)[1].transform.transforms  # the run's training pipeline
        jitter = [(op.brightness, op.contrast, op.saturation, op.hue) for op in ops if isinstance(op, v2.ColorJitter)]
        assert jitter == ([(pytest.approx(want),) * 3 + (None,)] if want else []), flags  # no hue, as DeiT III
    for argv, says in ((["--color-jitter", "0.2"], "no --three-augment"),
                       (["--warmup-lr", "0.1"], "--warmup-lr 0.1: above --lr 0.001"),
                       (["--warmup-lr", "1e-6", "--warmup-epochs", "0"], "--warmup-epochs 0 has no warmup")):
        capsys.readouterr()
        assert train.cli([*argv, "--print-config"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and argv[0] in err[0] and says in err[0], err


def test_random_erasing_replaces_one_rectangle_of_the_normalized_image_by_unit_noise(tmp_path):
    """--reprob P (DeiT's random erasing, timm's pixel mode): after the normalization, one rectangle of 2-33 % of
    the image becomes N(0, 1) noise, the rest is the normalized image; P = 0 leaves the pipeline as it was."""
    img = torch.full((3, 32, 32), 200, dtype=torch.uint8)  # normalized: (200/255 - 0.5) / 0.25 = 1.137 everywhere
    mean, std = (0.5,) * 3, (0.25,) * 3
    plain = data.build_transform(True, 32, mean, std, "cifar100").transforms
    assert [type(op) for op in data.build_transform(True, 32, mean, std, "cifar100", reprob=0.0).transforms] == \
        [type(op) for op in plain]
    t = data.build_transform(True, 32, mean, std, "cifar100", reprob=0.999)
    assert type(t.transforms[-1]) is v2.RandomErasing and type(t.transforms[-2]) is v2.Normalize
    torch.manual_seed(0)
    noise, fractions = [], []
    for _ in range(50):
        x = t(img)
        kept = torch.isclose(x, torch.tensor((200 / 255 - 0.5) / 0.25))
        padded = (x == (0 - 0.5) / 0.25).all(0)  # the crop's zero padding, normalized
        erased = ~kept & ~padded
        if erased.any():
            rows, cols = erased.any(0).any(1).nonzero(), erased.any(0).any(0).nonzero()
            box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
            fractions.append(box.item() / 32 ** 2)
            noise.append(x[erased])
    z = torch.cat(noise)
    assert len(fractions) >= 45 and 0.02 <= min(fractions) and max(fractions) <= 0.34, fractions
    assert abs(z.mean()) < 0.05 and abs(z.std() - 1) < 0.05  # unit noise, not the image's normalized value
    assert not data.batched_loader(parse_args(get_parser(), ["--reprob", "0.25", "--workers", "0"]),
                                   torch.device("cpu"))  # a per-image op: the per-image loader
    assert presets.DEIT["reprob"] == 0.25 and "reprob" not in presets.TABLE6  # Table 6: random erasing 0


def lamb_by_hand(p, grads, lr, wd, b1=0.9, b2=0.999, eps=1e-6, adapt=True):
    """The LAMB update written out with Python floats, one step per gradient."""
    p, m, v = list(p), [0.0] * len(p), [0.0] * len(p)
    for t, g in enumerate(grads, 1):
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
        u = [mi / (1 - b1 ** t) / (math.sqrt(vi / (1 - b2 ** t)) + eps) + wd * pi
             for mi, vi, pi in zip(m, v, p)]
        pn, un = math.sqrt(sum(x * x for x in p)), math.sqrt(sum(x * x for x in u))
        trust = pn / un if adapt and pn > 0 and un > 0 else 1.0
        p = [pi - lr * trust * ui for pi, ui in zip(p, u)]
    return p


@pytest.mark.parametrize("always_adapt", [False, True])
def test_lamb_follows_its_update_formula_for_two_steps(always_adapt):
    w0, b0, z0 = [0.5, -1.0, 2.0], [0.3, -0.2], [0.0, 0.0]  # decayed, not decayed, zero (trust 1)
    gw, gb, gz = [[0.1, 0.4, -0.3], [-0.2, 0.1, 0.5]], [[1.0, -2.0], [0.5, 0.5]], [[0.3, -0.1], [0.2, 0.2]]
    w, b, z = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (w0, b0, z0))
    opt = optim.Lamb([{"params": [w, z], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}],
                     lr=0.05, always_adapt=always_adapt)
    for step in range(2):
        for prm, g in ((w, gw), (b, gb), (z, gz)):
            prm.grad = torch.tensor(g[step], dtype=torch.float64)
        opt.step()
    assert torch.allclose(w, torch.tensor(lamb_by_hand(w0, gw, 0.05, 0.1), dtype=torch.float64), atol=1e-12)
    assert torch.allclose(z, torch.tensor(lamb_by_hand(z0, gz, 0.05, 0.1), dtype=torch.float64), atol=1e-12)
    want_b = lamb_by_hand(b0, gb, 0.05, 0.0, adapt=always_adapt)  # wd = 0: trust 1 unless always_adapt
    assert torch.allclose(b, torch.tensor(want_b, dtype=torch.float64), atol=1e-12)
    other = lamb_by_hand(b0, gb, 0.05, 0.0, adapt=not always_adapt)
    assert not torch.allclose(torch.tensor(want_b), torch.tensor(other))  # the two cases do differ


def bce_by_hand(logits, probs):
    s = torch.sigmoid(logits.double())
    return -(probs * s.log() + (1 - probs) * (1 - s).log()).mean()  # mean over B x classes


MODEL_FILES = {"bvit": lambda **k: bvit.BViT(num_blocks=2, stages=2, **k),
               "revit": lambda **k: revit.ReViT(experts=1, depth_dropout=0.0, **k),
               "odevit": lambda **k: odevit.ODEViT(**k),
               "srvit": lambda **k: srvit.SRViT(recursions=2, **k)}


@pytest.mark.parametrize("name", list(MODEL_FILES))
def test_bce_loss_is_the_binary_cross_entropy_formula(name):
    torch.manual_seed(0)
    kw = dict(img_size=8, patch_size=4, num_classes=5, embed_dim=16, depth=2, num_heads=2)
    model = MODEL_FILES[name](loss="bce", **kw).eval()
    ce_model = MODEL_FILES[name](**kw).eval()
    ce_model.load_state_dict(model.state_dict())
    x, y = torch.randn(3, 3, 8, 8), torch.tensor([0, 4, 2])
    soft = torch.softmax(torch.randn(3, 5), -1)

    def final_loss(m, loss):  # bvit with 2 stages: the last stage's loss is that of the returned logits
        return m.aux["stage1_loss"] if name == "bvit" else loss

    for targets, probs in ((y, F.one_hot(y, 5).double()), (soft, soft.double())):
        logits, loss = model(x, targets)
        assert torch.allclose(final_loss(model, loss).double(), bce_by_hand(logits, probs), atol=1e-6)
        logits, loss = ce_model(x, targets)  # the default stays cross-entropy
        assert torch.allclose(final_loss(ce_model, loss), F.cross_entropy(logits, targets), atol=1e-6)
    if name == "bvit":  # the stages are averaged whatever the loss
        assert torch.allclose(model(x, y)[1], torch.stack(list(model.aux.values())).mean(), atol=1e-6)
    with pytest.raises(ValueError, match="loss"):
        MODEL_FILES[name](loss="mse", **kw)


def test_every_presets_flags_line_pastes_back_to_the_same_run(capsys):
    """--list-presets NAME prints a `flags:` line; pasted as a command line (without --preset) it resolves to the
    same run as --preset NAME (--print-config), for every preset: no `--randaug 0.0` an integer flag refuses, no
    `--bce False` or `--eval-depths None` the parser cannot read."""
    for name, (_, given) in presets.PRESETS.items():
        cli = train_loopvae.cli if given["model"] == "loopvae" else train.cli  # (LoopVAE's: its own script's)
        assert cli(["--list-presets", name]) == 0
        line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("flags: "))
        pasted = config(capsys, *shlex.split(line[len("flags: "):]), cli=cli)
        preset = config(capsys, "--preset", name, cli=cli)
        assert {k: v for k, v in pasted.items() if k != "preset"} == {k: v for k, v in preset.items() if k != "preset"}, name
