"""Train a recurrent ViT: one plain loop for one process, N processes (torchrun) and CPU or GPU.

    python train.py --model bvit --data cifar100 --data-dir ../shared/data --max-steps 300
    torchrun --nproc_per_node 8 train.py --model bvit --size s --data imagenet --data-dir /imagenet

AdamW (fused on CUDA), linear warmup + cosine, bf16 autocast (fp16 with a GradScaler), optional
torch.compile of each block (compiled before DDP), gradient clipping, label smoothing,
MixUp/CutMix and RandAugment (torchvision v2), EMA, an atomic checkpoint every epoch and
--resume, top-1/top-5 each epoch, --eval-depths. Writes OUT/log.jsonl and OUT/ckpt.pt (SPEC s8).
"""
import argparse
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import data

# ----------------------------------------------------------------------------- arguments
SIZES = {"ti": (192, 3), "s": (384, 6), "b": (768, 12), "l": (1024, 16)}  # (embed_dim, num_heads)


def build_bvit(args, common):
    import bvit
    num_blocks = args.num_blocks or (common["depth"] if args.model == "vit" else 1)
    return bvit.BViT(num_blocks=num_blocks, stages=args.stages, stage_weights=args.stage_weights,
                     detach_stages=args.detach_stages, step_embed=args.step_embed, **common)


# The model registry: name -> builder(args, common kwargs). New model files add one line here.
MODELS = {"vit": build_bvit, "bvit": build_bvit}


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, exit status 2, no usage dump
        sys.stderr.write(f"train.py: error: {message}\n")
        sys.exit(2)


