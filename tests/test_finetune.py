"""Transfer (issue 12): --finetune from timm / rvits weights with the head and position embedding
adapted, --eval-only at another --img-size, and --grad-checkpoint through train.py.

CPU only; tiny models. The ImageFolder runs use ../shared/data/imagenet-sample (20 classes of 64 px
Tiny-ImageNet images) and skip without it.
"""
import json
import os

import numpy as np
import pytest
import torch

import bvit
from training import weights
from training.flags import LINKED
from training.registry import arch_flags
import train
from test_train import TINY, fake_cifar

pytestmark = pytest.mark.slow  # (train.py runs: README's quick tier, -m "not slow", leaves them out)

from conftest import SAMPLE  # noqa: E402  ($RVITS_DATA/imagenet-sample, else ../shared/data's)
needs_sample = pytest.mark.skipif(not os.path.isdir(SAMPLE), reason=f"{SAMPLE} not present (set RVITS_DATA)")
FOLDER = ["--data", "imagenet", "--data-dir", SAMPLE, "--img-size", "64", "--device", "cpu", "--workers", "0",
          "--batch-size", "8", "--val-subset", "16", "--eval-batch-size", "16", "--max-steps", "1"]
VIT = dict(embed_dim=32, depth=2, num_heads=2)


def timm_file(tmp_path, **kw):
    """A timm VisionTransformer (1000 classes, 32 px, patch 8: a 4x4 grid) saved as a state dict."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(1)
    ref = timm.models.vision_transformer.VisionTransformer(img_size=32, patch_size=8, **{**VIT, **kw})
    path = str(tmp_path / "timm_vit.pth")
    torch.save(ref.state_dict(), path)
    return path, ref.state_dict()


def test_timm_weights_load_exactly_with_a_fresh_head_and_a_resized_pos_embed(tmp_path):
    path, ref = timm_file(tmp_path)
    torch.manual_seed(0)
    m = bvit.BViT(img_size=64, patch_size=8, num_classes=20, num_blocks=2, **VIT)
    head = m.head.weight.clone()
    report = weights.finetune_weights(path, m)
    assert "head re-initialized (1000 -> 20 classes)" in report and "4x4 -> 8x8" in report, report
    own = m.state_dict()
    assert torch.equal(own["head.weight"], head)
    assert torch.equal(own["pos_embed"], bvit.resample_pos_embed(ref["pos_embed"], (8, 8), 1))
    assert torch.equal(own["pos_embed"][:, 0], ref["pos_embed"][:, 0])  # class-token row as it was
    loaded = [k for k in ref if not k.startswith(("head.", "pos_embed"))]
    assert len(loaded) > 20 and all(torch.equal(own[k], ref[k]) for k in loaded)


def test_a_deit3_state_dict_without_a_class_token_position_row_is_the_same_function(tmp_path):
    """timm's DeiT III models (deit3_*) use no_embed_class=True: pos_embed holds the patch rows only
    and the class token gets no position embedding. With a zero row for it, our ViT with LayerScale
    computes timm's logits; at another grid the zero row stays and the patch rows are resized."""
    path, ref = timm_file(tmp_path, no_embed_class=True, init_values=0.1, num_classes=10)
    timm = pytest.importorskip("timm")
    torch.manual_seed(1)
    deit3 = timm.models.vision_transformer.VisionTransformer(img_size=32, patch_size=8, no_embed_class=True,
                                                             init_values=0.1, num_classes=10, **VIT).eval()
    assert all(torch.equal(v, ref[k]) for k, v in deit3.state_dict().items()) and ref["pos_embed"].shape[1] == 16
    m = bvit.BViT(img_size=32, patch_size=8, num_classes=10, num_blocks=2, layer_scale=0.1, **VIT).eval()
    report = weights.finetune_weights(path, m)
    assert "zero class-token row" in report and "resized" not in report, report
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(m(x), deit3(x), atol=1e-5)
    big = bvit.BViT(img_size=64, patch_size=8, num_classes=10, num_blocks=2, layer_scale=0.1, **VIT)
    assert "4x4 -> 8x8" in weights.finetune_weights(path, big)
    assert not big.pos_embed[0, 0].any()


