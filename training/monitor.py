"""What the loop does around its steps, and the run's lines (how a run ends: training/exits.py).

- Monitor: the progress bar, the estimated time (pace_point, estimate_line), the reads of the device
  (loss, non-finite steps), the stop requests and the --save-every checkpoints, the step records of
  --log-every and the epoch records (log.jsonl, and TensorBoard with --tensorboard);
  EpochSums: an epoch's running sums (kept in a mid-epoch checkpoint).
- The run's lines: announce (its first lines and args.json), epoch_line, model_log (the model's
  values in log.jsonl).
"""
import contextlib
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

import data
from presets import PAPER, PRESETS, TIMES
from training.exits import Fail, Preempted, Stop, stopping, write
from training.flags import WARMUP_EPOCHS, short_warmup

# ----------------------------------------------------------------------------- around the steps
CHECK_EVERY = 20  # optimizer steps between the loop's reads of a GPU (loss, non-finite count, DDP stop flag)


class EpochSums:
    """The running sums of one epoch, restored from a checkpoint's `progress` when a run resumes
    mid-epoch: seconds and images so far, undecodable images skipped, and, on the device (read at the
    epoch's end only), the loss sum of the good (finite) steps, their count and the count of the steps
    skipped as non-finite."""

    def __init__(self, progress, device):
        self.t_spent, self.images = progress.get("time", 0.0), progress.get("imgs", 0)
        self.images_at_start = self.images  # (a step record's rate counts from here: Monitor.step_record)
        self.skipped = progress.get("skipped", 0)
        self.loss_sum = torch.tensor(progress.get("loss_sum", 0.0), device=device, dtype=torch.float64)
        self.steps = torch.tensor(float(progress.get("steps", 0)), device=device, dtype=torch.float64)
        self.nonfinite = torch.tensor(float(progress.get("nonfinite", 0)), device=device, dtype=torch.float64)
        self.device, self.t0 = device, time.time()

    def add(self, step_loss, bad):
        """One optimizer step's loss; `bad` (0-d, device): 1 when it was skipped as non-finite."""
        self.loss_sum += torch.where(bad > 0, 0.0, step_loss)  # (a NaN loss times 0 would still be NaN)
        self.steps += 1 - bad
        self.nonfinite += bad

    def seconds(self):
        return self.t_spent + time.time() - self.t0

    def state(self):
        """What a mid-epoch checkpoint keeps of the epoch (its `progress`)."""
        return {"time": self.seconds(), "imgs": self.images, "steps": int(self.steps.item()),
                "loss_sum": self.loss_sum.item(), "skipped": self.skipped, "nonfinite": int(self.nonfinite.item())}

    def mean_loss(self, world, ddp):
        """The epoch's mean training loss over the good steps of every rank; None when the epoch had
        none (every step skipped as non-finite): a mean over no steps is not a loss of 0."""
        total = self.loss_sum.clone()
        if ddp:
            dist.all_reduce(total)
        good = self.steps.item()
        return total.item() / (good * world) if good else None

    def nonfinite_steps(self):
        """The epoch's steps skipped as non-finite (the same on every rank: the gradients are all-reduced)."""
        return int(self.nonfinite.item())

    def total_skipped(self, ddp):
        """Undecodable images skipped in the epoch, summed over the ranks."""
        n = torch.tensor(float(self.skipped), device=self.device, dtype=torch.float64)
        if ddp:
            dist.all_reduce(n)
        return int(n.item())


