"""Frozen-backbone probes of any rvits checkpoint or timm-layout ViT file (reViT paper, arXiv 2610.12448, A.3).

    python lab/probe.py --weights runs/mini/vit/seed0/ckpt.pt --task linear --data-dir ../shared/data --out-dir OUT
    python lab/probe.py --weights CKPT --task seg --data cifar100 ...        # our analogue: mosaics (below)
    python lab/probe.py --weights dinov2_vits14.pth --task depth --data nyu --data-dir NYU --img-size 224 ...
    python lab/probe.py --preset in1k-probe-linear --weights CKPT --data-dir IMAGENET --out-dir OUT

The backbone is frozen; its final post-LayerNorm tokens are computed once per image set and only a head
trains (lab/analysis/probes.py: the heads, the learning-rate choice on a held-out tenth, mIoU, RMSE).
--task linear: a linear classifier on [class token; patch mean] (--data cifar100, or imagenet: an image
folder as train.py reads it). --task seg: a linear head on the patch tokens, mIoU (--data ade20k: ADE20k's
images/ + annotations/ folders). --task depth: a linear and a two-layer MLP head, RMSE in metres (--data
nyu: image files beside NAME_depth.png / .npy). With --data cifar100, seg and depth are our CPU-scale
analogue, named as such and not as ADE20k or NYUv2: 2 x 2 mosaics of CIFAR-100 images (training images
for the head's training set, test images for its test set), segmented by the class of each quadrant's
image, and the log2 zoom of each quadrant regressed per pixel (data.Mosaics).
--depth N runs a recurrent backbone at N steps (its --eval-depths unit) instead of its trained depth
(the reViT paper's Fig. 2 probes each elastic model at L = 8, 12, 16, 24) and writes probe_<task>_depth<N>.json.
Writes OUT/probe_<task>.json. Images are normalized as the backbone expects (an rvits checkpoint: its
run's dataset statistics; a timm file: ImageNet's). Any bad input is one line `probe.py: error: ...`
and exit status 2.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the product beside the lab

import torch
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

import data
from arms import PROBES
from analysis import probes
from training import flags, registry
from training.weights import read_weights, timm_vit
from analyze import save
from training.exits import Fail, printable_output


class Parser(argparse.ArgumentParser):
    def error(self, message):  # cli() prints it as one line with exit status 2
        raise Fail(message)


def get_parser():
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", required=True, metavar="FILE", help="an rvits checkpoint (or run folder) or a "
                   "ViT state dict in timm's layout (DINOv2's)")
    p.add_argument("--task", choices=["linear", "seg", "depth"], help="the probe (default: the preset's, else linear)")
    p.add_argument("--data", choices=["cifar100", "folder", "imagenet", "ade20k", "nyu"], help="the probe's data (default: "
                   "cifar100; with seg or depth the mosaic analogue)")
    p.add_argument("--data-dir", help="dataset root (default: $RVITS_DATA, else ../shared/data)")
    p.add_argument("--out-dir", required=True, help="where probe_<task>.json is written")
    p.add_argument("--preset", choices=sorted(PROBES), help="a probe protocol of lab/arms.py PROBES")
    p.add_argument("--img-size", type=flags.positive(int), help="the backbone's input size (default: an rvits "
                   "checkpoint's trained size; a timm file: 224)")
    p.add_argument("--num-train", type=flags.positive(int), help="first N training images (mosaics: 5000)")
    p.add_argument("--num-test", type=flags.positive(int), help="first N test images (mosaics: 1000)")
    p.add_argument("--epochs", type=flags.positive(int), help="passes of the head over the cached features "
                   "(default: linear 30, seg and depth 20)")
    p.add_argument("--depth", type=flags.positive(int), help="a recurrent rvits backbone's steps (its "
                   "--eval-depths unit; default: its trained depth); writes probe_<task>_depth<N>.json")
    p.add_argument("--seed", type=flags.seed, default=0, help="the held-out split, the head's init and order")
    p.add_argument("--batch-size", type=flags.positive(int), default=128, help="feature extraction batch")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    return p


def backbone(path, img_size, device, depth=None):
    """(frozen model, its input size, (mean, std) it expects, what it is in words). Raises Fail for a file
    that is not a classifier's or ViT's, for an rvits checkpoint at an --img-size its patches do not divide,
    and for a `depth` (--depth) given to a fixed stack (an untied ViT, a timm file)."""
    ck = read_weights(path, "--weights")
    if registry.classifier_checkpoint(ck, path, "--weights"):
        run = ck["args"]
        own = run.get("img_size") or (224 if run.get("data") in data.FOLDERS else 32)
        patch = run.get("patch_size")
        if img_size and patch and img_size % patch:
            below = img_size // patch * patch
            raise Fail(f"--img-size {img_size}: not a multiple of the backbone's patch size {patch}; use "
                       + (f"{below} or " if below else "") + f"{below + patch}")
        if depth and run["model"] == "vit":
            raise Fail(f"--depth {depth}: {path} is an untied ViT (--model vit), a fixed stack of blocks; --depth "
                       "runs a recurrent backbone (bvit, revit, srvit, odevit) at another depth: leave it out")
        model = registry.model_from_checkpoint(ck, path, "--weights", flags.get_parser(), img_size or own)
        return model, img_size or own, data.normalization(run.get("data")), f"--model {run['model']}"
    if depth:
        raise Fail(f"--depth {depth}: {path} is a timm-layout ViT, a fixed stack of blocks; --depth runs a recurrent "
                   "rvits checkpoint (bvit, revit, srvit, odevit) at another depth: leave it out")
    model = timm_vit(path, "--weights", img_size=img_size or 224)
    return model, model.img_size, (data.IMAGENET_MEAN, data.IMAGENET_STD), "timm-layout ViT"


def datasets(args, size, mean_std):
    """(train set, test set, number of classes or None) of the probe's task and data."""
    root = args.data_dir or data.default_root()
    if args.task == "linear":
        if args.data not in ("cifar100", *data.FOLDERS):
            raise Fail(f"--task linear --data {args.data}: a classifier's data; use --data cifar100 or folder")
        train, test, classes, _ = data.build_datasets(args.data, root, size, augment=False, mean_std=mean_std)
        return train, test, classes
    if args.data == "cifar100":  # the mosaic analogue of a dense task
        mosaic = lambda train, n, seed: data.Mosaics(*data.load_cifar100(root, train), n, size, seed, mean_std)
        return mosaic(True, args.num_train or 5000, args.seed), mosaic(False, args.num_test or 1000, args.seed + 1), 100
    want = {"seg": "ade20k", "depth": "nyu"}[args.task]
    if args.data != want:
        raise Fail(f"--task {args.task} --data {args.data}: use --data {want} (or cifar100, the mosaic analogue)")
    return (data.DenseFolder(root, args.data, True, size, mean_std), data.DenseFolder(root, args.data, False, size,
                                                                                      mean_std), 150 if want == "ade20k" else None)