def test_an_mae_pretraining_checkpoint_loads_its_encoder(tmp_path):
    path, ref = timm_file(tmp_path)
    mae = {**ref, "mask_token": torch.zeros(1, 1, 32), "decoder_embed.weight": torch.zeros(16, 32),
           "decoder_pred.weight": torch.zeros(48, 16)}
    torch.save({"model": mae}, tmp_path / "mae.pth")
    m = bvit.BViT(img_size=32, patch_size=8, num_classes=1000, num_blocks=2, **VIT)
    report = weights.finetune_weights(str(tmp_path / "mae.pth"), m)
    assert "MAE decoder and mask token dropped (3 tensors)" in report
    assert all(torch.equal(v, ref[k]) for k, v in m.state_dict().items())


def test_same_grid_and_classes_is_an_exact_copy(tmp_path):
    path, ref = timm_file(tmp_path)
    m = bvit.BViT(img_size=32, patch_size=8, num_classes=1000, num_blocks=2, **VIT)
    assert weights.finetune_weights(path, m).endswith("nothing adapted")
    assert all(torch.equal(v, ref[k]) for k, v in m.state_dict().items())


@needs_sample
def test_timm_state_dict_fine_tunes_into_vit_on_the_20_class_folder(tmp_path, capsys):
    path, ref = timm_file(tmp_path)
    out = tmp_path / "ft"
    rc = train.cli(FOLDER + ["--model", "vit", "--patch-size", "8", "--embed-dim", "32", "--depth", "2",
                             "--num-heads", "2", "--finetune", path, "--out-dir", str(out)])
    said = capsys.readouterr()
    assert rc == 0, said.err
    assert "head re-initialized (1000 -> 20 classes)" in said.out and "4x4 -> 8x8" in said.out
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["model"]["head.weight"].shape == (20, 32) and ck["step"] == 1  # fresh optimizer, schedule
    assert ck["model"]["pos_embed"].shape == (1, 65, 32)


@needs_sample
def test_rvits_cifar_checkpoint_fine_tunes_at_64px_with_a_16x16_grid(tmp_path, capsys):
    cifar = fake_cifar(tmp_path / "data")
    src = tmp_path / "c100"
    assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1", "--gap",
                             "--out-dir", str(src)]) == 0
    out = tmp_path / "ft"
    # no model flags: the architecture (patch 4, D=32, depth 2, GAP) comes from the checkpoint
    rc = train.cli(FOLDER + ["--finetune", str(src / "ckpt.pt"), "--out-dir", str(out)])
    said = capsys.readouterr()
    assert rc == 0, said.err
    assert "8x8 -> 16x16" in said.out and "100 -> 20 classes" in said.out
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["model"]["pos_embed"].shape == (1, 256, 32) and ck["args"]["gap"] and ck["args"]["patch_size"] == 4


@pytest.fixture
def cifar_ckpt(tmp_path):
    cifar = fake_cifar(tmp_path / "data")
    out = tmp_path / "vit"
    assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--model", "vit", "--max-steps", "1",
                             "--out-dir", str(out)]) == 0
    return cifar, str(out / "ckpt.pt")


def test_bad_finetune_files_and_mismatches_are_one_line_exit_2(tmp_path, cifar_ckpt, capsys):
    cifar, ckpt = cifar_ckpt
    d = TINY + ["--data", "cifar100", "--data-dir", cifar, "--out-dir", str(tmp_path / "o")]
    not_weights, evil = str(tmp_path / "list.pt"), str(tmp_path / "evil.pt")
    torch.save([1, 2, 3], not_weights)
    ck = torch.load(ckpt, weights_only=True)
    torch.save({"model": ck["model"], "payload": np.random.RandomState(0)}, evil)  # an object: code could run
    cases = {
        "no such file": (["--finetune", str(tmp_path / "nowhere.pt")], "no such file"),
        "not a state dict": (["--finetune", not_weights], "not a state dict"),
        "pickled object": (["--finetune", evil], "refused"),
        "other width": (["--model", "vit", "--embed-dim", "64", "--finetune", ckpt], "in the file"),
        "untied model of other depth": (["--model", "vit", "--depth", "3", "--finetune", ckpt],
                                        "blocks.2.norm1.weight is absent in the file"),
    }
    capsys.readouterr()
    failures = []
    for name, (flags, says) in cases.items():
        rc = train.cli(d + flags)
        lines = capsys.readouterr().err.strip().splitlines()
        if rc != 2 or len(lines) != 1 or says not in lines[0]:
            failures.append(f"{name}: rc={rc} stderr={lines[-3:]}")
    assert not failures, "\n".join(failures)


