"""Train LoopVAE, a looped image tokenizer: Stage 1 (reconstruction) and Stage 2 (adversarial).

    python train_loopvae.py --preset in256-loopvae-cnn --data-dir DATA --out-dir runs/s1       # Stage 1 (a GPU)
    python train_loopvae.py --preset in256-loopvae-cnn-gan --stage2 runs/s1                   # Stage 2 from its run
    python train_loopvae.py --eval-only --resume runs/s1/ckpt.pt --rfid                      # PSNR, SSIM, rFID
    python train_loopvae.py --list-presets

LoopVAE (loopvae.py; arXiv 2609.11516) encodes an image into a small latent and decodes it, each branch
a core of K blocks looped over the scales. Stage 1 trains it on its own loss, L1 + lambda_KL KL (+ lambda_p
LPIPS: --perceptual lpips); Stage 2 (--stage2 CKPT) continues a Stage-1 run and adds an adversarial term
from a discriminator trained beside it (loopvae_train/adversarial.py). Each epoch logs the validation
PSNR, SSIM, L1 and KL (--rfid: rFID). The rest is train.py's: the data, the optimizer and schedule, the
checkpoints and --resume, the stop signals and exit statuses, the progress bar and log.jsonl (training/),
and the set-up phases and the step's parts of train.py, which this script calls. Read main(), then
train(): the loop, with the forward, the adversarial term, the backward and the optimizer step.
"""
import os
import sys

import torch

import data
import train as tutorial
from loopvae_train import adversarial, evaluation, flags as lvflags, perceptual
from training import checkpoints, flags, optim
from training.exits import Fail, Preempted, Stop, leave_process_group, stopping
from training.monitor import EpochSums, Monitor, announce


def main(argv=None, stop=None):
    """The run of the flags `argv` (None: sys.argv), in the order of events (train.py's main(), whose
    phases it calls). `stop`: the run's training/exits.Stop (cli installs it)."""
    stop = stop if stop is not None else Stop()
    p = lvflags.get_parser()
    args = flags.configure(p, argv)  # the command line over a --preset over a checkpoint's flags
    if args is None:  # --print-config printed them
        return
    stop.eval_only, stop.running = args.eval_only, True

    # 1. processes, device, precision; 2. data: images in [-1, 1], a tokenizer's crops on image folders
    run = tutorial.runtime(args, p, stop)
    stop.master = run.master
    args, train_set, val_set, _, img_size = tutorial.load_data(args, p, mean_std=lvflags.NORMALIZATION,
                                                               reconstruct=True)
    tutorial.start_processes(args, run)
    train_loader, val_loader = data.build_loaders(args, train_set, val_set, run.micro, run.rank, run.world, run.device)
    if train_loader is not None and len(train_loader) < args.grad_accum:
        raise Fail(f"--batch-size {args.batch_size} is larger than the training set ({len(train_set)})")
    run.val_images = len(val_set)

    # 3. the model (its weights fit any image size), and the weights it starts from (--stage2, --finetune)
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts them)
    model = lvflags.build_model(args, img_size)
    start = "--stage2" if args.stage2 else "--finetune" if args.finetune else None
    if start and not args.resume:  # read on the CPU, before .to(device)
        report = checkpoints.start_weights(args, model, start)
        if run.master:
            print(report)
    model = model.to(run.device)
    if args.grad_checkpoint:
        model.set_grad_checkpointing(True)
    raw_model = model  # (compile and DDP wrap `model`; the checkpoint and evaluation use this one)

    # 4. what trains beside it: the discriminator (--stage2); --rfid's network
    adversary = adversarial.from_flags(args, model, run.device)  # (None unless --stage2: not for --eval-only)
    rfid = perceptual.rfid_metric(run.device) if args.rfid else None
    scope, why = tutorial.compile_scope(args, run, raw_model, None, [("--stage2", adversary is not None)])

    # 5. optimizer, schedule (the run's length), loss scaler (fp16), EMA
    optimizer, scheduler, run.steps_per_epoch, run.total_steps, run.warmup = tutorial.optimizer_and_schedule(
        args, model, None, train_loader)
    scaler = torch.amp.GradScaler(run.device.type, enabled=args.amp == "fp16")
    ema = optim.EMA(model, args.ema) if args.ema else None

    # 6. resume or start fresh (Stage 2: the discriminator and its optimizer too), and what a stopped run keeps
    run.ckpt_path, run.log_path = os.path.join(args.out_dir, "ckpt.pt"), os.path.join(args.out_dir, "log.jsonl")
    run.start_epoch, run.start_batch, run.start_step, run.progress = checkpoints.resume_or_start(
        args, run, model, optimizer, scheduler, scaler, ema, None, getattr(train_set, "classes", None),
        {"adversary": adversary}, lvflags.arch())  # (reads only)
    lock = checkpoints.take_out_dir(args, run)  # the folder created and locked to this run, its log continued
    if args.resume and not args.eval_only:  # what a stopped run keeps, until its first checkpoint
        stop.checkpoint, stop.step = args.resume, run.resumed["step"]
    stop.hint = checkpoints.continue_hint(p, argv, run.ddp, run.ckpt_path)
    save = checkpoints.Saver(run, {"model": raw_model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler,
                                   "ema": ema, "adversary": adversary}, args, getattr(train_set, "classes", None))

    # 7. compile (before DDP), DDP
    model, _, compiled = tutorial.compile_and_wrap(args, run, model, None, scope, why)
    if run.master:
        also, notes = stage2_lines(args, run)
        announce(args, run, raw_model, compiled, False, also, (*notes, *flags.rounded_to_nothing(p, args, run)))

    # 8. the loop; --eval-only: the checkpoint's metrics
    step = run.start_step
    if not args.eval_only:
        monitor = Monitor(args, run, save, scheduler, evaluation.epoch_line, lvflags.CPU_PRESET)
        usable = data.UsableImages(train_set, args.max_bad_images) if args.data in data.FOLDERS else None
        step = train(args, monitor, model, raw_model, adversary, optimizer, scheduler, scaler, ema,
                     (train_loader, val_loader, usable), rfid)
    else:
        evaluation.reconstruction_report(args, run, raw_model, ema, val_loader, step, rfid)
    if run.master:
        files = sorted(f for f in os.listdir(args.out_dir) if not f.startswith("."))
        print(f"done: {args.out_dir} holds {', '.join(files)}")
    leave_process_group()
    if lock is not None:
        lock.close()


