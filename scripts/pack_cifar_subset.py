"""Pack a CIFAR-100 subset (same `cifar-100-python` pickle layout) into a small folder, for a
machine that has only the repository (e.g. the GPU check machine: at most 64 MiB travel).

    python scripts/pack_cifar_subset.py --src ../shared/data --dst gpu_data --train 10000 --test 2000
    python train.py --data cifar100 --data-dir gpu_data ...

The first N images of each file are taken (the files are already in a class-mixed order).
10,000 + 2,000 images are 37 MB. `gpu_data/` is git-ignored.
"""
import argparse
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--src", default=data.default_root(), help="folder holding cifar-100-python/")
    p.add_argument("--dst", default="gpu_data")
    p.add_argument("--train", type=int, default=10_000)
    p.add_argument("--test", type=int, default=2_000)
    args = p.parse_args()
    out = os.path.join(args.dst, "cifar-100-python")
    os.makedirs(out, exist_ok=True)
    for split, n, train in (("train", args.train, True), ("test", args.test, False)):
        images, labels = data.load_cifar100(args.src, train)
        d = {"data": images[:n].reshape(len(images[:n]), -1).numpy(), "fine_labels": labels[:n].tolist()}
        with open(os.path.join(out, split), "wb") as f:
            pickle.dump(d, f, protocol=2)
        print(f"{split}: {len(d['fine_labels'])} images -> {os.path.join(out, split)}")


if __name__ == "__main__":
    main()