def test_recurrent_models_fine_tune_from_their_own_checkpoints(tmp_path, capsys):
    cifar = fake_cifar(tmp_path / "data")
    for model in ("bvit", "revit", "srvit", "odevit"):
        src, out = tmp_path / model, tmp_path / f"{model}_ft"
        assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--model", model, "--max-steps",
                                 "1", "--out-dir", str(src)]) == 0
        assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--finetune", str(src / "ckpt.pt"),
                                 "--max-steps", "1", "--out-dir", str(out)]) == 0, model
        said = capsys.readouterr().out
        assert "nothing adapted" in said and json.load(open(out / "args.json"))["model"] == model


def test_given_model_flags_win_over_the_finetuned_checkpoints(tmp_path, capsys):
    # --routing lory --finetune <a smear run>: the routing given, the checkpoint's weights (a preset's flags count as
    # given: flags.parse_args)
    cifar = fake_cifar(tmp_path / "data")
    small = ["--data-dir", cifar, "--device", "cpu", "--batch-size", "8", "--max-steps", "1", "--val-subset", "16",
             "--eval-batch-size", "16", "--eval-depths", "8"]
    small += ["--model", "revit", "--experts", "4", "--embed-dim", "32", "--num-heads", "2", "--depth", "8",
              "--patch-size", "8", "--workers", "0"]
    assert train.cli([*small, "--routing", "smear", "--out-dir", str(tmp_path / "smear")]) == 0
    assert train.cli([*small, "--routing", "lory", "--finetune", str(tmp_path / "smear" / "ckpt.pt"),
                      "--out-dir", str(tmp_path / "lory")]) == 0, capsys.readouterr().err
    assert json.load(open(tmp_path / "lory" / "args.json"))["routing"] == "lory"
    assert "nothing adapted" in capsys.readouterr().out


def test_eval_only_at_another_img_size_interpolates_the_position_embedding(tmp_path, capsys):
    data = ["--data", "synthetic", "--device", "cpu", "--workers", "0", "--val-subset", "16"]
    src = tmp_path / "s"
    assert train.cli(TINY + data + ["--img-size", "16", "--max-steps", "1", "--out-dir", str(src)]) == 0
    rc = train.cli(data + ["--eval-only", "--resume", str(src / "ckpt.pt"), "--img-size", "32",
                           "--eval-depths", "2", "--out-dir", str(tmp_path / "e")])
    assert rc == 0, capsys.readouterr().err
    assert json.load(open(tmp_path / "e" / "depth_eval.json"))["results"][0]["depth"] == 2
    default = tmp_path / "d"  # trained without --img-size (saved as None): 32 px
    assert train.cli(TINY + data + ["--max-steps", "1", "--out-dir", str(default)]) == 0
    assert train.cli(data + ["--eval-only", "--resume", str(default / "ckpt.pt"), "--img-size", "48",
                             "--eval-depths", "2", "--out-dir", str(tmp_path / "e48")]) == 0


def test_grad_checkpoint_gives_the_same_weights_through_train_py(tmp_path):
    cifar = fake_cifar(tmp_path / "data")
    job = TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "3", "--drop-path", "0.1"]
    for model in ("vit", "revit"):
        a, b = tmp_path / f"{model}_plain", tmp_path / f"{model}_ckpt"
        assert train.cli(job + ["--model", model, "--out-dir", str(a)]) == 0
        assert train.cli(job + ["--model", model, "--grad-checkpoint", "--out-dir", str(b)]) == 0
        wa = torch.load(a / "ckpt.pt", weights_only=True)["model"]
        wb = torch.load(b / "ckpt.pt", weights_only=True)["model"]
        assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa), model


def test_cifar_at_another_img_size_is_resized_for_fine_tuning(tmp_path):
    import data
    train_set, val_set, classes, size = data.build_datasets("cifar100", fake_cifar(tmp_path / "d"), img_size=64)
    assert size == 64 and train_set[0][0].shape == val_set[0][0].shape == (3, 64, 64)
    small = data.build_datasets("cifar100", str(tmp_path / "d"))[1][0][0]
    down = torch.nn.functional.avg_pool2d(val_set[0][0][None], 2)[0]  # the same image, bicubically 2x
    assert torch.corrcoef(torch.stack([down.flatten(), small.flatten()]))[0, 1] > 0.95


