"""Frozen-backbone probes (issue 39): lab/analysis/probes.py's heads and metrics on answers known in advance,
data.py's probe data (the CIFAR mosaics, ADE20k and NYUv2 folders), and probe.py end to end."""
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

import data
import probe
import train
from test_train import TINY, fake_cifar
from analysis import probes


def test_a_linear_probe_recovers_a_linear_answer_and_fails_on_noise():
    torch.manual_seed(0)
    w = torch.randn(16, 5)
    x, xt = torch.randn(2000, 16), torch.randn(500, 16)
    res = probes.linear_probe((x, (x @ w).argmax(1)), (xt, (xt @ w).argmax(1)), 5, epochs=20)
    assert res["top1"] > 95 and res["lr"] in probes.LRS and set(res["held_out"]) == set(probes.LRS)
    noise = probes.linear_probe((x, torch.randint(0, 5, (2000,))), (xt, torch.randint(0, 5, (500,))), 5, epochs=20)
    assert noise["top1"] < 30  # chance is 20 %: labels unrelated to the features cannot be read out


def test_miou_and_rmse_on_constructed_maps():
    t = torch.tensor([[0, 0, 1, 1], [2, 2, -1, -1]])
    assert probes.miou(t.clamp_min(0), t, 3) == pytest.approx(100.0)  # ignored pixels do not count
    p = torch.tensor([[0, 1, 1, 1], [2, 2, 0, 0]])
    # class 0: 1 / 2, class 1: 2 / 3, class 2: 2 / 2
    assert probes.miou(p, t, 3) == pytest.approx(100 * (1 / 2 + 2 / 3 + 1) / 3)
    assert probes.miou(p, t, 5) == pytest.approx(100 * (1 / 2 + 2 / 3 + 1) / 3)  # absent classes do not count
    d = torch.tensor([[1.0, 2.0], [float("nan"), 4.0]])
    assert probes.rmse(torch.tensor([[1.0, 4.0], [100.0, 4.0]]), d) == pytest.approx((4 / 3) ** 0.5)


def test_dense_heads_recover_a_per_token_answer():
    """Tokens on a 4x4 grid whose class and value are linear in the token: the segmentation head reaches
    a high mIoU on the 8x8 label map, the depth heads a small RMSE."""
    torch.manual_seed(0)
    w = torch.randn(8, 3)
    x, xt = torch.randn(300, 16, 8), torch.randn(100, 16, 8)
    up = lambda v: torch.nn.functional.interpolate(v.view(-1, 1, 4, 4).float(), size=(8, 8), mode="nearest")[:, 0]
    seg = lambda a: up((a @ w).argmax(-1)).long()
    res = probes.seg_probe((x, seg(x)), (xt, seg(xt)), 3, epochs=20)
    assert res["miou"] > 60 and res["pixel_acc"] > 75
    depth = lambda a: up(a[..., 0] + 0.5 * a[..., 1])
    res = probes.depth_probe((x, depth(x)), (xt, depth(xt)), epochs=20)
    spread = float(depth(xt).std())
    assert res["linear"]["rmse"] < 0.7 * spread and res["mlp"]["rmse"] < 0.7 * spread, (res, spread)


def test_mosaics_label_each_quadrant_by_its_image_and_zoom():
    images = torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8)
    labels = torch.arange(10) * 7
    m = data.Mosaics(images, labels, n=4, size=32, seed=1)
    x, seg, zoom = m[2]
    assert x.shape == (3, 32, 32) and seg.shape == zoom.shape == (32, 32)
    for r in (0, 16):
        for c in (0, 16):
            q = seg[r:r + 16, c:c + 16]
            assert (q == q[0, 0]).all() and int(q[0, 0]) in labels.tolist()
            assert float(zoom[r, c]) in [pytest.approx(np.log2(z)) for z in (1, 1.5, 2, 3)]
    again = data.Mosaics(images, labels, n=4, size=32, seed=1)[2]
    assert all(torch.equal(a, b) for a, b in zip(again, m[2]))  # a pure function of (seed, i)
    z1 = next(i for i in range(40) if (data.Mosaics(images, labels, 40, 32, 1)[i][2][0, 0] == 0))  # zoom 1
    x, seg, _ = data.Mosaics(images, labels, 40, 32, 1)[z1]
    src = images[labels.tolist().index(int(seg[0, 0]))].float() / 255
    want = torch.nn.functional.interpolate(src[None], size=(16, 16), mode="bilinear", antialias=True,
                                           align_corners=False)[0]
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in (data.CIFAR_MEAN, data.CIFAR_STD))
    assert torch.allclose(x[:, :16, :16] * std + mean, want, atol=1e-5)  # the whole image at half resolution


