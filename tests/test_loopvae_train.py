"""train_loopvae.py (issue 32; its own entry point since issue 78): a LoopVAE trains through its own loop
with train.py's pieces, logs its reconstruction metrics each epoch, resumes bit for bit after SIGTERM, evaluates a checkpoint with
--eval-only, and refuses in one line what would make a tokenizer run silently wrong (classification
flags, an LPIPS without its weights).

CPU only, in-process `train_loopvae.cli` calls on a tiny fake CIFAR-100 folder; no download.
"""
import contextlib
import io
import json
import os
import re
import signal
import sys
import types
import urllib.error

import pytest
import torch

import loopvae
import train
import train_loopvae
from loopvae_train import evaluation as lveval, flags as lvflags, perceptual
from training.flags import parse_args
from training import exits, optim
import data
from test_train import fake_cifar

pytestmark = pytest.mark.slow  # (train_loopvae.py runs: README's quick tier, -m "not slow", leaves them out)

# width 32 (32 GroupNorm groups), one block, two scales (1 and 2 passes): 8 steps per epoch of 64 images
TINY = ["--model", "loopvae", "--embed-dim", "32", "--num-blocks", "1", "--loops", "1,2", "--latent-dim", "4",
        "--device", "cpu", "--workers", "0", "--batch-size", "8", "--eval-batch-size", "32", "--epochs", "2",
        "--lr", "2e-3", "--warmup-epochs", "0.5", "--weight-decay", "0"]