def positive(kind):
    def parse(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {s!r}")
        if not v > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {s}")
        return v
    parse.__name__ = f"positive {kind.__name__}"
    return parse


def non_negative(s):
    v = float(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {s}")
    return v


def int_list(s):
    try:
        v = [int(t) for t in s.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 3,6,12, got {s!r}")
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {s!r}")
    return v


def float_list(s):
    try:
        return [float(t) for t in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 1,1,2, got {s!r}")


def get_parser():
    p = Parser(description=__doc__.split("\n")[0])
    a = p.add_argument
    # model
    a("--model", default="bvit", choices=list(MODELS), help="model family (default bvit)")
    a("--size", choices=list(SIZES), help="named width: ti D=192 h=3, s 384/6, b 768/12, l 1024/16 "
      "(depth 12, 24 for l); explicit flags override it (default: ti)")
    a("--embed-dim", type=positive(int))
    a("--depth", type=positive(int), help="block applications (steps)")
    a("--num-heads", type=positive(int))
    a("--mlp-ratio", type=positive(float), default=4.0)
    a("--patch-size", type=positive(int), help="default 4 for 32 px images, else 16")
    a("--num-blocks", type=positive(int), help="distinct blocks in contiguous phases "
      "(default 1 for bvit, depth for vit)")
    a("--stages", type=positive(int), default=1, help="deep-supervision stages (must divide depth)")
    a("--stage-weights", type=float_list, help="comma-separated loss weight per stage")
    a("--detach-stages", action="store_true", help="stop gradients between stages")
    a("--step-embed", action="store_true", help="learned per-step embedding (ablation)")
    a("--gap", action="store_true", help="global average pooling instead of a class token")
    a("--layer-scale", type=positive(float), help="LayerScale init (DeiT III), off by default")
    a("--drop-path", type=non_negative, default=0.0, help="stochastic depth rate")
    # data
    a("--data", default="cifar100", choices=data.DATASETS)
    a("--data-dir", help="dataset root (default $RVITS_DATA, else ./data)")
    a("--download", action="store_true", help="download CIFAR-100 through torchvision")
    a("--img-size", type=positive(int), help="default 32 (cifar100, synthetic) or 224 (imagenet)")
    a("--workers", type=int, default=2, help="data loader processes per rank")
    a("--val-subset", type=positive(int), help="evaluate on the first N validation images only")
    # optimization
    a("--epochs", type=positive(int), default=100)
    a("--max-steps", type=positive(int), help="stop after this many optimizer steps; the "
      "warmup + cosine schedule is compressed to end there")
    a("--batch-size", type=positive(int), default=128, help="global batch size (all ranks)")
    a("--eval-batch-size", type=positive(int), default=256, help="per-rank evaluation batch")
    a("--lr", type=positive(float), default=1e-3, help="peak learning rate")
    a("--min-lr", type=non_negative, default=1e-5)
    a("--warmup-epochs", type=non_negative, default=5.0)
    a("--weight-decay", type=non_negative, default=0.05)
    a("--clip-grad", type=non_negative, default=1.0, help="max gradient norm, 0 = off")
    a("--label-smoothing", type=non_negative, default=0.1)
    a("--mixup", type=non_negative, default=0.0, help="MixUp alpha, 0 = off")
    a("--cutmix", type=non_negative, default=0.0, help="CutMix alpha, 0 = off")
    a("--randaug", type=non_negative, default=0, help="RandAugment magnitude (2 ops), 0 = off")
    a("--ema", type=non_negative, default=0.0, help="EMA decay of the weights, e.g. 0.9999; 0 = off")
    # system
    a("--amp", default="auto", choices=["auto", "none", "bf16", "fp16"],
      help="autocast dtype; auto = bf16 on CUDA, none on CPU")
    a("--compile", action="store_true", help="torch.compile each block (before DDP)")
    a("--device", default="auto", help="auto, cpu, cuda")
    a("--seed", type=int, default=0)
    a("--out-dir", default="runs/default", help="where log.jsonl and ckpt.pt are written")
    a("--resume", help="checkpoint to continue from")
    a("--eval-depths", type=int_list, help="after training, evaluate at these depths, e.g. 3,6,12")
    return p


def resolve(args, p, img_size):
    """Fill size defaults and check every flag combination, naming the flag on error."""
    dim, heads = SIZES[args.size or "ti"]
    args.embed_dim = args.embed_dim or dim
    args.num_heads = args.num_heads or heads
    args.depth = args.depth or (24 if args.size == "l" else 12)
    args.patch_size = args.patch_size or (4 if img_size <= 64 else 16)
    if img_size % args.patch_size:
        ok = [d for d in range(1, img_size + 1) if img_size % d == 0]
        p.error(f"--patch-size {args.patch_size} does not divide the image size {img_size}; "
                f"allowed: {', '.join(map(str, ok))}")
    if args.embed_dim % args.num_heads:
        p.error(f"--embed-dim {args.embed_dim} is not divisible by --num-heads {args.num_heads}")
    if args.num_blocks and args.num_blocks > args.depth:
        p.error(f"--num-blocks {args.num_blocks} exceeds --depth {args.depth}")
    if args.depth % args.stages:
        p.error(f"--stages {args.stages} must divide --depth {args.depth}")
    if args.stage_weights and len(args.stage_weights) != args.stages:
        p.error(f"--stage-weights needs {args.stages} values (one per stage)")
    return args


# ----------------------------------------------------------------------------- helpers
def lr_lambda(total, warmup, lr, min_lr):
    """Multiplier of the peak lr at optimizer step s: linear warmup, then cosine to min_lr."""
    def f(s):
        if s < warmup:
            return (s + 1) / warmup
        t = (s - warmup) / max(1, total - warmup)
        return (min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(t, 1.0)))) / lr
    return f


def param_groups(model, weight_decay):
    """No weight decay on biases, norms, embeddings and other 1-D parameters (timm/DeiT)."""
    decay, no_decay = [], []
    for name, prm in model.named_parameters():
        if prm.ndim < 2 or name.split(".")[-1] in ("pos_embed", "cls_token", "step_embed"):
            no_decay.append(prm)
        else:
            decay.append(prm)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


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
    """Write to a temporary file, then rename: a crash mid-write keeps the previous file."""
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


@torch.no_grad()
def evaluate(model, loader, device, amp_ctx, depth=None):
    """Top-1/top-5 (percent) and cross-entropy of the final logits, summed over all ranks."""
    model.eval()
    sums = torch.zeros(4, device=device, dtype=torch.float64)  # loss, top1, top5, count
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with amp_ctx:
            logits, _ = model(x, depth=depth)
        logits = logits.float()
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hit = top5 == y[:, None]
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"), hit[:, 0].sum(),
                             hit.any(1).sum(), torch.tensor(len(y), device=device)]).double()
    if dist.is_initialized():
        dist.all_reduce(sums)
    loss, a1, a5, n = sums.tolist()
    model.train()
    return {"val_loss": loss / n, "val_acc1": 100 * a1 / n, "val_acc5": 100 * a5 / n}


