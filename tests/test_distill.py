"""Distillation (issue 14): --teacher CKPT with --distill feature|logits, through train.py and
distill.Distiller. CPU only, tiny models on a fake CIFAR folder."""
import copy

import pytest
import torch

import bvit
import data
from training import distill, weights
import revit
import train
from test_train import TINY, fake_cifar, load

pytestmark = pytest.mark.slow  # (train.py runs: README's quick tier, -m "not slow", leaves them out)

KW = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, depth=2, num_heads=2)


@pytest.mark.parametrize("kind", ["feature", "logits"])
@pytest.mark.parametrize("class_token", [True, False])
def test_a_student_equal_to_its_teacher_has_zero_distillation_loss(kind, class_token):
    torch.manual_seed(0)
    teacher = bvit.BViT(num_blocks=2, class_token=class_token, **KW)
    student = copy.deepcopy(teacher).train()
    d = distill.Distiller(student, teacher, kind)
    x = torch.randn(4, 3, 16, 16)
    assert d(x, student(x)).item() == pytest.approx(0.0, abs=1e-10)
    other = bvit.BViT(num_blocks=2, class_token=class_token, **KW)
    d = distill.Distiller(other, teacher, kind)
    assert d(x, other(x)).item() > 1e-4  # and it can fail


def test_feature_distillation_reads_the_final_post_layernorm_tokens():
    torch.manual_seed(0)
    teacher = bvit.BViT(num_blocks=2, **KW).eval()
    student = revit.ReViT(experts=2, depth_dropout=0.0, **{**KW, "embed_dim": 48}).eval()
    d = distill.Distiller(student, teacher, "feature")
    assert isinstance(d.proj, torch.nn.Linear) and d.proj.weight.shape == (32, 48)
    x = torch.randn(4, 3, 16, 16)
    loss = d(x, student(x))
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
    bad, reg = str(tmp_path / "bad.pt"), str(tmp_path / "reg.pt")
    torch.save({"weight": torch.zeros(3)}, bad)
    torch.save({**load(tmp_path / "t" / "ckpt.pt")["model"], "reg_token": torch.zeros(1, 4, 32)}, reg)
    cases = {"missing": (["--teacher", str(tmp_path / "none.pt")], "no such file"),
             "neither layout": (["--teacher", bad], "neither an rvits checkpoint nor a ViT state dict in timm's"),
             "registers": (["--teacher", reg], "register tokens"),
             "logits of a headless file": (["--teacher", timm_teacher(tmp_path, num_classes=0), "--distill", "logits"],
                                           "no classifier head")}
    capsys.readouterr()
    for name, (flags, says) in cases.items():
        rc = train.cli(d + flags + ["--out-dir", str(tmp_path / name.replace(" ", "_"))])
        err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
        assert rc == 2 and len(err) == 1 and says in err[0], (name, err)


