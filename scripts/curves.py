"""A run's curves from its log.jsonl: the training loss per optimizer step and per epoch, the validation
top-1 (a tokenizer: PSNR) per epoch.

    python scripts/curves.py runs/bvit-20261204-101500              # RUN/curves.png
    python scripts/curves.py runs/X/log.jsonl --out curves.png

The steps' losses are the records of train.py --log-every N; without them the loss is the epochs' means.
Prints the epoch records as a table (standard library); the figure needs matplotlib, an optional extra
(without it one line says which figure was not drawn). Bad input: one line `curves.py: error: ...`, exit 2.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from training.figures import curves, read_log  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run folder (train.py's --out-dir) or its log.jsonl")
    p.add_argument("--out", help="the PNG to write (default: curves.png beside the log)")
    args = p.parse_args(argv)
    path = os.path.join(args.run, "log.jsonl") if os.path.isdir(args.run) else args.run
    try:
        steps, epochs = read_log(path)
    except (OSError, ValueError) as e:
        print(f"curves.py: error: {getattr(e, 'strerror', None) and f'{path}: {e.strerror}' or e}; give a run folder "
              "that holds a log.jsonl (train.py writes one after its first epoch)", file=sys.stderr)
        return 2
    if not steps and not epochs:
        print(f"curves.py: error: {path} holds no step or epoch record yet (the first is written after "
              "--log-every N steps or the first epoch)", file=sys.stderr)
        return 2
    metric = "val_psnr" if any("val_psnr" in r for r in epochs) else "val_acc1"
    print(f"{path}: {len(steps)} step record(s), {len(epochs)} epoch record(s)")
    for r in epochs:
        loss = r.get("train_loss")
        print(f"  epoch {r['epoch']}: step {r['step']}, train_loss {'-' if loss is None else f'{loss:.4f}'}, "
              f"{metric} {r.get(metric, float('nan')):.2f}")
    out = args.out or os.path.join(os.path.dirname(path) or ".", "curves.png")
    if curves(steps, epochs, out, title=os.path.basename(os.path.dirname(os.path.abspath(path)))):
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
