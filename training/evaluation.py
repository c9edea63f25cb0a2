"""Evaluation for train.py: a classifier's top-1 / top-5 and loss (evaluate), summed over the ranks
(eval_batches, summed_over_ranks: also train_loopvae.py's); a classifier at other depths
(evaluate_depths, "beyond the training horizon": its table, depth_eval.json and figure).
"""
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import data
from training.exits import Fail, Preempted, cannot_write, stopping, write
from training.figures import pyplot
from training.registry import trained_depth


@torch.no_grad()
def evaluate(model, loader, device, amp_ctx, depth=None, stop=None):
    """Top-1/top-5 (percent) and cross-entropy of the final logits, summed over all ranks. Raises
    EmptyEvaluation when no rank had a usable image. Returns None, after the batch in flight, once
    `stop` (a Stop; one process only) holds a stop request."""
    model.eval()
    sums, count = torch.zeros(3, device=device, dtype=torch.float64), 0  # loss, top1, top5; images
    for x, y in eval_batches(loader, device):
        if stop:
            model.train()
            return None
        with amp_ctx:
            logits = model(x, depth=depth)
        logits = logits.float()
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hit = top5 == y[:, None]
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"), hit[:, 0].sum(), hit.any(1).sum()]).double()
        count += len(y)
    model.train()
    loss, a1, a5, n = summed_over_ranks(sums, count)
    return {"val_loss": loss / n, "val_acc1": 100 * a1 / n, "val_acc5": 100 * a5 / n}


def eval_batches(loader, device):
    """The validation batches (x, y) of `loader` on `device`; image folders: undecodable images dropped
    (data.drop_undecodable warns once per file), a batch without a usable one skipped."""
    for x, y in loader:
        if isinstance(loader, torch.utils.data.DataLoader):  # image folders only
            x, y, _ = data.drop_undecodable(x, y, loader.dataset)
            if not len(y):
                continue
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def summed_over_ranks(sums, count):
    """An evaluation's sums (K,) on the device and its image count, all-reduced over the ranks in one
    copy: K + 1 floats, the count last. Raises EmptyEvaluation when the count is 0."""
    sums = torch.cat([sums, sums.new_tensor([count])])  # one host-to-device copy per evaluation
    if dist.is_initialized():
        dist.all_reduce(sums)
    out = sums.tolist()
    if not out[-1]:
        raise EmptyEvaluation("no validation image could be used: every one was undecodable (the warnings above "
                              "name them); fix or replace the validation images")
    return out


class EmptyEvaluation(Fail):
    """An evaluation without a single usable image (all undecodable): one line, exit status 2."""


# ----------------------------------------------------------------------------- after training
EVAL_DEPTH_LIMIT = 32  # --eval-depths: at most this many times the trained depth (check_eval_depths)


def check_eval_depths(args):
    """The first problem of --eval-depths in a run of resolved flags `args` as one line, else None: a depth
    beyond EVAL_DEPTH_LIMIT x the trained depth (in the model's unit: registry.trained_depth). An evaluation's
    time grows with its depth (depth L costs L / trained of the trained depth's evaluation), and so does
    reViT's memory: its FFN is merged for every step, once per forward (reViT's depth 100000 asked 26 GB of
    a GPU). 32x takes the studies' 4x and --eval-only's default 8x with room; deeper is a study of its own."""
    return depth_problem("--eval-depths", args.eval_depths or [], args)


def depth_problem(flag, depths, run):
    """The first of `depths` (flag `flag`: --eval-depths, analyze.py's --depth) beyond EVAL_DEPTH_LIMIT x the
    trained depth of `run` (resolved flags: a Namespace or a dict) as one line naming the flag, else None."""
    trained = trained_depth(run)
    most = EVAL_DEPTH_LIMIT * trained
    over = [d for d in depths if d > most]
    if over:
        return (f"{flag} {over[0]}: at most {EVAL_DEPTH_LIMIT}x the trained depth {trained} ({most}): an "
                "evaluation's time grows with its depth, and reViT's memory too (its FFN merged for every step); give "
                f"depths up to {most}")
    return None


