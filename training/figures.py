"""How is a figure drawn? With matplotlib, an optional extra (pyplot: the module, or one line naming the
figure left out and how to get it), and a run's curves from its log.jsonl (read_log, curves; the command:
scripts/curves.py)."""
import json
import math
import os
import sys


def pyplot(*paths):
    """matplotlib.pyplot with the file-only Agg backend, or None when matplotlib is not installed, after one
    line on stderr naming the figures `paths` that are left out and how to get them. Every figure of rvits
    (train.py's depth_eval.png, analyze.py's, scripts/curves.py's) is drawn through it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 (not installed; or too old, broken: an import can raise anything)
        names = ", ".join(map(str, paths)) or "the figure"
        why = "is not installed" if isinstance(e, ImportError) and (e.name or "").split(".")[0] == "matplotlib" else (
            f"cannot be used ({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:120]})")
        print(f"note: matplotlib {why}: {names} not drawn (the numbers are in the JSON files); "
              "pip install matplotlib draws it", file=sys.stderr, flush=True)
        return None
    return plt


def read_log(path):
    """A run's log.jsonl at `path` as (step records, epoch records), each ordered by step, a later record
    of a step replacing an earlier one (a resumed run writes the steps after its checkpoint again).
    Step records are --log-every's ({step, loss, lr, grad_norm, img_per_s}); epoch records hold "epoch";
    the depth evaluations' records ("depth") are left out. Raises OSError, ValueError (a line that is
    not JSON: the line's number)."""
    steps, epochs = {}, {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}, line {n}: not a JSON record")
            if "epoch" in rec and "depth" not in rec:
                epochs[rec["step"]] = rec
            elif "loss" in rec and "epoch" not in rec:
                steps[rec["step"]] = rec
    return [steps[k] for k in sorted(steps)], [epochs[k] for k in sorted(epochs)]


def curves(steps, epochs, path, title=""):
    """The run's curves, to the PNG `path` (nothing without matplotlib: pyplot's line): left, the training
    loss per optimizer step (--log-every's records, thin) and the epoch means (train_loss, dots); right, the
    validation top-1 per epoch (and the EMA weights' with --ema), or a tokenizer's PSNR. `steps`, `epochs`:
    read_log's lists of records. Returns whether it was drawn."""
    plt = pyplot(path)
    if plt is None:
        return False
    metric, label = ("val_psnr", "validation PSNR (dB)") if any("val_psnr" in r for r in epochs) else (
        "val_acc1", "validation top-1 (%)")
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    if steps:
        ok = [r for r in steps if r["loss"] is not None]
        ax[0].plot([r["step"] for r in ok], [r["loss"] for r in ok], lw=0.8, alpha=0.7, label="step (last micro-batch)")
    means = [r for r in epochs if isinstance(r.get("train_loss"), (int, float)) and math.isfinite(r["train_loss"])]
    ax[0].plot([r["step"] for r in means], [r["train_loss"] for r in means], "o-", label="epoch mean")
    ax[0].set(xlabel="optimizer step", ylabel="training loss", title="training loss")
    ax[0].legend()
    for key, name in ((metric, "model"), ("ema_" + metric, "EMA")):
        rows = [r for r in epochs if key in r]
        if rows:
            ax[1].plot([r["epoch"] + 1 for r in rows], [r[key] for r in rows], "o-", label=name)
    ax[1].set(xlabel="epoch", ylabel=label, title=label)
    ax[1].legend()
    if title:
        fig.suptitle(title)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
