"""Image folders as people have them (issue 13): undecodable files, hidden folders, ImageNet's flat
val/ with a labels file, Tiny-ImageNet's val layout, a val/ holding a subset of the classes.

Every folder is rebuilt from ../shared/data/imagenet-sample (real 64 px JPEGs); those tests skip
without it. The GPU-decode equivalence test makes its own JPEGs and also runs on CUDA when present.
"""
import json
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

import data
import train
from test_train import TINY
from training.flags import get_parser, parse_args

from conftest import SAMPLE  # noqa: E402  ($RVITS_DATA/imagenet-sample, else ../shared/data's)
needs_sample = pytest.mark.skipif(not os.path.isdir(SAMPLE), reason=f"{SAMPLE} not present (set RVITS_DATA)")
CLASSES = sorted(os.listdir(os.path.join(SAMPLE, "train")))[:3] if os.path.isdir(SAMPLE) else []
RUN = TINY + ["--data", "imagenet", "--img-size", "32", "--patch-size", "8", "--batch-size", "4",
              "--max-steps", "2"]


def folder(root, classes=CLASSES, n_train=4, n_val=2):
    """train/<class>/ and val/<class>/ with the first images of each class of the sample."""
    for split, n in (("train", n_train), ("val", n_val)):
        for c in classes:
            os.makedirs(root / split / c)
            for f in sorted(os.listdir(os.path.join(SAMPLE, split, c)))[:n]:
                shutil.copy(os.path.join(SAMPLE, split, c, f), root / split / c / f)
    return root


def val_truth(root):
    """{file name: class name} of val/<class>/<file>, the ground truth of the flat layouts."""
    return {f: c for c in os.listdir(root / "val") for f in os.listdir(root / "val" / c)}


def flatten_val(root, sub=""):
    """Move every val/<class>/<file> to val/<sub>/<file>; returns the ground truth."""
    truth = val_truth(root)
    os.makedirs(root / "val" / sub, exist_ok=True)
    for f, c in truth.items():
        shutil.move(root / "val" / c / f, root / "val" / sub / f)
    for c in set(truth.values()):
        os.rmdir(root / "val" / c)
    return truth


def labels_of(samples, classes):
    return {os.path.basename(p): classes[y] for p, y in samples}


@needs_sample
def test_hidden_folders_and_files_are_ignored(tmp_path):
    root = folder(tmp_path)
    for where in ("train", "val", f"train/{CLASSES[0]}"):
        os.makedirs(root / where / ".ipynb_checkpoints")
        shutil.copy(next((root / "train" / CLASSES[0]).iterdir()), root / where / ".ipynb_checkpoints" / "x.JPEG")
    (root / "train" / CLASSES[1] / "._a.JPEG").write_bytes(b"macOS resource fork, not an image")
    classes, tr, va = data.image_folder(str(root))
    assert classes == CLASSES and len(tr) == 12 and len(va) == 6
    assert not any("/." in p for p, _ in tr + va)


@needs_sample
def test_val_subset_of_classes_is_mapped_by_name(tmp_path):
    root = folder(tmp_path)
    shutil.rmtree(root / "val" / CLASSES[0])  # val holds classes 1 and 2 only
    classes, _, va = data.image_folder(str(root))
    assert labels_of(va, classes) == val_truth(root) and {y for _, y in va} == {1, 2}


@needs_sample
def test_flat_val_with_a_labels_file(tmp_path):
    root = folder(tmp_path)
    truth = flatten_val(root)
    lines = ["ImageId,PredictionString"] + [f"{os.path.splitext(f)[0]},{c} 1 2 3 4" for f, c in truth.items()]
    (tmp_path / "LOC_val_solution.csv").write_text("\n".join(lines) + "\n")  # ImageNet's own format
    classes, _, va = data.image_folder(str(root), str(tmp_path / "LOC_val_solution.csv"))
    assert labels_of(va, classes) == truth
    (tmp_path / "labels.txt").write_text("".join(f"{f} {c}\n" for f, c in truth.items()))
    assert labels_of(data.image_folder(str(root), str(tmp_path / "labels.txt"))[2], classes) == truth


