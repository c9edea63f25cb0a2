"""Every flag of train.py: the parser (get_parser, its groups and type checks), --preset and
--list-presets (parse_args, list_presets), the checks and defaults that depend on other flags or on
the data (resolve), and which value a flag takes: the command line, else the preset, else a
checkpoint's (configure, checkpoint_args; `effective`: what a flag left out stands for). Another entry
point (train_loopvae.py) uses the same machinery with its own model flags and checks (an Entry).
Which flags a model reads, and which shape it, are its record's (training/registry.py). `resolved(argv)`
is the whole recipe for a tool: the flags of a command line, resolved as train.py resolves them. Every
error is one line, `train.py: error: ...`, exit status 2.
"""
import argparse
import difflib
import importlib
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

import data
import kernels
from presets import PAPER, PRESETS, TIMES
from training.weights import checkpoint_file, read_weights
from training.evaluation import check_eval_depths
from training.exits import Fail
from training.registry import MODELS, arch_flags, build_model, model_flags, script_of

DESCRIPTION = "Train a recurrent ViT: one plain loop for one process, N processes (torchrun) and CPU or GPU."
SIZES = {"ti": (192, 3), "s": (384, 6), "b": (768, 12), "l": (1024, 16)}  # (embed_dim, num_heads)
EPOCHS, WARMUP_EPOCHS = 100, 5.0  # the defaults of --epochs and --warmup-epochs: a warmup of 5 % of the run