# ----------------------------------------------------------------------------- checkpoints from other code (issue 24)
def test_a_deit_checkpoint_with_its_argparse_namespace_loads_and_other_globals_are_refused(tmp_path, capsys):
    import argparse
    import datetime
    path, ref = timm_file(tmp_path)
    deit = tmp_path / "deit.pth"  # DeiT's / MAE's main.py: {"model", "optimizer", "epoch", "args": Namespace}
    torch.save({"model": ref, "epoch": 299, "args": argparse.Namespace(model="deit_tiny", lr=5e-4)}, deit)
    m = bvit.BViT(img_size=32, patch_size=8, num_classes=1000, num_blocks=2, **VIT)
    assert "nothing adapted" in weights.finetune_weights(str(deit), m)
    other = tmp_path / "other.pth"
    torch.save({"model": ref, "args": datetime.date(2020, 1, 1)}, other)  # any other class: refused by name
    with pytest.raises(weights.Fail, match="refused, it references datetime.date"):
        weights.finetune_weights(str(other), m)


@pytest.mark.parametrize("prefix", ["_orig_mod.", "module._orig_mod.", "_orig_mod.module."])
def test_a_state_dict_of_a_compiled_or_ddp_model_loads(tmp_path, prefix):
    path, ref = timm_file(tmp_path)
    torch.save({prefix + k: v for k, v in ref.items()}, tmp_path / "compiled.pth")
    m = bvit.BViT(img_size=32, patch_size=8, num_classes=1000, num_blocks=2, **VIT)
    assert "nothing adapted" in weights.finetune_weights(str(tmp_path / "compiled.pth"), m)
    assert all(torch.equal(v, ref[k]) for k, v in m.state_dict().items())


