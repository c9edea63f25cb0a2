"""LoopVAE Stage 2 (loopvae_train/adversarial.py, train_loopvae.py --stage2): from a Stage-1 checkpoint the generator and the
discriminator both train, the adversarial term is off before --gan-start, one ckpt.pt resumes both
bit for bit, the frozen-DINOv2 discriminator loads timm's layout and trains its head only, and bad
input (flags, files, an rFID without its package or weights) is one line, exit 2.

CPU only, in-process `train_loopvae.cli` calls on a tiny fake CIFAR-100 folder (test_loopvae_train's TINY); no download.
"""
import os
import signal
import sys
import types
import urllib.error

import pytest
import timm
import torch

from loopvae_train import adversarial
import loopvae
import train
import train_loopvae
from training import exits, optim
from test_loopvae_train import TINY, records
from test_train import fake_cifar

pytestmark = pytest.mark.slow  # (train_loopvae.py runs: README's quick tier, -m "not slow", leaves them out)

STAGE2 = ["--max-steps", "6", "--gan-start", "3", "--r1-every", "2", "--epochs", "1"]
TERMS = ("d_loss", "g_loss", "gan_weight", "r1")


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    """A 2-step Stage-1 run: (the data folder, its run folder)."""
    cifar = fake_cifar(tmp_path_factory.mktemp("data"))
    out = tmp_path_factory.mktemp("stage1")
    assert train_loopvae.cli(TINY + ["--data-dir", cifar, "--out-dir", str(out), "--max-steps", "2"]) == 0
    return cifar, out


def job(stage1, out, *extra):
    cifar, s1 = stage1
    return TINY + ["--data-dir", cifar, "--out-dir", str(out), "--stage2", str(s1)] + STAGE2 + list(extra)


@pytest.fixture(scope="module")
def full(stage1, tmp_path_factory):
    """6 uninterrupted Stage-2 steps: (run folder, [(step, terms)] of every adversary call)."""
    out, calls = tmp_path_factory.mktemp("full"), []
    real = adversarial.Adversary.__call__

    def spy(self, x, x_hat, rec_loss, step):
        loss, terms = real(self, x, x_hat, rec_loss, step)
        calls.append((step, {k: float(v) for k, v in terms.items()}))
        return loss, terms
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(adversarial.Adversary, "__call__", spy)
        assert train_loopvae.cli(job(stage1, out)) == 0
    return out, calls


def test_stage2_starts_from_stage1_and_logs_its_terms_the_weight_zero_before_gan_start(full, stage1):
    out, calls = full
    assert [s for s, _ in calls] == list(range(6))
    for step, terms in calls:
        if step < 3:  # App. A.1: the discriminator warms up, lambda_a = 0 and no generator term
            assert terms["gan_weight"] == 0.0 and "g_loss" not in terms
        else:
            assert terms["gan_weight"] > 0 and "g_loss" in terms
    rec = records(out)[-1]
    assert rec["step"] == 6 and all(k in rec for k in TERMS) and "val_psnr" in rec and "l1" in rec
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["adversary"]["d_steps"] == 6 and ck["args"]["stage2"] == str(stage1[1] / "ckpt.pt")
    assert len(ck["adversary"]["optimizer"]["state"]) == len(list(loopvae.PatchDiscriminator().parameters()))


def test_sigterm_then_resume_continues_generator_and_discriminator_bit_for_bit(full, stage1, tmp_path, monkeypatch):
    """SIGTERM after step 3 of 6: both networks moved between step 3 and 6, and the resumed run ends
    with the uninterrupted run's generator, discriminator and both optimizers' moments exactly."""
    out = tmp_path / "stopped"
    real, calls = optim.optimizer_step, []

    def step_then_sigterm(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)
    monkeypatch.setattr(optim, "optimizer_step", step_then_sigterm)
    assert train_loopvae.cli(job(stage1, out)) == exits.PREEMPTED
    half = torch.load(out / "ckpt.pt", weights_only=True)
    monkeypatch.setattr(optim, "optimizer_step", real)
    assert train_loopvae.cli(job(stage1, out, "--resume", str(out / "ckpt.pt"))) == 0
    a, b = (torch.load(d / "ckpt.pt", weights_only=True) for d in (full[0], out))
    assert half["step"] == 3 and a["step"] == b["step"] == 6
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for k in a["adversary"]["disc"]:
        assert torch.equal(a["adversary"]["disc"][k], b["adversary"]["disc"][k]), k
    assert any(not torch.equal(half["model"][k], a["model"][k]) for k in a["model"])  # G trained on
    assert all(not torch.equal(half["adversary"]["disc"][k], a["adversary"]["disc"][k]) for k in a["adversary"]["disc"]
               if k.endswith("weight"))  # so did every layer of D
    for opt in (lambda c: c["optimizer"], lambda c: c["adversary"]["optimizer"]):
        for s, t in zip(opt(a)["state"].values(), opt(b)["state"].values()):
            assert torch.equal(s["exp_avg"], t["exp_avg"]) and torch.equal(s["exp_avg_sq"], t["exp_avg_sq"])
    assert a["adversary"]["d_steps"] == b["adversary"]["d_steps"] and torch.equal(a["adversary"]["r1"], b["adversary"]["r1"])
    assert [r[k] for r in records(full[0]) for k in TERMS] == [r[k] for r in records(out) for k in TERMS]