def model_log(model):
    """Model-specific values for log.jsonl: the last step's auxiliary terms (`model.aux`, e.g. the
    per-stage losses) and whatever `model.log_extras()` returns (e.g. reViT's gate table)."""
    out = {k: float(v) for k, v in getattr(model, "aux", {}).items()}
    if hasattr(model, "log_extras"):
        out.update(model.log_extras())
    return out


class Fail(Exception):
    """A problem the user can fix: printed as one line, exit status 2."""


# ----------------------------------------------------------------------------- main
def main(argv=None):
    p = get_parser()
    args = p.parse_args(argv)

    # --- set-up: distributed, device, precision ---
    ddp = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank, world, local_rank = 0, 1, 0
    if ddp:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cpu", "cuda"):
        p.error(f"--device {args.device}: allowed: auto, cpu, cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available; use --device cpu")
    device = torch.device(f"cuda:{local_rank}" if args.device == "cuda" else "cpu")
    if args.amp == "auto":
        args.amp = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "none"
    if args.amp == "fp16" and device.type == "cpu":
        p.error("--amp fp16 needs a CUDA device; use --amp bf16 or none on CPU")
    if args.batch_size % world:
        p.error(f"--batch-size {args.batch_size} is not divisible by the {world} processes")
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    amp_ctx = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else nullcontext()

    # --- data (before the process group, so a bad path fails fast on every rank) ---
    try:
        train_set, val_set, num_classes, img_size = data.build_datasets(
            args.data, args.data_dir, args.img_size, args.download, int(args.randaug), seed=args.seed)
    except (data.DataError, ValueError) as e:
        raise Fail(str(e))
    args = resolve(args, p, img_size)
    if args.val_subset:
        val_set = torch.utils.data.Subset(val_set, range(min(args.val_subset, len(val_set))))
    if ddp:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            torch.cuda.set_device(device)
    master = rank == 0
    train_loader = data.build_loader(train_set, args.batch_size // world, True, rank, world,
                                     args.seed, args.workers)
    val_loader = data.build_loader(val_set, args.eval_batch_size, False, rank, world, workers=args.workers)
    if len(train_loader) == 0:
        raise Fail(f"--batch-size {args.batch_size} is larger than the training set ({len(train_set)})")

    # --- model, optimizer, schedule ---
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts them)
    common = dict(img_size=img_size, patch_size=args.patch_size, num_classes=num_classes,
                  embed_dim=args.embed_dim, depth=args.depth, num_heads=args.num_heads,
                  mlp_ratio=args.mlp_ratio, class_token=not args.gap, layer_scale=args.layer_scale,
                  drop_path_rate=args.drop_path)
    try:
        model = MODELS[args.model](args, common).to(device)
    except ValueError as e:
        raise Fail(str(e))
    raw_model = model
    optimizer = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr,
                                  fused=device.type == "cuda")
    steps_per_epoch = len(train_loader)
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    warmup = round(total_steps * min(args.warmup_epochs / args.epochs, 1.0))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(total_steps, warmup, args.lr, args.min_lr))
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    ema = None
    if args.ema:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(args.ema), use_buffers=True)

    # --- resume ---
    start_epoch, step = 0, 0
    os.makedirs(args.out_dir, exist_ok=True)
    ckpt_path, log_path = os.path.join(args.out_dir, "ckpt.pt"), os.path.join(args.out_dir, "log.jsonl")
    if args.resume:
        try:
            ck = torch.load(args.resume, map_location="cpu", weights_only=True)
            model.load_state_dict(ck["model"])
        except FileNotFoundError:
            raise Fail(f"--resume {args.resume}: no such file")
        except Exception as e:
            raise Fail(f"--resume {args.resume}: not a checkpoint of this model ({str(e).splitlines()[0]})")
        optimizer.load_state_dict(ck["optimizer"])
        scheduler.load_state_dict(ck["scheduler"])
        scaler.load_state_dict(ck["scaler"])
        if ema is not None and ck.get("ema") is not None:
            ema.load_state_dict(ck["ema"])
        start_epoch, step = ck["epoch"], ck["step"]
        set_rng_state(ck["rng"])
    elif os.path.exists(ckpt_path):
        raise Fail(f"{ckpt_path} exists; pass --resume {ckpt_path} to continue it or choose another --out-dir")
    else:
        torch.manual_seed(args.seed + rank)  # rank-specific randomness (drop path, MixUp)

    if args.compile:  # regional compilation: each block once, reused for every step
        for blk in getattr(model, "blocks", []):
            blk.compile()
    if ddp:
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)

    mix = None
    if args.mixup or args.cutmix:
        from torchvision.transforms import v2
        mixes = ([v2.MixUp(alpha=args.mixup, num_classes=num_classes)] if args.mixup else []) + \
                ([v2.CutMix(alpha=args.cutmix, num_classes=num_classes)] if args.cutmix else [])
        mix = v2.RandomChoice(mixes)

    if master:
        flops = raw_model.flops_per_image()
        print(f"{args.model}: {raw_model.num_params() / 1e6:.3f} M params, {flops / 1e9:.3f} GFLOPs/img, "
              f"depth {args.depth}, {world} process(es) on {device.type}, amp {args.amp}, "
              f"{total_steps} steps ({steps_per_epoch}/epoch), warmup {warmup}")
        with open(os.path.join(args.out_dir, "args.json"), "w") as f:
            json.dump(vars(args), f, indent=1)

    # --- the loop ---
    eps = args.label_smoothing
    epoch = start_epoch
    while step < total_steps and epoch < args.epochs:
        train_loader.sampler.set_epoch(epoch)
        train_loader.generator.manual_seed(args.seed * 100_003 + epoch * 1009 + rank)
        t0, n_img, n_steps, loss_sum = time.time(), 0, 0, torch.zeros((), device=device)
        left = min(steps_per_epoch, total_steps - step)
        bar = tqdm(total=left, desc=f"epoch {epoch}", disable=not master, dynamic_ncols=True)
        for i, (x, y) in enumerate(train_loader):
            if i == left:
                break
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if mix is not None:
                x, y = mix(x, y)  # y becomes (B, classes) probabilities
            if eps:
                y = (y if y.ndim == 2 else F.one_hot(y, num_classes).float()) * (1 - eps) + eps / num_classes
            with amp_ctx:
                _, loss = model(x, y)
            scaler.scale(loss).backward()
            if args.clip_grad:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            if ema is not None:
                ema.update_parameters(raw_model)
            step, n_steps, n_img = step + 1, n_steps + 1, n_img + x.shape[0] * world
            loss_sum += loss.detach()
            bar.update()
            if master and (i % 20 == 0 or i == left - 1):
                bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
        bar.close()
        if not math.isfinite(loss_sum.item()):
            raise Fail(f"non-finite training loss at step {step}; lower --lr or use --amp bf16/none")
        epoch_time = time.time() - t0
        if ddp:
            dist.all_reduce(loss_sum)
        rec = {"epoch": epoch, "step": step, "lr": scheduler.get_last_lr()[0],
               "train_loss": loss_sum.item() / (n_steps * world),
               **evaluate(raw_model, val_loader, device, amp_ctx),
               "img_per_s": n_img / epoch_time, "epoch_time_s": epoch_time, **model_log(raw_model)}
        if ema is not None:
            rec.update({f"ema_{k}": v for k, v in evaluate(ema.module, val_loader, device, amp_ctx).items()})
        epoch += 1
        if master:
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(json.dumps(rec))
            save_atomic({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                         "ema": ema.state_dict() if ema is not None else None, "epoch": epoch,
                         "step": step, "rng": rng_state(), "args": vars(args)}, ckpt_path)

    # --- evaluation at other depths ("beyond the training horizon") ---
    for depth in args.eval_depths or []:
        try:
            r = evaluate(raw_model, val_loader, device, amp_ctx, depth=depth)
        except ValueError as e:
            raise Fail(f"--eval-depths {depth}: {e}")
        rec = {"depth": depth, "val_acc1": r["val_acc1"], "val_acc5": r["val_acc5"]}
        if master:
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(json.dumps(rec))
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        sys.stderr.write(f"train.py: error: {e}\n")
        sys.exit(2)