def test_a_run_folder_means_its_checkpoint_for_every_flag_that_reads_one(tmp_path, cifar_ckpt, capsys):
    cifar, ckpt = cifar_ckpt
    run = os.path.dirname(ckpt)
    d = TINY + ["--data", "cifar100", "--data-dir", cifar]
    assert train.cli(d + ["--model", "vit", "--finetune", run, "--max-steps", "1", "--out-dir", str(tmp_path / "f")]) == 0
    assert train.cli(d + ["--max-steps", "1", "--teacher", run, "--out-dir", str(tmp_path / "t")]) == 0
    assert train.cli(d + ["--eval-only", "--resume", run, "--eval-depths", "2", "--out-dir", str(tmp_path / "e")]) == 0
    assert train.cli(d + ["--resume", str(tmp_path / "f"), "--max-steps", "2"]) == 0  # continues in its folder
    assert torch.load(tmp_path / "f" / "ckpt.pt", weights_only=True)["step"] == 2
    capsys.readouterr()
    empty = tmp_path / "empty"
    empty.mkdir()
    for flag in ("--finetune", "--teacher", "--resume"):
        assert train.cli(d + [flag, str(empty), "--out-dir", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{flag} {empty}: a folder without ckpt.pt" in err[0], err


# ----------------------------------------------------------------------------- which flag wins (issue 24)
# Every model's architecture and depth flags: a value the checkpoint's run did not use, given on the
# command line with --finetune, must be the value the run takes (docs/cluster.md "Resuming and failures").
SAVED = dict(embed_dim=32, num_heads=2, depth=2, patch_size=4, mlp_ratio=4.0, gap=False, layer_scale=None,
             num_blocks=None, experts=4, recursions=2, solver="euler", ode_steps=None,
             horizon=None, field="subtracted", extend="time", routing="depth", lora_rank=0, size=None)
GIVEN = {"bvit": {"embed_dim": 48, "num_heads": 4, "depth": 3, "patch_size": 8, "mlp_ratio": 2.0, "gap": True,
                  "layer_scale": 0.1, "num_blocks": 2},
         "vit": {"depth": 3, "embed_dim": 48, "num_heads": 4},
         "revit": {"experts": 2, "depth": 5, "routing": "smear", "embed_dim": 48},
         "srvit": {"recursions": 3, "depth": 1},
         "odevit": {"depth": 4, "solver": "rk4", "horizon": 6.0, "field": "blackbox", "extend": "refine"}}


def flag_args(k, v):
    name = "--" + k.replace("_", "-")
    if isinstance(v, bool):
        return [name] if v else []
    return [name, str(v)]


def test_a_flag_given_with_finetune_is_the_flag_the_run_takes_for_every_model(tmp_path, capsys):
    failures = []
    for model, given in GIVEN.items():
        saved = dict(SAVED, model=model, ode_steps=2 if model == "odevit" else None, data="cifar100", img_size=None)
        path = tmp_path / f"{model}.pt"
        torch.save({"model": {"head.weight": torch.zeros(100, 32)}, "args": saved}, path)
        for k, v in given.items():
            capsys.readouterr()
            train.cli(["--finetune", str(path), "--print-config", *flag_args(k, v)])
            cfg = json.loads(capsys.readouterr().out)
            if cfg[k] != v:
                failures.append(f"{model} --{k} {v}: the run takes {cfg[k]}")
            others = [o for o in saved if o not in given and o in arch_flags() and o != "size"
                      and o not in LINKED.get(k, ())]
            wrong = [o for o in others if cfg[o] != saved[o]]
            if wrong:
                failures.append(f"{model} --{k}: {wrong} not taken from the checkpoint")
    assert not failures, "\n".join(failures)
    # linked flags: --size sets width, heads and depth; odevit's --depth is its number of steps
    capsys.readouterr()
    train.cli(["--finetune", str(tmp_path / "bvit.pt"), "--print-config", "--size", "s"])
    cfg = json.loads(capsys.readouterr().out)
    assert (cfg["embed_dim"], cfg["num_heads"], cfg["depth"]) == (384, 6, 12)
    saved = dict(SAVED, model="odevit", ode_steps=2)
    torch.save({"model": {}, "args": saved}, tmp_path / "ode.pt")
    for flags, want in ((["--depth", "4"], (32, 4)), (["--size", "ti"], (192, 12)),  # size -> depth
                        (["--preset", "c100-odevit-rk4-3"], (192, 3)), (["--preset", "c100-bvit-ti"], (192, 12))):
        train.cli(["--finetune", str(tmp_path / "ode.pt"), "--print-config", *flags])
        cfg = json.loads(capsys.readouterr().out)
        assert (cfg["embed_dim"], cfg["depth"]) == want and "ode_steps" not in cfg, (flags, cfg)  # as built


def test_finetune_then_requeue_with_resume_auto_continues_the_run(tmp_path, cifar_ckpt, capsys):
    cifar, ckpt = cifar_ckpt  # a vit run: its architecture comes from the checkpoint
    job = TINY[6:] + ["--data", "cifar100", "--data-dir", cifar, "--finetune", ckpt, "--resume", "auto",
                       "--out-dir", str(tmp_path / "b")]
    assert train.cli(job + ["--max-steps", "1"]) == 0
    assert train.cli(job + ["--max-steps", "2"]) == 0, capsys.readouterr().err  # the requeued job
    ck = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)
    assert ck["step"] == 2 and ck["args"]["model"] == "vit"
    assert train.cli(job + ["--max-steps", "3", "--embed-dim", "64"]) == 2  # a given model flag: refused
    assert "--embed-dim was 32, now 64" in capsys.readouterr().err


def test_eval_only_default_depths_are_in_the_models_unit_and_eval_ema_needs_ema_weights(tmp_path, capsys):
    data = ["--data", "synthetic", "--device", "cpu", "--workers", "0", "--val-subset", "16"]
    src = tmp_path / "sr"
    assert train.cli(TINY + data + ["--model", "srvit", "--recursions", "3", "--max-steps", "1",
                                    "--out-dir", str(src)]) == 0
    assert train.cli(data + ["--eval-only", "--resume", str(src), "--out-dir", str(tmp_path / "e")]) == 0
    res = json.load(open(tmp_path / "e" / "depth_eval.json"))
    assert res["trained_depth"] == 3 and [r["depth"] for r in res["results"]] == [2, 3, 6, 12, 24]  # recursions
    capsys.readouterr()
    assert train.cli(data + ["--eval-only", "--resume", str(src), "--eval-ema", "--ema", "0.9",
                             "--out-dir", str(tmp_path / "e2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no EMA weights" in err[0], err