METRICS = ("val_l1", "val_psnr", "val_psnr_raw", "val_ssim", "val_kl", "val_out_of_range")


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    return fake_cifar(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def trained(cifar, tmp_path_factory):
    """One uninterrupted tiny run of 2 epochs (16 steps): (its folder, what it printed)."""
    out, printed = tmp_path_factory.mktemp("full"), io.StringIO()
    with contextlib.redirect_stdout(printed):  # (capsys is per test)
        assert train_loopvae.cli(TINY + ["--data-dir", cifar, "--out-dir", str(out)]) == 0
    return out, printed.getvalue()


def records(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_a_loopvae_trains_and_logs_its_reconstruction_metrics_each_epoch(trained):
    out, printed = trained
    recs = records(out)
    assert [r["step"] for r in recs] == [8, 16]
    for r in recs:
        assert all(k in r for k in METRICS) and "val_acc1" not in r
        assert 0 < r["val_psnr"] < 60 and 0 < r["val_l1"] < 2 and -1 < r["val_ssim"] <= 1
        assert 0 <= r["val_out_of_range"] <= 1 and r["val_kl"] >= 0
        assert r["l1"] > 0 and r["kl"] >= 0  # the last training step's loss terms (model.aux)
    assert recs[1]["train_loss"] < recs[0]["train_loss"]  # it learns (L1 + 1e-6 KL)
    for r in recs:
        assert (f"epoch {r['epoch']}: validation PSNR {r['val_psnr']:.2f} dB, SSIM {r['val_ssim']:.4f}, "
                f"L1 {r['val_l1']:.4f} (step {r['step']} of 16)") in printed
    saved = json.loads((out / "args.json").read_text())
    assert (saved["depth"], saved["loops"], saved["share"]) == (3, [1, 2], "global") and "patch_size" not in saved


def test_the_images_are_in_minus_one_to_one_on_both_cifar_loaders(cifar):
    """LoopVAE's normalization (mean 0.5, std 0.5) on the per-image and the batched loader alike."""
    p = lvflags.get_parser()
    args = parse_args(p, TINY + ["--data-dir", cifar])
    _, train_set, val_set, _, _ = train.load_data(args, p, mean_std=lvflags.NORMALIZATION, reconstruct=True)
    per_image = torch.stack([val_set[i][0] for i in range(8)])
    assert torch.allclose(per_image, val_set.images[:8].float() / 127.5 - 1, atol=1e-6)
    batched = next(iter(data.DeviceCIFARLoader(val_set, 8, False, device="cpu")))[0]
    assert torch.allclose(batched, per_image, atol=1e-6) and batched.min() >= -1 and batched.max() <= 1


def test_sigterm_then_resume_equals_the_uninterrupted_run_bit_for_bit(trained, cifar, tmp_path, monkeypatch):
    """SIGTERM after step 5 (mid-epoch): the run saves and exits 75; --resume finishes it with the same
    weights, optimizer moments and logged metrics as the run that was never stopped (the posterior
    samples draw from the restored RNG, the batched loader continues mid-epoch), also from a checkpoint
    in the format train.py wrote before LoopVAE had its own entry point (issue 78)."""
    full, _ = trained
    out = tmp_path / "stopped"
    real, calls = optim.optimizer_step, []

    def step_then_sigterm(*a, **k):
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # train()'s handler notes it; the step finishes
        return real(*a, **k)
    monkeypatch.setattr(optim, "optimizer_step", step_then_sigterm)
    assert train_loopvae.cli(TINY + ["--data-dir", cifar, "--out-dir", str(out)]) == exits.PREEMPTED
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["step"] == 5
    # as train.py wrote it before LoopVAE had its own entry point (2aafb45): its args hold every flag of
    # train.py, and it has a "distill" entry (None); the run continues all the same
    from training import flags
    ck["args"] = {**{k: v for k, v in vars(flags.get_parser().parse_args([])).items()}, **ck["args"]}
    torch.save({**ck, "distill": None}, out / "ckpt.pt")
    monkeypatch.setattr(optim, "optimizer_step", real)
    assert train_loopvae.cli(TINY + ["--data-dir", cifar, "--out-dir", str(out), "--resume", str(out / "ckpt.pt")]) == 0
    a, b = (torch.load(d / "ckpt.pt", weights_only=True) for d in (full, out))
    assert a["step"] == b["step"] == 16
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for s, t in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(s["exp_avg"], t["exp_avg"]) and torch.equal(s["exp_avg_sq"], t["exp_avg_sq"])
    assert [r[k] for r in records(full) for k in METRICS] == [r[k] for r in records(out) for k in METRICS]


def test_eval_only_prints_the_metrics_the_run_logged_for_its_checkpoint(trained, tmp_path, capsys):
    full, _ = trained
    capsys.readouterr()
    assert train_loopvae.cli(["--eval-only", "--resume", str(full / "ckpt.pt"), "--out-dir", str(tmp_path / "ev")]) == 0
    printed = capsys.readouterr().out
    last = records(full)[-1]
    res = json.loads((tmp_path / "ev" / "reconstruction_eval.json").read_text())
    assert res["step"] == 16 and res["weights"] == "model"
    for k in METRICS:  # the same weights on the same validation images (data flags from the checkpoint)
        assert res[k] == pytest.approx(last[k], rel=1e-6, abs=1e-9), k
    assert re.search(rf"\(step 16, model weights\): validation PSNR {last['val_psnr']:.2f} dB \(unclipped "
                     rf"{last['val_psnr_raw']:.2f}\), SSIM {last['val_ssim']:.4f}, L1 {last['val_l1']:.4f}, "
                     r"KL [0-9.e-]+, out-of-range pixels [0-9.]+ %", printed), printed
    assert not {"log.jsonl", "ckpt.pt", "args.json"} & set(os.listdir(tmp_path / "ev"))  # the run's files stay its own
    # issue 76: a second --eval-only into the folder never replaces the first's record (names of its own)
    first = (tmp_path / "ev" / "reconstruction_eval.json").read_bytes()
    assert train_loopvae.cli(["--eval-only", "--resume", str(full / "ckpt.pt"), "--out-dir", str(tmp_path / "ev")]) == 0
    assert "its results go to reconstruction_eval-2.json" in capsys.readouterr().out
    assert (tmp_path / "ev" / "reconstruction_eval.json").read_bytes() == first
    assert json.loads((tmp_path / "ev" / "reconstruction_eval-2.json").read_text())["val_psnr"] == res["val_psnr"]


@pytest.mark.parametrize("flags,says", [
    (["--mixup", "0.8"], "--mixup"), (["--eval-depths", "2,4"], "--eval-depths"), (["--bce"], "--bce"),
    (["--label-smoothing", "0.1"], "--label-smoothing: classification flags"),
    (["--patch-size", "4"], "unrecognized arguments: --patch-size 4"),  # (a classifier's model flag: not its own)
    (["--drop-path", "0.1", "--gap"], "unrecognized arguments: --drop-path 0.1 --gap"),
    (["--preset", "cpu-first-bvit"],  # a classifier's preset: the script that trains it
     "--preset cpu-first-bvit trains --model bvit, which train_loopvae.py does not train: python train.py --preset"),
    (["--depth", "12"], "--depth 12 (given, or a checkpoint's): loopvae's depth is --num-blocks x"),
    (["--embed-dim", "48"], "embed_dim 48 is not divisible by num_groups 32"),
])
def test_a_classification_flag_or_a_bad_size_is_one_line_exit_2(flags, says, cifar, tmp_path, capsys):
    capsys.readouterr()
    assert train_loopvae.cli(TINY + ["--data-dir", cifar, "--out-dir", str(tmp_path / "o")] + flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "o" / "ckpt.pt").exists()


class OfflineLPIPS(torch.nn.Module):
    """Stands in for lpips.LPIPS on a machine without network: its ImageNet backbone cannot be downloaded."""

    def __init__(self, net="alex", pnet_rand=False, verbose=True, **kw):
        super().__init__()
        if not pnet_rand:  # what torchvision's download raises offline
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
        raise AssertionError("a network with random weights was built")


def test_perceptual_lpips_without_its_package_or_its_weights_is_one_line_exit_2(cifar, tmp_path, capsys, monkeypatch):
    job = TINY + ["--data-dir", cifar, "--out-dir", str(tmp_path / "o"), "--perceptual", "lpips"]
    monkeypatch.setitem(sys.modules, "lpips", None)  # not installed: import lpips raises ImportError
    capsys.readouterr()
    assert train_loopvae.cli(job) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install lpips" in err[0] and "optional" in err[0], err
    monkeypatch.setitem(sys.modules, "lpips", types.SimpleNamespace(LPIPS=OfflineLPIPS))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_cache"))  # no cached backbone weights
    missing = ["--lpips-weights", str(tmp_path / "nope.pth")]
    for extra, says in (([], "could not be downloaded"), (missing, "no such file")):
        assert train_loopvae.cli(job + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0] and "--lpips-weights FILE" in err[0] and perceptual.VGG16_URL in err[0], err
    assert not (tmp_path / "o" / "ckpt.pt").exists()


def test_a_cpu_sized_loopvae_trains_one_step_and_a_loopvae_moves_between_devices_and_dtypes(cifar, tmp_path):
    out = tmp_path / "o"  # (the lab's c100-mini-loopvae-unlooped arm's architecture)
    cpu_sized = ["--model", "loopvae", "--data", "cifar100", "--embed-dim", "32", "--num-heads", "4", "--num-blocks", "4",
                 "--num-groups", "4", "--latent-dim", "16", "--operator", "cnn", "--perceptual", "none",
                 "--share", "scale", "--loops", "1,1,1", "--workers", "0"]
    assert train_loopvae.cli([*cpu_sized, "--data-dir", cifar, "--out-dir", str(out),
                      "--max-steps", "1", "--batch-size", "8", "--val-subset", "16", "--device", "cpu"]) == 0
    rec = records(out)[0]
    assert rec["step"] == 1 and all(k in rec for k in METRICS)
    saved = json.loads((out / "args.json").read_text())
    assert (saved["loops"], saved["share"], saved["perceptual"], saved["depth"]) == ([1, 1, 1], "scale", "none", 12)
    m = loopvae.LoopVAE(img_size=16, embed_dim=32, num_blocks=1, loops=(1, 2), latent_dim=4).to("cpu", torch.float64)
    assert m(torch.zeros(1, 3, 16, 16, dtype=torch.float64))[0].dtype == torch.float64


def test_a_missing_dependency_of_lpips_is_named_not_lpips_itself(tmp_path, monkeypatch):
    """The lpips package is there but cannot import scipy: the line names scipy (issue 37)."""
    (tmp_path / "lpips").mkdir()
    (tmp_path / "lpips" / "__init__.py").write_text("raise ImportError(\"No module named 'scipy'\", name='scipy')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lpips", raising=False)
    with pytest.raises(exits.Fail, match="the lpips package needs scipy, which is not installed: pip install scipy"):
        perceptual.lpips_loss()


def test_num_groups_reaches_every_groupnorm_and_is_refused_where_it_does_nothing(capsys):
    """--num-groups (issue 38): the AdaGN blocks and both heads normalize in that many groups; it must
    divide the width; a classifier refuses it by name."""
    from training import flags
    args = flags.resolved(TINY + ["--num-groups", "8"], 16, lvflags.ENTRY)
    norms = [m for m in lvflags.build_model(args, 16).modules() if isinstance(m, torch.nn.GroupNorm)]
    assert norms and {m.num_groups for m in norms} == {8}
    default = [m for m in lvflags.build_model(flags.resolved(TINY, 16, lvflags.ENTRY), 16).modules()
               if isinstance(m, torch.nn.GroupNorm)]
    assert {m.num_groups for m in default} == {32}  # as before the flag: one channel per group at width 32
    with pytest.raises(exits.Fail, match="not divisible by num_groups 5"):
        lvflags.build_model(flags.resolved(TINY + ["--num-groups", "5"], 16, lvflags.ENTRY), 16)
    with pytest.raises(SystemExit):
        flags.resolved(["--model", "bvit", "--num-groups", "8"])  # train.py's: not one of its flags
    assert "unrecognized arguments: --num-groups 8" in capsys.readouterr().err


def test_a_tokenizer_on_image_folders_resizes_and_crops_instead_of_zooming_in(tmp_path):
    """Image folders for loopvae (issue 38): the short side resized (bicubic), a random crop in training
    and the centre crop in evaluation (the paper's preprocessing), where a classifier takes
    RandomResizedCrop and Resize(img/0.875) + CenterCrop. Through train.load_data, as a run reads them."""
    from torchvision.transforms import v2
    from test_presets import fake_imagenet
    from training import flags
    root = fake_imagenet(tmp_path / "folders")
    kinds = {}
    for model in ("loopvae", "bvit"):
        p = lvflags.get_parser() if model == "loopvae" else flags.get_parser()
        images = dict(mean_std=lvflags.NORMALIZATION, reconstruct=True) if model == "loopvae" else {}
        argv = (TINY if model == "loopvae" else ["--model", "bvit", "--embed-dim", "32", "--num-heads", "2",
                                                 "--depth", "2", "--patch-size", "8"]) + \
            ["--data", "imagenet", "--data-dir", root, "--img-size", "32"]
        _, train_set, val_set, _, _ = train.load_data(parse_args(p, argv), p, **images)
        kinds[model] = [[type(op) for op in s.transform.transforms] for s in (train_set, val_set)]
        kinds[model + " resize"] = val_set.transform.transforms[1].size
        assert train_set[0][0].shape == val_set[0][0].shape == (3, 32, 32)
    (tr, ev), (ctr, cev) = kinds["loopvae"], kinds["bvit"]
    assert v2.Resize in tr and v2.RandomCrop in tr and v2.RandomResizedCrop not in tr
    assert ev[1:3] == [v2.Resize, v2.CenterCrop] and kinds["loopvae resize"] == [32] and kinds["bvit resize"] == [36]
    assert v2.RandomResizedCrop in ctr and v2.RandomCrop not in ctr and cev[1:3] == [v2.Resize, v2.CenterCrop]


def test_validation_lpips_is_measured_when_the_run_has_the_perceptual_network():
    """--perceptual lpips (issue 38): each evaluation also reports val_lpips, the network's mean over the
    validation images (here a stand-in with a known value, the L1); without the network, no such key."""
    from contextlib import nullcontext
    evaluation = lveval
    torch.manual_seed(0)
    m = loopvae.LoopVAE(img_size=16, embed_dim=32, num_blocks=1, loops=(1, 2), latent_dim=4)
    batches = [(torch.rand(b, 3, 16, 16) * 2 - 1, torch.zeros(b, dtype=torch.long)) for b in (4, 2)]
    assert "val_lpips" not in evaluation.evaluate_reconstruction(m, batches, torch.device("cpu"), nullcontext())
    m.set_perceptual(lambda x_hat, x: (x_hat - x).abs().mean())
    r = evaluation.evaluate_reconstruction(m, batches, torch.device("cpu"), nullcontext())
    assert abs(r["val_lpips"] - r["val_l1"]) < 1e-6  # weighted by batch size, as every other metric
    assert "LPIPS " in lveval.epoch_line(0, {**r, "train_loss": 1.0}, 1, 1)