class Monitor:
    """The run as the loop sees it (`run`, its training/run.py Run: its processes `ddp`, `world`, `master`,
    its `stop`, the paths of its checkpoint and log, its length in steps, `val_images` the validation
    images of every process; `save`, its checkpoints.Saver), and everything the loop does between optimizer steps that is
    not training: the progress bar (on a terminal; written to a file, a line every tenth of the epoch
    instead), the loader-bottleneck note, the host's reads of the device (the loss and the count of
    consecutive non-finite steps: every CHECK_EVERY steps on a GPU (CUDA, MPS), every step on the CPU where a read
    costs nothing, at the end of an epoch and before a checkpoint, so that the host queues steps ahead
    of the GPU), the estimated
    time (after the first 10 steps or 30 s, then again after every epoch at that epoch's pace), the
    stop requests (a checkpoint, then Preempted) and the --save-every checkpoints. With --log-every N, a
    step record in log.jsonl every N optimizer steps (step_record): its values come in the same read of
    the device as the checks', made at those steps too, so the steps between two records and checks
    queue on the device without a host sync, as before; the epoch records (log_epoch) and, with
    --tensorboard, both as TensorBoard scalars (rank 0 writes them). `line`: the line of an epoch's record
    (epoch_line; another entry point's own: train_loopvae.py's); `cpu_preset`: the CPU-sized preset the
    estimate names (estimate_line; None: the model's record's)."""

    def __init__(self, args, run, save, scheduler, line=None, cpu_preset=None):
        self.args, self.run, self.save, self.scheduler = args, run, save, scheduler
        self.line, self.cpu_preset = line or epoch_line, cpu_preset
        self.device, self.ddp, self.world, self.master, self.stop = run.device, run.ddp, run.world, run.master, run.stop
        self.ckpt_path, self.log_path, self.val_images = run.ckpt_path, run.log_path, run.val_images
        self.total_steps, self.steps_per_epoch, step = run.total_steps, run.steps_per_epoch, run.start_step
        self.step, self.done = step, 0  # the last optimizer step finished, and which of its epoch's it was
        self.check_every = CHECK_EVERY if self.device.type != "cpu" else 1  # (a GPU: CUDA or MPS)
        self.bad_run = torch.zeros((), device=self.device)  # consecutive non-finite steps, counted on the device
        self.waited, self.probe = 0.0, (step, time.perf_counter())  # time spent waiting for batches, from here
        self.pace = []  # (step, time) of the two checks the estimate is measured between (pace_point)
        self.origin = self.probe  # where this process's steps start: the first ones warm up (pace_point)
        self.tty = sys.stderr.isatty()
        self.log_every, self.lr = getattr(args, "log_every", None), scheduler.get_last_lr()[0]
        self.mark = (None, 0, 0.0)  # (EpochSums, its images, time) at the last step record (step_record)
        self.writer = tensorboard_writer(os.path.dirname(self.log_path)) if getattr(args, "tensorboard", False) \
            and self.master else None

    def epoch(self, epoch, first, left, loader, sums=None):
        """Start an epoch of `left` steps (`first` done before a resume; `sums`: its EpochSums): its bar; returns
        its batches, timing the waits for them. A loader whose worker process died (data.worker_died: the OOM
        killer, kill -9) or ran out of shared memory ends the run as any failure does: the steps finished are
        saved, then one line and the command that continues (fail)."""
        self.epoch_no, self.first, self.left, self.t_epoch = epoch, first, left, time.perf_counter()
        self.sums = sums
        self.done = first
        self.next_line = max(1, left // 10)  # without a terminal: the step of the next progress line
        within = f"within {self.check_every} optimizer steps" if self.ddp and self.check_every > 1 else \
            "after the optimizer step in flight"  # (DDP on GPUs: the processes agree every CHECK_EVERY steps)
        self.stop.phase = (f"stops {within}, with a checkpoint",
                           "stops at once, losing the steps since the last checkpoint")
        self.bar = tqdm(total=left, desc=f"epoch {epoch}", disable=not self.master or not self.tty,
                        dynamic_ncols=True, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
        # (no tqdm remaining time: the bar shows the run's estimate, the same as the lines; self.left_line)
        batches = iter(loader)
        data.loader_checks_at_next_batch()  # (a dead worker is raised at the next batch, not mid-step)
        return self._timed(batches)

    def _timed(self, batches):
        while True:
            t = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            except Exception as e:  # a loader's worker died: the steps finished are kept
                why = data.worker_died(e) or data.out_of_shared_memory(e)
                if why is None or self.sums is None:
                    raise
                self.fail(why, self.sums)
            self.waited += time.perf_counter() - t
            yield batch

    def note(self, line):
        """A line below the bar (or alone, without a terminal), rank 0 only."""
        if not self.master:
            return
        if self.bar.disable:
            print(line, flush=True)
        else:
            self.bar.write(line)

    def after_step(self, step, epoch, done, loss, bad, sums):
        """After optimizer step `step` (the `done`-th of this epoch; `bad`: optimizer_step's non-finite
        flag, None when no step was taken; `loss`: the last micro-batch's): the checks of the class
        docstring."""
        args, probe = self.args, self.probe
        self.step, self.done = step, done
        i = done - 1 - self.first  # this epoch's steps since the start (or the resume)
        if bad is not None:
            self.bad_run = (self.bad_run + 1) * bad
        lr, self.lr = self.lr, self.scheduler.get_last_lr()[0]  # the rate this step used; the next one's
        record = self.log_every and step % self.log_every == 0  # (a host value: no read)
        self.bar.update()
        if self.master and step == probe[0] + 50 and self.waited > 0.2 * (time.perf_counter() - probe[1]):
            self.note(f"note: the data loader is the bottleneck: {self.waited / (time.perf_counter() - probe[1]):.0%} "
                      f"of the first 50 steps waited for images with --workers {args.workers}; raise --workers, or "
                      "leave out per-image augmentations (CIFAR then uses the batched loader)")
        saving = args.save_every and step % args.save_every == 0 and done < self.steps_per_epoch \
            and step < self.total_steps
        if not (record or i % self.check_every == 0 or i == self.left - 1 or saving or (self.stop and not self.ddp)):
            return  # (one process reads its signal flag every step: a host list, no sync)
        norm = getattr(self.scheduler.optimizer, "grad_norm", None) if record and bad is not None else None
        values = [loss.detach().float(), self.bad_run] + ([norm.float()] if norm is not None else [])
        last_loss, nonfinite, *grad_norm = torch.stack(values).tolist()  # one read of the device
        now = time.perf_counter()  # (the device has caught up: a synced time)
        if record and self.master:
            self.step_record(step, last_loss, lr, grad_norm[0] if grad_norm else None, sums, now)
        if self.master and pace_point(self.pace, step, now, self.origin):
            self.pace.append((step, now))
            if len(self.pace) == 2 and step < self.total_steps:  # (nothing to estimate at the last step)
                self.note(estimate_line(args, self.device, self.pace, self.total_steps, self.cpu_preset))
        if nonfinite >= args.max_nonfinite:
            self.bar.close()
            kept = (f"the last good checkpoint is {self.ckpt_path}" if os.path.exists(self.ckpt_path)
                    else "no checkpoint was written before them")
            raise Fail(f"{int(nonfinite)} consecutive non-finite steps (the last at step {step}); {kept}; "
                       "lower --lr or use --amp bf16/none")
        if self.master:
            left = self.time_left(step, now)  # refined at every check from the settled pace
            self.bar.set_postfix(loss=f"{last_loss:.3f}", lr=f"{self.scheduler.get_last_lr()[0]:.2e}",
                                 **({"run left": left} if left else {}))
            if not self.tty and i + 1 >= self.next_line:  # a log file: a line per tenth (at the next check)
                print(f"step {step} of {self.total_steps} (epoch {epoch}: {done} of {self.steps_per_epoch}), "
                      f"loss {last_loss:.3f}" + (f", about {left} left" if left else ""), flush=True)
                self.next_line = i + 1 + max(1, self.left // 10)
        stopped = stopping(self.stop, self.ddp, self.device)  # preempted: keep this step, exactly where it is
        if stopped or (saving and nonfinite == 0):
            self.save(epoch, done, sums.state(), step)
            if stopped or stopping(self.stop, self.ddp, self.device):  # (or the request came during the save)
                self.bar.close()
                raise Preempted(self.stop.line(f"after step {step} of {self.total_steps}"))

    def step_record(self, step, loss, lr, grad_norm, sums, now):
        """--log-every's record of optimizer step `step` in log.jsonl, and with --tensorboard its scalars
        (train/...): {"step", "loss": the last micro-batch's training loss on rank 0 (nanoGPT's), "lr": the
        learning rate the step used, "grad_norm": the global gradient norm before clipping (optim.optimizer_step;
        null for a step not taken), "img_per_s": images of all processes per second of wall time since the
        previous record or the epoch's start, whichever is later (the epoch's evaluation is not counted)}.
        A non-finite value is null (JSON has no NaN). An epoch record is told apart by its "epoch" key. `now`:
        a time read after the device caught up (perf_counter, s)."""
        if self.mark[0] is not sums:  # the epoch's first record: its rate from the epoch's start
            self.mark = (sums, sums.images_at_start, self.t_epoch)
        _, images, t = self.mark
        self.mark = (sums, sums.images, now)
        rec = {"step": step, "loss": finite(loss), "lr": lr, "grad_norm": finite(grad_norm),
               "img_per_s": (sums.images - images) / max(now - t, 1e-9)}
        write(self.log_path, json.dumps(rec) + "\n", self.stop.kept(), append=True)
        self.scalars("train", rec)

    def log_epoch(self, rec):
        """An epoch's record `rec` (rank 0): appended to log.jsonl, printed with its line (epoch_line), and with
        --tensorboard its numbers as scalars (epoch/...) at its step; the writer closes after the run's last."""
        if not self.master:
            return
        write(self.log_path, json.dumps(rec) + "\n", self.stop.kept(), append=True)
        print(json.dumps(rec))
        print(self.line(rec["epoch"], rec, rec["step"], self.total_steps), flush=True)
        self.scalars("epoch", rec)
        if self.writer is not None and rec["step"] >= self.total_steps:
            self.writer.close()
            self.writer = None

    def scalars(self, group, rec):
        """The numbers of the log record `rec` as TensorBoard scalars GROUP/KEY at its step (--tensorboard)."""
        if self.writer is None:
            return
        for k, v in rec.items():
            if k not in ("step", "epoch") and isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(f"{group}/{k}", v, rec["step"])
        self.writer.flush()

    def fail(self, why, sums):
        """End the run in the middle of a step for `why`, a problem the user fixes (e.g. more undecodable
        images than --max-bad-images; `sums`: the epoch's EpochSums): one process first saves the last
        finished step, where a resume continues, so nothing trained is lost (of a step with --grad-accum
        in flight, its micro-batches' random draws are not replayed); then Fail, saying what is kept.
        Under DDP the other processes are inside this step's collectives, which a save's gather would
        meet out of turn: the last checkpoint is kept (the others end as a peer failed, exit 1)."""
        self.bar.close()
        if not self.ddp and self.step > (self.stop.step or 0):  # (nothing trained since the last checkpoint)
            try:
                self.save(self.epoch_no, self.done, sums.state(), self.step)
            except Fail as e:  # a full disk: both causes in the one line
                raise Fail(f"{why}; then {e}")
        raise Fail(f"{why}; {self.stop.kept()}")

    @contextlib.contextmanager
    def evaluating(self, position, step):
        """Around the evaluation at the end of an epoch whose training ended at optimizer step `step`
        (`position`: (epoch, batch, progress), where the run continues): a stop request waits for it, and
        the first line says so; a second Ctrl-C stops it at once, and one process saves the epoch's
        training first (its evaluation is lost, not its training; exit 130). Under DDP the other processes
        may be inside the evaluation's all-reduce, which a save's gather would meet out of turn: the last
        checkpoint is kept."""
        self.stop.phase = (f"stops after the evaluation of epoch {self.epoch_no} ({self.val_images} images), with "
                           "the epoch's checkpoint", "stops at once, " + (
                               "losing the epoch's training since the last checkpoint" if self.ddp else
                               "saving the epoch's training first, without its evaluation"))
        try:
            yield
        except KeyboardInterrupt:
            if self.ddp:
                raise
            self.save(*position, step)
            raise KeyboardInterrupt(f"in the evaluation of epoch {self.epoch_no}, whose training was saved first "
                                    "(its evaluation is not in log.jsonl)") from None
        finally:
            self.stop.phase = Stop.ANYWHERE

    def close_epoch(self, step, inside, sums, raw_model, ema, evaluate):
        """The end of the epoch whose training ended at optimizer step `step` (`inside`: stopped inside it by
        --max-steps, resumable there; `sums`: its EpochSums): the bar closed (end_epoch), its record (the lr, the
        mean training loss, the non-finite steps, the last step's model terms (model_log, read first: under CUDA
        graphs they live in the graph's memory, which the next replay overwrites, and evaluation forwards may set
        them too), `evaluate(model)`'s metrics of `raw_model` and of the EMA's with the prefix ema_, img/s, the
        training time), the checkpoint with that record, then its line in log.jsonl: a log write that fails
        loses nothing. A stop request waits for the evaluation (evaluating); a training.evaluation.EmptyEvaluation
        keeps the epoch's training first and says where. Returns the record."""
        from training.evaluation import EmptyEvaluation
        epoch, done, world, ddp = self.epoch_no, self.first + self.left, self.world, self.ddp
        epoch_time = sums.seconds()  # training only: the evaluation below is not counted
        self.end_epoch(step)
        extras = model_log(raw_model, ddp)
        position = (epoch, done, sums.state()) if inside else (epoch + 1, 0, {})  # where the run continues
        rec = {"epoch": epoch, "step": step, "lr": self.scheduler.get_last_lr()[0],
               "train_loss": sums.mean_loss(world, ddp), "nonfinite_steps": sums.nonfinite_steps()}
        try:  # (a stop request waits for the evaluation; a second Ctrl-C saves the epoch's training first)
            with self.evaluating(position, step):
                rec.update(evaluate(raw_model))
                if ema is not None:
                    rec.update({f"ema_{k}": v for k, v in evaluate(ema.module).items()})
        except EmptyEvaluation as e:  # the epoch's training is kept first
            self.save(*position, step)
            raise EmptyEvaluation(f"{e}; the training of epoch {epoch} is saved in {self.ckpt_path} (--resume it)")
        rec.update({"img_per_s": sums.images / epoch_time, "epoch_time_s": epoch_time, **extras})
        if self.args.data in data.FOLDERS:
            rec["skipped_images"] = sums.total_skipped(ddp)
        self.save(*position, step, rec)  # the epoch's training first, with its record
        self.log_epoch(rec)  # log.jsonl, the epoch's line (rank 0); TensorBoard with --tensorboard
        return rec

    def time_left(self, step, now):
        """The training time left, in words, at the pace since the estimate's first point (None before the
        estimate is measured): the same figure in the bar and in the progress lines."""
        if len(self.pace) < 2 or step <= self.pace[0][0] or step >= self.total_steps:
            return None
        return duration((now - self.pace[0][1]) / (step - self.pace[0][0]) * (self.total_steps - step))

    def end_epoch(self, step):
        """Close the epoch's bar; with steps left, the estimated time again at this epoch's pace (so the
        figure sharpens as the run goes, not only from its first steps); then say that the evaluation
        of the run's validation images runs (it has no bar)."""
        self.bar.close()
        if self.master and self.left and step < self.total_steps and len(self.pace) == 2:
            per_step = (time.perf_counter() - self.t_epoch) / self.left
            line = estimate_line(self.args, self.device, [(0, 0.0), (1, per_step)], self.total_steps - step + 1,
                                 self.cpu_preset)
            self.note(line.replace("estimated time:", "estimated time, at the last epoch's pace:", 1))
        self.note(f"epoch {self.epoch_no}: evaluating on {self.val_images} validation images")


def finite(v):
    """`v` (a float or None) for a JSON record: None where it is not finite."""
    return v if v is not None and math.isfinite(v) else None


def tensorboard_writer(out_dir):
    """torch.utils.tensorboard's SummaryWriter writing to OUT/tensorboard (`tensorboard --logdir OUT`); the
    tensorboard package is an optional extra (flags.configure refuses --tensorboard without it)."""
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter(os.path.join(out_dir, "tensorboard"))


def pace_point(pace, step, now, origin=(0, 0.0)):
    """Whether a synced check at `step` (time `now`, seconds) is one of the two (step, time) points
    the estimated time is measured between. The first steps of a process warm up (allocations, the
    first batches; measured: an estimate from them said 15 min for 8 min of training), so the first
    point is the first check 10+ steps after `origin` (the process's first (step, time)), or 30+ s
    after it for slow steps (a GPU-sized model on a CPU: 10 steps can take minutes); the second is
    20+ steps or 60+ s after the first."""
    if len(pace) >= 2:
        return False
    (s0, t0), wait = (pace[0], (20, 60)) if pace else (origin, (10, 30))
    return step - s0 >= wait[0] or (step > s0 and now - t0 >= wait[1])


def duration(seconds):
    """Seconds as a person reads a wait: '3 d 4 h', '2 h 5 min', '7 min 12 s'."""
    d, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    return f"{d} d {h} h" if d else f"{h} h {rest // 60} min" if h else f"{rest // 60} min {rest % 60} s"


def estimate_line(args, device, pace, total_steps, cpu_preset=None):
    """One line: the time the rest of the run should take at the pace measured between the two
    (step, seconds) points of `pace`, evaluation not included; on a CPU, when that is more than
    3 hours, the model's CPU-sized preset (its record's cpu_preset, training/registry.py; a model
    without one, a run of that preset and a run of a --config file get no hint)."""
    from training.registry import MODELS  # (registry.py imports this module)
    (s0, t0), (s1, t1) = pace
    per_step = (t1 - t0) / (s1 - s0)
    left = per_step * (total_steps - s1)
    line = (f"estimated time: {duration(left)} for the {total_steps - s1} steps left ({per_step:.3g} s per step; "
            "evaluations not included)")
    cpu = cpu_preset or getattr(MODELS.get(args.model), "cpu_preset", None)  # None: a model without one, no hint
    # (not for the CPU-sized preset itself, nor for a --config file's recipe: the lab's CPU-scale arms run so)
    if cpu and device.type == "cpu" and left > 3 * 3600 and args.preset != cpu and not getattr(args, "config", None):
        said = "" if TIMES[cpu][0].startswith("est.") else " as measured"  # (LoopVAE's: estimated)
        line += (f"; a GPU-sized run on a CPU: --preset {cpu} is this model's CPU-sized run "
                 f"({TIMES[cpu][0]} on 2 cores{said}; --list-presets)")
    return line


# ----------------------------------------------------------------------------- the run's lines
def announce(args, run, model, compiled, distilling, also="", notes=()):
    """The run's first lines (rank 0): the preset, the model's size and FLOPs, the processes, precision,
    compilation (`compiled`, its words) and schedule (and `also`, an entry point's words for that line),
    where a resumed run continues, the entry point's `notes` (lines), the run folder; writes OUT/args.json
    (not for --eval-only, which leaves the training run's files alone; `run.stop` says what is kept if that
    write fails). `run`: the run's Run (training/run.py); `distilling`: whether a teacher trains it."""
    world, device, stop, step = run.world, run.device, run.stop, run.start_step
    total_steps, steps_per_epoch, warmup = run.total_steps, run.steps_per_epoch, run.warmup
    start_epoch, start_batch = run.start_epoch, run.start_batch
    if args.preset:
        print(f"preset {args.preset}: {PRESETS[args.preset][0]}; paper: {PAPER[args.preset]}")
    flops = model.flops_per_image()
    print(f"{args.model}: {model.num_params() / 1e6:.3f} M params, {flops / 1e9:.3f} GFLOPs/img, "
          f"depth {args.depth}, {world} process(es) on {device.type}, amp {args.amp}{compiled}"
          + ("" if args.eval_only else f", {total_steps} steps ({steps_per_epoch}/epoch), warmup {warmup}")
          + (f", distilling from {args.teacher} ({args.distill})" if distilling else "") + also)
    if not args.eval_only and args.epochs <= WARMUP_EPOCHS and args.warmup_epochs == short_warmup(args.epochs):
        print(f"note: warmup {args.warmup_epochs:g} epochs ({warmup} of {total_steps} steps), 5 % of the run: the "
              f"default --warmup-epochs {WARMUP_EPOCHS:g} is not below --epochs {args.epochs}, and would make the whole "
              "run warmup; give --warmup-epochs to choose another")
    twice = sorted({d for d in args.eval_depths or [] if args.eval_depths.count(d) > 1})
    if twice:
        print(f"note: --eval-depths gives depth {', '.join(map(str, twice))} more than once: each depth is evaluated once")
    if args.resume and not args.eval_only:
        print(f"resumed from {args.resume} at step {step} (epoch {start_epoch}, step {start_batch} of it)"
              + ("; nothing left to train" if step >= total_steps or start_epoch >= args.epochs else ""))
    for line in notes:
        print(line)
    print(f"run folder: {args.out_dir}")
    if not args.eval_only:  # --eval-only leaves the training run's files alone
        write(os.path.join(args.out_dir, "args.json"), json.dumps(vars(args), indent=1), stop.kept())


def epoch_line(epoch, rec, step, total_steps, said=None):
    """The line printed after an epoch's evaluation (`rec`: its log.jsonl record): top-1/top-5 (`said`:
    another entry point's words for its metrics, e.g. train_loopvae.py's PSNR), and its non-finite steps."""
    said = said or f"top-1 {rec['val_acc1']:.2f} %, top-5 {rec['val_acc5']:.2f} %"
    line = f"epoch {epoch}: validation {said} (step {step} of {total_steps})"
    if rec.get("train_loss", 0) is None:
        line += f"; no finite training step: all {rec['nonfinite_steps']} of this epoch were skipped as non-finite"
    elif rec.get("nonfinite_steps"):
        line += f"; {rec['nonfinite_steps']} step(s) skipped as non-finite"
    return line


def model_log(model, ddp=False):
    """Model-specific values for log.jsonl: the last step's auxiliary terms (`model.aux`, e.g. the
    per-stage losses), under DDP their mean over the processes (each
    computed them from its own share of the batch), and whatever `model.log_extras()` returns (e.g.
    reViT's gate table)."""
    aux = getattr(model, "aux", {})
    values = [float(v) for v in aux.values()]
    if ddp and values:  # every rank calls this at the same point (the end of an epoch)
        device = next((v.device for v in aux.values() if torch.is_tensor(v)), torch.device("cpu"))
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        values = (t / dist.get_world_size()).tolist()
    out = dict(zip(aux, values))
    if hasattr(model, "log_extras"):
        out.update(model.log_extras())
    return out
