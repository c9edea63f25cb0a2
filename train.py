"""Train a recurrent ViT: one plain loop for one process, N processes (torchrun) and CPU or GPU.

    python train.py --model bvit --data cifar100 --data-dir ../shared/data --max-steps 300
    torchrun --nproc_per_node 8 train.py --model revit --experts 4 --size s --data imagenet --data-dir /imagenet
    python train.py --list-presets; python train.py --preset c100-bvit-ti --print-config

Read main(), then train(): main() sets the run up in the order of events, train() is the loop, and the
step's parts and the set-up phases follow them. What they lean on is in training/, one question per
file (training/__init__.py lists them): the flags (flags.py), --model's classes (registry.py),
checkpoints and resume (checkpoints.py), evaluation (evaluation.py), the progress bar and the estimate
(monitor.py), the stop signals and the exit statuses (exits.py). A paper's protocol is one flag (--preset,
presets.py).

The loop: AdamW (fused) or LAMB, linear warmup + cosine, bf16 autocast (fp16 with a GradScaler), gradient
accumulation, clipping, MixUp/CutMix and label smoothing, EMA, distillation from a frozen teacher
(--teacher), an atomic checkpoint every epoch, top-1/top-5 each epoch, and Ctrl-C / SIGTERM: the step in
flight finishes, a checkpoint is written, and the run says how to continue (exit 75). Writes OUT/log.jsonl,
OUT/ckpt.pt, OUT/args.json. The tokenizer LoopVAE trains with its own script, train_loopvae.py.
"""
import datetime
import os
import signal
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data
import kernels
from training import checkpoints, distill, evaluation, flags, optim, registry
from training.exits import (INTERRUPTED, PREEMPTED, Fail, PeerFailed, Preempted, Stop, leave_process_group,
                            printable_output, say, stopping)
from training.monitor import EpochSums, Monitor, announce
from training.run import Run, choose_device