@needs_sample
def test_tiny_imagenet_val_layout_is_recognized(tmp_path):
    root = folder(tmp_path)
    truth = flatten_val(root, "images")
    (root / "val" / "val_annotations.txt").write_text(
        "".join(f"{f}\t{c}\t0\t0\t63\t63\n" for f, c in truth.items()))
    classes, _, va = data.image_folder(str(root))
    assert labels_of(va, classes) == truth


@pytest.mark.slow
@needs_sample
@pytest.mark.parametrize("case, says", [
    ("val class not in train", "class folder nzzz is not in train/"),
    ("empty class folder", "Found no valid file"),
    ("flat val without labels", "--val-labels"),
    ("labels file naming an unknown class", "line 1"),
    ("unlabelled val file", "has no line in"),
    ("labels file for class folders", "drop --val-labels"),
])
def test_layout_problems_are_one_line_exit_2(tmp_path, capsys, case, says):
    root = folder(tmp_path / "d")
    flags = []
    if case == "val class not in train":
        os.makedirs(root / "val" / "nzzz")
        shutil.copy(next((root / "val" / CLASSES[0]).iterdir()), root / "val" / "nzzz" / "a.JPEG")
    elif case == "empty class folder":
        os.makedirs(root / "train" / "nempty")
    elif case == "flat val without labels":
        flatten_val(root)
    elif case == "labels file for class folders":
        (tmp_path / "labels.txt").write_text("".join(f"{f} {c}\n" for f, c in val_truth(root).items()))
        flags = ["--val-labels", str(tmp_path / "labels.txt")]
    else:
        truth = flatten_val(root)
        rows = [f"{f} {c}" for f, c in truth.items()]
        rows = ["a.JPEG n99999999"] + rows if "unknown" in case else rows[1:]
        (tmp_path / "labels.txt").write_text("\n".join(rows) + "\n")
        flags = ["--val-labels", str(tmp_path / "labels.txt")]
    rc = train.cli(RUN + ["--data-dir", str(root), "--out-dir", str(tmp_path / "o")] + flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and says in err[0] and "expected" in err[0], err


def test_grayscale_cmyk_and_rgba_files_decode_as_rgb(tmp_path):
    rng = np.random.RandomState(0)
    samples = []
    for mode, ext in (("L", "jpg"), ("CMYK", "jpg"), ("RGBA", "png"), ("P", "png")):
        img = Image.fromarray(rng.randint(0, 256, (40, 48, 3), dtype=np.uint8)).convert(mode)
        img.save(tmp_path / f"{mode}.{ext}")
        samples.append((str(tmp_path / f"{mode}.{ext}"), 0))
    t = data.build_transform(False, 32, data.IMAGENET_MEAN, data.IMAGENET_STD, "imagenet")
    ds = data.ImageFiles(samples, ["a"], t, 32)
    assert all(ds[i][0].shape == (3, 32, 32) and ds[i][1] == 0 for i in range(len(ds)))


def truncate_one(root):
    victim = sorted((root / "train" / CLASSES[1]).iterdir())[0]
    victim.write_bytes(victim.read_bytes()[:400])  # "Truncated File Read" in PIL
    return victim


@pytest.mark.slow
@needs_sample
def test_a_truncated_jpeg_is_skipped_named_and_counted_with_worker_processes(tmp_path, capsys):
    root = folder(tmp_path / "d")
    victim = truncate_one(root)
    out = tmp_path / "o"
    rc = train.cli(RUN + ["--data-dir", str(root), "--out-dir", str(out), "--workers", "1", "--max-steps", "3"])
    err = capsys.readouterr().err
    assert rc == 0 and f"skipped undecodable image {victim}" in err and "Traceback" not in err, err
    rec = json.loads((out / "log.jsonl").read_text().splitlines()[0])
    assert rec["skipped_images"] == 1 and rec["step"] == 3  # 12 images, batch 4: the whole epoch


@pytest.mark.slow
@needs_sample
def test_past_max_bad_images_the_run_stops_naming_the_file_and_keeps_the_checkpoint(tmp_path, capsys):
    root = folder(tmp_path / "d")
    out = tmp_path / "o"
    assert train.cli(RUN + ["--data-dir", str(root), "--out-dir", str(out), "--max-steps", "3", "--epochs", "2"]) == 0
    before = (out / "ckpt.pt").read_bytes()
    victim = truncate_one(root)
    capsys.readouterr()
    rc = train.cli(RUN + ["--data-dir", str(root), "--out-dir", str(out), "--max-steps", "6", "--epochs", "2",
                          "--max-bad-images", "0", "--resume", str(out / "ckpt.pt")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]  # not the progress bar
    assert rc == 2 and len(err) == 1 and str(victim) in err[0] and "--max-bad-images" in err[0], err
    assert (out / "ckpt.pt").read_bytes() == before


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_device_decode_path_matches_pil_after_the_same_crop(tmp_path, device):
    # DeviceDecodeLoader (torchvision's JPEG decoder, nvJPEG on CUDA, + the transforms on device
    # tensors) vs ImageFiles (PIL + the same transforms), same per-image seeds, hence the same
    # RandomResizedCrop and flip. Smooth random 60x80 JPEGs and one PNG (the CPU fallback).
    rng = np.random.RandomState(0)
    samples = []
    for k in range(24):
        img = Image.fromarray(rng.randint(0, 256, (3, 4, 3), dtype=np.uint8)).resize((80, 60), Image.BICUBIC)
        path = str(tmp_path / f"{k}.{'png' if k == 5 else 'jpg'}")
        img.save(path)
        samples.append((path, k % 3))
    t = data.build_transform(True, 48, data.IMAGENET_MEAN, data.IMAGENET_STD, "imagenet")
    files = data.ImageFiles(samples, ["a", "b", "c"], t, 48)
    cpu = data.build_loader(files, 8, True, seed=3, workers=0)
    dev = data.DeviceDecodeLoader(files, 8, seed=3, workers=0, device=device)
    std = torch.tensor(data.IMAGENET_STD).view(1, 3, 1, 1) * 255
    n = 0
    for (xa, ya), (xb, yb) in zip(cpu, dev):
        assert torch.equal(ya, yb) and xb.device.type == device
        assert ((xa - xb.cpu()) * std).abs().mean() <= 2.0  # pixel units (0.000 on CPU-2)
        n += len(ya)
    assert n == 24


# ----------------------------------------------------------------------------- the evaluation crop (--eval-crop-ratio)
def framed(side=128, frame=8):
    """A black square image with a white frame of `frame` px (1/16 of the side: what a 0.875 crop cuts)."""
    a = np.full((side, side, 3), 255, dtype=np.uint8)
    a[frame:-frame, frame:-frame] = 0
    return Image.fromarray(a)


@pytest.mark.slow
def test_eval_crop_ratio_1_keeps_the_whole_image_and_0_875_cuts_its_border():
    """Resize the short side to img_size / ratio, then the center crop of img_size (DeiT III's
    --eval-crop-ratio): at 1.0 (the reViT paper's Table 6) the frame is in the picture, at 0.875 (56 px
    from 64) the crop cuts exactly the outer 1/16 on each side, the frame. CIFAR has no crop."""
    def evaluated(ratio):
        t = data.build_transform(False, 56, (0, 0, 0), (1, 1, 1), "imagenet", crop_ratio=ratio)
        return t(framed()).mean(0)  # (56, 56), in [0, 1]
    whole, cut = evaluated(1.0), evaluated(0.875)
    assert whole.shape == cut.shape == (56, 56)
    assert whole[0].mean() > 0.9 and whole[:, 0].mean() > 0.9 and 0.15 < (whole > 0.5).float().mean() < 0.3
    assert (cut > 0.5).sum() == 0 and cut[0].mean() < 0.2  # (the resize blurs the edge a little)
    cifar = [type(op) for op in data.build_transform(False, 32, (0,) * 3, (1,) * 3, "cifar100", crop_ratio=0.5).transforms]
    assert v2.Resize not in cifar and v2.CenterCrop not in cifar


@pytest.mark.slow
def test_eval_crop_ratio_reaches_the_validation_transform_and_bad_values_are_one_line(tmp_path, capsys):
    from test_presets import fake_imagenet
    root = fake_imagenet(tmp_path / "in")
    p = get_parser()
    for flags, side in (([], 36), (["--eval-crop-ratio", "1.0"], 32)):  # int(32 / 0.875) = 36
        args = parse_args(p, ["--data", "imagenet", "--data-dir", root, "--img-size", "32", *flags])
        val = train.load_data(args, p)[2]
        assert [op.size for op in val.transform.transforms if isinstance(op, v2.Resize)] == [[side]], flags
    for argv, says in ((["--data", "imagenet", "--eval-crop-ratio", "0"], "must be > 0"),
                       (["--data", "imagenet", "--eval-crop-ratio", "1.2"], "must be in (0, 1]"),
                       (["--eval-crop-ratio", "1.0"], "--data cifar100 is evaluated whole")):
        capsys.readouterr()
        assert train.cli([*argv, "--print-config"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--eval-crop-ratio" in err[0] and says in err[0], err


# ----------------------------------------------------------------------------- pixels and label files as people have them (issue 24)
def ramp(h=40, w=48):
    return np.arange(h * w, dtype=np.float64).reshape(h, w) / (h * w - 1)  # 0 .. 1


@pytest.mark.parametrize("mode, ext, make, bits", [
    ("L", "png", lambda r: (r * 255).astype(np.uint8), 8),
    ("I;16", "png", lambda r: (r * 65535).astype(np.uint16), 16),  # a 16-bit grayscale PNG
    ("I;16", "tif", lambda r: (r * 65535).astype(np.uint16), 16),
    ("I", "tif", lambda r: (r * 65535).astype(np.int32), 16),  # 32-bit integer holding 16-bit data
    ("I", "tif", lambda r: (r * (2 ** 31 - 1)).astype(np.int32), 31),  # the positive range of int32
    ("F", "tif", lambda r: r.astype(np.float32), None),  # float in [0, 1]
    ("RGB", "png", lambda r: np.stack([(r * 255).astype(np.uint8)] * 3, -1), 8),
    ("LA", "png", lambda r: np.stack([(r * 255).astype(np.uint8)] * 2, -1), 8),
])
@pytest.mark.parametrize("path", ["cpu", "device decode"])
def test_every_pil_mode_decodes_to_the_files_mean_pixel(tmp_path, mode, ext, make, bits, path):
    """PIL's convert("RGB") clips values above 255: a 16-bit PNG decoded all white (mean 255). Both
    decode paths (ImageFiles, and DeviceDecodeLoader's CPU fallback for non-JPEGs) now scale to 8
    bits: the decoded mean is the file's mean in 8-bit units."""
    arr = make(ramp())
    file = tmp_path / f"img.{ext}"
    Image.fromarray(arr).save(file)
    assert Image.open(file).mode == mode  # the file holds what the case says
    raw = np.asarray(Image.open(file)).astype(np.float64)
    gray = raw[..., 0] if raw.ndim == 3 else raw
    gray = np.clip(gray * 255 if bits is None else np.floor(gray / 2 ** (bits - 8)), 0, 255)  # the file in 8 bits
    t = data.build_transform(False, 40, (0.0,) * 3, (1 / 255,) * 3, "imagenet")  # pixels in 0..255 units
    want = t(Image.fromarray(gray.astype(np.uint8), "L").convert("RGB")).mean().item()  # same resize and crop
    files = data.ImageFiles([(str(file), 0)], ["a"], t, 40)
    if path == "cpu":
        x = files[0][0]
    else:
        x = data.DeviceDecodeLoader(files, 1, workers=0, device="cpu").decode(
            [(torch.frombuffer(bytearray(file.read_bytes()), dtype=torch.uint8), 0, 0, 0)])[0][0]
    assert abs(x.mean().item() - want) < 1.0, (mode, x.mean().item(), want)
    assert want > 100  # a mid-gray ramp: all-white (255) or all-black (0) would fail


def write(path, text, encoding="utf-8"):
    path.write_bytes(text.encode(encoding))
    return str(path)


def test_label_files_as_spreadsheets_write_them(tmp_path):
    classes = {"n01": 0, "n02": 1}
    want = {"a 1.jpg": 0, "b.jpg": 1, "c,2.jpg": 0}
    rows = [("a 1.jpg", "n01"), ("b.jpg", "n02"), ("c,2.jpg", "n01")]
    quoted = lambda sep: "".join(f'"{f}"{sep}{c}\r\n' for f, c in rows)  # noqa: E731
    cases = {
        "CSV UTF-8 (byte-order mark), header": write(tmp_path / "bom.csv", "\ufefffile,class\r\n" + quoted(","), "utf-8"),
        "semicolon (European Excel)": write(tmp_path / "semi.csv", "Filename;Label\n" + quoted(";")),
        "tab separated": write(tmp_path / "tab.tsv", quoted("\t")),
        "UTF-16 (Unicode text)": write(tmp_path / "u16.txt", "\ufeff" + quoted("\t"), "utf-16-le"),
    }
    for name, path in cases.items():
        assert data.read_labels(path, classes) == want, name
    plain = write(tmp_path / "plain.txt", "b.jpg n02\n# a comment\n\nx.jpg n01 0 0 63 63\n")  # whitespace, extra fields
    assert data.read_labels(plain, classes) == {"b.jpg": 1, "x.jpg": 0}
    latin = tmp_path / "latin.csv"
    latin.write_bytes("b.jpg,n02\n".encode() + "caf\u00e9.jpg,n01\n".encode("latin-1"))
    with pytest.raises(data.DataError, match="line 2: not UTF-8 text"):
        data.read_labels(str(latin), classes)
    with pytest.raises(data.DataError, match="line 2: 'b.jpg;n99'"):
        data.read_labels(write(tmp_path / "bad.csv", "a.jpg;n01\nb.jpg;n99\n"), classes)


# ----------------------------------------------------------------------------- a batch or an epoch with nothing in it (issue 24)
@pytest.mark.slow
@needs_sample
def test_a_step_whose_only_image_is_undecodable_makes_no_optimizer_step(tmp_path, capsys):
    root = folder(tmp_path / "d")  # 12 training images
    truncate_one(root)
    out = tmp_path / "o"
    rc = train.cli(RUN + ["--data-dir", str(root), "--out-dir", str(out), "--batch-size", "1", "--max-steps", "12",
                          "--eval-batch-size", "4"])
    assert rc == 0, capsys.readouterr().err
    rec = json.loads((out / "log.jsonl").read_text().splitlines()[0])
    assert rec["step"] == 12 and np.isfinite(rec["train_loss"]) and rec["skipped_images"] == 1
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert {float(s["step"]) for s in ck["optimizer"]["state"].values()} == {11.0}  # 12 steps, one without an image


@pytest.mark.slow
@needs_sample
def test_a_validation_set_without_a_usable_image_is_one_line_after_the_epoch_is_saved(tmp_path, capsys):
    root = folder(tmp_path / "d")
    for f in (root / "val").rglob("*.JPEG"):
        f.write_bytes(b"not an image")
    out = tmp_path / "o"
    rc = train.cli(RUN + ["--data-dir", str(root), "--out-dir", str(out), "--max-steps", "3"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert rc == 2 and len(err) == 1 and "no validation image could be used" in err[0], err
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["step"] == 3 and ck["epoch"] == 1  # the epoch's training is kept


# ----------------------------------------------------------------------------- valid input once refused (issue 30)
def images(root, tree):
    """Small distinct PNGs at root/<path> for each path of `tree`; returns root."""
    for k, path in enumerate(tree):
        os.makedirs(os.path.dirname(root / path), exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), 10 * k, np.uint8)).save(root / path)
    return root


def test_class_names_with_spaces_or_quotes_in_a_labels_file_are_whole_names(tmp_path):
    """Stanford Dogs and Fruits-360 name classes with spaces; a CSV field (quoted or not) and the rest of
    a whitespace-separated line are the class; Tiny-ImageNet's box fields still follow a one-word class."""
    classes = {"golden retriever": 0, "pug": 1, "n01": 2}
    csv_file = write(tmp_path / "dogs.csv",
                     'file,label\nv1.jpg,golden retriever\n"v2.jpg","golden retriever"\nv3.jpg,pug\n')
    assert data.read_labels(csv_file, classes) == {"v1.jpg": 0, "v2.jpg": 0, "v3.jpg": 1}
    plain = write(tmp_path / "dogs.txt", "v1.jpg golden retriever\nv3.jpg pug\nv4.jpg n01 0 0 63 63\n")
    assert data.read_labels(plain, classes) == {"v1.jpg": 0, "v3.jpg": 1, "v4.jpg": 2}


def test_class_folders_differing_only_in_unicode_normalization_match(tmp_path):
    """val/ copied from macOS (NFD: 'e' + a combining accent) beside train/ in NFC: the same class, for
    class folders and for a labels file."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    root = images(tmp_path / "d", [f"train/{nfc}/a.png", "train/tea/b.png", f"val/{nfd}/c.png", "val/tea/d.png"])
    classes, _, va = data.image_folder(str(root))
    assert classes == [nfc, "tea"] and sorted(y for _, y in va) == [0, 1]
    flat = images(tmp_path / "flat", [f"train/{nfc}/a.png", "train/tea/b.png", "val/c.png"])
    labels = write(tmp_path / "labels.csv", f"c.png,{nfd}\n")
    assert data.image_folder(str(flat), labels)[2] == [(str(flat / "val" / "c.png"), 0)]


def test_symbolic_links_are_followed_but_no_image_counts_twice_or_under_another_class(tmp_path):
    """A file link into another class counts in the class where the image lives; a folder linked twice
    and a link cycle (a folder linking to its parent) add nothing; a link to an image outside counts."""
    root = images(tmp_path / "d", ["train/a/1.png", "train/a/2.png", "train/b/3.png", "outside/4.png",
                                   "val/a/5.png", "val/b/6.png"])
    os.symlink("../a/1.png", root / "train" / "b" / "1-again.png")  # a's image, linked from b
    os.symlink("..", root / "train" / "a" / "up")  # a cycle: train/a/up/a/up/...
    os.symlink("../b", root / "train" / "a" / "b-again")  # b's folder inside a
    os.symlink("../../outside/4.png", root / "train" / "b" / "4.png")  # a link farm's usual link
    classes, tr, va = data.image_folder(str(root))
    got = sorted((os.path.basename(p), classes[y]) for p, y in tr)
    assert got == [("1.png", "a"), ("2.png", "a"), ("3.png", "b"), ("4.png", "b")] and len(va) == 2


@pytest.mark.slow
def test_eval_only_needs_the_class_names_only(tmp_path, capsys):
    """--eval-only of an image-folder checkpoint reads val/ alone: train/ may be gone, and the
    training set need not hold one training batch; the class names come from the checkpoint."""
    tree = [f"{s}/{c}/{k}.png" for s in ("train", "val") for c in ("ant", "bee") for k in range(4)]
    root = images(tmp_path / "d", tree)
    flags = TINY + ["--data", "imagenet", "--data-dir", str(root), "--img-size", "16", "--patch-size", "8"]
    assert train.cli(flags + ["--max-steps", "1", "--out-dir", str(tmp_path / "o")]) == 0
    shutil.rmtree(root / "train")
    shutil.rmtree(root / "val" / "ant")  # (a subset of the classes, mapped by the checkpoint's names)
    assert train.cli(["--eval-only", "--resume", str(tmp_path / "o"), "--eval-depths", "2", "--out-dir",
                      str(tmp_path / "ev")]) == 0, capsys.readouterr().err
    res = json.load(open(tmp_path / "ev" / "depth_eval.json"))["results"]
    assert [r["depth"] for r in res] == [2]


# ----------------------------------------------------------------------------- any image folder (issue 79, item 7)
def small_pngs(root, side=32, h=None, n=4):
    """train/ and val/ of two classes, n distinct side x h PNGs each (default square); returns root."""
    rng = np.random.RandomState(0)
    for split in ("train", "val"):
        for c in ("cat", "dog"):
            os.makedirs(root / split / c)
            for i in range(n):
                Image.fromarray(rng.randint(0, 256, (h or side, side, 3)).astype(np.uint8)).save(root / split / c / f"{i}.png")
    return root


@pytest.mark.parametrize("w, h, img_size, patch, says", [
    (32, 32, 224, None, "about 32x32 px (median of 8 files); --img-size 224 upsamples each to 49x its pixels "
                        "(49x the patches, the compute, at one --patch-size); --img-size 32 trains at their size"),
    (32, 32, 64, None, "to 4x its pixels"), (28, 28, 224, 16, "--img-size 32 trains"), (40, 16, 224, None, "31x"),
    (32, 32, 63, None, None), (32, 32, 48, None, None), (40, 16, 64, None, None)])
def test_images_much_smaller_than_img_size_are_said_with_the_factor_and_the_flag(tmp_path, w, h, img_size, patch, says):
    """Both median sides at most half of --img-size: one line with their size, (img_size / side)^2 and the --img-size
    that trains at their size (a multiple of the patch); otherwise nothing."""
    train_set, *_ = data.build_datasets("folder", str(small_pngs(tmp_path, w, h)), img_size)
    line = data.small_images(train_set, img_size, patch)
    assert (line is None) if says is None else (says in line and line.startswith("note: ") and "\n" not in line)


def test_folder_and_imagenet_are_one_reader_with_one_pipeline(tmp_path):
    """--data folder is --data imagenet under its general name: the same samples, classes, normalization, default
    size and augmentation draws (the same tensors under one seed), the same resolved defaults."""
    from training.flags import default_img_size, effective
    root = str(small_pngs(tmp_path))
    a, b = data.build_datasets("folder", root), data.build_datasets("imagenet", root)
    assert a[2:] == b[2:] == (2, 224) and a[0].samples == b[0].samples and a[1].classes == b[1].classes
    for k in (0, 1):
        torch.manual_seed(5)
        x = a[k][3][0]
        torch.manual_seed(5)
        assert torch.equal(x, b[k][3][0])
    assert data.normalization("folder") == data.normalization("imagenet") == (data.IMAGENET_MEAN, data.IMAGENET_STD)
    args = parse_args(get_parser(), ["--data", "folder"])
    assert default_img_size(args) == effective("img_size", None, {"data": "folder"}) == 224


@pytest.mark.slow
def test_a_folder_of_32px_images_is_said_before_training_at_224px(tmp_path, capsys):
    """Issue 79, item 7: `--data folder` on 32-px images without --img-size says so in one line before the first
    step; at --img-size 32 nothing is said; both count skipped images as an image folder does."""
    root = str(small_pngs(tmp_path / "d"))
    job = TINY + ["--data", "folder", "--data-dir", root, "--batch-size", "4", "--max-steps", "1", "--epochs", "1"]
    assert train.cli(job + ["--out-dir", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    said = [ln for ln in out.splitlines() if "32x32 px" in ln]
    assert said == [said[0]] and "49x" in said[0] and "--img-size 32 trains" in said[0]
    assert out.index(said[0]) < out.index("params,")  # before the model's line, the first of the run
    assert train.cli(job + ["--img-size", "32", "--out-dir", str(tmp_path / "b")]) == 0
    assert "px (median" not in capsys.readouterr().out
    for run in "ab":
        assert json.loads((tmp_path / run / "log.jsonl").read_text().splitlines()[0])["skipped_images"] == 0
