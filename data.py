"""Datasets and loaders for rvits: CIFAR-100, ImageNet (ImageFolder) and synthetic images.

- `cifar100`: the standard `cifar-100-python` pickles (train, test, meta), read directly, so a
  copy whose bytes differ from the official archive (e.g. ../shared/data) works. `--download`
  fetches the official archive through torchvision.
- `folder` (or `imagenet`, ImageNet's name for it): any image folder `train/<class>/*` with `val/<class>/*`
  (any subset of the classes),
  a flat `val/` + a labels file, or Tiny-ImageNet's `val/images/` + `val_annotations.txt`
  (`image_folder`); undecodable files are skipped (`ImageFiles`, `drop_undecodable`).
- `synthetic`: deterministic random images, for smoke tests and benchmarks only.

The data root defaults to $RVITS_DATA, else ./data. Each DDP rank sees a
disjoint shard. Loaders yield `(images, labels)` batches: images float (B, 3, H, W) normalized
(by the dataset's mean and std, or as the model asks: LoopVAE's [-1, 1], `build_datasets`' mean_std),
labels int64 (B,). `build_loaders` picks the loaders of a run (below).

Which path augments a training image (`build_loaders`; train.py's flags):
- the batched path, `random_crop_flip` inside `DeviceCIFARLoader` (crop + flip only, on the whole
  batch): CIFAR-100 at 32 px on CUDA (the lab's c100-gpu-* arms), and on the CPU with `--workers 0`
  (the lab's c100-mini-* arms), unless the run's `build_transform` holds anything else (--randaug,
  --three-augment, another --img-size; `batched_loader` reads the pipeline itself) or --cpu-loader;
- the per-image path, `build_transform` in a DataLoader: every other CIFAR run (the c100-* presets,
  with RandAugment; the CPU default --workers 2), ImageNet-style folders on the CPU or with
  --cpu-loader, synthetic images (no augmentation);
- `DeviceDecodeLoader`: image folders on CUDA, JPEGs decoded on the GPU, then `build_transform`'s
  training transform per image there.
So CIFAR's crop + flip exists twice: `build_transform`'s v2.RandomCrop + RandomHorizontalFlip and
`random_crop_flip`. Both take their padding from `crop_padding` and flip with probability 1/2; an
edit to one alone fails tests/test_speed.py's
test_per_image_and_batched_cifar_augmentation_draw_the_same_crops_and_flips.
"""
import atexit
import csv
import ctypes
import io
import math
import multiprocessing.util  # noqa: F401  (its exit handler first, end_workers' after)
import os
import pickle
import shutil
import signal
import threading
import sys
import unicodedata
import warnings
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import v2
from tqdm import tqdm

CIFAR_MEAN, CIFAR_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DATASETS = ("cifar100", "folder", "imagenet", "synthetic")
FOLDERS = ("folder", "imagenet")  # image folders (image_folder): `imagenet` names ImageNet's layout, the same reader


class DataError(Exception):
    """A dataset is missing or unreadable; the message says where we looked and what to do."""


def default_root():
    return os.environ.get("RVITS_DATA", "./data")