def main(argv=None, stop=None):
    """The run of the flags `argv` (None: sys.argv), in the order of events. `stop`: the run's Stop,
    the handler of its stop signals (cli installs it)."""
    stop = stop if stop is not None else Stop()
    p = flags.get_parser()
    args = flags.configure(p, argv)  # the command line over a --preset over a checkpoint's flags
    if args is None:  # --print-config printed them
        return
    stop.eval_only, stop.running = args.eval_only, True

    # 1. processes, device, precision: the Run, the record of the run's facts (training/run.py), filled in below
    run = runtime(args, p, stop)
    stop.master = run.master  # (rank 0 answers a stop request with a line)
    # 2. data (read before the process group, so that a bad path fails fast on every rank)
    args, train_set, val_set, num_classes, img_size = load_data(args, p)
    start_processes(args, run)
    train_loader, val_loader = data.build_loaders(args, train_set, val_set, run.micro, run.rank, run.world, run.device)
    if train_loader is not None and len(train_loader) < args.grad_accum:
        raise Fail(f"--batch-size {args.batch_size} is larger than the training set ({len(train_set)})")
    run.val_images = len(val_set)

    # 3. the model (--model names its class: training/registry.py), and the weights it starts from
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts them)
    model_img = getattr(args, "model_img_size", None) if args.eval_only else None
    # --eval-only at another --img-size: the model at its trained size, with timm's dynamic size
    dynamic = bool(model_img) and model_img != img_size
    model = registry.build_model(args, model_img if dynamic else img_size, num_classes, dynamic_img_size=dynamic)
    if args.finetune and not args.resume:  # read on the CPU, before .to(device)
        report = checkpoints.start_weights(args, model)
        if run.master:
            print(report)
    model = model.to(run.device)
    if args.grad_checkpoint:
        model.set_grad_checkpointing(True)
    raw_model = model  # (compile and DDP wrap `model`; the checkpoint and evaluation use this one)

    # 4. what trains beside it: a frozen teacher (--teacher)
    distiller = distill.from_flags(args, p, model, run.device)  # (None unless --teacher: not for --eval-only)
    scope, why = compile_scope(args, run, raw_model, distiller)  # (checked before a file is written)

    # 5. optimizer, schedule (the run's length), loss scaler (fp16), EMA
    optimizer, scheduler, run.steps_per_epoch, run.total_steps, run.warmup = optimizer_and_schedule(
        args, model, distiller, train_loader)
    scaler = torch.amp.GradScaler(run.device.type, enabled=args.amp == "fp16")
    ema = optim.EMA(model, args.ema) if args.ema else None

    # 6. resume or start fresh, and what a stopped run keeps
    run.ckpt_path, run.log_path = os.path.join(args.out_dir, "ckpt.pt"), os.path.join(args.out_dir, "log.jsonl")
    classes = getattr(train_set, "classes", None)
    run.start_epoch, run.start_batch, run.start_step, run.progress = checkpoints.resume_or_start(
        args, run, model, optimizer, scheduler, scaler, ema, distiller, classes)  # (reads only)
    lock = checkpoints.take_out_dir(args, run)  # the folder created and locked to this run, its log continued
    if args.resume and not args.eval_only:  # what a stopped run keeps, until its first checkpoint
        stop.checkpoint, stop.step = args.resume, run.resumed["step"]
    stop.hint = checkpoints.continue_hint(p, argv, run.ddp, run.ckpt_path)
    save = checkpoints.Saver(run, {"model": raw_model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler,
                                   "ema": ema, "distill": distiller}, args, classes)

    # 7. compile (before DDP), DDP
    model, distiller, compiled = compile_and_wrap(args, run, model, distiller, scope, why)
    if run.master:
        announce(args, run, raw_model, compiled, distiller is not None, notes=flags.rounded_to_nothing(p, args, run))

    # 8. the loop
    step = run.start_step
    if not args.eval_only:
        monitor = Monitor(args, run, save, scheduler)
        usable = data.UsableImages(train_set, args.max_bad_images) if args.data in data.FOLDERS else None
        step = train(args, monitor, model, raw_model, distiller, optimizer, scheduler, scaler, ema,
                     data.MixAndSmooth(args, num_classes), (train_loader, val_loader, usable))

    # 9. the model at other depths ("beyond the training horizon")
    evaluation.evaluate_depths(args, run, raw_model, ema, val_loader, step)
    if run.master:
        files = sorted(f for f in os.listdir(args.out_dir) if not f.startswith("."))
        print(f"done: {args.out_dir} holds {', '.join(files)}")
    leave_process_group()
    if lock is not None:
        checkpoints.release_out_dir(lock)