def evaluate_depths(args, run, raw_model, ema, val_loader, step):
    """Top-1/top-5 at --eval-depths (with --eval-only and none given: 0.5x-8x the trained depth in the
    model's unit), "beyond the training horizon" (Training Crossroads), of the weights trained to `step`:
    each once (a depth given twice is evaluated once: announce says so), one log.jsonl line each (training runs)
    and depth_eval.json (results_files: depth_eval-2.json ... where OUT holds a record this run did not make)
    rewritten after each (write_depth_eval: a failure at a depth keeps the depths before
    it), then depth_report's table and figure. `run`:
    the run's Run (training/run.py): its device, precision, log and stop, and val_images, the validation
    images of every process (`val_loader` holds this process's share), for its lines. Raises Fail for a depth
    the model cannot run or has no memory for, Preempted for a stop request (`run.stop`): after the batch in flight (one
    process), or before the next depth (DDP: the processes agree there)."""
    device, amp_ctx, master, stop = run.device, run.amp_ctx, run.master, run.stop
    log_path, images = run.log_path, run.val_images
    depths, rows = list(dict.fromkeys(args.eval_depths or [])), []
    json_path, png = (None, None) if args.eval_only else results_files(args, master, "depth_eval.json", "depth_eval.png")
    weights, eval_model = ("ema", ema.module) if args.eval_ema else ("model", raw_model)
    if args.eval_only and not depths:  # 0.5, 1, 2, 4, 8 x the trained depth, in the model's own unit
        depths = sorted({max(1, round(f * trained_depth(args))) for f in (0.5, 1, 2, 4, 8)})
    ddp = dist.is_initialized()
    # the trained depth's epoch evaluation, reused: rank 0 wrote log.jsonl, so its reading decides for every
    # process (a peer may read the file before that write, or not see it on another node's disk)
    known = [epoch_evaluation(log_path, step, "ema_" if args.eval_ema else "") if master and not args.eval_only
             else None]
    if ddp:
        dist.broadcast_object_list(known, src=0)
    known = known[0]
    for depth in depths:
        try:
            if known and depth == trained_depth(args):  # the last epoch's own evaluation, of these weights
                r = known
            else:
                if master:
                    print(f"evaluating at depth {depth} on {images} validation images", flush=True)
                r = None if stopping(stop, ddp, device) else evaluate(eval_model, val_loader, device, amp_ctx,
                                                                       depth=depth, stop=None if ddp else stop)
        except ValueError as e:
            raise Fail(f"--eval-depths {depth}: {e}")
        except RuntimeError as e:  # (torch.OutOfMemoryError on a GPU; the CPU allocator's is a RuntimeError)
            if not isinstance(e, torch.OutOfMemoryError) and "can't allocate memory" not in str(e):
                raise
            kept = f"; depths {', '.join(str(r['depth']) for r in rows)} are in {os.path.basename(json_path)}" \
                if rows else ""
            raise Fail(f"--eval-depths {depth}: out of memory ({str(e).strip().splitlines()[0][:160]}){kept}; "
                       "give smaller depths, or a smaller --eval-batch-size")
        if r is None:
            done = "" if args.eval_only else f", after training to step {step}"
            line = stop.line(f"in the evaluation at depth {depth} ({len(rows)} of {len(depths)} depths done{done})")
            if args.eval_only and rows:  # the depths done are in its results file (written after each)
                line = line.replace("nothing was written", f"{os.path.basename(json_path)} holds depth(s) "
                                    + ", ".join(str(r["depth"]) for r in rows))
            raise Preempted(line)
        rec = {"depth": depth, "val_acc1": r["val_acc1"], "val_acc5": r["val_acc5"], "weights": weights}
        # block evaluations per image: counted by the model if it can (odevit: a step's evaluations), else the depth
        nfe = depth * raw_model.blocks_per_step if hasattr(raw_model, "nfe") else depth
        rows.append({**rec, "nfe": nfe, "val_loss": r["val_loss"]})
        if master and not args.eval_only:
            write(log_path, json.dumps(rec) + "\n", stop.kept(), append=True)
            print(json.dumps(rec))
        if master:  # each depth kept before the next starts
            if json_path is None:  # (--eval-only: names of its own, claimed at its first write)
                json_path, png = results_files(args, master, "depth_eval.json", "depth_eval.png")
            write_depth_eval(args, raw_model, rows, step, stop.kept(), json_path)
    if master and rows:
        depth_report(args, raw_model, rows, stop.kept(), png)


def epoch_evaluation(log_path, step, prefix=""):
    """The validation metrics {val_acc1, val_acc5, val_loss} that log.jsonl's epoch record of `step` holds
    (`prefix` "ema_": the EMA weights'), or None: the trained depth's evaluation, not repeated by
    evaluate_depths."""
    try:
        with open(log_path) as f:
            recs = [json.loads(ln) for ln in f if '"epoch"' in ln]
    except (OSError, ValueError):
        return None
    last = recs[-1] if recs else {}
    keys = ("val_acc1", "val_acc5", "val_loss")
    if last.get("step") != step or not all(prefix + k in last for k in keys):
        return None
    return {k: last[prefix + k] for k in keys}