def tiny_dinov2(path, img_size=224):
    """A randomly initialized timm ViT in DINOv2-small's layout (patch 14, LayerScale, no head), width 64."""
    torch.manual_seed(0)
    vit = timm.models.vision_transformer.VisionTransformer(img_size=img_size, patch_size=14, embed_dim=64, depth=2,
                                                           num_heads=1, init_values=1e-5, num_classes=0)
    torch.save(vit.state_dict(), path)
    return vit.eval()


def test_the_dinov2_discriminator_is_timms_frozen_features_and_trains_its_head_only(tmp_path):
    timm_vit = tiny_dinov2(tmp_path / "dinov2.pth")
    gen = loopvae.LoopVAE(img_size=16, embed_dim=32, num_blocks=1, loops=(1, 2), latent_dim=4)
    adv = adversarial.build(gen, "dinov2", str(tmp_path / "dinov2.pth"), torch.device("cpu"), lr=1e-2, start=0,
                            r1_every=1, policy=())
    disc = adv.disc
    assert all(not p.requires_grad for p in disc.backbone.parameters()) and adv.trainable == list(disc.head.parameters())
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    seen = []
    disc.head.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    disc(x)
    resized = torch.nn.functional.interpolate((x + 1) / 2, size=(224, 224), mode="bilinear", align_corners=False)
    with torch.no_grad():
        want = timm_vit.forward_features((resized - disc.mean) / disc.std)[:, 1:]  # (B, 256, 64): timm's tokens
    torch.testing.assert_close(seen[0], want, rtol=1e-4, atol=1e-4)
    frozen = {k: v.clone() for k, v in disc.backbone.state_dict().items()}
    head = {k: v.clone() for k, v in disc.head.state_dict().items()}
    x_hat, rec = gen(x, targets=0)
    loss, terms = adv(x, x_hat, rec, step=0)
    grads = [p.grad.clone() for p in disc.head.parameters()]  # the discriminator update's
    loss.backward()  # the generator's step (train_loopvae.py's): it adds no gradient to the discriminator
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, disc.head.parameters())) and gen.last_layer().grad is not None
    assert all(p.grad is None for p in disc.backbone.parameters())
    assert terms["gan_weight"] > 0 and terms["r1"] > 0
    assert all(torch.equal(frozen[k], v) for k, v in disc.backbone.state_dict().items())
    # (the last bias has no gradient while every logit is inside the hinge's margin: -1 + 1 = 0)
    assert all(not torch.equal(head[k], v) for k, v in disc.head.state_dict().items() if k.endswith("weight"))


def test_a_stage2_run_with_the_dinov2_discriminator_trains(stage1, tmp_path):
    tiny_dinov2(tmp_path / "dinov2.pth", img_size=28)  # pos_embed 2 x 2, resized to 16 x 16 as DINOv2's 37 x 37
    out = tmp_path / "o"
    assert train_loopvae.cli(job(stage1, out, "--disc", "dinov2", "--disc-weights", str(tmp_path / "dinov2.pth"),
                         "--max-steps", "2", "--gan-start", "1", "--val-subset", "8")) == 0
    assert all(k in records(out)[-1] for k in TERMS)


