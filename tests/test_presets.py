"""Reproduction presets (issue 8): every preset resolves, explicit flags override it, the CIFAR protocol
arms train one step, the matched pairs are matched, and LAMB and the binary cross-entropy follow
their formulas. (The lab's study arms: lab/tests/test_arms.py.) CPU only, in-process `train.cli` calls on a
tiny fake CIFAR-100 folder."""
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
CIFAR_PRESETS = [n for n in presets.PRESETS if n.startswith("c100-")]


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
    assert "CPU-2 (2 cores, AMD EPYC)" in header and "one H200" in header and "est. = estimated" in header  # how timed
    rows = lines[head + 1:]
    assert [ln.split()[0] for ln in rows] == [n for n, (_, f) in presets.PRESETS.items() if f["model"] != "loopvae"] \
        and 30 <= len(rows) <= 45  # (issue 78: <= 45 presets; LoopVAE's: train_loopvae.py --list-presets)
    assert rows[0].startswith("cpu-first-bvit ") and max(len(ln) for ln in lines) <= 120
    for line, (name, (what, flags)) in zip(rows, presets.PRESETS.items()):  # name, model, params, times, what
        assert line.split()[1] == flags["model"] and " M  " in line, line
        assert f"  {presets.TIMES[name][0]}  " in line and what[:20] in line, line
    by_name = dict(zip(presets.PRESETS, rows))
    # figures as measured (README's first run) or estimated (docs/presets.md's GPU-hours)
    assert "  3.2 min  " in by_name["cpu-first-bvit"] and "  est. 32 h  " in by_name["in1k-revit-b16-e4"]
    assert not any(n.startswith(("c100-mini-", "c100-gpu-")) for n in presets.PRESETS)  # the lab's arms (lab/arms.py)
    assert train.cli(["--list-presets", "cpu"]) == 0  # the presets timed on a CPU: the laptop's choices
    table = lambda out: [ln for ln in out.splitlines()[out.splitlines().index(next(
        ln for ln in out.splitlines() if ln.startswith("NAME "))) + 1:]]
    cpu = [ln.split()[0] for ln in table(capsys.readouterr().out)]
    assert cpu[0] == "cpu-first-bvit" and all(presets.TIMES[n][0] != "?" for n in cpu) and "in1k-vit-b16" not in cpu
    assert train_loopvae.cli(["--list-presets", "loopvae"]) == 0  # LoopVAE's: its own script's
    listed = [ln.split()[0] for ln in table(capsys.readouterr().out)]
    assert listed == [n for n in presets.PRESETS if "loopvae" in n] and len(listed) >= 2  # (its CPU arms: the lab's)
    assert train.cli(["--list-presets", "in256-loopvae-cnn-gan"]) == 2  # train.py names the script
    assert "python train_loopvae.py --list-presets in256-loopvae-cnn-gan" in capsys.readouterr().err
    assert train.cli(["--list-presets", "in1k-revit-b16-e4"]) == 0  # one preset in full
    full = capsys.readouterr().out
    assert "paper: ImageNet-1k top-1 83.0 (reViT Table 5, Table 1)" in full and "--experts 4" in full and "--opt adamw" in full
    assert train.cli(["--list-presets", "nosuch"]) == 2  # bad input: one line, exit 2
    assert "--list-presets 'nosuch': no preset matches" in capsys.readouterr().err


def test_the_first_preset_is_readmes_first_command(capsys):
    argv = "--model bvit --data cifar100 --embed-dim 128 --num-heads 4 --patch-size 4 --depth 6 --batch-size 64 " \
        "--max-steps 300 --device cpu".split()
    assert {**config(capsys, "--preset", "cpu-first-bvit"), "preset": None} == config(capsys, *argv)


def test_help_names_the_cpu_sized_preset_and_a_cpu_sized_run_does_not_recommend_itself(capsys):
    """A run on a CPU estimated at days names the model's CPU-sized preset (bvit: cpu-first-bvit), unless it is that
    preset, or a --config file's recipe (the lab's CPU-scale arms run so); a model without one gets no hint."""
    assert "cpu-first-bvit" in " ".join(get_parser().format_help().split())
    pace, steps = [(1, 0.0), (11, 100.0)], 100_000  # 10 s per step: days on a CPU
    says = "--preset cpu-first-bvit is this model's CPU-sized run (3.2 min on 2 cores as measured"
    for preset, config_file, model, named in [(None, None, "bvit", True), ("c100-bvit-ti", None, "bvit", True),
                                              ("cpu-first-bvit", None, "bvit", False), (None, "arm.json", "bvit", False),
                                              (None, None, "revit", False)]:
        args = SimpleNamespace(preset=preset, config=config_file, model=model)
        line = monitor.estimate_line(args, torch.device("cpu"), pace, steps)
        assert (says in line) == named and " d " in line, (preset, config_file, model, line)
    assert [m for m, r in registry.MODELS.items() if r.cpu_preset] == ["bvit"]


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
    for vit, bv in (("c100-vit-ti", "c100-bvit-ti"),):
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
    assert train.cli(["--preset", "c100-bvit-tii"]) == 2
    line = capsys.readouterr().err.strip()
    assert "did you mean c100-bvit-ti or " in line and "\n" not in line


def build(name, argv=None, **over):
    """The preset's model as train.py builds it (CIFAR: 32 px, 100 classes); argv: the flags that name the
    recipe, if not --preset NAME (the lab's arms: --config FILE)."""
    p = get_parser()
    args = resolve(parse_args(p, argv or ["--preset", name]), p, 32)
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
    assert train.cli(["--preset", name, "--data-dir", data_dir, "--out-dir", str(out), *TINY, *depth]) == 0
    saved = json.loads((out / "args.json").read_text())
    assert saved["preset"] == name and saved["embed_dim"] == 16
    assert saved["randaug"] == 9.0
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert recs[0]["step"] == 1 and math.isfinite(recs[0]["train_loss"])
    assert [r["depth"] for r in recs[1:]] == (saved["eval_depths"] or [])  # beyond the horizon



def test_a_preset_that_continues_a_run_names_what_is_missing(tmp_path, monkeypatch, capsys):
    """in256-loopvae-cnn-gan continues the in256-loopvae-cnn run (a path in the preset): before that run exists,
    one line says to train it first; given another, it continues that one."""
    monkeypatch.chdir(tmp_path)
    assert train_loopvae.cli(["--preset", "in256-loopvae-cnn-gan", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "which does not exist yet: train it first" in err[0] and "--stage2" in err[0], err



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
    gpu = parse_args(p, ["--preset", "c100-bvit-ti", "--randaug", "0"])  # (the lab's c100-gpu-* arms: bench.GPU_BVIT)
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