def test_dense_folders_read_ade20k_and_nyu_layouts(tmp_path):
    rng = np.random.RandomState(0)
    for split in ("training", "validation"):
        os.makedirs(tmp_path / "ade" / "images" / split)
        os.makedirs(tmp_path / "ade" / "annotations" / split)
        for i in range(2):
            Image.fromarray(rng.randint(0, 255, (20, 30, 3), dtype=np.uint8)).save(tmp_path / "ade" / "images" / split
                                                                                     / f"a{i}.jpg")
            Image.fromarray(np.full((20, 30), 5, np.uint8)).save(tmp_path / "ade" / "annotations" / split / f"a{i}.png")
    ade = data.DenseFolder(str(tmp_path / "ade"), "ade20k", False, 16)
    x, y = ade[0]
    assert len(ade) == 2 and x.shape == (3, 16, 16) and y.shape == (16, 16) and (y == 4).all()  # 1..150 -> 0..149
    scene = tmp_path / "nyu" / "test" / "kitchen"
    os.makedirs(scene)
    Image.fromarray(rng.randint(0, 255, (24, 24, 3), dtype=np.uint8)).save(scene / "r0.png")
    depth_mm = np.full((24, 24), 2500, np.uint16)
    depth_mm[0, 0] = 0  # no reading
    Image.fromarray(depth_mm).save(scene / "r0_depth.png")
    Image.fromarray(rng.randint(0, 255, (24, 24, 3), dtype=np.uint8)).save(scene / "r1.jpg")
    np.save(scene / "r1_depth.npy", np.full((24, 24), 1.25, np.float32))
    nyu = data.DenseFolder(str(tmp_path / "nyu"), "nyu", False, 24)
    assert len(nyu) == 2
    (_, d0), (_, d1) = nyu[0], nyu[1]
    assert torch.isnan(d0[0, 0]) and d0[1, 1] == pytest.approx(2.5) and (d1 == 1.25).all()  # metres
    with pytest.raises(data.DataError, match="no image and target pairs"):
        data.DenseFolder(str(tmp_path / "nyu"), "nyu", True, 24)


@pytest.mark.slow
def test_probe_py_runs_each_probe_on_a_checkpoint_and_refuses_bad_input(tmp_path, capsys):
    cifar = fake_cifar(tmp_path / "data", n_train=64, n_test=32)
    assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1",
                             "--out-dir", str(tmp_path / "r")]) == 0
    ckpt = str(tmp_path / "r" / "ckpt.pt")
    base = ["--weights", ckpt, "--data-dir", cifar, "--out-dir", str(tmp_path / "p"), "--epochs", "1"]
    out = probe.main(base + ["--task", "linear"])
    assert out["num_train"] == 64 and out["num_test"] == 32 and out["feature_shape"] == [64] and 0 <= out["top1"] <= 100
    out = probe.main(base + ["--preset", "c100-probe-seg", "--num-train", "16", "--num-test", "8"])
    assert out["data"] == "cifar100 mosaics (our analogue)" and out["feature_shape"] == [64, 32] and "miou" in out
    out = probe.main(base + ["--task", "depth", "--num-train", "16", "--num-test", "8"])
    assert set(out) >= {"linear", "mlp"} and out["linear"]["rmse"] > 0
    saved = json.loads((tmp_path / "p" / "probe_depth.json").read_text())
    assert saved["mlp"]["rmse"] == out["mlp"]["rmse"] and saved["backbone"] == "--model bvit"
    assert "depth RMSE linear" in capsys.readouterr().out
    for flags, says in ((["--task", "seg", "--data", "imagenet"], "use --data ade20k"),
                        (["--task", "linear", "--data", "nyu"], "use --data cifar100 or folder"),
                        (["--task", "depth", "--data", "nyu"], "no image and target pairs"),
                        (["--weights", str(tmp_path / "none.pt")], "no such file")):
        assert probe.cli(base + flags) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("probe.py: error: ") and says in err[0], err


def test_probe_depth_reads_the_recurrent_backbone_at_that_depth_and_refuses_a_fixed_stack(tmp_path, capsys):
    """--depth N: the features are the model's at N steps (model(x, depth=N)), not at its trained depth, and land
    in probe_<task>_depth<N>.json; an untied ViT (a fixed stack of blocks) is refused in one line."""
    cifar = fake_cifar(tmp_path / "data", n_train=32, n_test=16)
    assert train.cli(TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1",
                             "--out-dir", str(tmp_path / "r")]) == 0
    ckpt = str(tmp_path / "r" / "ckpt.pt")
    base = ["--weights", ckpt, "--data-dir", cifar, "--out-dir", str(tmp_path / "p"), "--epochs", "1", "--task", "linear"]
    model, size, mean_std, _ = probe.backbone(ckpt, None, "cpu")
    _, test, _ = probe.datasets(probe.get_parser().parse_args([*base, "--data", "cifar100"]), size, mean_std)
    loader = torch.utils.data.DataLoader(test, batch_size=16)
    trained = model.depth
    feats = {d: probes.extract(model, loader, "cpu", depth=d)[0] for d in (None, trained, 2 * trained)}
    assert torch.equal(feats[None], feats[trained]) and not torch.allclose(feats[trained], feats[2 * trained])
    out = probe.main(base + ["--depth", str(2 * trained)])
    assert out["depth"] == 2 * trained and (tmp_path / "p" / f"probe_linear_depth{2 * trained}.json").is_file()
    assert not (tmp_path / "p" / "probe_linear.json").exists()
    assert train.cli([*TINY, "--model", "vit", "--data", "cifar100", "--data-dir", cifar, "--max-steps", "1",
                      "--out-dir", str(tmp_path / "v")]) == 0
    capsys.readouterr()
    assert probe.cli(["--weights", str(tmp_path / "v" / "ckpt.pt"), *base[2:], "--depth", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--depth 3" in err[0] and "fixed stack" in err[0], err