def train(args, monitor, model, raw_model, adversary, optimizer, scheduler, scaler, ema, loaders, rfid):
    """The training loop of both stages (train.py's train(), docs/training.md): epochs of optimizer steps
    from the run's start_step on, each epoch evaluated (its reconstruction metrics: loopvae_train/
    evaluation.py), logged and checkpointed. `model` runs the forward (compiled, DDP), `raw_model` is the
    module itself, `adversary` Stage 2's discriminator and its term (None in Stage 1); `monitor`
    (training/monitor.py) holds the run and the save and does what happens between steps. `loaders`:
    (train, val, data.UsableImages or None); `rfid`: --rfid's metric or None. Returns the step reached."""
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
                x, y, weight = tutorial.usable_batch(x, y, usable, sums, ddp, monitor, args.grad_accum)
                if not weight and not ddp:
                    continue  # nothing to learn from: no forward, no backward, no step below if all are
                x = x.to(device, non_blocking=True)
                accumulating = ddp and j < args.grad_accum - 1  # DDP all-reduces in the last backward only
                with tutorial.no_sync(model, accumulating):
                    with amp_ctx:
                        x_hat, loss = model(x, x)  # the reconstruction and the Stage-1 loss (eq. 10): the target is x
                        if adversary is not None:  # Stage 2: a discriminator update, then + lambda_a L_adv (eq. 11)
                            loss, terms = adversary(x, x_hat, loss, step)
                            raw_model.aux.update(terms)
                    scaler.scale(loss * weight).backward()  # the mean over the step's micro-batches
                if weight:
                    step_loss, seen = step_loss + loss.detach() / args.grad_accum, seen + 1
                    sums.images += x.shape[0] * world
            bad = None  # (0-d, device) 1 when the step was skipped as non-finite
            if seen or ddp:  # gradients are all-reduced, so every rank skips the same steps
                bad = optim.optimizer_step(raw_model, optimizer, scaler, args.clip_grad)  # unscale, clip, step
                sums.add(step_loss, bad)
            else:  # one process, no usable image in the whole step: no optimizer step, nothing logged
                optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            if ema is not None:
                ema.update(raw_model)
            step += 1
            monitor.after_step(step, epoch, first + i + 1, loss, bad, sums)
        # the epoch's end (training/monitor.py): its record (the loss terms: l1, kl; Stage 2: d_loss, g_loss, ...; the
        # reconstruction metrics, of the EMA too), the checkpoint with it, then its line in log.jsonl
        inside = first + left < steps_per_epoch  # stopped inside the epoch by --max-steps: resumable there
        monitor.close_epoch(step, inside, sums, raw_model, ema,
                            lambda m: evaluation.evaluate_reconstruction(m, val_loader, device, amp_ctx, rfid=rfid))
        if inside:
            break
        epoch += 1
        if step < total_steps and epoch < args.epochs and stopping(stop, ddp, device):  # during the evaluation or save
            raise Preempted(stop.line(f"after step {step} of {total_steps}, the end of epoch {epoch - 1}"))
    return step


def stage2_lines(args, run):
    """What the run's first lines say of Stage 2 (announce's `also` and `notes`): where it starts and its
    discriminator, and a run that ends before its adversarial term begins."""
    if not args.stage2 or args.eval_only:
        return "", ()
    also = f", Stage 2 from {args.stage2} (--disc {args.disc}, adversarial term from step {args.gan_start})"
    short = (f"note: this Stage-2 run ends at step {run.total_steps}, not after --gan-start {args.gan_start}: it "
             "trains the discriminator alone and the generator on the Stage-1 loss (no adversarial term); lower "
             "--gan-start or train longer")
    return also, (short,) if run.total_steps <= args.gan_start else ()


def cli(argv=None):
    """train.py's cli (the stop signals, one line per user-fixable problem, the exit statuses) for this run."""
    return tutorial.cli(argv, main, "train_loopvae.py")


if __name__ == "__main__":
    sys.exit(cli())