def timm_teacher(tmp_path, **kw):
    """A DINOv2-like timm VisionTransformer (patch 14, LayerScale, class token; 64 wide, 2 blocks) saved as
    a state dict: (path)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(3)
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=56, patch_size=14, embed_dim=64, depth=2, num_heads=1, init_values=1e-5, **kw)
    path = str(tmp_path / f"timm_teacher{kw.get('num_classes', '')}.pth")
    torch.save(ref.state_dict(), path)
    return path


def test_a_timm_layout_teacher_gives_timms_own_tokens_on_the_students_grid(tmp_path):
    """--teacher FILE in timm's layout (DINOv2's): at its own grid the final post-LayerNorm tokens are
    timm's forward_features; at a 32-px student's 8x8 grid it runs at 8 x 14 = 112 px on the student's
    images resized and renormalized, so the feature term compares token for token."""
    timm = pytest.importorskip("timm")
    from training import registry
    path = timm_teacher(tmp_path, num_classes=0)
    torch.manual_seed(3)
    ref = timm.models.vision_transformer.VisionTransformer(img_size=56, patch_size=14, embed_dim=64, depth=2,
                                                           num_heads=1, init_values=1e-5, num_classes=0).eval()
    ref.load_state_dict(torch.load(path, weights_only=True))
    own = weights.timm_vit(path, "--teacher", grid=4)
    assert (own.img_size, own.patch_size, own.has_head, len(own.blocks)) == (56, 14, False, 2)
    x = torch.randn(2, 3, 56, 56)
    tokens = distill.FinalTokens(own)
    with torch.no_grad():
        own(x)
        want = ref.forward_features(x)
    assert torch.allclose(tokens.tokens, want, atol=1e-5), (tokens.tokens - want).abs().max()
    student = bvit.BViT(img_size=32, patch_size=4, num_classes=10, embed_dim=32, depth=2, num_heads=2, num_blocks=1)
    teacher = weights.timm_vit(path, "--teacher", grid=8)
    norms = ((data.CIFAR_MEAN, data.CIFAR_STD), (data.IMAGENET_MEAN, data.IMAGENET_STD))
    d = distill.Distiller(student, teacher, "feature", renormalize=norms)
    assert d.proj.weight.shape == (64, 32) and d.matched == "; matching all tokens"
    x = torch.randn(2, 3, 32, 32)
    raw = x * torch.tensor(data.CIFAR_STD).view(1, 3, 1, 1) + torch.tensor(data.CIFAR_MEAN).view(1, 3, 1, 1)
    want = torch.nn.functional.interpolate((raw - torch.tensor(data.IMAGENET_MEAN).view(1, 3, 1, 1))
                                           / torch.tensor(data.IMAGENET_STD).view(1, 3, 1, 1), size=(112, 112),
                                           mode="bicubic", align_corners=False)
    assert torch.allclose(d.teacher_input(x), want, atol=1e-5)
    loss = d(x, student(x))
    assert d.teacher_tokens.tokens.shape == (2, 65, 64) and loss.item() > 0
    gap = bvit.BViT(img_size=32, patch_size=4, num_classes=10, embed_dim=32, depth=2, num_heads=2, num_blocks=1,
                    class_token=False)
    d = distill.Distiller(gap, teacher, "feature")
    assert "matching the 64 patch tokens (only the teacher has a class token)" in d.matched
    d(x, gap(x))
    assert d.teacher_tokens.tokens[:, d.skip[1]:].shape == d.student_tokens.tokens.shape[:2] + (64,)
    with pytest.raises(ValueError, match="patch grid is 8x8 and the teacher's 4x4"):
        distill.Distiller(student, own, "feature")


def test_train_py_distills_from_a_timm_file_and_says_how_it_meets_the_student(tmp_path, capsys):
    cifar = fake_cifar(tmp_path / "data")
    d = TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1"]
    path = timm_teacher(tmp_path, num_classes=0)
    assert train.cli(d + ["--model", "revit", "--teacher", path, "--out-dir", str(tmp_path / "s")]) == 0, \
        capsys.readouterr().err
    out = capsys.readouterr().out
    assert ("teacher: timm-layout ViT (2 blocks, width 64), patch 14, at 112 px: its 8x8 patch grid is the student's; "
            "images renormalized to its mean and std; matching all tokens") in out
    assert load(tmp_path / "s" / "ckpt.pt")["distill"]["proj.weight"].shape == (64, 32)
    # an rvits teacher of another patch size runs on the student's grid too (it used to be refused)
    assert train.cli(d + ["--out-dir", str(tmp_path / "t"), "--patch-size", "8"]) == 0
    capsys.readouterr()
    assert train.cli(d + ["--model", "revit", "--teacher", str(tmp_path / "t"), "--out-dir", str(tmp_path / "u")]) == 0
    assert "teacher: --model bvit, patch 8, at 64 px: its 8x8 patch grid is the student's; matching all" in \
        capsys.readouterr().out


def test_a_checkpoint_saved_with_distill_but_no_teacher_still_evaluates_and_analyses(tmp_path, capsys):
    # an earlier train.py saved distill="feature" for every run; evaluation distils nothing (analysis:
    # lab/tests/test_lab_failures.py)
    cifar = fake_cifar(tmp_path / "data")
    d = TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1"]
    assert train.cli(d + ["--model", "revit", "--out-dir", str(tmp_path / "r")]) == 0
    ck = load(tmp_path / "r" / "ckpt.pt")
    ck["args"].update(distill="feature", teacher=None)
    torch.save(ck, tmp_path / "old.pt")
    assert train.cli(["--eval-only", "--resume", str(tmp_path / "old.pt"), "--eval-depths", "2",
                      "--out-dir", str(tmp_path / "e")]) == 0, capsys.readouterr().err