def results_files(args, master, *names):
    """The paths in OUT that a run's results `names` go to (rank 0, `master`; other ranks write none): a training
    run's own (OUT/depth_eval.json, ...: its folder; one there that names another checkpoint, an --eval-only's
    that wrote into the folder before this run, is left as it is), and for --eval-only, which may write into
    another run's folder, names no file there has: the names themselves, else with -2, -3, ... before the extension
    (depth_eval-2.json with depth_eval-2.png), the first claimed now by an exclusive create (its write replaces
    the empty file; call this when that write follows), so that it never replaces a record it did not make (the
    training run's depth evaluation, an earlier --eval-only's). A folder that cannot be written raises Fail."""
    paths = [os.path.join(args.out_dir, name) for name in names]
    if not master or not args.eval_only and made_here(paths[0], os.path.join(args.out_dir, "ckpt.pt")):
        return paths
    n = 1
    while True:
        try:
            if not any(os.path.lexists(p) for p in paths[1:]):
                os.close(os.open(paths[0], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                if n > 1:
                    print(f"note: {args.out_dir} holds {names[0]} of another run or evaluation, which this one leaves "
                          f"as it is: its results go to {', '.join(map(os.path.basename, paths))}", flush=True)
                return paths
        except FileExistsError:
            pass
        except OSError as e:
            raise cannot_write(paths[0], e, "nothing was written")
        n += 1
        paths = [os.path.join(args.out_dir, f"{os.path.splitext(name)[0]}-{n}{os.path.splitext(name)[1]}")
                 for name in names]


def made_here(path, ckpt):
    """Whether the results file at `path` is absent or a training run's of the checkpoint `ckpt` (its
    "checkpoint" in the same folder; an --eval-only's record says "eval_only": true)."""
    try:
        with open(path) as f:
            res = json.load(f)
        said = res.get("checkpoint")
    except FileNotFoundError:
        return True
    except (OSError, ValueError, AttributeError):
        return False
    return not res.get("eval_only") and isinstance(said, str) and os.path.realpath(
        os.path.dirname(os.path.abspath(said))) == os.path.realpath(os.path.dirname(os.path.abspath(ckpt)))


def write_depth_eval(args, model, rows, step, kept, path=None):
    """Write OUT/depth_eval.json (or `path`: results_files'): the run's depth evaluation so far (rows: [{depth,
    nfe, val_acc1, val_acc5, val_loss}]). A write that fails raises Fail saying what the run keeps (`kept`,
    e.g. Stop.kept())."""
    res = {"checkpoint": args.resume if args.eval_only else os.path.join(args.out_dir, "ckpt.pt"),
           "model": args.model, "trained_depth": trained_depth(args), "step": step,
           "solver": getattr(model, "solver", None), "extend": getattr(model, "extend", None),
           "val_subset": args.val_subset, "img_size": args.img_size or getattr(model, "img_size", None),
           "weights": rows[0].get("weights") if rows else None, "results": rows,
           **({"eval_only": True} if args.eval_only else {})}
    write(path or os.path.join(args.out_dir, "depth_eval.json"), json.dumps(res, indent=1), kept)


def depth_report(args, model, rows, kept, png=None):
    """Print accuracy by depth (rows: write_depth_eval's, which wrote depth_eval.json or results_files' name), and
    draw OUT/depth_eval.png (or `png`, results_files' name beside it) with matplotlib (an optional extra; without
    it one line says the figure was not drawn: figures.pyplot). A write that fails raises
    Fail saying what the run keeps (`kept`)."""
    print(f"{'depth':>6} {'nfe':>5} {'acc@1':>7} {'acc@5':>7} {'loss':>7}")
    for r in rows:
        print(f"{r['depth']:>6} {r['nfe']:>5} {r['val_acc1']:>7.2f} {r['val_acc5']:>7.2f} {r['val_loss']:>7.3f}")
    png = png or os.path.join(args.out_dir, "depth_eval.png")
    plt = pyplot(png)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["depth"] for r in rows], [r["val_acc1"] for r in rows], "o-")
    ax.axvline(trained_depth(args), color="gray", linestyle="--", label=f"trained depth {trained_depth(args)}")
    ax.set_xscale("log", base=2)
    solver = getattr(model, "solver", None)
    what = f"{args.model} {solver}, extend={getattr(model, 'extend', None)}" if solver else args.model
    ax.set(xlabel="depth at evaluation", ylabel="val top-1 (%)", title=f"{what}: accuracy vs depth")
    ax.legend()
    try:
        fig.savefig(png, dpi=120, bbox_inches="tight")
    except OSError as e:
        raise cannot_write(png, e, kept)
    finally:
        plt.close(fig)
