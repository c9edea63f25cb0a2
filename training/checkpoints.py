"""Training state on disk for train.py: checkpoints (atomic save, RNG states, restoring a run's objects;
Saver, the run's save, and resume_or_start), the --resume policy and how to continue a stopped run
(continue_hint), the weights a --finetune run starts from (start_weights), and the run folder
(new_run_dir; other_run; take_out_dir: writable, locked to one run, its log continued, a branch's later
records set aside). Which flags a checkpoint gives a run (--eval-only, --finetune, --resume) is
training/flags.py's; how any weights file is read and fitted to a model (head and
position embedding adapted) is training/weights.py's.

Everything is read with torch.load(weights_only=True) (weights.read_weights): tensors and plain values,
never code.
"""
import errno
import json
import os
import random
import shlex
import sys
import time
import unicodedata

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from training.exits import Fail, cannot_write, write
from training.flags import effective
from training.registry import arch_flags
from training.weights import checkpoint_file, finetune_weights, read_weights


def rng_state():
    s = {"torch": torch.get_rng_state(), "python": random.getstate(),
         "numpy": [v.tolist() if isinstance(v, np.ndarray) else v for v in np.random.get_state()]}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s):
    torch.set_rng_state(s["torch"])
    random.setstate(tuple(tuple(v) if isinstance(v, list) else v for v in s["python"]))
    n = s["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), *n[2:]))
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def save_atomic(obj, path):
    """Write to a temporary file, flushed to the disk, then rename: a crash mid-write keeps the
    previous file. torch.save writes through a Python file object, so a full disk raises OSError
    (ENOSPC), not the zip writer's RuntimeError ('unexpected pos'); on any error or interruption
    the partial temporary file is removed and the error raised again."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            try:
                torch.save(obj, f)
            except RuntimeError as e:  # the zip writer's ('unexpected pos'), around the file's own OSError
                raise written_error(e) from e
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:  # (not there; or a disk that refuses even that: the error above is the one to say)
            pass
        raise


def written_error(e):
    """The OSError behind torch.save's RuntimeError `e` (its zip writer, inline_container.cc, raises
    'unexpected pos' when a write of the file object failed: EFBIG under `ulimit -f` or a 4 GB FAT32 limit,
    EDQUOT, EIO), else an OSError(EIO) of its first line: every failure of a checkpoint write is an OSError."""
    inner = e.__context__
    while inner is not None and not isinstance(inner, OSError):
        inner = inner.__context__
    return inner if inner is not None else OSError(errno.EIO, (str(e).strip().splitlines() or ["?"])[0][:200])


def load_checkpoint(path, args):
    """An rvits training checkpoint for --resume, checked for every key an exact resume needs."""
    ck = read_weights(path, "--resume")
    keys = {"model", "optimizer", "scheduler", "scaler", "epoch", "batch", "step", "rng", "args"}
    if not isinstance(ck, dict) or not keys <= set(ck):
        raise Fail(f"--resume {path}: not an rvits training checkpoint (missing {sorted(keys - set(ck or {}))})")
    if ck["args"].get("model") != args.model:
        raise Fail(f"--resume {path}: checkpoint of --model {ck['args'].get('model')}, not {args.model}")
    return ck


# --resume policy. Flags that shape the weights never change on a resume (--finetune starts a new
# run from them). Flags that decide which images the remaining steps of an epoch see, and how they
# are augmented, change only at an epoch boundary, where a new epoch draws a new permutation: mid-
# epoch the position in the data order (samples consumed per process) would be wrong. Every other
# difference (lr, schedule, EMA, workers, device, ...) is printed and applies from the resumed step
# on; schedule flags rebuild the learning-rate curve at the current step.
EPOCH_FLAGS = {"batch_size", "data", "img_size", "seed", "randaug", "reprob", "three_augment", "color_jitter", "repeated_aug",
               "cpu_loader", "val_labels", "val_subset"}
# --size is not compared itself: it is a name for --embed-dim, --num-heads and --depth, which are.
NOT_COMPARED = {"resume", "print_config", "list_presets", "model_img_size", "model_classes", "eval_only",
                "eval_depths", "size"}
# What a changed flag means beyond its new value, said in its resume line.
CHANGE_NOTES = {"opt": "the new optimizer starts from fresh state (no moments or step counts), the "
                       "learning-rate schedule goes on"}


def restore(ck, path, lr, model, optimizer, scheduler, scaler, ema=None, distiller=None, opt=None, step=None):
    """Load the training state of checkpoint `ck` (load_checkpoint; read from `path`) into a run's
    objects, for train.py --resume: weights, optimizer moments, schedule position, GradScaler, EMA
    and the distillation projection. This command's --lr (the schedule's peak) and weight decays
    apply from the next step on (resume_changes reports them); so does its optimizer `opt`
    (--opt): another than the checkpoint's starts from fresh state. `step`: the optimizer step the
    schedule continues at (None: the checkpoint's; schedule_step maps it for another --batch-size).
    Raises Fail when the weights do not fit the model."""
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as e:
        why = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), str(e))
        raise Fail(f"--resume {path}: its weights do not fit this model ({why}); use the size flags of the original run")
    decays = [g["weight_decay"] for g in optimizer.param_groups]
    scales = [g.get("lr_scale", 1.0) for g in optimizer.param_groups]  # (--router-lr-scale: its own groups)
    mine = next((v for v in scales if v != 1), 1.0)
    theirs = next((g["lr_scale"] for g in ck["optimizer"]["param_groups"] if g.get("lr_scale", 1.0) != 1), 1.0)
    if (mine == 1) != (theirs == 1):  # (the groups differ in number: the optimizer's state cannot follow)
        raise Fail(f"--resume {path}: its --router-lr-scale is {theirs:g} and this run's {mine:g}, and only a scale "
                   f"other than 1 gives the router optimizer groups of its own: leave --router-lr-scale out to continue, "
                   f"or start a new run from these weights with --finetune {path}")
    if len(ck["optimizer"]["param_groups"]) != len(optimizer.param_groups):  # the projection's group
        raise Fail(f"--resume {path}: this run's distillation differs from the checkpoint's (--teacher "
                   f"{ck['args'].get('teacher')}) in its trained feature projection; give the original --teacher "
                   f"and --distill, or start a new run from these weights with --finetune {path}")
    if opt is None or ck["args"].get("opt", "adamw") == opt:  # (AdamW's and LAMB's states differ)
        optimizer.load_state_dict(ck["optimizer"])
    scheduler.load_state_dict(ck["scheduler"])
    if step is not None:
        scheduler.last_epoch = step
    for g, wd, scale in zip(optimizer.param_groups, decays, scales):
        g["weight_decay"] = wd
        if scale != 1 or "lr_scale" in g:
            g["lr_scale"] = scale  # (this run's, as its --lr)
        # the implementation is this run's, not the checkpoint's: train.py's step needs the fused
        # AdamW (it reads found_inf), which runs before 2026-12-01 saved as fused=False on the CPU
        g.update({k: optimizer.defaults[k] for k in ("fused", "foreach") if k in optimizer.defaults})
    scheduler.base_lrs = [lr * g.get("lr_scale", 1.0) for g in optimizer.param_groups]  # (--router-lr-scale)
    for g, base, f in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):  # as LambdaLR does
        g["lr"] = base * f(scheduler.last_epoch)
    scaler.load_state_dict(ck["scaler"])
    if ema is not None and ck.get("ema") is not None:
        ema.load_state_dict(ck["ema"])
    if distiller is not None and ck.get("distill") is not None:
        distiller.load_state_dict(ck["distill"])


def check_out_dir(out_dir):
    """Create --out-dir and check that this process can write a file there (a probe named by the
    process id, so that ranks sharing the folder do not race on it). Raises Fail."""
    probe = os.path.join(out_dir, f".write_test.{os.getpid()}")
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise Fail(f"--out-dir {out_dir} cannot be written ({e.strerror}); choose another directory")


def resume_changes(ck, args, world, path, arch=None):
    """Lines `resume: --flag old -> new` for every flag (and the number of processes) that differs
    from the checkpoint's run, each compared as the value it stands for (flags.effective); raises Fail
    for a difference the policy above refuses (a flag that shapes the model: `arch`, default
    registry.arch_flags; another entry point's: its Entry's arch)."""
    saved, lines, arch = ck["args"], [], arch if arch is not None else arch_flags()
    changes = [(k, saved[k], v) for k, v in vars(args).items()
               if k in saved and k not in NOT_COMPARED and effective(k, saved[k], saved) != effective(k, v, vars(args))]
    if len(ck["rng"]) != world:
        changes.append(("processes", len(ck["rng"]), world))
    saved_flags = os.path.join(os.path.dirname(path), "args.json")  # the run's own flags, beside its checkpoint
    original = (f"give the original value (--config {saved_flags} gives every flag of the run)"
                if os.path.isfile(saved_flags) else "give the original value")
    for k, old, new in changes:
        flag = "processes" if k == "processes" else "--" + k.replace("_", "-")
        if k in arch:  # (given on the command line: the others come from the checkpoint)
            raise Fail(f"--resume {path}: {flag} was {old}, now {new}, which changes the model; {original}, "
                       f"or start a new run from these weights with --finetune {path}")
        if ck["batch"] and (k in EPOCH_FLAGS or k == "processes"):
            raise Fail(f"--resume {path}: {flag} was {old}, now {new}: the checkpoint is mid-epoch (step "
                       f"{ck['batch']} of epoch {ck['epoch']}), where this changes which images the remaining "
                       f"steps see; {original}, or resume from an end-of-epoch checkpoint")
        lines.append(f"resume: {flag} {old} -> {new}" + (f": {CHANGE_NOTES[k]}" if k in CHANGE_NOTES else ""))
    return lines


def lock_out_dir(out_dir):
    """Take an exclusive lock on OUT/.lock for this run, so a second run on the same --out-dir is
    refused. A POSIX record lock (lockf): the OS releases it when the process ends, however it
    ends, so a killed run leaves no stuck lock, and unlike flock it is not shared with forked
    loader workers (which outlive a SIGKILLed parent for a few seconds). Returns the open file;
    the lock lasts until it is closed."""
    import fcntl
    path = os.path.join(out_dir, ".lock")
    f = open(path, "a+")
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not os.path.exists(path) or not os.path.samestat(os.fstat(f.fileno()), os.stat(path)):
            f.close()  # the run that held it ended and removed it (release_out_dir) as we opened it: take a new one
            return lock_out_dir(out_dir)
    except OSError:
        f.seek(0)
        pid = f.read().strip() or "?"
        f.close()
        raise Fail(f"--out-dir {out_dir} is in use by a running training process (pid {pid}); wait for it "
                   "to end, or choose another --out-dir")
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def release_out_dir(lock):
    """The end of a run that ended cleanly: OUT/.lock removed while still held (so no run folder keeps a
    stale lock file), then closed. A run that opened the file just before is refused while it is held
    and, after, sees it gone (lock_out_dir compares the file it locked with the path) and locks a new one."""
    try:
        os.unlink(lock.name)
    except FileNotFoundError:
        pass
    lock.close()


# ----------------------------------------------------------------------------- a run's checkpoint
class Saver:
    """save(epoch, batch, progress, step): the atomic checkpoint of everything a bit-exact resume
    needs (rank 0 writes it; every rank's RNG state and `progress`, its epoch's sums, are gathered), and the class names (image folders),
    which are all that --eval-only needs of the training set. `objects`: name -> the object whose
    state_dict() the checkpoint holds under that name (None: saved as None), e.g. "model",
    "optimizer", "scheduler", "scaler", "ema", "distill" (train_loopvae.py: "adversary"). `run`: the run's Run
    (training/run.py), whose ckpt_path it writes and whose processes take part; after a save its `stop`
    (an exits.Stop) names it as what a stopped run keeps. Raises Fail when the file cannot be written
    (a full disk): the previous checkpoint is kept."""

    def __init__(self, run, objects, args, classes):
        self.path, self.objects, self.args, self.classes = run.ckpt_path, objects, args, classes
        self.stop = run.stop
        self.ddp, self.world, self.master = run.ddp, run.world, run.master

    def __call__(self, epoch, batch, progress, step, record=None):
        """`record`: the epoch's log.jsonl record (at an epoch's end), kept so that a resume writes it
        if the run could not (its log write failed, or it died between the save and the write)."""
        ranks = [None] * self.world  # every process's RNG state and epoch sums (its own loss sum: EpochSums)
        if self.ddp:
            dist.all_gather_object(ranks, (rng_state(), progress))
        else:
            ranks = [(rng_state(), progress)]
        if self.master:
            state = {k: v.state_dict() if v is not None else None for k, v in self.objects.items()}
            try:
                save_atomic({**state, "epoch": epoch, "batch": batch, "step": step, "progress": progress,
                             "progress_ranks": [p for _, p in ranks], "rng": [r for r, _ in ranks],
                             "args": vars(self.args), "classes": self.classes, "record": record,
                             "pretrained_cfg": getattr(self.objects.get("model"), "pretrained_cfg", None)}, self.path)
            except OSError as e:
                raise Fail(f"writing the checkpoint {self.path} at step {step} failed ({e.strerror or e}); its "
                           f"partial file {self.path}.tmp was removed; free space in {self.args.out_dir}, or lift the "
                           f"file-size limit (ulimit -f, a quota, FAT32's 4 GB); {self.stop.kept()}")
            tqdm.write(f"saved checkpoint at step {step}")  # below a progress bar, on a line of its own
            sys.stdout.flush()
        self.stop.checkpoint, self.stop.step = self.path, step


def resume_or_start(args, run, model, optimizer, scheduler, scaler, ema, distiller, classes=None, others=None,
                    arch=None):
    """With --resume: restore every object from the checkpoint (rank 0 prints what changed since it
    was written; `others`, {name: object or None}, the run's other objects saved under their names,
    e.g. train_loopvae.py's discriminator: those not None too) and this rank's RNG state and epoch
    sums, at the step schedule_step maps it to; else refuse an existing OUT/ckpt.pt (`run.ckpt_path`;
    `run`: the run's Run), or an OUT/log.jsonl of an earlier run, and seed this rank. It only reads: the
    run folder is created, locked and its log continued after it has accepted the run (take_out_dir), so
    that a refusal leaves nothing behind. `classes`: the class names of the training set (an image
    folder's; None: CIFAR, synthetic data, --eval-only), checked against the checkpoint's. `arch`: the
    flags that shape the model (resume_changes). Returns (start_epoch, start_batch, step, progress) and sets `run.resumed` for take_out_dir. Raises
    Fail for a checkpoint that cannot be resumed with these flags, class folders or --out-dir (one that
    holds another run: other_run), or (DDP) when the processes do not see the same files (same_files)."""
    world, rank, ckpt_path = run.world, run.rank, run.ckpt_path
    same_files(args, ckpt_path)
    log = os.path.join(args.out_dir, "log.jsonl")
    if not args.resume:
        if os.path.exists(ckpt_path):
            raise Fail(f"{ckpt_path} exists; pass --resume {ckpt_path} (or --resume auto) to continue it, or "
                       "choose another --out-dir")
        if rank0_sees(lambda: os.path.exists(log)):  # rank 0 writes the log: its view decides on every process
            raise Fail(f"--out-dir {args.out_dir} holds the log.jsonl of an earlier run, and no ckpt.pt to continue "
                       "it; a new run there would add its records to that log and overwrite its args.json: choose "
                       "another --out-dir, or move the earlier run's files away")
        torch.manual_seed(args.seed + rank)  # rank-specific randomness (drop path, MixUp)
        return 0, 0, 0, {}
    ck = load_checkpoint(args.resume, args)
    if args.eval_ema and ck.get("ema") is None:
        raise Fail(f"--eval-ema: {args.resume} holds no EMA weights (its run trained without --ema); "
                   "leave out --eval-ema to evaluate its model weights")
    same_classes(ck, args.resume, classes)
    changes = [] if args.eval_only else resume_changes(ck, args, world, args.resume, arch)
    if not args.eval_only:  # (a checkpoint that cannot continue here is named first)
        other_run(args.resume, args.out_dir)
    for line in changes:
        if rank == 0:
            print(line)
    step = ck["step"] if args.eval_only else schedule_step(ck, args, run)
    restore(ck, args.resume, args.lr, model, optimizer, scheduler, scaler, ema, distiller, opt=args.opt, step=step)
    for name, obj in (others or {}).items():  # (the entry point checked that the checkpoint holds them)
        if obj is not None:
            obj.load_state_dict(ck[name])
    if len(ck["rng"]) == world:
        set_rng_state(ck["rng"][rank])
    else:  # another number of processes (an epoch boundary): fresh per-rank randomness
        torch.manual_seed(args.seed + rank + 7919 * ck["step"])
    run.resumed = {k: ck.get(k) for k in ("step", "epoch", "batch", "record")} | {"path": args.resume}
    ranks = ck.get("progress_ranks") or []  # (written since 2026-12-04; before, rank 0's sums only)
    return ck["epoch"], ck["batch"], step, ranks[rank] if len(ranks) == world else ck["progress"]


def rank0_sees(check):
    """`check()` (a look at the run folder) as rank 0 sees it, on every process (rank 0 writes the folder)."""
    seen = [check()]
    if dist.is_initialized():
        dist.broadcast_object_list(seen, src=0)
    return seen[0]


def same_folder(path, out_dir):
    """Whether the checkpoint `path` lies in the run folder `out_dir` (links and relative paths resolved)."""
    return os.path.realpath(os.path.dirname(os.path.abspath(path))) == os.path.realpath(out_dir)


def other_run(path, out_dir):
    """--resume `path` --out-dir `out_dir` of another folder: refused (Fail, naming both) when `out_dir` holds
    a run of its own (a ckpt.pt or a log.jsonl), whose checkpoint and args.json the continued run would
    overwrite and whose log it would add its records to. A folder without them (new, or holding only an
    --eval-only's results) takes the continued run, its log starting afresh."""
    if same_folder(path, out_dir):
        return
    held = rank0_sees(lambda: [f for f in ("ckpt.pt", "log.jsonl") if os.path.exists(os.path.join(out_dir, f))])
    if held:
        home = os.path.dirname(path) or "."
        raise Fail(f"--resume {path} --out-dir {out_dir}: {out_dir} holds another run (its {' and '.join(held)}), "
                   f"which continuing the run of {home} there would overwrite and mix with it; leave out --out-dir "
                   f"(the run continues in {home}), give an --out-dir that holds no run, or continue {out_dir}'s own "
                   f"run with --resume {os.path.join(out_dir, 'ckpt.pt')}")


def schedule_step(ck, args, run):
    """The optimizer step at which a run resumed from checkpoint `ck` continues its learning-rate schedule:
    the checkpoint's, except at an epoch boundary where this run's steps per epoch (`run.steps_per_epoch`:
    another --batch-size, or another number of processes) differ from those the checkpoint counted: there
    the schedule follows epochs, i.e. images seen (epoch E starts at step E x this run's steps per epoch, of
    a schedule as long as this run's --epochs at this batch size), and rank 0 says how it mapped the step.
    (Mid-epoch, another batch size is refused: resume_changes.)"""
    step = ck["epoch"] * run.steps_per_epoch
    if ck["batch"] or step == ck["step"]:
        return ck["step"]
    if run.master:
        print(f"resume: epoch {ck['epoch']} starts at step {step} of this run ({run.steps_per_epoch} steps per epoch "
              f"at --batch-size {args.batch_size}), where the checkpoint counted step {ck['step']} (--batch-size "
              f"{ck['args'].get('batch_size')}): the learning-rate schedule follows epochs (images seen), not steps")
    return step


def take_out_dir(args, run):
    """The run folder, once resume_or_start has accepted the run: --out-dir created and checked writable
    (every process: check_out_dir), locked to this run (rank 0 of a training run: lock_out_dir), and the
    log.jsonl of a resumed run continued (`run.resumed`, resume_or_start's): a last line cut off mid-write
    repaired (repair_log); in the checkpoint's own folder, the records of steps after the checkpoint's set
    aside (set_aside_later_records) and the checkpoint's epoch record written if the log lacks it
    (log_the_saved_epoch). Returns the lock's open file (None: another rank, or --eval-only, which writes
    only its own results). Raises Fail."""
    check_out_dir(args.out_dir)
    if not run.master or args.eval_only:
        return None
    lock = lock_out_dir(args.out_dir)
    if run.resumed:
        kept = f"checkpoint {run.resumed['path']} (step {run.resumed['step']}) is intact"
        repair_log(run.log_path, kept)
        if same_folder(run.resumed["path"], args.out_dir):
            set_aside_later_records(run.resumed, run.log_path, run.ckpt_path, kept)
            if run.resumed["record"]:
                log_the_saved_epoch(run.resumed, run.resumed["path"], args.out_dir)
    return lock


def same_classes(ck, path, classes):
    """The class folders of an image folder's train/ now (`classes`, sorted as its labels are; None:
    nothing to compare) against those of the checkpoint `ck` (read from `path`) was trained on, in
    Unicode NFC: a folder renamed, added or removed since would shift the labels after it, or leave the
    head the wrong size. Raises Fail naming the classes that changed, under DDP on every process when
    any process's folders differ (each reads its own; they agree in one all-gather)."""
    saved = ck.get("classes")
    if classes is None or saved is None:  # (the same on every process: the data flags and the checkpoint)
        return
    saved, classes = ([unicodedata.normalize("NFC", c) for c in names] for names in (saved, classes))
    what, gone, new = [], [c for c in saved if c not in classes], [c for c in classes if c not in saved]
    for names, how in ((gone, "gone"), (new, "new")):
        if names:
            what.append(", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
                        + (" is " if len(names) == 1 else " are ") + how)
    what = None if saved == classes else "; ".join(what) or "the same names, in another order"
    if dist.is_initialized():
        seen = [None] * dist.get_world_size()
        dist.all_gather_object(seen, what)
        what = next((w for w in seen if w), None)
    if what:
        raise Fail(f"--resume {path}: the class folders of its train/ differ from the checkpoint's {len(saved)}: "
                   f"{what}; the labels would no longer mean the classes it learnt; restore the original folders, or "
                   f"start a new run from these weights in another --out-dir with --finetune {path}")


def same_files(args, ckpt_path):
    """Under DDP, check that every process took the decisions that read the run folder from the same
    files: which checkpoint --resume (auto) continues, and whether OUT/ckpt.pt exists (a fresh run
    refuses it). Rank 0 alone writes that folder, so a process on a node that does not see it would
    start afresh beside a resumed rank 0. Raises Fail on every process, naming the first that differs."""
    if not dist.is_initialized():
        return
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (args.resume, os.path.exists(ckpt_path)))
    odd = next((r for r, s in enumerate(seen) if s != seen[0]), None)
    if odd is not None:
        said = lambda s: (f"resumes {s[0]}" if s[0] else "starts afresh") + (", sees" if s[1] else ", does not see") \
            + f" {ckpt_path}"  # noqa: E731
        raise Fail(f"the processes do not see the same run folder: rank 0 {said(seen[0])}, rank {odd} "
                   f"{said(seen[odd])}; --out-dir must be a folder every process reads (a shared filesystem on "
                   "a cluster)")


def repair_log(log, kept):
    """A log.jsonl whose last line was cut off mid-write (a kill or a full disk in the middle of a write:
    no line end at its end), before a resumed run appends to it: a cut record is removed (a resumed run
    writes its checkpoint's record again: log_the_saved_epoch), a whole record without its line end
    gets it; one line says which. Nothing to do for a whole log or none. Raises Fail when the file
    cannot be written (saying what is kept: `kept`)."""
    try:
        with open(log, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return
    except OSError as e:
        raise cannot_write(log, e, kept)
    if not text or text.endswith(b"\n"):
        return
    last = text[text.rfind(b"\n") + 1:]
    try:
        json.loads(last)
    except ValueError:  # (a cut UTF-8 character too)
        try:
            with open(log, "r+b") as f:
                f.truncate(len(text) - len(last))
        except OSError as e:
            raise cannot_write(log, e, kept)
        print(f"log.jsonl: its last line was cut off mid-write ({len(last)} bytes, not a whole record); removed it, "
              "so that the records written now start on a line of their own")
        return
    write(log, "\n", kept, append=True)
    print("log.jsonl: its last record had no line end (the write was cut off just before it); added it")


def log_the_saved_epoch(ck, path, out_dir):
    """A run resumed in its own folder whose checkpoint holds an epoch's log record that log.jsonl lacks
    (the write failed after the save, or the run ended between the two): append it, and say so."""
    if os.path.abspath(os.path.dirname(path)) != os.path.abspath(out_dir):
        return  # another folder: its log starts afresh
    log, rec = os.path.join(out_dir, "log.jsonl"), ck["record"]
    try:
        with open(log) as f:
            seen = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        seen = []
    if not any(r.get("epoch") == rec["epoch"] and r.get("step") == rec["step"] and "train_loss" in r for r in seen):
        write(log, json.dumps(rec) + "\n", f"checkpoint {path} (step {ck['step']}) is intact", append=True)
        print(f"log.jsonl: added the record of epoch {rec['epoch']} (step {rec['step']}), which its checkpoint held and "
              "the stopped run had not written")


def set_aside_later_records(resumed, log, ckpt_path, kept):
    """A run resumed in its own folder from a checkpoint (`resumed`: its path, step, epoch and batch, the
    position it continues at) that the folder's run had trained on from (e.g. --resume OUT/ckpt_e0.pt after
    epoch 3): log.jsonl keeps one record per epoch and step of the branch that continues. From its first
    epoch record past the checkpoint's position on (an epoch it starts or goes on with; by epoch, as the step
    counts of two batch sizes differ: schedule_step), its lines move to a file of their own beside it,
    log.abandoned-TIME.jsonl (written first, then the log replaced atomically: a crash between the two
    leaves them in both, never in neither); the later OUT/ckpt.pt (`ckpt_path`), which this run's first
    checkpoint replaces, is named in the same one line. Raises Fail when a file cannot be written (`kept`)."""
    step, epoch, batch, path = resumed["step"], resumed["epoch"], resumed["batch"], resumed["path"]
    try:
        with open(log) as f:
            lines = f.readlines()
    except FileNotFoundError:
        lines = []
    except OSError as e:
        raise cannot_write(log, e, kept)

    def later(line):
        try:
            rec = json.loads(line)
        except ValueError:
            return False
        if not (isinstance(rec, dict) and isinstance(rec.get("epoch"), int) and isinstance(rec.get("step"), int)):
            return False  # (an --eval-depths row: it goes with the records before it)
        return rec["epoch"] > epoch or rec["epoch"] == epoch and (not batch or rec["step"] > step)
    cut = next((i for i, line in enumerate(lines) if later(line)), len(lines))
    replaced = os.path.exists(ckpt_path) and not os.path.samefile(ckpt_path, path)
    if cut == len(lines) and not replaced:
        return
    said = f"resume: {path} continues this folder's run at step {step}"
    if cut < len(lines):
        reached = [json.loads(ln) for ln in lines[cut:] if later(ln)][-1]
        folder, now, n = os.path.dirname(log), time.strftime("%Y%m%d-%H%M%S"), 1
        stamp = now
        while os.path.exists(os.path.join(folder, f"log.abandoned-{stamp}.jsonl")):  # (a second one this second)
            n += 1
            stamp = f"{now}-{n}"
        # the --eval-depths results of the abandoned weights go with their log rows
        moved = [name for name in ("log.jsonl", "depth_eval.json", "depth_eval.png") if name == "log.jsonl" or (
            os.path.exists(os.path.join(folder, name)) and any('"depth"' in ln for ln in lines[cut:]))]
        aside = {name: os.path.join(folder, name.replace(".", f".abandoned-{stamp}.", 1)) for name in moved}
        write(aside["log.jsonl"], "".join(lines[cut:]), kept)
        try:
            with open(log + ".tmp", "w") as f:
                f.write("".join(lines[:cut]))
                f.flush()
                os.fsync(f.fileno())
            os.replace(log + ".tmp", log)
            for name in moved[1:]:
                os.replace(os.path.join(folder, name), aside[name])
        except OSError as e:
            raise cannot_write(log, e, kept)
        said += (f", back from where it had got to (epoch {reached['epoch']}, step {reached['step']}): log.jsonl's "
                 f"{len(lines) - cut} later record(s) moved to {aside['log.jsonl']}"
                 + "".join(f", and {name} to {aside[name]}" for name in moved[1:]))
    if replaced:
        said += f"; {ckpt_path}, which this run does not continue, is replaced at its first checkpoint"
    print(said)


def continue_hint(p, argv, ddp, ckpt_path):
    """How to continue this run from `ckpt_path` once stopped: the same command when it resumes
    that checkpoint by itself (--resume auto, or --resume of that file), else the command with
    --resume CKPT added (argparse takes the last value of a flag), under torchrun with torchrun and
    its options (launcher), so that it can be pasted."""
    argv = sys.argv[1:] if argv is None else list(argv)
    given = p.parse_args(argv).resume
    if given == "auto":
        return "continue with the same command (its --resume auto continues the checkpoint)"
    if given and os.path.abspath(checkpoint_file(given, "--resume")) == os.path.abspath(ckpt_path):
        return "continue with the same command"
    start = launcher(parent_command(), argv, os.environ, p.prog) if ddp else ["python", p.prog]
    return "continue with: " + shlex.join(start + argv + ["--resume", ckpt_path])


def parent_command():
    """The command line of this process's parent (under torchrun: torchrun's, which started it), as a list
    of words; [] where it cannot be read (no /proc: not Linux)."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            return [os.fsdecode(w) for w in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def launcher(parent, argv, env, prog="train.py"):
    """The words that start a DDP process of train.py (or of the script `prog`) with the arguments `argv`:
    torchrun, its options and the script, from torchrun's command line `parent` (parent_command: `torchrun
    OPTIONS SCRIPT ARGV` or `python -m torch.distributed.run OPTIONS SCRIPT ARGV`, written as torchrun);
    where `parent` is not that, rebuilt from what torchrun sets in the environment `env` (LOCAL_WORLD_SIZE, GROUP_WORLD_SIZE,
    GROUP_RANK, MASTER_ADDR, MASTER_PORT): on many nodes each node's own command."""
    for i, w in enumerate(parent):
        if os.path.basename(w) == "torchrun" or (w == "torch.distributed.run" and parent[i - 1:i] == ["-m"]):
            rest, n = parent[i + 1:], len(argv) + 1  # OPTIONS SCRIPT ARGV
            if len(rest) >= n and rest[len(rest) - n + 1:] == list(argv):
                return ["torchrun", *rest[:len(rest) - n + 1]]
            break
    nodes = env.get("GROUP_WORLD_SIZE", "1")
    words = ["torchrun", "--nnodes", nodes, "--nproc_per_node", env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1"))]
    if nodes != "1":
        words += ["--node_rank", env.get("GROUP_RANK", "0"), "--master_addr", env.get("MASTER_ADDR", "127.0.0.1"),
                  "--master_port", env.get("MASTER_PORT", "29500")]
    return words + [sys.argv[0] if sys.argv[0].endswith(".py") else prog]


def start_weights(args, model, flag="--finetune"):
    """--finetune without --resume (or another start `flag` of an entry point: train_loopvae.py's --stage2): the
    weights to start from, loaded into `model` on the CPU (finetune_weights; the source's kind was checked
    with its flags: flags.check_source). Returns the report line."""
    return finetune_weights(getattr(args, flag[2:].replace("-", "_")), model, flag)


def new_run_dir(model, kind=None, root="runs"):
    """ROOT/MODEL[-KIND]-YYYYmmdd-HHMMSS, the default --out-dir: a new folder per run (as timm's
    output/train/<time>-<model>), with -2, -3, ... when that second already has one. Choosing the name and
    claiming it are one step, an exclusive os.mkdir (it fails where the folder exists), so that runs started
    at the same moment (a job array, a shell loop with &) each get a folder of their own. The folder is
    recorded in CLAIMED; release_unused removes it if the run ends before writing into it. Raises Fail when
    ROOT cannot be written."""
    base = os.path.join(root, "-".join([model, *([kind] if kind else []), time.strftime("%Y%m%d-%H%M%S")]))
    path, n = base, 2
    try:
        os.makedirs(root, exist_ok=True)
        while True:
            try:
                os.mkdir(path)
                break
            except FileExistsError:
                path, n = f"{base}-{n}", n + 1
    except OSError as e:
        raise Fail(f"the run folder {path} (the default --out-dir) cannot be created ({e.strerror}); give --out-dir")
    CLAIMED.append(path)
    return path


CLAIMED = []  # the run folders new_run_dir made in this process


def release_unused():
    """Remove the folders new_run_dir claimed that are still empty (a run refused, or stopped, before it wrote
    a file there): a run that ended before it began leaves no folder behind."""
    while CLAIMED:
        try:
            os.rmdir(CLAIMED.pop())
        except OSError:  # (not empty: the run's files; or gone)
            pass