class CifarUnpickler(pickle.Unpickler):
    """Unpickler that builds only what a CIFAR file holds: dicts, lists, strings, numbers and numpy
    arrays. Any other global (a function such as os.system, any class) is refused before it is
    called, so a crafted file cannot run code (plain pickle.load would run it)."""
    ALLOWED = {(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray")  # numpy 1 / 2 names
               for n in ("_reconstruct", "scalar")} | {("numpy", "ndarray"), ("numpy", "dtype"),
                                                      ("_codecs", "encode")}  # protocol-2 bytes from Python 3

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise RefusedGlobal(f"{module}.{name}")
        return super().find_class(module, name)


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle referenced a global that CifarUnpickler does not allow (its name is the message)."""


def load_cifar100(root, train, download=False):
    """Read CIFAR-100 from `root/cifar-100-python/{train,test}` (or `root` itself).

    Returns (images uint8 (N, 3, 32, 32), labels int64 (N,)) with the 100 fine labels.
    Raises DataError when the files are missing (naming the directory and `--download`), corrupt,
    or reference any Python global other than numpy's array reconstruction (CifarUnpickler), and when
    the download fails (offline, a partial or corrupt archive: named).
    """
    split = "train" if train else "test"
    candidates = [os.path.join(root, "cifar-100-python"), root]
    folder = next((c for c in candidates if os.path.isfile(os.path.join(c, split))), None)
    if folder is None and download:
        from torchvision.datasets import CIFAR100  # official archive, md5-checked by torchvision
        try:
            CIFAR100(root, train=train, download=True)
        except Exception as e:  # offline (URLError), an archive cut short or corrupt (its md5, tarfile), a full disk
            archive = os.path.join(root, CIFAR100.filename)
            part = f"; {archive} ({os.path.getsize(archive) / 2 ** 20:.0f} MB) is incomplete or corrupt (a run " \
                "that can download fetches it anew)" if os.path.isfile(archive) else ""
            raise DataError(f"--download: fetching CIFAR-100 into {root} failed ({type(e).__name__}: "
                            f"{(str(e).strip().splitlines() or [''])[0][:200]}){part}; run again where the download "
                            "works, or copy cifar-100-python/ from a machine that has it into --data-dir")
        folder = candidates[0]
    if folder is None:
        raise DataError(f"CIFAR-100 not found: no '{split}' file in {candidates[0]} or {root}; "
                        "pass --data-dir DIR containing cifar-100-python/ (or set RVITS_DATA), "
                        "or fetch it once with `python train.py --download --data-dir DIR ...`")
    path = os.path.join(folder, split)
    try:
        with open(path, "rb") as f:
            d = CifarUnpickler(f, encoding="latin1").load()
        images = torch.as_tensor(d["data"], dtype=torch.uint8).view(-1, 3, 32, 32)
        labels = torch.as_tensor(d["fine_labels"], dtype=torch.int64)
    except RefusedGlobal as e:
        raise DataError(f"CIFAR-100 file {path} refused: it references the Python global {e}, which a "
                        "CIFAR file never holds (it could run code); nothing was executed; use a trusted copy")
    except Exception as e:  # truncated pickle, wrong keys, wrong sizes
        raise DataError(f"CIFAR-100 file {path} is unreadable ({type(e).__name__}: {e}); "
                        "delete it and re-run with --download, or point --data-dir at a good copy")
    if len(images) != len(labels) or len(images) == 0:
        raise DataError(f"CIFAR-100 file {path} holds {len(images)} images and {len(labels)} labels")
    return images, labels


class TensorImages(Dataset):
    """uint8 images (N, C, H, W) + labels (N,), with a per-image torchvision v2 transform; `mean_std`:
    the (mean, std) per channel the transform normalizes with (DeviceCIFARLoader applies the same)."""

    def __init__(self, images, labels, transform, mean_std=(CIFAR_MEAN, CIFAR_STD)):
        self.images, self.labels, self.transform, self.mean_std = images, labels, transform, mean_std

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(self.images[i]), self.labels[i]


class SyntheticImages(Dataset):
    """`n` random uint8 images (3, size, size); image i is a pure function of (seed, i) and its
    label is i % num_classes, so every rank and every run sees the same data."""

    def __init__(self, n, size, num_classes, transform, seed=0):
        self.n, self.size, self.num_classes, self.transform, self.seed = n, size, num_classes, transform, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        img = torch.randint(0, 256, (3, self.size, self.size), generator=g, dtype=torch.uint8)
        return self.transform(img), torch.tensor(i % self.num_classes)


def three_augment(img_size, dataset, color_jitter=0.3):
    """DeiT III's "simple random crop" + 3-Augment (Touvron et al. 2022, section 3): resize (ImageNet),
    random crop with 4 px reflect padding, flip, then one of grayscale / solarization / Gaussian
    blur chosen uniformly, then color jitter: brightness, contrast and saturation each by a factor
    in [1 - c, 1 + c], no hue (DeiT III's --color-jitter c, default 0.3; 0 = none)."""
    ops = [v2.Resize(img_size, antialias=True)] if dataset in FOLDERS else []
    return ops + [
        v2.RandomCrop(img_size, padding=4, padding_mode="reflect"), v2.RandomHorizontalFlip(),
        v2.RandomChoice([v2.Grayscale(num_output_channels=3), v2.RandomSolarize(128, p=1.0),
                         v2.GaussianBlur(kernel_size=7, sigma=(0.1, 2.0))])] + \
        ([v2.ColorJitter(color_jitter, color_jitter, color_jitter)] if color_jitter else [])


def crop_padding(img_size):
    """Zero padding of CIFAR's training crop, for both augmentation paths (module docstring):
    img_size / 8, i.e. 4 px at 32 px, the standard CIFAR random crop."""
    return img_size // 8


def build_transform(train, img_size, mean, std, dataset, randaug=0, augment=True, three_aug=False, reconstruct=False,
                    color_jitter=0.3, crop_ratio=0.875, reprob=0.0):
    """torchvision v2 pipeline on uint8 images -> normalized float (3, img_size, img_size).

    `reconstruct` (a tokenizer, LoopVAE: arXiv 2609.11516, sec. 4.1) on image folders: the short side
    resized to img_size (bicubic), then a random crop of img_size (training) or the centre crop
    (evaluation); no zoomed-in RandomResizedCrop and no 0.875 crop. CIFAR keeps its pipeline.

    CIFAR (bicubically resized first when img_size is not 32) training: random crop with
    crop_padding(img_size) zero padding + horizontal flip (the same draws as the batched
    `random_crop_flip`; module docstring); ImageNet training:
    RandomResizedCrop + flip; `three_aug`: DeiT III's simple random crop + 3-Augment instead, with
    `color_jitter` (three_augment); evaluation: CIFAR as is, ImageNet the short side resized to
    int(img_size / crop_ratio) + the center crop of img_size (DeiT III's --eval-crop-ratio: 0.875, the
    usual 256 -> 224; 1.0, the reViT paper's Table 6: the short side resized to img_size, nothing cut
    from it). `randaug` > 0 adds RandAugment(num_ops=2, magnitude=randaug). `reprob` > 0 (training) erases one
    rectangle per image with that probability after normalization, each pixel drawn from N(0, 1): DeiT's random
    erasing (--reprob 0.25, timm's mode "pixel", one count; area 2-33 % of the image, aspect 0.3-3.3, torchvision's
    RandomErasing defaults and timm's); like RandAugment, not in a tokenizer's image-folder crops.
    """
    ops, erase = [v2.ToImage()], []
    if dataset == "cifar100" and img_size != 32:  # upsampled, as when fine-tuning at 224 px (DeiT)
        ops.append(v2.Resize(img_size, interpolation=v2.InterpolationMode.BICUBIC, antialias=True))
    if dataset in FOLDERS and reconstruct:
        ops += [v2.Resize(img_size, interpolation=v2.InterpolationMode.BICUBIC, antialias=True),
                v2.RandomCrop(img_size) if train and augment else v2.CenterCrop(img_size)]
    elif train and augment:
        if three_aug:
            ops += three_augment(img_size, dataset, color_jitter)
        elif dataset in FOLDERS:
            ops += [v2.RandomResizedCrop(img_size, antialias=True), v2.RandomHorizontalFlip()]
        else:
            ops += [v2.RandomCrop(img_size, padding=crop_padding(img_size)), v2.RandomHorizontalFlip()]
        if randaug:
            ops.append(v2.RandAugment(num_ops=2, magnitude=randaug))
        if reprob:  # after the normalization, as DeiT's (timm's) random erasing
            erase = [v2.RandomErasing(p=reprob, value="random")]
    elif dataset in FOLDERS:
        ops += [v2.Resize(int(img_size / crop_ratio), antialias=True), v2.CenterCrop(img_size)]
    return v2.Compose(ops + [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)] + erase)


class MixAndSmooth:
    """The training targets of a batch on its device (train.py's step; bench.py times the same):
    MixUp / CutMix (torchvision v2, one of the two chosen per batch when both --mixup and --cutmix are
    on; `mix=False` leaves them out) and label smoothing (--label-smoothing; with --bce every class in
    a mix is a positive, as DeiT III's code does). `(x, y)` with x (B, C, H, W) and y (B,) class
    indices -> (x, y) with y (B,) indices or (B, num_classes) probabilities."""

    def __init__(self, args, num_classes, mix=True):
        self.num_classes, self.eps, self.bce = num_classes, args.label_smoothing, args.bce
        mixes = ([v2.MixUp(alpha=args.mixup, num_classes=num_classes)] if args.mixup else []) + \
                ([v2.CutMix(alpha=args.cutmix, num_classes=num_classes)] if args.cutmix else [])
        self.mix = v2.RandomChoice(mixes) if mixes and mix else None

    def __call__(self, x, y):
        if self.mix is not None:
            x, y = self.mix(x, y)  # y becomes (B, classes) probabilities
            if self.bce:  # DeiT III's code: every class in the mix is a positive
                y = (y > 0).to(y.dtype)
        if self.eps:
            y = (y if y.ndim == 2 else F.one_hot(y, self.num_classes).float()) * (1 - self.eps) + self.eps / self.num_classes
        return x, y


# ----------------------------------------------------------------------------- image folders
LAYOUT = ("expected train/<class>/<image> and val/<class>/<image>, or a flat val/ with --val-labels "
          "FILE, or Tiny-ImageNet's val/images/ + val/val_annotations.txt")


def _nfc(name):
    """A file or class name in Unicode's NFC form: names copied from macOS (NFD, "e" + combining
    accent) equal the same names typed elsewhere ("\u00e9")."""
    return unicodedata.normalize("NFC", name)


def _images(folder):
    """The visible image files directly in `folder`, sorted."""
    return sorted(e.name for e in os.scandir(folder) if e.is_file() and not e.name.startswith(".")
                  and e.name.lower().endswith(IMG_EXTENSIONS))


def _walk(top):
    """(folder, its real path, [(file name, is a link)]) for `top` and every visible folder below it
    (names starting with a dot are hidden), with its visible image files; symbolic links are
    followed, but a folder whose real path was visited already is not entered again (a link cycle,
    or two links to one folder)."""
    todo, visited = [top], {os.path.realpath(top)}
    while todo:
        root = todo.pop()
        files, below = [], []
        for e in sorted(os.scandir(root), key=lambda e: e.name):
            if e.name.startswith("."):
                continue
            if e.is_dir():  # (follows a link)
                real = os.path.realpath(e.path)
                if real not in visited:
                    visited.add(real)
                    below.append(e.path)
            elif e.name.lower().endswith(IMG_EXTENSIONS):  # (a broken link too: it is skipped as undecodable)
                files.append((e.name, e.is_symlink()))
        todo += reversed(below)
        yield root, os.path.realpath(root), files


def _class_samples(folder, class_to_idx):
    """[(path, class index)] of every visible image below folder/<class>/, in torchvision's
    make_dataset order (classes by name, folders by path, files by name). Symbolic links are
    followed, as ImageFolder does, but an image counts once: a folder is entered once (_walk), and
    a file reached by several paths is kept under the class whose folder holds the image itself,
    else the link to it (not through a linked folder), else under the first (one note on stderr
    says how many were dropped). Raises DataError for a class folder without an image."""
    found, empty = [], []  # found: (path, class index, real path, rank: 0 the image is here, 1 its link, 2 neither)
    for c in sorted(class_to_idx):
        home, n = os.path.realpath(os.path.join(folder, c)) + os.sep, len(found)
        for root, real_root, files in sorted(_walk(os.path.join(folder, c))):
            for name, link in files:
                real = os.path.realpath(os.path.join(root, name)) if link else os.path.join(real_root, name)
                rank = 0 if real.startswith(home) else 1 if (real_root + os.sep).startswith(home) else 2
                found.append((os.path.join(root, name), class_to_idx[c], real, rank))
        if len(found) == n:
            empty.append(c)
    if empty:
        raise DataError(f"{folder}: Found no valid file for the classes {', '.join(empty)}; {LAYOUT}: add images "
                        "or remove the empty folders")
    keep = {}  # real path -> the entry that counts
    for k, (_, _, real, rank) in enumerate(found):
        if real not in keep or rank < found[keep[real]][3]:
            keep[real] = k
    if len(keep) < len(found):
        print(f"note: {folder}: {len(found) - len(keep)} of {len(found)} image paths lead to an image already "
              "counted (symbolic links); each image counts once", file=sys.stderr)
    chosen = set(keep.values())
    return [(path, label) for k, (path, label, _, _) in enumerate(found) if k in chosen]


def label_lines(path):
    """The text lines of a labels file as spreadsheets and other tools write it: UTF-8 with or
    without a byte-order mark ("CSV UTF-8"), UTF-16 with one ("Unicode text"), any line ending.
    Raises DataError naming the first line that is not text in that encoding."""
    try:
        raw = open(path, "rb").read()
    except OSError as e:
        raise DataError(f"labels file {path} is unreadable ({e.strerror}); give a text file of lines '<file> <class>'")
    encoding = "utf-16" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"
    try:
        return raw.decode(encoding).splitlines()
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DataError(f"{path} line {line}: not {encoding.split('-sig')[0].upper()} text ({e.reason} at byte "
                        f"{e.start}); save the file as UTF-8 (a spreadsheet's 'CSV UTF-8')")


def label_rows(lines):
    """The fields of a labels file's lines: CSV with the separator that splits the most lines in
    two or more (comma, semicolon or tab; CSV quoting, so a quoted file name may hold spaces or
    separators), else whitespace. Each row is [file name, class text, further CSV fields]; the
    class text is the second field (whitespace: the rest of the line), which read_labels reads."""
    def split(sep):
        return [next(csv.reader([ln], delimiter=sep, skipinitialspace=True), []) for ln in lines]
    best = max((split(sep) for sep in (",", ";", "\t")), key=lambda rows: sum(len(r) > 1 for r in rows))
    if not any(len(r) > 1 for r in best):
        return [[f.strip() for f in ln.split(None, 1)] for ln in lines]
    return [[r[0].strip(), r[1].strip(), *r[2:]] if len(r) > 1 else [f.strip() for f in r if f.strip()]
            for r in best]


HEADER_NAMES = ("imageid", "image_id", "image", "img", "file", "filename", "file_name", "name", "path", "id")


def read_labels(path, class_to_idx):
    """A labels file: lines `<file name> <class>` (label_lines, label_rows). The class is the whole
    class text ('golden retriever', as Stanford Dogs writes it), else its first word (ImageNet's
    LOC_val_solution.csv '<class> <box> ...', Tiny-ImageNet's boxes); names match in Unicode NFC.
    Blank lines, `#` comments and a header whose class is no class are skipped. Returns {file name
    (NFC): class index} (a LabelsFile; its `of` finds a name without its extension too). Raises DataError
    naming the line that could not be read or whose class is not in train/, and naming both lines where one
    image is given two classes."""
    names = {_nfc(c): i for c, i in class_to_idx.items()}
    out, lines = LabelsFile(path), label_lines(path)
    for n, (line, fields) in enumerate(zip(lines, label_rows(lines)), 1):
        text = _nfc(fields[1]) if len(fields) > 1 else ""
        label = names.get(text, names.get((text.split() or [""])[0]))
        if not fields or fields[0].startswith("#") or (n == 1 and label is None and fields[0].lower() in HEADER_NAMES):
            continue
        if label is None:
            raise DataError(f"{path} line {n}: {line.strip()[:80]!r}: expected '<file name> <class>' with the "
                            f"class a train/ folder name ({len(class_to_idx)} classes, e.g. {next(iter(class_to_idx))})")
        name = _nfc(fields[0])
        if name in out and out[name] != label:  # (two label exports concatenated: which one is right?)
            raise DataError(f"{path}: {out.where(name)} and line {n} {line.strip()[:80]!r} give {name} two classes; "
                            "keep one line per image")
        if name not in out:
            out[name], out.lines[name] = label, (n, line.strip()[:80])
    return out


class LabelsFile(dict):
    """read_labels' result: {file name: class index}, and where each name's line is (`lines`: name -> (line
    number, text)), so that a conflict can name both lines."""

    def __init__(self, path):
        super().__init__()
        self.path, self.lines = path, {}

    def where(self, name):
        n, text = self.lines[name]
        return f"line {n} {text!r}"

    def of(self, file):
        """The class of the image `file`: its line, else the line of its name without the extension; DataError
        when both lines exist and give different classes."""
        full, stem = _nfc(file), os.path.splitext(_nfc(file))[0]
        if full in self and stem in self and full != stem and self[full] != self[stem]:
            raise DataError(f"{self.path}: {self.where(stem)} and {self.where(full)} give {file} two classes; keep "
                            "one line per image")
        return self.get(full, self.get(stem))


def image_folder(root, val_labels=None, classes=None, train=True):
    """Class names and (path, class index) samples of an image folder, in one of the layouts:
    val/<class>/ (a subset of the train classes is fine), a flat val/ labelled by `val_labels`, or
    Tiny-ImageNet's val/images/ + val/val_annotations.txt. Class indices come from train/ (sorted
    folder names), or from `classes` when given (a checkpoint's: then train/ need not exist);
    val classes are mapped to them by name, in Unicode NFC (a folder copied from macOS matches).
    train=False: no training samples (--eval-only). Hidden files and folders are ignored. Raises
    DataError, one line saying which layout was expected and how to fix it."""
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    known = f"one of the checkpoint's {len(classes)} classes" if classes else "in train/"  # (where they come from)
    for d in (val_dir,) if classes else (train_dir, val_dir):
        if not os.path.isdir(d):
            raise DataError(f"no {os.path.basename(d)}/ folder in {root}; {LAYOUT}; pass --data-dir DIR")
    classes = classes or sorted(e.name for e in os.scandir(train_dir) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise DataError(f"{train_dir} has no class folder; {LAYOUT}")
    class_to_idx = {c: i for i, c in enumerate(classes)}
    by_name = {_nfc(c): i for i, c in enumerate(classes)}
    if len(by_name) < len(classes):
        twice = next(c for c in classes if sum(_nfc(d) == _nfc(c) for d in classes) > 1)
        raise DataError(f"{train_dir}: two class folders are named {_nfc(twice)}, in different Unicode "
                        "normalizations (one copied from macOS?); merge them")
    samples = _class_samples(train_dir, class_to_idx) if train else []
    annotations = os.path.join(val_dir, "val_annotations.txt")
    folders = [e.name for e in os.scandir(val_dir) if e.is_dir() and not e.name.startswith(".")]
    if val_labels and folders and not _images(val_dir):
        raise DataError(f"--val-labels {val_labels}: {val_dir} holds class folders ({folders[0]}, ...), not a flat "
                        f"folder of images; drop --val-labels (the folder names are the labels); {LAYOUT}")
    if val_labels or os.path.isfile(annotations):  # flat: files in val/ (or Tiny-ImageNet's val/images/)
        labels = read_labels(val_labels or annotations, class_to_idx)
        flat = val_dir if val_labels else os.path.join(val_dir, "images")
        files = _images(flat) if os.path.isdir(flat) else []
        label = {f: labels.of(f) for f in files}
        unlabeled = [f for f in files if label[f] is None]
        if not files or unlabeled:
            raise DataError(f"{flat}: " + (f"{unlabeled[0]} has no line in {val_labels or annotations}"
                                           if files else "no image files") + f"; {LAYOUT}")
        val = [(os.path.join(flat, f), label[f]) for f in files]
    else:
        found = sorted(e.name for e in os.scandir(val_dir) if e.is_dir() and not e.name.startswith("."))
        unknown = [c for c in found if _nfc(c) not in by_name]
        if unknown or not found:
            raise DataError(f"{val_dir}: " + (f"class folder {unknown[0]} is not {known}" if unknown else
                            "no class folder (a flat folder of images needs --val-labels FILE)") + f"; {LAYOUT}")
        val = _class_samples(val_dir, {c: by_name[_nfc(c)] for c in found})
    return classes, samples, val


def small_images(files, img_size, patch_size=None, n=16):
    """One line when the images of `files` (an ImageFiles) are much smaller than `img_size` (px): the median
    width and height of n evenly spaced files (their headers only, PIL) both at most img_size / 2, so every image
    is upsampled to about (img_size / side)^2 times its pixels (side: the larger median side), as many times the
    patches and the compute at one patch size (attention's own cost grows faster); it names the flag to set, --img-size side rounded up to a
    multiple of the patch (`patch_size`, else train.py's default at that size: 4 up to 64 px, 16 above). None
    otherwise, or when no file's size can be read (an undecodable file is ImageFiles' to skip)."""
    sizes = []
    for i in range(0, len(files.samples), max(1, len(files.samples) // n))[:n]:
        try:
            with Image.open(files.samples[i][0]) as im:
                sizes.append(im.size)
        except (OSError, ValueError):
            continue
    if not sizes:
        return None
    w, h = (sorted(s[k] for s in sizes)[len(sizes) // 2] for k in (0, 1))
    if 2 * max(w, h) > img_size:
        return None
    side = max(w, h)
    patch = patch_size or (4 if side <= 64 else 16)
    factor = f"{(img_size / side) ** 2:.0f}x"
    return (f"note: the training images are about {w}x{h} px (median of {len(sizes)} files); --img-size {img_size} "
            f"upsamples each to {factor} its pixels ({factor} the patches, the compute, at one --patch-size); "
            f"--img-size {-(-side // patch) * patch} trains at their size")


class ImageFiles(Dataset):
    """Image files decoded by PIL as RGB (grayscale, CMYK and RGBA included) + a v2 transform.
    samples: [(path, class index)]. An undecodable file (truncated, not an image) yields a zero
    image and the label -1 - i (i its index here), which `drop_undecodable` removes from the batch,
    so one bad file costs one image, not the run."""

    def __init__(self, samples, classes, transform, img_size):
        self.samples, self.classes, self.transform, self.img_size = samples, classes, transform, img_size

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        img = self.open_rgb(path)
        if img is None:
            return torch.zeros(3, self.img_size, self.img_size), -1 - i
        return self.transform(img), label

    @staticmethod
    def open_rgb(file):
        """PIL image in 8-bit RGB of a path or file object (rgb8), decoded in full (a truncated file
        fails here); None when it cannot be decoded."""
        try:
            with Image.open(file) as img:
                return rgb8(img)
        except Exception:  # PIL raises OSError, SyntaxError, ValueError, ... for broken files
            return None


def rgb8(img):
    """A PIL image as 8-bit RGB. PIL's convert("RGB") clips every value above 255, so a 16-bit image
    (PNG/TIFF, modes I;16*) turned white; here it keeps its top 8 bits, as torchvision's decoders
    scale 16-bit images to uint8. 32-bit integer images (mode I) are scaled by the bits their values
    use (8, 16 or 31, the positive range of int32; PIL's I also holds 16-bit data), float images (mode F) from [0, 1] (else as
    integers). Every other mode (L, P, RGBA, CMYK, LA, 1, ...) is PIL's own conversion."""
    if not (img.mode.startswith("I;16") or img.mode in ("I", "F")):
        return img.convert("RGB")
    a = np.asarray(img).astype(np.float64)
    top = a.max(initial=0.0)
    if img.mode == "F" and top <= 1.0:
        a = a * 255.0
    else:
        bits = 16 if img.mode.startswith("I;16") else next(b for b in (8, 16, 31) if top < 2.0 ** b or b == 31)
        a = np.floor(a / 2.0 ** (bits - 8))
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "L").convert("RGB")


def drop_undecodable(x, y, dataset):
    """Remove the images ImageFiles could not decode from a batch (labels < 0, on the CPU), with
    one warning line per file. Returns (x, y, paths of the removed files). dataset: the
    ImageFiles (or Subsets of it); any other dataset never has such labels."""
    bad = y < 0
    if not bad.any():
        return x, y, []
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    paths = [dataset.samples[-1 - int(v)][0] for v in y[bad]]
    for p in paths:
        if p not in WARNED:
            WARNED.add(p)
            tqdm.write(f"warning: skipped undecodable image {p}", file=sys.stderr)  # below a progress bar
    return x[~bad], y[~bad], paths


WARNED = set()  # files drop_undecodable has warned about (one line per file and process)


class TooManyUndecodable(DataError):
    """More undecodable images in a run than its limit (--max-bad-images)."""


class UsableImages:
    """The training batches of an image folder without their undecodable images (drop_undecodable),
    counted over the run: `usable(x, y)` -> (x, y, images dropped). Raises TooManyUndecodable once
    more than `limit` were dropped in all, naming the last."""

    def __init__(self, dataset, limit):
        self.dataset, self.limit, self.total = dataset, limit, 0

    def __call__(self, x, y):
        x, y, bad = drop_undecodable(x, y, self.dataset)
        self.total += len(bad)
        if self.total > self.limit:
            raise TooManyUndecodable(f"{self.total} undecodable images (more than --max-bad-images {self.limit}), "
                                     f"the last {bad[-1]}")
        return x, y, len(bad)


class FileBytes(Dataset):
    """The raw bytes of ImageFiles' files, for DeviceDecodeLoader: item (i, seed) -> (bytes uint8
    (n,), label, seed, i); workers only read files. Unreadable: empty bytes (then undecodable)."""

    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, item):
        i, seed = item
        path, label = self.files.samples[i]
        try:
            with open(path, "rb") as f:
                raw = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        except (OSError, RuntimeError, ValueError):  # (ValueError: an empty file)
            raw = torch.empty(0, dtype=torch.uint8)
        return raw, label, seed, i


class DeviceDecodeLoader:
    """Image-folder training with JPEG decoding on `device` (nvJPEG on CUDA): loader workers only
    read file bytes; decode_jpeg decodes the batch's JPEGs in one call there, other formats (PNG,
    ...) are decoded on the CPU, and the training transform (RandomResizedCrop + flip, 3-Augment or
    RandAugment when asked; torchvision v2 ops run on device tensors) is applied per image on the
    device under the image's seed, so the crops equal the CPU path's (data.Seeded). Files that
    torchvision cannot decode (CMYK JPEGs on some builds, a corrupt file in the batch) go through
    PIL like ImageFiles. A 2-core host
    cannot decode ImageNet fast enough for one GPU; this moves the work to it.

    Same order, shards, resume and `repeats` as `build_loader` (a ResumableSampler). Yields (images float
    (B, 3, S, S) normalized on `device`, labels int64 (B,) on the CPU); an undecodable file gives
    a zero image and label -1 - i, as ImageFiles does (`drop_undecodable`)."""

    def __init__(self, files, batch_size, rank=0, world_size=1, seed=0, workers=2, device="cuda", repeats=0):
        self.files, self.device = files, torch.device(device)
        self.sampler = ResumableSampler(files, world_size, rank, seed, repeats)
        self.loader = DataLoader(FileBytes(files), batch_size, sampler=self.sampler, num_workers=workers,
                                 drop_last=True, persistent_workers=workers > 0, collate_fn=list,
                                 generator=torch.Generator(), worker_init_fn=partial(worker_signals, os.getpid()))

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for items in self.loader:
            yield self.decode(items)

    def decode(self, items):
        """[(bytes, label, seed, i)] -> (images (B, 3, S, S) on the device, labels (B,))."""
        raw = [r for r, *_ in items]
        images = [None] * len(raw)
        jpeg = [k for k, r in enumerate(raw) if len(r) > 2 and r[0] == 0xFF and r[1] == 0xD8]
        try:  # one batched call; a file it cannot decode fails it, then the CPU decodes each file
            with warnings.catch_warnings():  # torchvision 0.29 deprecates its decoders for TorchCodec's, which is
                # not a dependency here and whose GPU image decoding this path has not been measured with
                warnings.filterwarnings("ignore", "The image decoding and encoding capabilities of TorchVision",
                                        DeprecationWarning)
                decoded = decode_jpeg([raw[k] for k in jpeg], mode=ImageReadMode.RGB, device=self.device) if jpeg \
                    else []  # (a batch without a JPEG: no call, decode_jpeg refuses [])
            for k, img in zip(jpeg, decoded):
                images[k] = img
        except RuntimeError:
            pass
        out, labels, size = [], [], self.files.img_size
        for k, (r, label, seed, i) in enumerate(items):
            img = images[k]
            if img is None:  # not a JPEG, or not decodable above: PIL on the CPU
                pil = ImageFiles.open_rgb(io.BytesIO(r.numpy().tobytes()))
                if pil is None:
                    out.append(torch.zeros(3, size, size, device=self.device))
                    labels.append(-1 - i)
                    continue
                img = v2.functional.pil_to_tensor(pil).to(self.device)
            with torch.random.fork_rng(devices=[]):  # the crop parameters come from the CPU RNG
                torch.manual_seed(seed)
                out.append(self.files.transform(img))
            labels.append(label)
        return torch.stack(out), torch.tensor(labels)


def normalization(name):
    """The (mean, std) per channel that dataset `name` is normalized with unless a model asks for its own
    (build_datasets' mean_std): CIFAR-100's statistics, ImageNet's (for image folders), or 0.5."""
    return (CIFAR_MEAN, CIFAR_STD) if name == "cifar100" else (IMAGENET_MEAN, IMAGENET_STD) if name in FOLDERS else \
        ((0.5,) * 3,) * 2


def build_datasets(name, data_dir=None, img_size=None, download=False, randaug=0, augment=True,
                   synthetic_size=(50_000, 10_000), num_classes=100, seed=0, three_aug=False,
                   val_labels=None, train=True, classes=None, mean_std=None, reconstruct=False, color_jitter=0.3,
                   crop_ratio=0.875, reprob=0.0):
    """Returns (train_set, val_set, num_classes, img_size) for `name` in DATASETS.

    img_size defaults to 32 (cifar100, synthetic) or 224 (FOLDERS); CIFAR at another size is resized.
    folder, imagenet: an image folder (see `image_folder`; `val_labels` labels a flat val/ folder; `classes`,
    a checkpoint's class names, stand in for train/'s). train=False: no training set is read
    (train_set None), for --eval-only. mean_std: the (mean, std) per channel images are normalized
    with, the model's choice (LoopVAE: ((0.5,) * 3, (0.5,) * 3), i.e. [0, 1] -> [-1, 1]); None: the
    dataset's own statistics. reconstruct: a tokenizer's crops for image folders (build_transform).
    color_jitter: 3-Augment's (three_aug); crop_ratio: image folders' evaluation crop; reprob: random
    erasing's probability (build_transform).
    Raises DataError for a missing/corrupt dataset and ValueError for an
    unknown name.
    """
    root = data_dir or default_root()
    if name == "cifar100":
        img_size = img_size or 32
        mean, std = mean_std or normalization(name)
        t_train = build_transform(True, img_size, mean, std, name, randaug, augment, three_aug, color_jitter=color_jitter,
                                  reprob=reprob)
        t_val = build_transform(False, img_size, mean, std, name)
        train_set = TensorImages(*load_cifar100(root, True, download), t_train, (mean, std)) if train else None
        val = TensorImages(*load_cifar100(root, False, download), t_val, (mean, std))
        return train_set, val, 100, img_size
    if name in FOLDERS:
        img_size = img_size or 224
        mean, std = mean_std or normalization(name)
        t_train = build_transform(True, img_size, mean, std, name, randaug, augment, three_aug, reconstruct,
                                  color_jitter, reprob=reprob)
        t_val = build_transform(False, img_size, mean, std, name, reconstruct=reconstruct, crop_ratio=crop_ratio)
        classes, train_samples, val_samples = image_folder(root, val_labels, classes, train)
        return (ImageFiles(train_samples, classes, t_train, img_size) if train else None,
                ImageFiles(val_samples, classes, t_val, img_size), len(classes), img_size)
    if name == "synthetic":
        img_size = img_size or 32
        # No augmentation: random images gain nothing from it, and without it a run is a pure
        # function of the seed (the 1-process vs 2-process DDP test relies on that).
        mean, std = mean_std or normalization(name)
        t_train = build_transform(False, img_size, mean, std, name)
        t_val = build_transform(False, img_size, mean, std, name)
        n_train, n_val = synthetic_size
        return (SyntheticImages(n_train, img_size, num_classes, t_train, seed) if train else None,
                SyntheticImages(n_val, img_size, num_classes, t_val, seed + 1), num_classes, img_size)
    raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}")


class Seeded(Dataset):
    """Wraps a dataset so that item `(i, seed)` is transformed under `torch.manual_seed(seed)`.

    The augmentation of every image is then a pure function of (run seed, epoch, index): the same
    for any number of loader workers, and reproduced exactly when a run resumes mid-epoch.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, item):
        i, seed = item
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream untouched
            torch.manual_seed(seed)
            return self.dataset[i]


class ResumableSampler(DistributedSampler):
    """DistributedSampler (this rank's disjoint shard, reshuffled by `set_epoch`) that yields
    `(index, per-sample seed)` pairs for `Seeded` and can start mid-epoch (`set_start(n)`, n
    samples of this rank already consumed), so a resumed run sees exactly the data it would have.

    `repeats` N >= 2: repeated augmentation (--repeated-aug; Hoffer et al. 2020, Berman et al. 2019),
    with the semantics of DeiT's RASampler (github.com/facebookresearch/deit, samplers.py). Every
    rank draws the same permutation p of the n images (seeded by seed + epoch, as without repeats);
    the repeated list holds each image N times in a row, slot q holding image p[q // N] as its copy
    q % N; rank r takes slots r, r + W, r + 2W, ... (W ranks), so the copies of one image go to N
    different ranks when W >= N (to some ranks twice when W < N). An epoch keeps DeiT's length: the
    first n - n % 256 slots in all (whole batches of 256, DeiT's rounding; a set under 256 images keeps
    its n, where DeiT's epoch would be empty), (n - n % 256) // W per rank, so that about n / N
    distinct images are seen per epoch, N times each. A copy's seed comes from (index, copy), so the
    N copies get N different augmentations. N = 0 (or 1) is the plain shard, slot q holding p[q].
    """

    def __init__(self, dataset, world_size, rank, seed, repeats=0):
        super().__init__(dataset, world_size, rank, shuffle=True, seed=seed, drop_last=True)
        self.start, self.repeats = 0, max(1, repeats)
        if repeats > 1:
            n = len(dataset)
            self.num_samples = (n - n % 256 if n >= 256 else n) // world_size

    def set_start(self, n):
        self.start = n

    def slots(self):
        """This rank's samples from set_start on: (image indices (M,), keys (M,)) as int64 tensors, the
        key index + n * copy (copy 0 without repeats), unique per sample of the epoch."""
        n, world = len(self.dataset), self.num_replicas
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch))  # DistributedSampler's
        slot = torch.arange(self.rank + self.start * world, self.num_samples * world, world)
        index = perm[slot // self.repeats]
        return index, index + n * (slot % self.repeats)

    def __iter__(self):
        base = (self.seed * 1_000_003 + self.epoch) * 100_003
        for i, key in zip(*(t.tolist() for t in self.slots())):
            yield i, (base + key) % (2 ** 63)

    def __len__(self):
        return self.num_samples - self.start


def image_hash(index, seed, epoch):
    """A pseudo-random int64 in [0, 2^31) per image (B,) -> (B,), a pure function of (seed, epoch,
    index) (integer mixing in the spirit of splitmix; int64 products wrap alike on CPU and CUDA), so
    an image's crop never depends on the batch, micro-batch or process it lands in."""
    h = index.long() * 2654435761 + (seed * 1_000_003 + epoch) * 40503 + 12345
    for mult in (1274126177, 2246822519):
        h = (h ^ (h >> 15)) * mult
    return (h ^ (h >> 16)) & 0x7FFFFFFF


def random_crop_flip(x, pad, h):
    """Batched random crop with zero padding + horizontal flip, on x's device.

    x uint8 (B, C, H, W), h (B,) random int64 >= 0 (image_hash) -> (B, C, H, W): image b is the
    window at offset (dy_b, dx_b) in [0, 2 pad] of its zero-padded copy, mirrored with
    probability 1/2 (as v2.RandomCrop(padding) + flip), all three drawn from h_b.
    """
    B, C, H, W = x.shape
    dev, n = x.device, 2 * pad + 1
    xp = F.pad(x, (pad, pad, pad, pad))  # (B, C, H + 2p, W + 2p)
    dy, dx, flip = h % n, (h // n) % n, (h // (n * n)) % 2 == 1
    rows = dy[:, None] + torch.arange(H, device=dev)  # (B, H)
    cols = dx[:, None] + torch.arange(W, device=dev)  # (B, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    b = torch.arange(B, device=dev)[:, None, None, None]
    c = torch.arange(C, device=dev)[None, :, None, None]
    return xp[b, c, rows[:, None, :, None], cols[:, None, None, :]]


class DeviceCIFARLoader:
    """GPU-resident CIFAR loader: the whole uint8 dataset lives on `device` (150 MB for CIFAR-100
    train) and each batch is gathered, randomly cropped (crop_padding: 4 px) and flipped on the device,
    so data loading never waits on CPU workers.

    Same order and shards as `build_loader` (a ResumableSampler: `loader.sampler.set_epoch(e)`,
    `loader.sampler.set_start(n)`, `repeats`); each image's crop and flip are a function of (seed,
    epoch, index, and its copy under repeats: the sampler's key) (image_hash), as on the CPU path, so
    runs are deterministic, resume exactly, and do not change with the batch split (--grad-accum,
    the number of processes). Yields
    (images float32 (B, 3, 32, 32) normalized with the dataset's `mean_std`, labels int64 (B,)).
    """

    def __init__(self, dataset, batch_size, train, rank=0, world_size=1, seed=0, device="cuda", repeats=0):
        self.batch_size, self.train, self.seed, self.rank, self.device = batch_size, train, seed, rank, device
        keep = None
        if isinstance(dataset, Subset):  # --val-subset: the chosen images only
            dataset, keep = dataset.dataset, torch.as_tensor(list(dataset.indices))
        self.images = (dataset.images if keep is None else dataset.images[keep]).to(device)  # (N, 3, 32, 32) uint8
        self.labels = (dataset.labels if keep is None else dataset.labels[keep]).to(device)
        mean, std = dataset.mean_std  # the per-image transform's normalization (build_datasets)
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1) * 255
        if train:
            self.sampler = ResumableSampler(dataset, world_size, rank, seed, repeats)
        else:
            self.shard = torch.arange(rank, len(self.labels), world_size, device=device)

    def __len__(self):
        n = len(self.sampler) if self.train else len(self.shard)
        return n // self.batch_size if self.train else math.ceil(n / self.batch_size)

    def __iter__(self):
        if not self.train:
            for j in range(len(self)):
                idx = self.shard[j * self.batch_size:(j + 1) * self.batch_size]
                yield (self.images[idx].float() - self.mean) / self.std, self.labels[idx]
            return
        # once per epoch: the epoch's order, copied from pinned memory without blocking the host (a
        # pageable copy waits for the device: 1 sync per epoch, which scripts/gpu_check.py counts)
        cuda = torch.device(self.device).type == "cuda"
        order, keys = (t.pin_memory().to(self.device, non_blocking=True) if cuda else t.to(self.device)
                       for t in self.sampler.slots())
        for j in range(len(self)):
            idx, key = (t[j * self.batch_size:(j + 1) * self.batch_size] for t in (order, keys))
            x = random_crop_flip(self.images[idx], crop_padding(self.images.shape[-1]),
                                 image_hash(key, self.seed, self.sampler.epoch))
            yield (x.float() - self.mean) / self.std, self.labels[idx]


def worker_signals(parent, worker_id=None):
    """DataLoader worker_init_fn (`parent`: the training process's pid): a worker leaves stopping to
    the training process and never outlives it. The signals a terminal or a cluster sends to the
    whole process group (SIGINT on Ctrl-C, SIGTERM from scancel or a preemption, SIGUSR1 from
    SLURM, SIGHUP when the terminal closes; torchrun relays them) are ignored here: the training process gets them too, finishes its
    step and writes the stop checkpoint, which a worker that died of them would prevent. On Linux
    the kernel SIGKILLs a worker that the training process started (fork or spawn; not a
    forkserver's) when that process ends, however it ends (prctl PR_SET_PDEATHSIG; one already
    gone: the worker exits now); at its exit the training process ends its workers itself
    (end_workers)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    if sys.platform.startswith("linux") and os.getppid() == parent:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent ended before the line above
            os._exit(0)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@atexit.register  # (after multiprocessing's own exit handler, so it runs before it: atexit is LIFO)
def end_workers(timeout=10.0):
    """SIGKILL this process's loader workers (multiprocessing's daemonic children) at its exit and
    wait up to `timeout` seconds for them. multiprocessing's own exit handler would send them
    SIGTERM, which they ignore (worker_signals), and wait for them forever: an error that ends the
    training process with its loaders still open then never exited. torch's SIGCHLD check, which
    raises when a worker dies of a signal, is switched off first (the run is over)."""
    children = [p for p in multiprocessing.active_children() if p.daemon]
    if not children:
        return
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for p in children:
        p.kill()
    for p in children:
        p.join(timeout)


def worker_died(error):
    """The line for an exception of a loader whose worker process died (killed by the OOM killer, kill -9, a
    crash in a decoder: torch's "DataLoader worker (pid X) exited unexpectedly / is killed by signal", or the
    ConnectionResetError / EOFError of a batch handed over as it died), or None for any other."""
    text = str(error)
    if isinstance(error, RuntimeError) and "DataLoader worker" in text and (
            "exited unexpectedly" in text or "killed by signal" in text):
        return f"a data loader worker process died ({text.strip().splitlines()[0][:160]}): the OOM killer (lower " \
               "--workers or --batch-size, or free memory), or a signal"
    if isinstance(error, (ConnectionResetError, EOFError)):
        return f"a data loader worker process died while handing over a batch ({type(error).__name__}); lower " \
               "--workers or --batch-size, or free memory"
    return None


def loader_checks_at_next_batch():
    """torch's SIGCHLD handler, set with a loader's first workers, raises the error of a worker that died of a
    signal wherever the training process then is (in the forward, in an optimizer step half done); with the
    default action the loader finds the dead worker itself at the next batch (within its 5 s status check) and
    raises there, between steps, where the run can save the steps it finished (training.monitor)."""
    if signal.getsignal(signal.SIGCHLD) not in (signal.SIG_DFL, None) and \
            threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def out_of_shared_memory(error):
    """The line for an exception of the loader whose worker processes ran out of shared memory
    (/dev/shm, where they hand batches over; Docker's default is 64 MB), or None for any other."""
    text = str(error)
    if not ("shared memory" in text or "(shm)" in text or "unable to write to file </torch_" in text):
        return None
    try:
        size = f"{shutil.disk_usage('/dev/shm').total / 2 ** 20:.0f} MB"
    except OSError:
        size = "its size unknown"
    return (f"the data loader's worker processes ran out of shared memory (/dev/shm, {size}); raise it "
            "(docker run --shm-size 8g, or mount -o remount,size=8g /dev/shm) or use --workers 0")


def build_loader(dataset, batch_size, train, rank=0, world_size=1, seed=0, workers=2, repeats=0):
    """DataLoader over this rank's disjoint shard.

    Training: a ResumableSampler (shuffled with `seed`; call `loader.sampler.set_epoch(e)` and,
    to resume mid-epoch, `loader.sampler.set_start(batches_done * batch_size)`; `repeats`: repeated
    augmentation), drop_last so every rank takes the same number of steps; `batch_size` is per rank.
    Evaluation: rank r takes items r, r + world, ... (no padding, so counts summed over ranks
    are exact).
    """
    pin = torch.cuda.is_available()
    if train:
        sampler = ResumableSampler(dataset, world_size, rank, seed, repeats)
        # own generator: starting an iterator must not draw from the global RNG (exact resume)
        return DataLoader(Seeded(dataset), batch_size, sampler=sampler, num_workers=workers,
                          drop_last=True, persistent_workers=workers > 0, pin_memory=pin,
                          generator=torch.Generator(), worker_init_fn=partial(worker_signals, os.getpid()))
    shard = Subset(dataset, range(rank, len(dataset), world_size))
    return DataLoader(shard, batch_size, shuffle=False, num_workers=workers, persistent_workers=workers > 0,
                      pin_memory=pin, generator=torch.Generator(), worker_init_fn=partial(worker_signals, os.getpid()))


def batched_eval_loader(args, device):
    """train.py's evaluation loader rule: DeviceCIFARLoader (the whole uint8 CIFAR test set on the GPU,
    normalized there a batch at a time; the same values as the per-image transform, to float
    rounding) for CIFAR at 32 px on CUDA; else the DataLoader."""
    return args.data == "cifar100" and device.type == "cuda" and args.img_size in (None, 32)


# What the batched CIFAR path reproduces of build_transform's training pipeline: the crop and flip
# (random_crop_flip, the same draws), the conversion and the normalization (DeviceCIFARLoader).
BATCHED_OPS = (v2.ToImage, v2.RandomCrop, v2.RandomHorizontalFlip, v2.ToDtype, v2.Normalize)


def batched_loader(args, device):
    """train.py's loader rule, given its flags (argparse namespace) and the device. True: train on
    DeviceCIFARLoader (the whole uint8 CIFAR on `device`, batched crop + flip
    there): CIFAR on CUDA, or on the CPU with --workers 0 (cheaper than per-image transforms in the
    training process), and only when the run's per-image pipeline (build_transform, the one place
    that defines a run's augmentation) holds nothing but BATCHED_OPS: an augmentation only the
    per-image DataLoader has (--randaug, --three-augment, --reprob, a resize to another --img-size, or one
    added to build_transform later) sends the run there, never silently off. Never for --cpu-loader."""
    if args.data != "cifar100" or args.cpu_loader or not (device.type == "cuda" or args.workers == 0):
        return False
    ops = build_transform(True, args.img_size or 32, CIFAR_MEAN, CIFAR_STD, "cifar100", int(args.randaug),
                          three_aug=args.three_augment, reprob=args.reprob).transforms
    return all(type(op) in BATCHED_OPS for op in ops)


def build_loaders(args, train_set, val_set, batch_size, rank, world_size, device):
    """train.py's loaders for its flags (argparse namespace): (train, val). Training: DeviceCIFARLoader
    where `batched_loader` says so; ImageNet-style folders on CUDA: DeviceDecodeLoader (workers read
    bytes, JPEGs decoded on the GPU) unless --cpu-loader; else the per-image DataLoader. Evaluation:
    DeviceCIFARLoader where `batched_eval_loader` says so, else the DataLoader. batch_size: the
    training micro-batch per process; the evaluation batch is --eval-batch-size; every training
    loader samples with --repeated-aug (ResumableSampler). No training set (--eval-only): no
    training loader (None)."""
    reps = args.repeated_aug
    if train_set is None:
        train = None
    elif batched_loader(args, device):
        train = DeviceCIFARLoader(train_set, batch_size, True, rank, world_size, args.seed, device, reps)
    elif args.data in FOLDERS and device.type == "cuda" and not args.cpu_loader:
        train = DeviceDecodeLoader(train_set, batch_size, rank, world_size, args.seed, args.workers, device, reps)
    else:
        train = build_loader(train_set, batch_size, True, rank, world_size, args.seed, args.workers, reps)
    if batched_eval_loader(args, device):
        val = DeviceCIFARLoader(val_set, args.eval_batch_size, False, rank, world_size, device=device)
    else:
        val = build_loader(val_set, args.eval_batch_size, False, rank, world_size, workers=args.workers)
    return train, val


# ----------------------------------------------------------------------------- dense probes (probe.py)
class Mosaics(Dataset):
    """Our CPU-scale analogue of the reViT paper's dense probes (A.3; not ADE20k, not NYUv2): 2 x 2
    mosaics of CIFAR-100 images at `size` px, each quadrant one image shown at half resolution after a
    centre zoom by z in `zooms` (a centre crop of 32 / z px, resized; bilinear, antialiased). Mosaic i
    is a pure function of (seed, i). Item: (image (3, size, size) normalized with mean_std, seg
    (size, size) int64: the class of each pixel's image, the segmentation target, zoom (size, size)
    float32: log2 z of each pixel's image, the dense regression target standing in for depth (how
    near the camera a surface is sets how large it looks))."""

    def __init__(self, images, labels, n, size=32, seed=0, mean_std=(CIFAR_MEAN, CIFAR_STD), zooms=(1, 1.5, 2, 3)):
        if size % 2:
            raise ValueError(f"mosaic size {size} must be even (2 x 2 quadrants)")
        self.images, self.labels, self.n, self.size, self.seed, self.zooms = images, labels, n, size, seed, zooms
        self.mean, self.std = (torch.tensor(v).view(3, 1, 1) for v in mean_std)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        pick = torch.randint(0, len(self.labels), (4,), generator=g)
        zoom = torch.randint(0, len(self.zooms), (4,), generator=g)
        h = self.size // 2
        img, seg, z = torch.zeros(3, self.size, self.size), torch.zeros(self.size, self.size, dtype=torch.int64), \
            torch.zeros(self.size, self.size)
        for q in range(4):
            src = self.images[pick[q]].float() / 255
            side = self.images.shape[-1]
            c = max(1, round(side / self.zooms[zoom[q]]))
            o = (side - c) // 2
            part = F.interpolate(src[None, :, o:o + c, o:o + c], size=(h, h), mode="bilinear", antialias=True,
                                 align_corners=False)[0]
            r, col = divmod(q, 2)
            img[:, r * h:(r + 1) * h, col * h:(col + 1) * h] = part
            seg[r * h:(r + 1) * h, col * h:(col + 1) * h] = self.labels[pick[q]]
            z[r * h:(r + 1) * h, col * h:(col + 1) * h] = math.log2(self.zooms[zoom[q]])
        return (img - self.mean) / self.std, seg, z


class DenseFolder(Dataset):
    """The real dense probes' data, resized (short side to `size`, bicubic; targets nearest) and
    centre-cropped to size x size, normalized with mean_std. kind "ade20k": ADE20k's layout,
    ROOT/images/{training,validation}/NAME.jpg + ROOT/annotations/{...}/NAME.png (0 = "other",
    ignored: -1; 1..150 -> 0..149); kind "nyu": NYUv2 as image and depth files, ROOT/{train,test}/
    (any depth of folders) NAME.{jpg,png} beside NAME_depth.png (16-bit, millimetres) or
    NAME_depth.npy (metres); depth 0 = no reading (ignored: nan). Item: (image, target (size, size)).
    Raises DataError for a folder without pairs, naming what it looked for."""

    def __init__(self, root, kind, train, size, mean_std=(IMAGENET_MEAN, IMAGENET_STD)):
        self.kind, self.size = kind, size
        self.mean, self.std = (torch.tensor(v).view(3, 1, 1) for v in mean_std)
        if kind == "ade20k":
            split = "training" if train else "validation"
            img_dir, ann_dir = os.path.join(root, "images", split), os.path.join(root, "annotations", split)
            names = sorted(os.path.splitext(f)[0] for f in os.listdir(img_dir)) if os.path.isdir(img_dir) else []
            self.pairs = [(os.path.join(img_dir, n + ".jpg"), os.path.join(ann_dir, n + ".png")) for n in names
                          if os.path.isfile(os.path.join(ann_dir, n + ".png"))]
            want = f"{img_dir}/NAME.jpg with {ann_dir}/NAME.png"
        else:
            top = os.path.join(root, "train" if train else "test")
            self.pairs = []
            for d, _, files in sorted(os.walk(top)):
                for f in sorted(files):
                    stem, ext = os.path.splitext(f)
                    if ext.lower() in (".jpg", ".jpeg", ".png") and not stem.endswith("_depth"):
                        depth = next((os.path.join(d, stem + s) for s in ("_depth.png", "_depth.npy")
                                      if os.path.isfile(os.path.join(d, stem + s))), None)
                        if depth:
                            self.pairs.append((os.path.join(d, f), depth))
            want = f"{top}/**/NAME.jpg (or .png) with NAME_depth.png (mm) or NAME_depth.npy (m)"
        if not self.pairs:
            raise DataError(f"{kind}: no image and target pairs in {root}: looked for {want}")

    def __len__(self):
        return len(self.pairs)

    def fit(self, img, resample):  # short side to size, centre crop
        w, h = img.size
        s = self.size / min(w, h)
        img = img.resize((max(self.size, round(w * s)), max(self.size, round(h * s))), resample)
        w, h = img.size
        left, top = (w - self.size) // 2, (h - self.size) // 2
        return img.crop((left, top, left + self.size, top + self.size))

    def __getitem__(self, i):
        img_path, target_path = self.pairs[i]
        try:
            img = self.fit(Image.open(img_path).convert("RGB"), Image.BICUBIC)
            if target_path.endswith(".npy"):
                target = Image.fromarray(np.load(target_path, allow_pickle=False).astype(np.float32), mode="F")
            else:
                target = Image.open(target_path)
            target = np.asarray(self.fit(target, Image.NEAREST))
        except (OSError, ValueError) as e:
            raise DataError(f"{self.kind}: cannot read {img_path} or {target_path} ({e})")
        x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255
        if self.kind == "ade20k":
            y = torch.from_numpy(target.astype(np.int64)) - 1  # 0 ("other") -> -1, ignored
        else:
            y = torch.from_numpy(target.astype(np.float32))
            y = y / 1000 if not target_path.endswith(".npy") else y  # millimetres -> metres
            y[y <= 0] = float("nan")
        return (x - self.mean) / self.std, y