def train(args, monitor, model, raw_model, distiller, optimizer, scheduler, scaler, ema, mix, loaders):
    """The training loop (docs/training.md): epochs of optimizer steps from the run's start_step on
    (checkpoints.resume_or_start's), each epoch evaluated, logged and checkpointed. `model` is what
    runs the forward (compiled, DDP), `raw_model` the module itself; `monitor` (training/monitor.py)
    holds the run (`monitor.run`, a training/run.py Run: processes, device, stop, paths, length, start)
    and the save, and does what happens between steps: the bar, the estimate, the device reads, the
    stop requests (a checkpoint after the step in flight, then Preempted) and --save-every. `loaders`:
    (train, val, data.UsableImages or None). Returns the optimizer step reached."""
    run, (train_loader, val_loader, usable) = monitor.run, loaders
    device, ddp, world, stop, amp_ctx = run.device, run.ddp, run.world, run.stop, run.amp_ctx
    epoch, start_batch, step, progress = run.start_epoch, run.start_batch, run.start_step, run.progress
    start_epoch, steps_per_epoch, total_steps = epoch, run.steps_per_epoch, run.total_steps
    if stopping(stop, ddp, device):  # a stop request during the set-up
        raise Preempted(stop.line(f"before the first step (at step {step})"))
    while step < total_steps and epoch < args.epochs:
        first = start_batch if epoch == start_epoch else 0  # optimizer steps of this epoch already done
        train_loader.sampler.set_epoch(epoch)
        train_loader.sampler.set_start(first * (args.batch_size // world))
        sums, progress = EpochSums(progress, device), {}
        left = min(steps_per_epoch - first, total_steps - step)
        batches = monitor.epoch(epoch, first, left, train_loader, sums)
        for i in range(left):
            step_loss, seen = 0.0, 0  # seen: micro-batches with a usable image
            for j in range(args.grad_accum):  # micro-batches of one optimizer step (gradients add up)
                x, y = next(batches)
                x, y, weight = usable_batch(x, y, usable, sums, ddp, monitor, args.grad_accum)
                if not weight and not ddp:
                    continue  # nothing to learn from: no forward, no backward, no step below if all are
                x, y = mix(x.to(device, non_blocking=True), y.to(device, non_blocking=True))  # MixUp/CutMix, smoothing
                accumulating = ddp and j < args.grad_accum - 1  # DDP all-reduces in the last backward only
                with no_sync(model, accumulating), no_sync(distiller, accumulating):
                    with amp_ctx:
                        logits, loss = model(x, y)  # the forward and the model's loss
                        if distiller is not None:  # + the distillation term (training/distill.py)
                            term = distiller(x, logits)
                            raw_model.aux["distill_loss"] = term.detach()  # logged with the model's terms
                            loss = args.task_weight * loss + args.distill_weight * term
                    scaler.scale(loss * weight).backward()  # the mean over the step's micro-batches
                if weight:
                    step_loss, seen = step_loss + loss.detach() / args.grad_accum, seen + 1
                    sums.images += x.shape[0] * world
            bad = None  # (0-d, device) 1 when the step was skipped as non-finite
            if seen or ddp:  # gradients are all-reduced, so every rank skips the same steps
                bad = optim.optimizer_step(raw_model, optimizer, scaler, args.clip_grad)  # unscale, clip, step
                sums.add(step_loss, bad)
                if hasattr(raw_model, "after_step"):  # balancers between steps (revit_moe: DeepSeek-V3, ReMoE)
                    raw_model.after_step()
            else:  # one process, no usable image in the whole step: no optimizer step, nothing logged
                optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            if ema is not None:
                ema.update(raw_model)
            step += 1
            monitor.after_step(step, epoch, first + i + 1, loss, bad, sums)
        # the epoch's end (training/monitor.py): its record (the model's terms, the evaluation, of the EMA too), the
        # checkpoint with it, then its line in log.jsonl
        inside = first + left < steps_per_epoch  # stopped inside the epoch by --max-steps: resumable there
        monitor.close_epoch(step, inside, sums, raw_model, ema,
                            lambda m: evaluation.evaluate(m, val_loader, device, amp_ctx))
        if inside:
            break
        epoch += 1
        if step < total_steps and epoch < args.epochs and stopping(stop, ddp, device):  # during the evaluation or save
            raise Preempted(stop.line(f"after step {step} of {total_steps}, the end of epoch {epoch - 1}"))
    return step


# ----------------------------------------------------------------------------- the step's parts
def usable_batch(x, y, usable, sums, ddp, monitor, grad_accum):
    """A micro-batch without its undecodable images (image folders: `usable`, a data.UsableImages;
    counted in `sums`): (x, y, weight), weight = the micro-batch's share of the step's loss, 1 / grad_accum,
    or 0.0 when no image is usable. Under DDP an empty micro-batch becomes a zero-weighted stand-in
    image, which keeps this rank in the gradient all-reduce. Raises Fail past --max-bad-images, after
    saving the steps since the last checkpoint (one process: monitor.fail)."""
    if usable is None:
        return x, y, 1.0 / grad_accum
    try:
        x, y, skipped = usable(x, y)
    except data.TooManyUndecodable as e:
        monitor.fail(f"{e}; fix or remove them", sums)
    sums.skipped += skipped
    empty = not len(y)
    if empty and ddp:
        x, y = torch.zeros((1, *x.shape[1:])), torch.zeros(1, dtype=torch.long)
    return x, y, 0.0 if empty else 1.0 / grad_accum


def no_sync(module, accumulating):
    """DDP's no_sync() while gradients accumulate over micro-batches (nothing for a plain module)."""
    return module.no_sync() if accumulating and isinstance(module, DDP) else nullcontext()


# ----------------------------------------------------------------------------- the set-up phases
def runtime(args, p, stop):
    """The processes (torchrun's RANK / WORLD_SIZE / LOCAL_RANK), the device and the precision of a run,
    checking the flags that depend on them (p.error, one line). Resolves --device, --amp and --workers
    in `args`. Returns the run's Run (training/run.py) of these facts and its Stop `stop`: ddp, rank,
    world, local_rank, device, micro (the micro-batch per process), amp_ctx (the autocast context)."""
    ddp = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank, world, local_rank = 0, 1, 0
    if ddp:
        try:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            local_rank = int(os.environ.get("LOCAL_RANK", 0))
        except ValueError:
            p.error(f"RANK={os.environ['RANK']!r}, WORLD_SIZE={os.environ['WORLD_SIZE']!r} in the environment: "
                    "expected integers (torchrun sets them); unset them to run one process")
    try:  # auto: cuda, else mps (an Apple GPU), else cpu
        device = choose_device(args.device, local_rank, ddp)
    except ValueError as e:
        p.error(str(e))
    args.device = device.type
    if args.amp == "auto":
        args.amp = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "none"
    if args.compile_scope and not args.compile:
        p.error(f"--compile-scope {args.compile_scope} needs --compile")
    if args.eval_ema and not args.ema:
        p.error("--eval-ema needs EMA weights: train with --ema DECAY (--eval-only takes it from the checkpoint)")
    if args.amp == "fp16" and device.type == "cpu":
        p.error("--amp fp16 needs a CUDA or MPS device; use --amp bf16 or none on CPU")
    if args.batch_size % (world * args.grad_accum):
        p.error(f"--batch-size {args.batch_size} is not divisible by the {world} processes x "
                f"--grad-accum {args.grad_accum}")
    micro = args.batch_size // world // args.grad_accum  # images per forward pass on one process
    if args.workers is None:  # a GPU consumes images faster than 2 workers decode them
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        args.workers = 2 if device.type == "cpu" else max(2, min(16, (os.cpu_count() or 2) // per_node))
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    amp_ctx = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else nullcontext()
    return Run(ddp, rank, world, local_rank, device, micro, amp_ctx, stop)


def load_data(args, p, **images):
    """The datasets of the flags, --val-subset applied, and the flags resolved against the data's
    image size (the entry point's resolve: p.entry): (args, train_set (None for --eval-only), val_set,
    num_classes, img_size). `images`: data.build_datasets' keywords of another entry point's images
    (train_loopvae.py's normalization and crops; default: the model record's normalization). Raises
    Fail for bad data."""
    images = images or {"mean_std": registry.MODELS[args.model].normalization}
    try:  # --eval-only reads no training set: an image folder's class names come from the checkpoint
        train_set, val_set, num_classes, img_size = data.build_datasets(
            args.data, args.data_dir, args.img_size, args.download, int(args.randaug), seed=args.seed,
            three_aug=args.three_augment, val_labels=args.val_labels, train=not args.eval_only,
            classes=getattr(args, "model_classes", None) if args.eval_only else None,
            color_jitter=args.color_jitter, crop_ratio=args.eval_crop_ratio, reprob=args.reprob, **images)
    except (data.DataError, ValueError) as e:
        raise Fail(str(e))
    if train_set is not None and args.data in data.FOLDERS:  # images far smaller than --img-size: one line (rank 0)
        small = data.small_images(train_set, img_size, getattr(args, "patch_size", None))  # (as given; LoopVAE: none)
        if small and os.environ.get("RANK", "0") == "0":
            print(small)
    args = p.entry.resolve(args, p, img_size)
    if args.val_subset:  # CIFAR: the first N images; image folders: N evenly spaced (the set is ordered by class)
        n = min(args.val_subset, len(val_set))
        keep = range(n) if args.data not in data.FOLDERS else [i * len(val_set) // n for i in range(n)]
        val_set = torch.utils.data.Subset(val_set, keep)
    return args, train_set, val_set, num_classes, img_size


def start_processes(args, run):
    """Join the DDP process group (NCCL on CUDA, gloo on the CPU; a dead or hung peer fails the others
    after --dist-timeout instead of a hang), and name the run folder when --out-dir is not given:
    rank 0 picks runs/MODEL-time and broadcasts it, so every process writes to the same one (`run`: the Run)."""
    device = run.device
    if run.ddp:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:  # (left in the shell by an earlier job, with plain python)
            raise Fail(f"RANK={os.environ['RANK']} and WORLD_SIZE={os.environ['WORLD_SIZE']} are set in the "
                       f"environment, {' and '.join(missing)} not: start the processes with torchrun, or unset RANK "
                       "and WORLD_SIZE to run one process")
        if device.type == "cuda":  # bind the device first: NCCL's communicator then uses it
            torch.cuda.set_device(device)
        try:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    timeout=datetime.timedelta(seconds=args.dist_timeout),
                                    device_id=device if device.type == "cuda" else None)
        except (dist.DistError, RuntimeError, ValueError) as e:  # a peer that never came, an address in use
            where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
            raise PeerFailed(f"rank {os.environ['RANK']}: the {os.environ['WORLD_SIZE']} processes did not meet at {where} "
                             f"within --dist-timeout {args.dist_timeout:g} s ({type(e).__name__}: "
                             f"{(str(e).strip().splitlines() or [''])[0][:160]}); start every process (torchrun does), "
                             "or raise --dist-timeout")
    if not args.out_dir:
        name = [checkpoints.new_run_dir(args.model, "eval" if args.eval_only else None) if run.master else None]
        if run.ddp:
            dist.broadcast_object_list(name, src=0)
        args.out_dir = name[0]


def compile_scope(args, run, model, distiller, also=()):
    """--compile's scope for the run `run` (its Run), checked before anything is written (kernels.choose_scope):
    ("blocks" or "model", why not the whole model; `also`: more (why, on) pairs that keep it to the blocks).
    Raises Fail for a --compile-scope the run cannot take, and for a machine without the compiler
    torch.compile needs on its device (kernels.compiler_missing)."""
    if not args.compile:
        return "blocks", None
    missing = kernels.compiler_missing(run.device)
    if missing:
        raise Fail(f"--compile: {missing}")
    blockers = [why for why, on in (("DDP", run.ddp), ("--teacher", distiller is not None), *also,
                                    ("--eval-only", args.eval_only)) if on]
    try:
        return kernels.choose_scope(model, args.compile_scope or "auto", blockers)
    except ValueError as e:
        raise Fail(f"--compile-scope {args.compile_scope}: {e}")


def optimizer_and_schedule(args, model, distiller, train_loader):
    """The optimizer (training/optim.py): AdamW, fused on CPU and CUDA (it skips a non-finite step on the
    device), or LAMB (eps 1e-8: DeiT's --opt-eps default, our reading of its code); no weight decay on
    1-D parameters; a feature distiller's projection trains too. The schedule: linear warmup, then
    cosine to --min-lr, over the run's optimizer steps (--max-steps compresses it). Returns (optimizer,
    scheduler, steps per epoch, total steps, warmup steps)."""
    groups = optim.param_groups(model, args.weight_decay, args.lr, getattr(args, "router_lr_scale", 1.0))
    if args.opt == "lamb":
        optimizer = optim.Lamb(groups, lr=args.lr, eps=1e-8)
    else:
        optimizer = torch.optim.AdamW(groups, lr=args.lr, fused=True)
    if distiller is not None and list(distiller.parameters()):
        optimizer.add_param_group({"params": list(distiller.parameters()), "weight_decay": args.weight_decay})
    steps_per_epoch = len(train_loader) // args.grad_accum if train_loader is not None else 0  # (--eval-only)
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    warmup = round(total_steps * min(args.warmup_epochs / args.epochs, 1.0))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, optim.lr_lambda(total_steps, warmup, args.lr, args.min_lr,
                                                                                 args.warmup_lr))
    return optimizer, scheduler, steps_per_epoch, total_steps, warmup


def compile_and_wrap(args, run, model, distiller, scope, why):
    """--compile (kernels.py; before DDP): each block (regional compilation), and the training forward
    whole where `scope` is "model"; then under DDP the model, and a distiller with parameters (its
    projection), wrapped (`run`: the Run). Returns (model, distiller, the words of the announcement)."""
    device, compiled = run.device, ""
    if args.compile:
        model = kernels.compile_for_training(model, scope, device)
        compiled = ", compiled: " + (f"each block (not the whole forward: {why})" if scope == "blocks" else
                                     "the whole training forward" + (" (CUDA graphs)" if device.type == "cuda"
                                                                     else "") + " and each block")
    if run.ddp:
        ids = [run.local_rank] if device.type == "cuda" else None
        model = DDP(model, device_ids=ids)
        if distiller is not None and list(distiller.parameters()):
            distiller = DDP(distiller, device_ids=ids)
    return model, distiller, compiled


def cli(argv=None, entry=None, prog="train.py"):
    """Run main(argv) with the run's Stop as the handler of its stop signals, and turn user-fixable
    problems into one line on stderr: returns the exit status (0 ok, 2 bad input, non-finite
    training, a full disk or /dev/shm, 1 a failed or timed-out DDP peer, 75 stopped by SIGINT,
    SIGTERM, SIGUSR1 or SIGHUP at a safe point, 130 stopped at once by a second Ctrl-C). A line that
    cannot be printed ends nothing (exits.Unfailing: a full disk under `> log`, a closed pipe or
    terminal). The loader workers end with the process (data.worker_signals, data.end_workers). `entry`,
    `prog`: another entry point's main() and name (train_loopvae.py's), whose lines start with it."""
    printable_output(prog)  # (a path on a stdout that cannot encode it: escaped; a failed write ends nothing)
    stop = Stop()
    handlers = {s: signal.signal(s, stop) for s in Stop.SIGNALS}
    try:
        (entry or main)(argv, stop)
    except SystemExit as e:  # argparse errors (status 2) and --help (status 0)
        return e.code
    except Fail as e:
        say(f"{prog}: error: {e}")
        return 2
    except Preempted as e:
        say(f"{prog}: {e}")
        return PREEMPTED
    except PeerFailed as e:
        say(f"{prog}: error: {e}")
        return 1
    except KeyboardInterrupt as e:  # (its words: where it stopped, when that is not a step)
        say(f"{prog}: stopped at once by a second Ctrl-C{f' {e}' if str(e) else ''}; {stop.kept()}")
        return INTERRUPTED
    except Exception as e:
        shm = data.out_of_shared_memory(e) or data.worker_died(e)  # (an evaluation's loader; training's: monitor)
        if shm:
            say(f"{prog}: error: {shm}; {stop.kept()}")
            return 2
        if not (dist.is_available() and dist.is_initialized()):
            raise
        msg = (str(e).strip().splitlines() or [""])[0]  # (gloo and NCCL raise a plain RuntimeError too)
        say(f"{prog}: error: rank {dist.get_rank()}: this process or a peer failed or timed out "
            f"({type(e).__name__}: {msg[:200]}); resume from the last checkpoint with --resume")
        return 1
    finally:  # the run's signal handlers end with it (cli may be called again in-process)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        kernels.release_compile_workers()  # a compiled run exits now, not never (kernels.py)
        leave_process_group(finished=False)  # (the normal ending left it in main; gloo's otherwise, see exits.py)
        checkpoints.release_unused()  # a default run folder claimed and never written to
    return 0


if __name__ == "__main__":
    sys.exit(cli())
