"""Distillation (issue 14): --teacher CKPT with --distill feature|logits, through train.py and
distill.Distiller. CPU only, tiny models on a fake CIFAR folder."""
import copy

import pytest
import torch

import bvit
from training import distill
import revit
import train
from test_train import TINY, fake_cifar, load

KW = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, depth=2, num_heads=2)


@pytest.mark.parametrize("kind", ["feature", "logits"])
@pytest.mark.parametrize("class_token", [True, False])
def test_a_student_equal_to_its_teacher_has_zero_distillation_loss(kind, class_token):
    torch.manual_seed(0)
    teacher = bvit.BViT(num_blocks=2, class_token=class_token, **KW)
    student = copy.deepcopy(teacher).train()
    d = distill.Distiller(student, teacher, kind)
    x = torch.randn(4, 3, 16, 16)
    assert d(x, student(x)[0]).item() == pytest.approx(0.0, abs=1e-10)
    other = bvit.BViT(num_blocks=2, class_token=class_token, **KW)
    d = distill.Distiller(other, teacher, kind)
    assert d(x, other(x)[0]).item() > 1e-4  # and it can fail


def test_feature_distillation_reads_the_final_post_layernorm_tokens():
    torch.manual_seed(0)
    teacher = bvit.BViT(num_blocks=2, **KW).eval()
    student = revit.ReViT(experts=2, depth_dropout=0.0, **{**KW, "embed_dim": 48}).eval()
    d = distill.Distiller(student, teacher, "feature")
    assert isinstance(d.proj, torch.nn.Linear) and d.proj.weight.shape == (32, 48)
    x = torch.randn(4, 3, 16, 16)
    loss = d(x, student(x)[0])
    z = teacher.embed(x)
    for blk in teacher.blocks:
        z = blk(z)
    want = torch.nn.functional.mse_loss(d.proj(d.student_tokens.tokens), teacher.norm(z))
    assert torch.allclose(loss, want)


def test_distillation_trains_through_train_py_and_weight_zero_changes_nothing(tmp_path, capsys):
    cifar = fake_cifar(tmp_path / "data")
    d = TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "2"]
    assert train.cli(d + ["--model", "vit", "--out-dir", str(tmp_path / "t")]) == 0
    teacher = str(tmp_path / "t" / "ckpt.pt")
    runs = {"plain": [], "zero": ["--teacher", teacher, "--distill-weight", "0"],
            "feature": ["--teacher", teacher], "logits": ["--teacher", teacher, "--distill", "logits"],
            "wider": ["--teacher", teacher, "--embed-dim", "48"]}
    w = {}
    for name, flags in runs.items():
        assert train.cli(d + ["--model", "revit", "--drop-path", "0", "--out-dir", str(tmp_path / name)] + flags) == 0, \
            capsys.readouterr().err
        w[name] = load(tmp_path / name / "ckpt.pt")
    assert all(torch.equal(w["plain"]["model"][k], w["zero"]["model"][k]) for k in w["plain"]["model"])
    assert not torch.equal(w["plain"]["model"]["head.weight"], w["feature"]["model"]["head.weight"])
    assert not torch.equal(w["plain"]["model"]["head.weight"], w["logits"]["model"]["head.weight"])
    assert w["feature"]["distill"] == {} and w["wider"]["distill"]["proj.weight"].shape == (32, 48)
    # resuming without the teacher whose projection the checkpoint trained: one line, exit 2, no traceback
    capsys.readouterr()
    rc = train.cli(d + ["--model", "revit", "--drop-path", "0", "--embed-dim", "48", "--max-steps", "3",
                        "--out-dir", str(tmp_path / "wider"), "--resume", str(tmp_path / "wider" / "ckpt.pt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "feature projection" in err[0], err


def test_bad_teachers_are_one_line_exit_2(tmp_path, capsys):
    cifar = fake_cifar(tmp_path / "data")
    d = TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1"]
    assert train.cli(d + ["--out-dir", str(tmp_path / "t"), "--patch-size", "8"]) == 0
    sd = str(tmp_path / "sd.pt")
    torch.save(load(tmp_path / "t" / "ckpt.pt")["model"], sd)
    cases = {"missing": (["--teacher", str(tmp_path / "none.pt")], "no such file"),
             "state dict only": (["--teacher", sd], "not an rvits checkpoint"),
             "other token grid": (["--teacher", str(tmp_path / "t" / "ckpt.pt")], "tokens")}
    capsys.readouterr()
    for name, (flags, says) in cases.items():
        rc = train.cli(d + flags + ["--out-dir", str(tmp_path / name.replace(" ", "_"))])
        err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
        assert rc == 2 and len(err) == 1 and says in err[0], (name, err)


def test_a_checkpoint_saved_with_distill_but_no_teacher_still_evaluates_and_analyses(tmp_path, capsys):
    # an earlier train.py saved distill="feature" for every run; evaluation and analysis distil nothing
    import analyze
    cifar = fake_cifar(tmp_path / "data")
    d = TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1"]
    assert train.cli(d + ["--model", "revit", "--out-dir", str(tmp_path / "r")]) == 0
    ck = load(tmp_path / "r" / "ckpt.pt")
    ck["args"].update(distill="feature", teacher=None)
    torch.save(ck, tmp_path / "old.pt")
    assert train.cli(["--eval-only", "--resume", str(tmp_path / "old.pt"), "--eval-depths", "2",
                      "--out-dir", str(tmp_path / "e")]) == 0, capsys.readouterr().err
    assert analyze.cli(["--resume", str(tmp_path / "old.pt"), "--out-dir", str(tmp_path / "a"),
                        "--num-images", "8"]) == 0, capsys.readouterr().err