def one_line_exit_2(argv, says, capsys, cli=None):
    capsys.readouterr()
    assert (cli or train_loopvae.cli)(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


@pytest.mark.parametrize("flags,says", [
    (["--disc", "dinov2"], "--disc dinov2 needs --disc-weights FILE"),
    (["--disc-weights", "w.pth"], "--disc-weights is for --disc dinov2"),
    (["--grad-accum", "2"], "--grad-accum with --stage2"),
    (["--finetune", "STAGE1"], "leave out --finetune"),
    (["--model", "bvit"], "--model bvit: train_loopvae.py does not train it; train.py does"),
    (["--diffaug", "color,flip"], "--diffaug: expected none or comma-separated of color, translation, cutout"),
])
def test_bad_stage2_flags_are_one_line_exit_2(flags, says, stage1, tmp_path, capsys):
    flags = [str(stage1[1]) if f == "STAGE1" else f for f in flags]
    one_line_exit_2(job(stage1, tmp_path / "o") + flags, says, capsys)
    assert not (tmp_path / "o" / "ckpt.pt").exists()


def test_bad_stage2_inputs_are_one_line_exit_2(stage1, tmp_path, capsys):
    cifar, s1 = stage1
    plain = TINY + ["--data-dir", cifar, "--out-dir", str(tmp_path / "p")]
    one_line_exit_2(plain + ["--gan-start", "7", "--r1-gamma", "1"], "--gan-start, --r1-gamma: Stage-2 flags; add "
                    "--stage2 CKPT", capsys)
    one_line_exit_2(plain + ["--resume", str(s1 / "ckpt.pt"), "--stage2", str(s1)], "a Stage-1 checkpoint; start "
                    "Stage 2 from it in a new --out-dir", capsys)
    torch.save({"model": {}, "args": {"model": "bvit"}}, tmp_path / "bvit.pt")
    one_line_exit_2(job(stage1, tmp_path / "o") + ["--stage2", str(tmp_path / "bvit.pt")],
                    "a --model bvit checkpoint, not a LoopVAE one", capsys)
    (tmp_path / "junk.pth").write_bytes(b"not weights")
    one_line_exit_2(job(stage1, tmp_path / "o", "--disc", "dinov2", "--disc-weights", str(tmp_path / "junk.pth")),
                    f"--disc-weights {tmp_path / 'junk.pth'}: not a checkpoint", capsys)
    torch.save({"blocks.0.norm1.weight": torch.ones(4)}, tmp_path / "nopatch.pth")
    one_line_exit_2(job(stage1, tmp_path / "o", "--disc", "dinov2", "--disc-weights", str(tmp_path / "nopatch.pth")),
                    "not a ViT state dict in timm's layout", capsys)
    assert not (tmp_path / "o" / "ckpt.pt").exists()


class OfflineFID:
    """Stands in for torchmetrics' FrechetInceptionDistance offline: torch-fidelity cannot download its weights."""

    def __init__(self, *a, **k):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")


def test_rfid_without_its_package_or_its_weights_is_one_line_exit_2(stage1, tmp_path, capsys, monkeypatch):
    cifar, _ = stage1
    argv = TINY + ["--data-dir", cifar, "--out-dir", str(tmp_path / "o"), "--rfid"]
    monkeypatch.setitem(sys.modules, "torchmetrics", None)  # not installed
    one_line_exit_2(argv, "--rfid needs torchmetrics with torch-fidelity, an optional extra", capsys)
    fid = types.ModuleType("torchmetrics.image.fid")
    fid.FrechetInceptionDistance = OfflineFID
    for name, mod in (("torchmetrics", types.ModuleType("torchmetrics")),
                      ("torchmetrics.image", types.ModuleType("torchmetrics.image")), ("torchmetrics.image.fid", fid)):
        monkeypatch.setitem(sys.modules, name, mod)
    one_line_exit_2(argv, "the FID Inception weights are not cached and could not be downloaded", capsys)
    one_line_exit_2(["--rfid"], "unrecognized arguments: --rfid", capsys, train.cli)  # (train.py: LoopVAE's flag)
    assert not (tmp_path / "o" / "ckpt.pt").exists()


def test_a_stage2_run_that_ends_before_gan_start_says_so_at_its_start(stage1, tmp_path, capsys):
    assert train_loopvae.cli(job(stage1, tmp_path / "o", "--max-steps", "1", "--gan-start", "5", "--val-subset", "8")) == 0
    assert "note: this Stage-2 run ends at step 1, not after --gan-start 5: it trains the discriminator alone" \
        in capsys.readouterr().out


def test_stage2_carries_the_stage1_runs_loss_and_data_flags_unless_given(stage1, tmp_path):
    """--stage2 (issue 38): the Stage-1 run's --kl-weight and data come with its architecture; a flag on
    the command line still wins; the optimization flags stay the preset's or the defaults."""
    from loopvae_train import flags as lvflags
    from training import flags
    cifar, s1 = stage1
    ck = torch.load(s1 / "ckpt.pt", weights_only=True)
    ck["args"]["kl_weight"] = 1e-3  # a Stage-1 loss other than the default
    torch.save(ck, tmp_path / "s1.pt")
    p = lvflags.get_parser()
    args = flags.configure(p, ["--model", "loopvae", "--stage2", str(tmp_path / "s1.pt"), "--out-dir", str(tmp_path / "o")])
    assert args.data_dir == cifar and args.embed_dim == ck["args"]["embed_dim"] and args.kl_weight == 1e-3
    assert args.lr == 1e-3  # the default, not Stage 1's 2e-3: the optimization flags start fresh
    p = lvflags.get_parser()
    args = flags.configure(p, ["--model", "loopvae", "--stage2", str(tmp_path / "s1.pt"), "--kl-weight", "0.5",
                               "--data", "synthetic"])
    assert args.kl_weight == 0.5 and args.data == "synthetic"