class HelpFormatter(argparse.HelpFormatter):
    """--help with every default that is a value (not None or off) after its flag's help, unless
    the help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        off = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if not off and "(default" not in text:  # 0 is a value (0 == False, hence `is`)
            text += (" " if text else "") + "(default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose error is one line on stderr, `PROG: error: ...`, exit status 2 (no usage
    dump): train.py's, and every tool's that takes numbers (bench.py, lab/, scripts/)."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def number(s, kind=float):
    """argparse type: `s` as a finite `kind` (int or float). ArgumentTypeError for anything else: a
    fraction given to an integer flag (int('0.5') fails, where int(0.5) would truncate it to 0), and nan
    or inf (float() takes them; a check written `v < 0` lets NaN through, `v > 0` lets inf through)."""
    try:
        v = kind(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer (a whole number), got {s!r}" if kind is int
                                         else f"expected a number, got {s!r}")
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {s!r}")
    return v


def positive(kind):
    def parse(s):
        v = number(s, kind)
        if not v > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {s}")
        return v
    parse.__name__ = f"positive {kind.__name__}"
    return parse


def non_negative(s):
    v = number(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {s}")
    return v


def below_one(s):
    v = non_negative(s)
    if v >= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {s}")
    return v


def count(s):
    v = number(s, int)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {s}")
    return v


def copies(s):
    """--repeated-aug: 0 (off) or a number of copies >= 2."""
    v = count(s)
    if v == 1:
        raise argparse.ArgumentTypeError("1 copy is no repetition: use 0 (off) or a number of copies >= 2, e.g. 3")
    return v


def crop_ratio(s):
    """--eval-crop-ratio: in (0, 1]."""
    v = positive(float)(s)
    if v > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (the crop's share of the resized side), got {s}")
    return v


SEED_LIMIT = 10 ** 8  # |--seed| below it: every seed data.py derives from it stays a 64-bit integer (the batched
# CIFAR path's image hash multiplies it by about 4e10); a 64-bit seed overflowed there, or in torch.manual_seed


def seed(s):
    """--seed: an integer whose magnitude is below SEED_LIMIT (ArgumentTypeError otherwise: one line)."""
    v = number(s, int)
    if not -SEED_LIMIT < v < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be between {1 - SEED_LIMIT} and {SEED_LIMIT - 1} (every seed of the "
                                         f"data order and augmentation derived from it stays a 64-bit integer), got {s}")
    return v


def int_list(s):
    try:
        v = [int(t) for t in s.split(",") if t.strip()]
    except ValueError:
        v = []
    if not v or min(v) < 1:  # one message for both mistakes: not integers, or not positive
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 (e.g. 1,2,4), got {s!r}")
    return v


int_list.comma_separated = True  # (a flag whose text is a list: a --config file may give it as a JSON list)


def get_parser(entry=None):
    """The parser of train.py, or of another entry point `entry` (an Entry: train_loopvae.py's), which it
    keeps (p.entry) for parse_args, configure and resolve: the reproduction flags, the entry's model flags,
    then the flags of every run (data, optimization, augmentation; train.py's distillation; system,
    checkpoints, evaluation, logging)."""
    entry = entry or TRAIN
    p = Parser(prog=entry.prog, description=entry.description, formatter_class=HelpFormatter,
               usage=f"{entry.prog} [--preset NAME] [--FLAG VALUE ...]   (the flags by group below)")
    p.entry = entry
    a = p.add_argument_group('reproduction', 'presets.py; docs/presets.md').add_argument
    a("--preset", help="fill every flag of a paper's protocol; flags given on the command line still win. "
      "cpu-first-bvit: the first run, on a CPU; c100-*, in1k-*, in256-*: GPU-sized (--list-presets describes "
      "each, with its time)")
    a("--list-presets", nargs="?", const="", metavar="TEXT", help="print the presets as a table (name, model, "
      "parameters, time on 2 CPU cores and on one H200, what it reproduces) and exit; TEXT keeps those whose name, "
      "model or description contain it (cpu: the ones timed on a CPU; gpu: on a GPU); a preset's name: all of it")
    a("--print-config", action="store_true", help="print the resolved configuration (JSON) and exit")
    a("--config", metavar="FILE", help="take the flags from a JSON file: a run's args.json, --print-config's output "
      "or a file of your own ({\"model\": \"revit\", \"lr\": 0.002, ...}, keys as in args.json); flags on the command "
      "line win, and so does what they set (--size: the width, heads and depth); it wins over --preset (its own "
      "\"preset\" applies first). Its out_dir and resume are not taken: where its run was written; a \"config\" key "
      "names a base file, whose flags apply under the file's (one level; read_config)")
    a("--seed", type=seed, default=0, help="initial weights, data order and augmentation: an integer from "
      f"{1 - SEED_LIMIT} to {SEED_LIMIT - 1}")
    entry.groups(p)
    add_data_flags(p)
    if entry.distillation:
        add_distillation_flags(p)
    add_run_flags(p)
    return p


def add_model_flags(p):
    """train.py's model flags: --model (the classifiers of training/registry.py), their sizes, and the
    groups of the families' own flags."""
    a = p.add_argument_group('model').add_argument
    a("--model", default="bvit", choices=list(MODELS), help="model family")
    a("--size", choices=list(SIZES), help="named width: ti D=192 h=3, s 384/6, b 768/12, l 1024/16 "
      "(depth 12, 24 for l); explicit flags override it (default: ti)")
    a("--embed-dim", type=positive(int), help="token width D (default: by --size)")
    a("--depth", type=positive(int), help="block applications (steps); for odevit solver steps, not block "
      "evaluations (default: by --size: 12, 24 for l)")
    a("--num-heads", type=positive(int), help="attention heads (default: by --size)")
    a("--mlp-ratio", type=positive(float), default=4.0, help="MLP hidden width / D")
    a("--patch-size", type=positive(int), help="(default: 4 for images up to 64 px, else 16)")
    a("--num-blocks", type=positive(int), help="distinct blocks in contiguous phases (default: 1 for bvit, "
      "depth for vit)")
    a("--stages", type=positive(int), default=1, help="deep-supervision stages; must divide --depth")
    a("--gap", action="store_true", help="global average pooling instead of a class token")
    a("--layer-scale", type=positive(float), help="LayerScale init (DeiT III) (default: off)")
    a("--drop-path", type=below_one, default=0.0, help="stochastic depth rate, in [0, 1)")
    a("--init", default="default", choices=["default", "mimetic", "structured"], help="attention "
      "init, on --init-base: default = the base's own; mimetic: W_q W_k^T ~ I, W_v W_o ~ -I; structured: each "
      "head a 3x3 impulse (shift) filter on the position embedding (x18)")
    a("--init-base", default="timm", choices=["timm", "pytorch"], help="init of every layer the attention "
      "init does not set: timm = trunc-normal 0.02, zero biases; pytorch = PyTorch's defaults (weights and "
      "biases U(+-1/sqrt(fan_in)), position embedding randn x 0.02, class token 0): the structured-init "
      "paper's baseline (its weight_init=skip) with --init default")
    a = p.add_argument_group('model: SR-ViT', 'srvit.py').add_argument
    a("--recursions", type=positive(int), default=4, help="srvit: times the --depth-layer stack is "
      "applied, outputs mixed per token; --eval-depths then counts recursions")
    a = p.add_argument_group('model: reViT', 'revit.py, revit_moe.py').add_argument
    a("--experts", type=positive(int), default=4, help="revit: FFN experts merged per step by "
      "normalized depth (1 = the tied bViT block)")
    a("--depth-dropout", type=non_negative, default=0.0, help="revit: per-image probability of "
      "dropping each step in training (elastic depth, the paper's second stage at 0.3: the c100-*-elastic "
      "presets; dropped = identity), in [0, 1), 0 = off (fixed depth, the paper's supervised recipe)")
    a("--routing", default="depth", choices=["depth", "lory", "smear", "deepseek", "qwen3", "moeut", "remoe",
                                             "softmoe"], help="revit: how the FFN of each step is chosen "
      "(revit_moe.py; the reViT paper's Table 3 baselines at U = 1, as its appendix B adapts them): "
      "depth = reViT, merged by normalized depth; "
      "lory = one FFN merged per image from the state entering the step (Lory, Zhong et al. 2024); "
      "smear = one FFN merged per image from its input, no auxiliary loss (SMEAR, Muqeeth et al. 2024); "
      "deepseek = sigmoid top-1 of E routed + 1 shared expert at hidden ratio 2, bias balancer (DeepSeek-V3); "
      "qwen3 = softmax top-1 of E renormalized, no shared expert (Qwen3); "
      "moeut = sigmoid-gated top-1 of E, no renormalization (MoEUT's sigma-MoE); "
      "remoe = all E experts at hidden ratio 1 on every token, ReLU gates, sparsity controller (ReMoE); "
      "softmoe = patch-count slots split over E full-width experts (Soft-MoE)")
    a("--lora-rank", type=count, default=0, help="revit with --experts 1: layer-wise LoRA baseline, a "
      "rank-r update per step on qkv, proj, fc1, fc2 (0 = off)")
    a("--router-lr-scale", type=positive(float), default=1.0, help="revit (--routing depth, --experts > 1): the "
      "router's (A.1) learning rate as a multiple of --lr, through warmup and decay; not the paper's (one rate): "
      "a candidate of the search for a CPU recipe on which the experts engage (issue 63)")
    a("--lambda-bal", type=non_negative, default=1e-2, help="revit: weight of the gate-entropy "
      "balance loss mean_k [1 - H(g_k)/log E] (eq. 6; E > 1 only)")
    a("--lambda-z", type=non_negative, default=1e-3, help="revit: weight of the router z-loss "
      "mean_k logsumexp(logits)^2 (eq. 8; E > 1 only)")
    a("--lambda-div", type=non_negative, default=1e-3, help="revit: weight of the mean pairwise "
      "squared cosine similarity of the experts' parameters (eq. 9; E > 1 only)")
    a = p.add_argument_group('model: ODEViT', 'odevit.py').add_argument
    a("--solver", default="euler", choices=["euler", "midpoint", "heun", "rk4"], help="odevit: "
      "fixed-step solver; block evaluations (NFE) per step 1, 2, 2, 4")
    a("--horizon", type=positive(float), help="odevit: integration horizon T (default: the number "
      "of steps, so h = T/steps = 1, which with euler is the bViT recurrence)")
    a("--field", default="subtracted", choices=["subtracted", "blackbox"], help="odevit: "
      "subtracted = dz/dt = F(z) - z; blackbox = dz/dt = F(z)")
    a("--extend", default="time", choices=["time", "refine"], help="odevit: what a depth L other "
      "than the trained steps means: time = L steps at the trained h (T grows), refine = L steps "
      "over the trained T (h = T/L)")


def add_data_flags(p):
    """The data, optimization and augmentation flags of every entry point's run."""
    a = p.add_argument_group('data').add_argument
    a("--data", default="cifar100", choices=data.DATASETS, help="dataset: folder = any image folder (train/<class>/, "
      "val/; docs/data.md), imagenet = the same reader, ImageNet's name for it")
    a("--data-dir", help="dataset root (default: $RVITS_DATA, else ./data)")
    a("--download", action="store_true", help="download CIFAR-100 through torchvision")
    a("--img-size", type=positive(int), help="(default: 32 for cifar100 and synthetic, 224 for image folders)")
    a("--workers", type=count, help="data loader processes per rank (default: 2 on CPU; on CUDA the "
      "machine's cores / processes per node, at most 16)")
    a("--cpu-loader", action="store_true", help="CIFAR: use the DataLoader with per-image "
      "transforms instead of the batched crop/flip loader (chosen on CUDA, and on CPU with --workers "
      "0, unless --randaug or --three-augment is set); image folders on CUDA: decode and augment "
      "in the CPU workers instead of decoding JPEGs and augmenting on the GPU")
    a("--val-labels", metavar="FILE", help="image folders: labels of a flat val/ folder, lines "
      "'<file name> <class>' (whitespace or comma separated; class = a train/ folder name)")
    a("--max-bad-images", type=count, default=100, help="image folders: undecodable files are skipped "
      "with a warning; stop (exit 2) once more than this many were skipped in the run")
    a("--val-subset", type=positive(int), help="evaluate on N validation images only: the first N for "
      "CIFAR (its files are shuffled), N evenly spaced ones for image folders (sorted by class); a short run "
      "(--max-steps, --eval-depths) spends most of its time on the 10k-image evaluations, which --val-subset 1000 cuts")
    a = p.add_argument_group('optimization').add_argument
    a("--epochs", type=positive(int), default=EPOCHS, help="training epochs")
    a("--max-steps", type=positive(int), help="stop after this many optimizer steps; the "
      "warmup + cosine schedule is compressed to end there")
    a("--batch-size", type=positive(int), default=128, help="global batch size (all ranks)")
    a("--grad-accum", type=positive(int), default=1, help="split each process's share of the batch "
      "into N micro-batches whose gradients add up to one optimizer step (same global batch)")
    a("--opt", default="adamw", choices=["adamw", "lamb"], help="optimizer: AdamW or LAMB (DeiT III)")
    a("--lr", type=positive(float), default=1e-3, help="peak learning rate")
    a("--min-lr", type=non_negative, default=1e-5, help="learning rate at the end of the cosine")
    a("--warmup-epochs", type=non_negative, default=WARMUP_EPOCHS, help="linear warmup, in epochs, below the run's "
      "epochs; left out, a run of 5 epochs or fewer gets 5 %% of them, said in its first lines")
    a("--warmup-lr", type=non_negative, help="learning rate of the first warmup step, from which the warmup "
      "rises linearly to --lr (DeiT's --warmup-lr; the reViT paper's Table 6: 1e-6) (default: --lr / the "
      "warmup steps, a ramp from 0)")
    a("--weight-decay", type=non_negative, default=0.05, help="decoupled weight decay (none on 1-D parameters)")
    a("--clip-grad", type=non_negative, default=1.0, help="max gradient norm, 0 = off")
    a("--label-smoothing", type=below_one, default=0.1, help="label smoothing epsilon")
    a("--bce", action=argparse.BooleanOptionalAction, default=False, help="binary cross-entropy "
      "(DeiT III) instead of cross-entropy; MixUp/CutMix targets become 1 for every class in the "
      "mix (targets > 0), as DeiT's code does")
    a("--ema", type=below_one, default=0.0, help="EMA decay of the weights, e.g. 0.9999; 0 = off")
    a("--max-nonfinite", type=positive(int), default=20,
      help="stop after N consecutive steps with a non-finite gradient (those steps are skipped)")
    a = p.add_argument_group('augmentation').add_argument
    a("--mixup", type=non_negative, default=0.0, help="MixUp alpha, 0 = off")
    a("--cutmix", type=non_negative, default=0.0, help="CutMix alpha, 0 = off")
    a("--randaug", type=count, default=0, help="RandAugment magnitude (2 ops), an integer, 0 = off, at most 30")
    a("--reprob", type=below_one, default=0.0, metavar="P", help="random erasing (DeiT's --reprob, timm's pixel "
      "mode): each training image has one rectangle replaced by N(0, 1) noise after normalization with "
      "probability P, e.g. 0.25; 0 = off")
    a("--three-augment", action=argparse.BooleanOptionalAction, default=False, help="DeiT III's "
      "simple random crop + 3-Augment (grayscale / solarize / blur, then --color-jitter) for training")
    a("--color-jitter", type=non_negative, default=0.3, help="--three-augment: brightness, contrast and "
      "saturation jitter, each by a factor in [1 - c, 1 + c] (DeiT III's --color-jitter; 0 = none)")
    a("--repeated-aug", type=copies, default=0, metavar="N", help="repeated augmentation (DeiT's RASampler; "
      "timm's --aug-repeats): each image of an epoch N times, differently augmented, the copies on different "
      "processes; an epoch keeps its length, so it sees about 1/N of the images (data.ResumableSampler); "
      "0 = off; the reViT paper's Table 6: yes (DeiT: 3)")


def add_distillation_flags(p):
    """train.py's distillation flags (training/distill.py)."""
    a = p.add_argument_group('distillation', 'training/distill.py').add_argument
    a("--teacher", metavar="CKPT", help="distill from this rvits checkpoint or timm-layout ViT state dict (DINOv2's): "
      "frozen, in eval mode, on the same augmented images resized to its patch grid = the student's "
      "(training/distill.py); the loss becomes the task loss + --distill-weight x the term")
    a("--distill", choices=["feature", "logits"], help="with --teacher: feature: match the final "
      "post-LayerNorm tokens (MSE; a learned projection when the widths differ), the reViT paper's "
      "final-feature objective; logits: soft KD, KL at --distill-temperature (default: feature)")
    a("--distill-weight", type=non_negative, default=1.0, help="with --teacher: the loss is the task loss + this "
      "x the distillation term")
    a("--distill-temperature", type=positive(float), default=3.0, help="--distill logits (DeiT: 3)")
    a("--task-weight", type=non_negative, default=1.0, help="with --teacher: the task loss's weight; 0 distils from "
      "the teacher's features alone, no labels (the reViT paper's DINOv2 regime, A.3)")


def add_run_flags(p):
    """The system, checkpoint, evaluation and logging flags of every entry point's run."""
    a = p.add_argument_group('system and distributed', 'kernels.py; torchrun').add_argument
    a("--device", default="auto", help="auto = cuda when torch sees a CUDA device, else mps when it sees an Apple GPU, "
      "else cpu; cpu; cuda; mps (Apple silicon, one process: --amp auto is none there, bf16 and fp16 with its "
      "GradScaler as the installed torch supports them; training/run.py choose_device)")
    a("--amp", default="auto", choices=["auto", "none", "bf16", "fp16"],
      help="autocast dtype; auto = bf16 on CUDA, none on CPU and MPS")
    a("--compile", action="store_true", help="torch.compile the model (before DDP); see --compile-scope")
    a("--compile-scope", choices=list(kernels.SCOPES), help="with --compile: blocks = each distinct "
      "block compiled once, the step loop eager (regional compilation); model = the whole training "
      "forward at the trained depth as one graph (CUDA graphs on CUDA), blocks compiled too for "
      "evaluation at any depth; not under DDP, with --teacher or --eval-only, nor for reViT's elastic "
      "depth or the revit_moe.py baselines; auto = model where it applies, else blocks (kernels.py) (default: auto)")
    a("--grad-checkpoint", action="store_true", help="activation checkpointing of each recurrent "
      "step (torch.utils.checkpoint): a step keeps only its input state (B, N, D) for the backward "
      "instead of all its activations, at the cost of about one more forward")
    a("--dist-timeout", type=positive(float), default=600.0,
      help="seconds a process waits for its peers before failing (DDP)")
    a = p.add_argument_group('checkpoints', 'training/checkpoints.py; docs/cluster.md "Resuming and failures"').add_argument
    a("--out-dir", help="where log.jsonl, ckpt.pt and args.json are written (default: a new folder per run, "
      "runs/MODEL-YYYYmmdd-HHMMSS; --resume auto needs it given)")
    a("--resume", help="checkpoint to continue from (exactly: same data order and RNG streams); "
      "'auto': OUT/ckpt.pt when it exists, else start fresh (one command for every requeue); a "
      "flag that differs from the checkpoint's is printed, and refused where it breaks the run "
      "(README \"Resuming and failures\")")
    a("--finetune", metavar="PATH", help="start from these model weights only (optimizer, schedule "
      "and epochs start fresh): an rvits checkpoint, whose architecture flags are used unless given, "
      "or a state-dict file (timm, DeiT); a head with another number of classes is re-initialized "
      "and pos_embed resized to the patch grid (README \"Fine-tuning\"); ignored with --resume")
    a("--save-every", type=positive(int), help="also checkpoint every N optimizer steps mid-epoch")
    a = p.add_argument_group('evaluation').add_argument
    a("--eval-batch-size", type=positive(int), default=256, help="per-rank evaluation batch")
    a("--eval-crop-ratio", type=crop_ratio, default=0.875, help="image folders: evaluate the center crop of "
      "--img-size after resizing the short side to --img-size / ratio (DeiT III's --eval-crop-ratio; the reViT "
      "paper's Table 6: 1.0, no cut); CIFAR is evaluated whole")
    a("--eval-depths", type=int_list, help="after training (or with --eval-only), evaluate at these "
      "depths, e.g. 3,6,12,24,48: block applications for vit/bvit, solver steps for odevit (see "
      "--extend); prints a table and writes OUT/depth_eval.json (and a PNG if matplotlib is installed; "
      "depth_eval-2.json ... where OUT holds one this run did not make)")
    a("--eval-only", action="store_true", help="no training: evaluate --resume CKPT at --eval-depths "
      "(without them: 0.5, 1, 2, 4, 8 x its depth); model flags come from the checkpoint unless given; "
      "another --img-size interpolates the position embedding (dynamic_img_size); "
      "writes only depth_eval.json (+ PNG) in --out-dir (depth_eval-2.json ... where the folder holds one: it never "
      "replaces a record it did not make)")
    a("--eval-ema", action="store_true", help="--eval-depths and --eval-only use the EMA weights "
      "(a run trained with --ema)")
    a = p.add_argument_group('logging', 'training/monitor.py; a run\'s curves: python scripts/curves.py OUT').add_argument
    a("--log-every", type=positive(int), metavar="N", help="also a step record in OUT/log.jsonl every N optimizer "
      "steps: step, loss (the last micro-batch's), lr, grad_norm (before clipping), img_per_s (timm's "
      "--log-interval); the device is read at those steps only (default: off, epoch records only)")
    a("--tensorboard", action="store_true", help="also write log.jsonl's numbers (the step and epoch records) as "
      "TensorBoard scalars to OUT/tensorboard (torch.utils.tensorboard; the tensorboard package is an optional "
      "extra: pip install tensorboard)")
    return p


# ----------------------------------------------------------------------------- resolving
def resolve(args, p, img_size):
    """train.py's flags: fill size defaults and check every flag combination, naming the flag on error
    (another entry point resolves its own: its Entry's resolve)."""
    dim, heads = SIZES[args.size or MODELS[args.model].size]  # its record: its default size, its own flags
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
    wrong = check_eval_depths(args)  # (before training, not after hours of it)
    if wrong:
        p.error(wrong)
    wrong = too_small(args)
    if wrong:
        p.error(wrong)
    resolve_run(args, p)
    for flag, models in model_flags().items():  # (a flag only some models read: their records' `flags`)
        if args.model not in models and given(p, [flag]):
            which = f"{', '.join(models[:-1])} or {models[-1]}" if len(models) > 1 else models[0]
            p.error(f"--{flag.replace('_', '-')} is a flag of --model {which}; --model {args.model} does not use it "
                    "(it would change nothing): leave it out")
    if args.init_base == "pytorch" and args.routing not in ("depth", "lory", "smear"):
        p.error(f"--init-base pytorch with --routing {args.routing}: revit_moe.py initializes that routing's experts or "
                "router as timm does (trunc-normal 0.02), so the base would not hold; use --init-base timm")
    if args.lora_rank and args.routing != "depth":
        p.error(f"--lora-rank is the baseline on the tied block (--routing depth --experts 1); got --routing {args.routing}")
    if args.router_lr_scale != 1 and (args.routing != "depth" or args.experts == 1 or args.lora_rank):
        p.error(f"--router-lr-scale scales reViT's depth router (--routing depth, --experts > 1); this run has "
                f"--routing {args.routing} --experts {args.experts}" + (" --lora-rank" if args.lora_rank else "")
                + " (it would change nothing): leave it out")
    if args.lora_rank and args.experts != 1:
        p.error(f"--lora-rank needs --experts 1 (the tied block plus one adapter per step), got --experts {args.experts}")
    if args.distill and not args.teacher:
        p.error("--distill needs --teacher CKPT, the checkpoint to distill from")
    lone = given(p, ("distill_weight", "distill_temperature", "task_weight")) if not args.teacher else []
    if lone:
        p.error(f"{lone[0]} weighs a distillation term, and there is no --teacher CKPT: add one or leave it out")
    args.distill = args.distill or ("feature" if args.teacher else None)
    return args


def widths(args):
    """Every size of the model of resolved flags `args` that a flag becomes through a conversion, as the model
    files compute it: {what, in words: its value}. The MLP's hidden width int(D x --mlp-ratio) (bvit.py,
    revit.py, srvit.py, odevit.py, loopvae.py), and revit_moe.py's expert width, that width // 2 (deepseek) or
    // 4 (remoe); the sizes a flag gives as they are (--embed-dim, --depth ...) are checked by their types."""
    hidden = int(args.embed_dim * args.mlp_ratio)
    out = {f"--mlp-ratio {args.mlp_ratio:g} x --embed-dim {args.embed_dim}: an MLP of hidden width": hidden}
    if args.model == "revit" and args.routing in ("deepseek", "remoe"):
        out[f"--routing {args.routing}: its experts' hidden width {hidden} // {2 if args.routing == 'deepseek' else 4} ="
            ] = hidden // (2 if args.routing == "deepseek" else 4)
    return out


def too_small(args):
    """The first size of `widths(args)` below 1 as one line (a layer of width 0 builds and trains: nothing
    would say that the blocks' MLPs are gone), else None."""
    for what, v in widths(args).items():
        if v < 1:
            return f"{what} {v} (after rounding down): every width must be >= 1; give a larger --mlp-ratio or --embed-dim"
    return None


def resolve_run(args, p):
    """The checks of every entry point's run flags (augmentation, schedule, evaluation crop), naming the flag
    (p.error, one line); resolve's and another entry point's (loopvae_train/flags.py)."""
    if args.randaug > 30:
        p.error(f"--randaug {args.randaug:g}: RandAugment magnitudes go from 0 to 30")
    if args.min_lr > args.lr:
        p.error(f"--min-lr {args.min_lr:g} is above --lr {args.lr:g}")
    resolve_warmup(args, p)
    if args.warmup_lr is not None and (args.warmup_lr > args.lr or not args.warmup_epochs):
        p.error(f"--warmup-lr {args.warmup_lr:g}: " + (f"above --lr {args.lr:g}" if args.warmup_epochs else
                "--warmup-epochs 0 has no warmup to start"))
    if given(p, ["color_jitter"]) and not args.three_augment:
        p.error("--color-jitter is 3-Augment's color jitter, and this run has no --three-augment (it would change "
                "nothing): add --three-augment or leave it out")
    if given(p, ["eval_crop_ratio"]) and args.data not in data.FOLDERS:
        p.error(f"--eval-crop-ratio crops the evaluation images of image folders (--data folder, imagenet); --data "
                f"{args.data} is evaluated whole (it would change nothing): leave it out")


def short_warmup(epochs):
    """The warmup (in epochs) of a run of `epochs` that leaves --warmup-epochs at its default: the default
    where it is shorter than the run, else the default's share of the default run (5 %: 0.15 of 3 epochs)."""
    return WARMUP_EPOCHS if WARMUP_EPOCHS < epochs else WARMUP_EPOCHS * epochs / EPOCHS


def resolve_warmup(args, p):
    """A warmup at least as long as the run (--epochs 3 with the default --warmup-epochs 5) would leave the
    lr at its peak at the end, the cosine and --min-lr never acting: a given --warmup-epochs (command line,
    preset) is refused in one line (p.error); the default is shortened to short_warmup (announce says so).
    With --max-steps the schedule is compressed, the warmup's share of the run kept."""
    if args.eval_only or args.warmup_epochs < args.epochs:
        return
    if given(p, ["warmup_epochs"]):
        p.error(f"--warmup-epochs {args.warmup_epochs:g} is not below --epochs {args.epochs}: the whole run would be "
                "warmup (the lr would end at its peak, the cosine and --min-lr never acting); give a shorter one, e.g. "
                f"--warmup-epochs {short_warmup(args.epochs):g}, or 0")
    args.warmup_epochs = short_warmup(args.epochs)


# The epoch-valued flags that the schedule turns into a count of optimizer steps (train.optimizer_and_schedule):
# dest -> (the Run field holding its steps, what 0 steps of it leave). (--epochs itself: an epoch of 0 steps is
# refused, train.py's main().)
IN_STEPS = {"warmup_epochs": ("warmup", "no warmup, its lr at --lr from the first step")}


def rounded_to_nothing(p, args, run):
    """One note per flag of IN_STEPS given > 0 (command line, --config, preset: `given`) that comes to 0 optimizer
    steps of `run` (a short --max-steps, a small training set): a warmup of 0 steps is none, and nothing else
    would say so. The run's first lines print them (announce's `notes`)."""
    if args.eval_only or not run.total_steps:
        return []
    notes = []
    for dest, (steps, left) in IN_STEPS.items():
        value, flag = getattr(args, dest), f"--{dest.replace('_', '-')}"
        if value > 0 and not getattr(run, steps) and given(p, [dest]):
            notes.append(f"note: {flag} {value:g} comes to 0 of this run's {run.total_steps} optimizer steps "
                         f"({value:g} of --epochs {args.epochs}" + (f", cut to --max-steps {args.max_steps}" if
                         args.max_steps and args.max_steps < args.epochs * run.steps_per_epoch else "") +
                         f"): the run has {left}; " + (f"give {flag} {args.epochs / run.total_steps:.3g} or more for "
                         "one step, or 0" if run.total_steps > 1 else "a run of one step has no room for one: give 0"))
    return notes


def parse_args(p, argv=None):
    """Parse argv; with --preset NAME and --config FILE, parse again with the preset's flags, then the
    file's (read_config), as the defaults, so the flags given on the command line override them (and
    the flags LINKED to those: --size sets the depth a file gives). --list-presets describes them and
    exits. Records on `p` which flags the command line, the preset or the file gave (`p.given`, their
    dests; of the file's, those that differ from the default they replace): a value that came from a
    checkpoint, or a default, is never refused as if someone had given it (`given`). A --model that another
    entry point trains is one line naming its script."""
    words = sys.argv[1:] if argv is None else list(argv)
    named = [w[len("--model="):] if w.startswith("--model=") else words[i + 1] for i, w in enumerate(words)
             if w.startswith("--model=") or (w == "--model" and i + 1 < len(words))]
    other = next((m for m in named if m not in trained(p) and script_of(m)), None)
    if other:
        p.error(f"--model {other}: {p.prog} does not train it; {script_of(other)} does (python {script_of(other)} "
                "--help lists its flags)")
    args = p.parse_args(argv)
    if args.list_presets is not None:
        if not list_presets(args.list_presets, p):
            p.error(f"--list-presets {args.list_presets!r}: no preset matches; --list-presets alone lists all "
                    f"{len(presets_of(p))}")
        sys.exit(0)
    config = read_config(p, args.config) if args.config else {}
    preset = args.preset if args.preset is not None else config.get("preset")
    if preset is not None:
        if preset not in PRESETS:
            close = difflib.get_close_matches(preset, PRESETS, n=3, cutoff=0.6)
            p.error(f"--preset {preset} is unknown{f' (in --config {args.config})' if args.preset is None else ''}; "
                    + (f"did you mean {' or '.join(close)}? " if close else "")
                    + f"python {p.prog} --list-presets lists all {len(presets_of(p))} (--list-presets WORD: those "
                    "matching it)")
        trains = PRESETS[preset][1].get("model")
        if trains not in trained(p):  # (another entry point's preset: LoopVAE's, train_loopvae.py)
            p.error(f"--preset {preset} trains --model {trains}, which {p.prog} does not train: python "
                    f"{script_of(trains)} --preset {preset}")
        p.set_defaults(**PRESETS[preset][1])
    actions = {a.dest: a for a in p._actions}
    below = {k: parsed_default(actions[k], p.get_default(k)) for k in config}  # what the file's values replace
    p.set_defaults(**config)
    if preset is not None or config:
        args = p.parse_args(argv)
    unset = object()
    probe = argparse.Namespace(**{k: unset for k in vars(args)})
    p.parse_args(argv, namespace=probe)  # argparse fills no default where an attribute exists
    p.typed = {k for k, v in vars(probe).items() if v is not unset}  # on the command line
    for k in linked(p.typed, p) & set(config):  # set through a flag on the command line (--size: the depth)
        setattr(args, k, below[k])
    readers = p.entry.model_flags()  # a file's flag of another model (an args.json holds every flag): a note, not refused
    other = sorted(k for k, v in config.items() if k in readers and args.model not in readers[k] and v != below[k])
    if other:
        print(f"note: --config {args.config}: {', '.join(f'{k} {config[k]}' for k in other)}: not read by --model "
              f"{args.model} (flags of other models)", file=sys.stderr)
    p.given = p.typed | set(PRESETS[preset][1] if preset else ()) | {
        k for k, v in config.items() if v != below[k] and k not in linked(p.typed, p) and k not in other}
    if "preset" in p.typed and config:
        args.preset = preset_under_config(p, args, config)
    return args


def preset_under_config(p, args, config):
    """--preset A --config B: the file's flags win over A's, the command line's over both. One line says which
    of A's flags the file replaces (and that the file's own "preset" was not applied); when none of A's is left
    in the run, A had no effect and the record names the preset the file's flags came from (its "preset", or
    None). Returns the preset the run records."""
    actions = {a.dest: a for a in p._actions}
    ours = {k: parsed_default(actions[k], v) for k, v in PRESETS[args.preset][1].items()}
    replaced = sorted(k for k, v in ours.items() if k in config and config[k] != v and k not in p.typed)
    theirs = config.get("preset")
    kept = [k for k, v in ours.items() if k not in p.typed and getattr(args, k) == v and k not in config]
    said = f"--preset {args.preset}: " + (f"--config {args.config} sets {', '.join(replaced)}, which win over the preset's"
                                         if replaced else "")
    if theirs not in (None, args.preset):
        said += ("; " if replaced else "") + f"the file's own preset {theirs} is not applied (--preset wins over it)"
    if not kept and replaced:  # every flag of A is replaced (or given): the run is the file's
        print(f"note: --preset {args.preset} has no effect: --config {args.config} sets every flag it sets (and "
              f"{', '.join(replaced)} otherwise); the run is the file's, and records preset {theirs}", file=sys.stderr)
        return theirs
    if replaced or theirs not in (None, args.preset):
        print(f"note: {said}", file=sys.stderr)
    return args.preset


# Keys of a --config file that are a command's actions, not a run's flags (--print-config's output holds
# them), or what train.py derives from a checkpoint and args.json records beside the flags (checkpoint_args):
# left out. And where the run that wrote an args.json lives and what it continued: not taken.
CONFIG_ACTIONS = ("config", "print_config", "list_presets", "model_img_size", "model_classes")
CONFIG_PLACE = ("out_dir", "resume")


def read_config(p, path):
    """--config FILE: the flags of the JSON object in `path` (a run's args.json, --print-config's output,
    or a user's file; a key is a flag's dest, embed_dim, or its name, --embed-dim), each value checked by
    its flag's own type and choices, as {dest: value}. A key "config" names a base file (relative to this file's
    folder) whose flags apply under the file's own, one level deep (a base that names another is refused; in a
    run's record, an args.json or --print-config's output, the key says which file gave its flags, all of which
    the record holds: not read). Left out: CONFIG_ACTIONS, and CONFIG_PLACE (a note
    on stderr names those the file set: a new run goes to its own --out-dir, never into another run's).
    p.error (one line, exit 2) for a file that cannot be read, is not a JSON object, has keys that are
    not flags (all named) or a value its flag refuses, and for a flag rvits cut (CUT_FLAGS) that the file
    sets (an older run's args.json holds them unset: left out); a file of another entry point's run (its
    "model") names that entry point's script. Another entry point's flags, which an older args.json holds
    (Entry.foreign: a LoopVAE run's held every flag of train.py), are left out, with a note where one is
    not at its default."""
    raw = config_file(p, path)
    base = raw.get("config") if "print_config" not in raw else None  # (a run's record: where its flags came from)
    if base is not None:  # a file on another: the base's flags, under the file's own (one level)
        if not isinstance(base, str):
            p.error(f"--config {path}: config: {json.dumps(base)} is not a file name; give the base file's path "
                    "(relative to this file's folder), or remove the key")
        base = os.path.join(os.path.dirname(path), base)
        if os.path.exists(base) and os.path.samefile(base, path):
            p.error(f"--config {path}: config: {base} is this file itself; remove the key")
        lower = config_file(p, base, f"--config {path}: its base ")
        if lower.get("config") is not None and "print_config" not in lower:
            p.error(f"--config {path}: its base {base} names another, {lower['config']}: a base is read one level "
                    f"deep (no chains, no cycles); copy {lower['config']}'s flags into {base}, or into {path}")
        raw = {**{k: v for k, v in lower.items() if k != "config"}, **{k: v for k, v in raw.items() if k != "config"}}
    actions = {a.dest: a for a in p._actions if a.dest != "help"}
    config = {k.lstrip("-").replace("-", "_"): v for k, v in raw.items()}
    for old, now in FOLDED_FLAGS.items():  # (a flag folded into another: its value moves there, or must agree)
        if old in config and old not in actions:
            v = config.pop(old)
            if v is not None and config.get(now) is None:
                config[now] = v
            elif v is not None and config[now] != v:
                p.error(f"--config {path}: {old} {json.dumps(v)} and {now} {json.dumps(config[now])}: "
                        f"--{old.replace('_', '-')} is --{now.replace('_', '-')} now; keep one value under \"{now}\" "
                        f"and remove \"{old}\"")
    trains = config.get("model")
    if isinstance(trains, str) and trains not in trained(p) and script_of(trains):
        p.error(f"--config {path}: the flags of a --model {trains} run, which {p.prog} does not train: python "
                f"{script_of(trains)} --config {path}")
    foreign = p.entry.foreign()  # (another entry point's flags, which an older args.json holds: left out)
    aside = {k: v for k, v in config.items() if k not in actions and k in foreign}
    noted = [f"{k} {v}" for k, v in aside.items() if v != foreign[k]]
    if noted:
        print(f"note: --config {path}: {', '.join(noted)}: not read by {p.prog} (flags of another entry point's "
              "models)", file=sys.stderr)
    config = {k: v for k, v in config.items() if k not in aside}
    raw = {k: v for k, v in raw.items() if k.lstrip("-").replace("-", "_") in config}
    cut = [k for k in CUT_FLAGS if config.get(k)]
    if cut:
        p.error(f"--config {path}: {', '.join(cut)}: set in the file, and rvits no longer has {'them' if len(cut) > 1 else 'it'} "
                "(issue 51); remove the key, or use the rvits of commit f4ca284 or earlier for that run")
    unknown = [k for k in raw if k.lstrip("-").replace("-", "_") not in actions and k not in CUT_FLAGS + CONFIG_ACTIONS]
    if unknown:
        p.error(f"--config {path}: {', '.join(map(str, unknown))}: not flags of {p.prog} (python {p.prog} --help "
                f"lists them); remove {'them' if len(unknown) > 1 else 'it'} from the file")
    left = {k: config.pop(k) for k in CONFIG_PLACE if config.get(k) is not None}
    if left:
        print(f"note: --config {path}: not taken: {', '.join(f'{k} {v}' for k, v in left.items())} (where the run "
              "that wrote it lives; give --out-dir or --resume on the command line)", file=sys.stderr)
    return {k: config_value(p, actions[k], v, f"--config {path}: {k}") for k, v in config.items()
            if k not in CONFIG_ACTIONS + CONFIG_PLACE + CUT_FLAGS}


def config_file(p, path, said="--config "):
    """The JSON object of flags in the file `path` (read_config's), else p.error (one line starting `said`)."""
    fix = f"give a JSON object of {p.prog}'s flags (a run's args.json, or --print-config's output)"
    try:
        with open(path) as f:
            raw = json.load(f)
    except OSError as e:
        p.error(f"{said}{path}: {e.strerror}; {fix}")
    except ValueError as e:  # (json.JSONDecodeError; a file that is not UTF-8 too)
        p.error(f"{said}{path}: not JSON ({getattr(e, 'msg', e)}, line {getattr(e, 'lineno', '?')}); {fix}")
    if not isinstance(raw, dict):
        p.error(f"{said}{path}: a JSON {type(raw).__name__}, not an object of flags; {fix}")
    return raw


def parsed_default(action, default):
    """A flag's default as parse_args leaves it: a text default goes through the flag's type (argparse does)."""
    return action.type(default) if isinstance(default, str) and action.type else default


def config_value(p, action, v, where):
    """The value `v` of a --config file for the flag of `action`, parsed as its command-line text would be
    (its type and choices; a list is the comma-separated text): p.error (one line, `where`) if refused."""
    on_off = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)
    if v is None:  # null: the flag left out, which only a flag whose default is "not given" (None) can be
        if p.get_default(action.dest) is None:
            return None
        p.error(f"{where}: null is not a value of {action.option_strings[0]} (its default is "
                f"{json.dumps(p.get_default(action.dest))}); give a value, or remove the key")
    if isinstance(v, list) and not getattr(action.type, "comma_separated", False):  # (int_list, diffaug_policy)
        p.error(f"{where}: {json.dumps(v)} is not a value of {action.option_strings[0]} (one value, not a list)")
    if isinstance(action, on_off) != isinstance(v, bool) or isinstance(v, dict):
        p.error(f"{where}: {json.dumps(v)} is not a value of {action.option_strings[0]}"
                + (" (true or false)" if isinstance(action, on_off) else ""))
    if isinstance(action, on_off):
        return v
    # a whole float is written as an integer (a preset's randaug=9.0, an older args.json's 0.0), so an
    # integer flag takes it; a float flag reads the same value either way
    whole = lambda x: str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)  # noqa: E731
    text = ",".join(map(whole, v)) if isinstance(v, list) else whole(v)
    try:
        value = action.type(text) if action.type else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
        p.error(f"{where}: {e}")
    if action.choices is not None and value not in action.choices:
        p.error(f"{where}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    return value


def given(p, names):
    """The flags (--name) among `names` that the command line or the preset gave (parse_args' p.given;
    none for a parser it did not run, e.g. flags rebuilt from a checkpoint): the flags a check may
    refuse. A given flag counts whatever its value: one the run cannot use is refused even at its
    default."""
    return [f"--{k.replace('_', '-')}" for k in names if k in getattr(p, "given", ())]


def configure(p, argv):
    """The run's flags: parsed (with --preset), run folders resolved to their ckpt.pt, and what a
    checkpoint gives (docs/cluster.md "Resuming and failures", "Which value a flag takes"). Returns None when
    --print-config printed the resolved configuration instead."""
    args = parse_args(p, argv)
    if args.resume == "auto":  # a requeued job: continue the previous attempt's checkpoint if any
        if not args.out_dir:
            p.error("--resume auto needs --out-dir, the folder every attempt of the job writes to")
        auto = os.path.join(args.out_dir, "ckpt.pt")
        args.resume = auto if os.path.exists(auto) else None
    for k in p.entry.checkpoints:  # a preset that continues (or distils) seed 0's run, the command
        src = PRESETS[args.preset][1].get(k) if args.preset else None  # line not naming one
        if not src or k in p.typed:
            continue
        if "seed" in p.typed and args.seed != 0 and src.rstrip("/").endswith("seed0"):  # another seed: its own run
            p.error(f"--preset {args.preset} --seed {args.seed} {'distils' if k == 'teacher' else 'continues'} {src}, "
                    f"seed 0's run; give that seed's own with --{k} {src[:-1]}{args.seed} (lab/reproduce_mini.sh "
                    "does), or leave out --seed")
        if k in p.entry.starts and not args.print_config and not args.resume and not os.path.exists(src):  # not there yet: train it first
            p.error(f"--preset {args.preset} continues the run {src}, which does not exist yet: train it first (its "
                    f"arm's preset, with --out-dir {src}; lab/reproduce_mini.sh runs them in order), or give --{k} CKPT")
    for flag in ("resume", *p.entry.checkpoints):  # a run folder means its ckpt.pt
        setattr(args, flag, checkpoint_file(getattr(args, flag), "--" + flag))
    # Which value a flag takes (docs/cluster.md "Resuming and failures"): the command line, else the preset,
    # else the checkpoint's (--eval-only: the run's flags; --resume: its model and --data-dir; --finetune: its
    # architecture; an entry point's other starts, p.entry.starts: their own), else the default.
    if args.eval_only:  # (a preset's flags count as given: p.given)
        if not args.resume:
            p.error("--eval-only needs --resume CKPT, the checkpoint to evaluate")
        run_flags = EVAL_RUN_FLAGS | p.entry.eval_flags
        args = checkpoint_args(p, args, args.resume, lambda k: k not in run_flags, "--resume")
    elif any(getattr(args, k) for k in ("resume", *p.entry.starts)):  # with --resume, --finetune is ignored: the
        # run continues
        source = next((f"--{k}", getattr(args, k)) for k in ("resume", *p.entry.starts) if getattr(args, k))
        if not (args.print_config and source[0] != "--resume" and not os.path.exists(source[1])):
            # (a preset's continuation printed before the run it starts from exists: the preset's flags describe
            # the model)
            carried = p.entry.arch() | ({"resume": RESUME_FLAGS} | p.entry.starts).get(source[0][2:], set())
            args = checkpoint_args(p, args, source[1], lambda k: k in carried, source[0])
        if args.resume and not args.out_dir:  # a run continues in its own folder
            args.out_dir = os.path.dirname(args.resume) or "."
    if args.tensorboard:  # (an optional extra: what the run will use, imported before anything is written)
        why = unusable("tensorboard", "torch.utils.tensorboard", "SummaryWriter")
        if why:
            p.error(f"--tensorboard needs the tensorboard package, which {why}: pip install -U tensorboard, or leave "
                    "out --tensorboard (log.jsonl holds the same numbers: python scripts/curves.py OUT draws them)")
    if args.print_config:  # what this command would train; reads no data, builds no model
        args.img_size = default_img_size(args)
        print(json.dumps(vars(p.entry.resolve(args, p, args.img_size)), indent=1))
        return None
    return args


def unusable(package, module, name):
    """Why the optional extra `package`, through `module`.`name`, cannot be used, in words ("is not installed", "cannot be imported
    (ImportError: TensorBoard logging requires TensorBoard version 1.15 or above)"), else None: imported as the
    run will use it, so that a package too old, broken or half-installed is found before the run starts (an
    import can raise anything: AttributeError, RuntimeError, a version check's ImportError)."""
    try:
        getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == package:
            return "is not installed"
        return f"cannot be imported (it needs {e.name}, which is not installed)"
    except Exception as e:  # noqa: BLE001 (any failure of a third-party import: one line, not a traceback)
        return f"cannot be imported ({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]})"
    return None


# ----------------------------------------------------------------------------- a checkpoint's flags
# Flags that --eval-only always takes from the command line, never from the checkpoint (the data
# flags, --data-dir and --val-subset included, come from the checkpoint unless given).
EVAL_RUN_FLAGS = {"eval_only", "resume", "eval_depths", "out_dir", "device", "amp", "workers",
                  "download", "eval_batch_size", "compile", "compile_scope", "eval_ema", "teacher", "distill",
                  "log_every", "tensorboard", "config"}
# Flags that --resume also takes from its checkpoint unless given: where the data is, as --eval-only
# takes it (the command line's --data-dir wins, then the checkpoint's, then $RVITS_DATA, then ./data).
RESUME_FLAGS = {"data_dir"}
# Flags that rvits once had and cut (issue 51): a checkpoint trained with one of them set is refused (check_source).
CUT_FLAGS = ("stage_weights", "detach_stages", "step_embed")
# Flags folded into another (issue 78): {old dest: the flag that now says it}. ODEViT's --ode-steps was --depth under
# a second name (resolve set --depth to it), so an older args.json holds both at one value, or ode_steps null.
FOLDED_FLAGS = {"ode_steps": "depth"}
# (The flags --finetune takes from an rvits checkpoint unless given, what shapes the weights: registry.arch_flags.)


# Flags that set the same quantity: giving the key keeps these from coming from a checkpoint, so the
# given flag is applied instead of being overridden (--size sets the width, heads and depth unless
# they are given); an entry point adds its own (Entry.linked).
LINKED = {"size": ("embed_dim", "num_heads", "depth")}


def linked(named, p=None):
    """The flags set through the flags `named` (LINKED and the entry point's of parser `p`, followed through:
    --size sets --depth)."""
    links, out, todo = {**LINKED, **(p.entry.linked if p is not None else {})}, set(), list(named)
    while todo:
        for k in links.get(todo.pop(), ()):
            if k not in out and k not in named:
                out.add(k)
                todo.append(k)
    return out


def checkpoint_args(p, args, path, keep, flag):
    """Flags from the checkpoint at `path` (its saved args) wherever the command line gives none and
    `keep(flag)` is true; flags given on the command line or by the preset (`p.given`, parse_args)
    always win, and so do the flags LINKED to them. --eval-only takes all but the
    run flags (e.g. --extend refine or another --solver can still be given); --finetune takes the
    architecture. args.model_img_size records the checkpoint's image size (a model evaluated at
    another --img-size is built at it with dynamic_img_size=True), and for --eval-only
    args.model_classes its class names (None for CIFAR, synthetic data and older checkpoints).
    Before a flag is copied, the source's kind is checked (check_source): a checkpoint of the wrong
    kind is named as what it is, not blamed on a flag it would bring. Raises Fail."""
    ck = read_weights(path, flag)  # a bad file is reported before anything else (e.g. the data)
    named = set(getattr(p, "given", ()))
    check_source(ck, path, flag, p, args)
    if not (isinstance(ck, dict) and isinstance(ck.get("args"), dict)):
        return args  # --finetune from a plain state dict: the command line describes the model
    saved = ck["args"]
    through = linked(named, p)  # set through a flag that was given
    actions = {a.dest: a for a in p._actions}
    for k, v in saved.items():
        if hasattr(args, k) and k not in named and k not in through and keep(k):
            a = actions.get(k)
            if a is not None and (a.type or a.choices) and v is not None:  # checked as its command-line text is
                config_value(p, a, v, f"{flag} {path}: its saved {a.option_strings[0]}")  # (a changed file: exit 2)
            setattr(args, k, v)
    args.model_img_size = saved.get("img_size") or (224 if saved.get("data") in data.FOLDERS else 32)
    if getattr(args, "eval_only", False):  # it reads no training set: an image folder's class names
        args.model_classes = ck.get("classes")
    return args


def check_source(ck, path, flag, p, args):
    """What a --resume / --finetune / --eval-only source `ck` (read from `path`; or another start of the
    entry point of parser `p`) is, checked before its flags are used in the run of flags `args`: --resume
    needs an rvits training checkpoint; the entry point's own check (Entry.check) passes; and the
    checkpoint's model is one the entry point trains (a LoopVAE checkpoint given to train.py names
    train_loopvae.py). Raises Fail naming what the checkpoint is."""
    saved = ck["args"] if isinstance(ck, dict) and isinstance(ck.get("args"), dict) else None
    kind = saved.get("model") if saved else None
    cut = [f"--{k.replace('_', '-')}" for k in CUT_FLAGS if saved and saved.get(k)]
    if cut:  # (their weights or losses no longer exist: the run cannot be rebuilt as it trained)
        raise Fail(f"{flag} {path}: trained with {', '.join(cut)}, which rvits no longer has (issue 51: no preset, "
                   "study or result used it); use the rvits of commit f4ca284 or earlier for this checkpoint")
    said = f"a --model {kind} checkpoint" if kind else "not an rvits checkpoint (no flags of the run that saved it)"
    if flag == "--resume" and saved is None:
        raise Fail(f"--resume {path}: not an rvits training checkpoint (no flags of the run that saved it)")
    if p.entry.check is not None:
        p.entry.check(ck, path, flag, args, said)
    if kind and kind not in trained(p) and script_of(kind):
        raise Fail(f"{flag} {path}: {said}, not {p.entry.kind}; {script_of(kind)} trains and evaluates it")


def effective(k, v, run):
    """The value flag `k` given as `v` stands for in a run of flags `run` (a dict): a default left
    out (None) is resolved as train.py resolves it (the image size; the run's model record's
    `defaults`), so that a command spelling out the default (--img-size 32 on CIFAR, --num-blocks 1
    for bvit) equals the one that leaves it out (checkpoints.resume_changes compares the two)."""
    if v is not None:
        return v
    if k == "img_size":
        return 224 if run.get("data") in data.FOLDERS else 32
    return MODELS[run["model"]].defaults(run).get(k) if run.get("model") in MODELS else None


def command_line(flags, p=None):
    """`flags` ({dest: value}, a preset's) as a command line of train.py (or of parser `p`'s entry point) that
    parses back to the same values: a switch by its name (--gap; --bce / --no-bce), a value left at None or a
    plain switch left off omitted (their defaults), a whole number of an integer flag without ".0", a list
    comma-joined, a value quoted where needed."""
    actions = {a.dest: a for a in (p or get_parser())._actions}
    words = []
    for k, v in flags.items():
        name, action = "--" + k.replace("_", "-"), actions.get(k)
        if v is None or v is False and not isinstance(action, argparse.BooleanOptionalAction):
            continue
        if isinstance(v, bool):
            words.append(name if v else "--no-" + name[2:])
            continue
        value = ",".join(map(str, v)) if isinstance(v, list) else str(v)
        if isinstance(v, float) and v.is_integer() and action is not None and action.type is not None:
            try:
                action.type(value)
            except (argparse.ArgumentTypeError, TypeError, ValueError):  # an integer flag: 0.0 -> 0
                value = str(int(v))
        words += [name, value]
    return shlex.join(words)


def trained(p):
    """The --model names the entry point of parser `p` trains (its --model's choices: train.py's, every
    record of training/registry.py, one registered later too); their presets are its (presets_of), another's
    are named with their script (registry.script_of)."""
    return next(a.choices for a in p._actions if a.dest == "model")


def presets_of(p):
    """The presets of the entry point of parser `p` (those of a model it trains): {name: (what, flags)}."""
    return {name: v for name, v in PRESETS.items() if v[1].get("model") in trained(p)}


def list_presets(text, p):
    """--list-presets [TEXT]: a table, one row per preset: its name, model (built on the meta device:
    shapes only, no memory, no init), parameters, the time a run takes (presets.TIMES, which says where
    each figure comes from) and what it reproduces, cut to fit a line; TEXT keeps the presets whose name,
    model or description contain it ("cpu" / "gpu": those with a time on that hardware). A preset's
    exact name prints all of it: what it reproduces, the paper's number (presets.PAPER), times, flags.
    Only the presets of the entry point of parser `p` (presets_of); another's exact name is one line
    naming its script (p.error). Returns False (nothing printed) when TEXT matches no preset."""
    mine = presets_of(p)
    if text in PRESETS and text not in mine:
        p.error(f"--list-presets {text}: a preset of --model {PRESETS[text][1].get('model')}, which {p.prog} does not "
                f"train: python {script_of(PRESETS[text][1].get('model'))} --list-presets {text}")
    if text in mine:
        what, flags = PRESETS[text]
        cpu, gpu = TIMES[text]
        print(f"{text}: {what}\npaper: {PAPER[text]}\ntime: CPU-2 {cpu}; one H200 {gpu}\nflags: "
              + command_line(flags, p))
        return True
    t, rows = text.lower(), []
    for name, (what, flags) in mine.items():
        cpu, gpu = TIMES[name]
        keep = {"cpu": cpu != "?", "gpu": gpu != "?"}.get(t, t in f"{name} {flags['model']} {what}".lower())
        if not keep:
            continue
        args = resolved(["--preset", name], entry=p.entry)
        with torch.device("meta"):
            model = p.entry.build(args, default_img_size(args), 1000 if args.data in data.FOLDERS else 100)
        rows.append((name, args.model, f"{model.num_params() / 1e6:.3g} M", cpu, gpu, what))
    if not rows:
        return False
    print("times (presets.TIMES): wall time of training and evaluation on CPU-2 (2 cores, AMD EPYC) and on one H200;\n"
          "est. = estimated (docs/presets.md says from what), ? = not measured. --list-presets NAME prints a preset in full.")
    head = ("NAME", "MODEL", "PARAMS", "CPU-2", "H200", "WHAT")
    widths = [max(len(r[k]) for r in rows + [head]) for k in range(5)]
    room = max(20, 120 - sum(widths) - 10)
    for r in [head] + rows:
        what = r[5] if len(r[5]) <= room else r[5][:room - 3] + "..."
        print("  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + what)
    return True


def default_img_size(args):
    """--img-size, else the data's: 224 for image folders (data.FOLDERS), 32 for CIFAR-100 and synthetic."""
    return args.img_size or (224 if args.data in data.FOLDERS else 32)


def resolved(argv, img_size=None, entry=None):
    """The flags of the command line `argv` (a list; --preset applied) resolved as train.py (or the entry
    point `entry`) resolves them, at `img_size` (default: default_img_size), reading no data and no
    checkpoint: the recipe of a tool that builds train.py's model of a command line
    (registry.build_model(args, img_size, classes)). A bad flag: one line, exit status 2, as train.py."""
    p = get_parser(entry)
    args = parse_args(p, argv)
    return p.entry.resolve(args, p, img_size or default_img_size(args))


# ----------------------------------------------------------------------------- entry points
@dataclass(frozen=True)
class Entry:
    """What an entry point brings to the flag machinery above, which keeps it on its parser (p.entry):
    train.py's (TRAIN), or another script's (train_loopvae.py's, in loopvae_train/flags.py: training/ never
    imports it).

    prog, description: its script's name and its docstring's first line;
    groups: p -> None, adds its model flags (train.py: add_model_flags); distillation: whether it has the
        distillation group;
    resolve: (args, p, img_size) -> args: its flags' defaults and checks (p.error, one line);
    build: (args, img_size, num_classes) -> its model, for --list-presets (built on the meta device);
    arch: () -> the flags (dests) that shape its model: a start takes them from its checkpoint unless given,
        --resume refuses a change;
    starts: {flag (dest): the flags it takes from its checkpoint unless given, beside `arch`}: the flags
        naming the checkpoint a new run starts from, in the order they are looked up (--finetune);
    checkpoints: every flag naming a checkpoint or run folder beside --resume (the starts, --teacher);
    linked: its own LINKED; eval_flags: its own EVAL_RUN_FLAGS; model_flags: () -> {flag: the models
        that read it} (registry.model_flags);
    kind: what its checkpoints are, in words ("a classifier one"), when another's is refused;
    check: (ck, path, flag, args, said) -> None: its own check of a checkpoint source (Fail), or None;
    foreign: () -> {dest: value}: keys a --config file may hold at these values though they are not its
        flags (left out: read_config)."""
    prog: str
    description: str
    groups: Callable
    resolve: Callable
    build: Callable
    arch: Callable
    starts: dict
    checkpoints: tuple
    kind: str
    distillation: bool = False
    linked: dict = field(default_factory=dict)
    eval_flags: frozenset = frozenset()
    model_flags: Callable = dict
    check: Optional[Callable] = None
    foreign: Callable = dict


# The flags train.py had before LoopVAE's moved to train_loopvae.py (issue 78), at their defaults: the args.json of
# an older run of train.py holds them (a classifier never read them); a --config file leaves them out there.
MOVED_FLAGS = {"loops": [1, 2, 4], "share": "global", "operator": "cnn", "num_groups": 32, "latent_dim": 16,
               "kl_weight": 1e-6, "perceptual": "none", "perceptual_weight": 1.0, "lpips_weights": None, "rfid": False,
               "stage2": None, "disc": "conv", "disc_weights": None, "gan_weight": 0.5, "gan_start": 5000,
               "r1_gamma": 10.0, "r1_every": 16, "disc_lr": None, "diffaug": ["color", "translation", "cutout"]}


def build_listed(args, img_size, num_classes):
    """train.py's model of a preset for --list-presets (its attention init left at the default: shapes only)."""
    return build_model(argparse.Namespace(**{**vars(args), "init": "default"}), img_size, num_classes)


TRAIN = Entry("train.py", DESCRIPTION, add_model_flags, resolve, build_listed, arch_flags,
              starts={"finetune": set()}, checkpoints=("finetune", "teacher"), kind="a classifier one",
              distillation=True, model_flags=model_flags, foreign=lambda: MOVED_FLAGS)