def main(argv=None):
    args = get_parser().parse_args(argv)
    for k, v in PROBES.get(args.preset, {}).items():  # a preset fills what the command line left out
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.task, args.data = args.task or "linear", args.data or "cifar100"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise Fail("--device cuda: no CUDA device is available; use --device cpu")
    t0 = time.time()
    model, size, mean_std, what = backbone(args.weights, args.img_size, args.device, args.depth)
    model = model.to(args.device)
    try:
        train, test, classes = datasets(args, size, mean_std)
    except (data.DataError, ValueError) as e:
        raise Fail(f"{e} (--data-dir)")
    n_train, n_test = (min(n or len(s), len(s)) for n, s in ((args.num_train, train), (args.num_test, test)))
    if n_train < 2:  # (lab/analysis/probes.select_and_fit: a held-out tenth, at least one image, and the rest)
        said = f"--num-train {args.num_train}" if args.num_train and args.num_train < 2 else f"{n_train} training image"
        raise Fail(f"{said}: the probe needs at least 2 training images (it holds out a tenth, at least one, to "
                   "choose the head's learning rate, and fits the head on the rest)")
    dense = args.task != "linear"
    feats = []
    for name, ds, n in (("train", train, n_train), ("test", test, n_test)):
        loader = DataLoader(Subset(ds, range(n)), batch_size=args.batch_size)
        bar = lambda it, name=name: tqdm(it, desc=f"features ({name})", leave=False, file=sys.stderr)
        feats.append(probes.extract(model, loader, args.device, dense, progress=bar, depth=args.depth))
    (x, ys), (xt, yts) = feats
    seconds = time.time() - t0
    fits = lambda it, desc: tqdm(it, desc=desc, leave=False, file=sys.stderr)  # each head's passes
    if args.task == "linear":
        res = probes.linear_probe((x, ys[0]), (xt, yts[0]), classes, args.epochs or 30, args.seed, device=args.device,
                                   progress=fits)
        line = f"linear probe top-1 {res['top1']:.2f} %"
    elif args.task == "seg":
        res = probes.seg_probe((x, ys[0]), (xt, yts[0]), classes, args.epochs or 20, args.seed, device=args.device,
                                progress=fits)
        line = f"segmentation mIoU {res['miou']:.2f} % (pixel accuracy {res['pixel_acc']:.2f} %)"
    else:
        k = 1 if args.data == "cifar100" else 0  # the mosaics' second target: log2 zoom
        res = probes.depth_probe((x, ys[k]), (xt, yts[k]), args.epochs or 20, args.seed, device=args.device,
                                  progress=fits)
        unit = "log2 zoom" if args.data == "cifar100" else "m"
        line = f"depth RMSE linear {res['linear']['rmse']:.4f}, MLP {res['mlp']['rmse']:.4f} ({unit})"
    analogue = args.task != "linear" and args.data == "cifar100"
    out = {"task": args.task, "data": args.data + (" mosaics (our analogue)" if analogue else ""), "preset": args.preset,
           "weights": args.weights, "backbone": what, "depth": args.depth, "img_size": size, "num_train": n_train, "num_test": n_test,
           "feature_shape": list(x.shape[1:]), "seed": args.seed, "extract_s": round(seconds, 1),
           "total_s": round(time.time() - t0, 1), **res}
    name = f"probe_{args.task}" + (f"_depth{args.depth}" if args.depth else "")
    save(out, args.out_dir, name, lambda res, path: None)  # (JSON only: no figure)
    at = f" at depth {args.depth}" if args.depth else ""
    print(f"{line}; {what}{at} at {size} px, {n_train} / {n_test} images; wrote {args.out_dir}/{name}.json")
    return out


def cli(argv=None):
    """main(argv) with every user-fixable problem as one line on stderr and exit status 2."""
    printable_output("probe.py")  # (a path on a stdout that cannot encode it: escaped; a failed write ends nothing)
    try:
        main(argv)
    except Fail as e:
        sys.stderr.write(f"probe.py: error: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
