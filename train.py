"""Train a recurrent ViT: one plain loop for one process, N processes (torchrun) and CPU or GPU.

    python train.py --model bvit --data cifar100 --data-dir ../shared/data --max-steps 300
    torchrun --nproc_per_node 8 train.py --model bvit --size s --data imagenet --data-dir /imagenet
    python train.py --list-presets; python train.py --preset c100-bvit-ti --print-config
    python train.py --model loopvae --preset c100-mini-loopvae-global   # a tokenizer (Stage 1)
    python train.py --preset c100-mini-loopvae-gan   # its Stage 2 (adversarial, --stage2 CKPT; adversarial.py)

A paper's protocol is one flag (--preset, table PRESETS; explicit flags still win). AdamW (fused on
CUDA) or LAMB (optim.py), cross-entropy or binary cross-entropy (--bce), linear warmup + cosine, bf16 autocast
(fp16 with a GradScaler), optional torch.compile of each block (compiled before DDP), gradient
clipping, label smoothing, MixUp/CutMix, RandAugment or 3-Augment (torchvision v2), EMA, an atomic
checkpoint every epoch and --resume, top-1/top-5 each epoch, --eval-depths. LoopVAE (loopvae.py) is
a tokenizer trained by the same loop: its Stage-1 loss (L1 + KL, + LPIPS with --perceptual lpips), images
in [-1, 1], and each epoch's validation PSNR, SSIM, L1, KL and out-of-range pixels instead of top-1 (+ rFID
with --rfid); --stage2 CKPT continues it adversarially (a discriminator with its own optimizer, adversarial.py).
Writes OUT/log.jsonl and OUT/ckpt.pt.
"""
import argparse
import datetime
import json
import os
import shlex
import signal
import sys
import time
import warnings
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import data
import kernels
from optim import EMA, Lamb, lr_lambda, param_groups
from checkpoints import (ARCH_FLAGS, EVAL_RUN_FLAGS, Fail, check_out_dir, checkpoint_args, checkpoint_file,
                         finetune_weights, load_checkpoint, lock_out_dir, read_weights, restore, resume_changes, rng_state,
                         save_atomic, set_rng_state)
from presets import PAPER, PRESETS, TIMES
import adversarial

# ----------------------------------------------------------------------------- arguments
SIZES = {"ti": (192, 3), "s": (384, 6), "b": (768, 12), "l": (1024, 16)}  # (embed_dim, num_heads)


def build_bvit(args, common):
    import bvit
    num_blocks = args.num_blocks or (common["depth"] if args.model == "vit" else 1)
    return bvit.BViT(num_blocks=num_blocks, stages=args.stages, stage_weights=args.stage_weights,
                     detach_stages=args.detach_stages, step_embed=args.step_embed, **common)


def build_revit(args, common):
    import revit
    if not 0 <= args.depth_dropout < 1:
        raise ValueError(f"--depth-dropout {args.depth_dropout} must be in [0, 1)")
    kw = dict(experts=args.experts, depth_dropout=args.depth_dropout, lambda_bal=args.lambda_bal,
              lambda_z=args.lambda_z, lambda_div=args.lambda_div, **common)
    if args.routing == "depth" and not args.lora_rank:
        return revit.ReViT(**kw)
    import revit_moe  # the paper's comparison baselines (section 4.3, appendix B)
    return revit_moe.ReViTMoE(routing=args.routing, lora_rank=args.lora_rank, **kw)


# The model registry: name -> builder(args, common kwargs). New model files add one line here.
MODELS = {"vit": build_bvit, "bvit": build_bvit}
MODELS["revit"] = build_revit


def build_srvit(args, common):
    import srvit
    return srvit.SRViT(recursions=args.recursions, **common)  # --depth: layers of the recursion body


MODELS["srvit"] = build_srvit


def build_odevit(args, common):
    import odevit
    # For odevit a depth counts solver steps (block evaluations = steps x 1, 2, 2, 4 for euler,
    # midpoint, heun, rk4); --ode-steps sets it (default --depth), and args.depth follows so that
    # the log, args.json and the checkpoint state the trained number of steps.
    args.depth = common["depth"] = args.ode_steps or common["depth"]
    return odevit.ODEViT(solver=args.solver, horizon=args.horizon, field=args.field, extend=args.extend,
                         stages=args.stages, stage_weights=args.stage_weights, **common)


MODELS["odevit"] = build_odevit


def build_loopvae(args, common):
    import loopvae
    # A tokenizer: of `common` only the image size applies (resolve refuses the classifier flags);
    # --num-blocks is K, and args.depth = K sum(--loops), the block applications per branch (resolve).
    model = loopvae.LoopVAE(img_size=common["img_size"], embed_dim=args.embed_dim, num_blocks=args.num_blocks,
                            loops=args.loops, latent_dim=args.latent_dim, share=args.share, operator=args.operator,
                            mlp_ratio=args.mlp_ratio, num_heads=args.num_heads, lambda_kl=args.kl_weight,
                            lambda_p=args.perceptual_weight)
    if args.perceptual == "lpips" and not args.eval_only:  # a loss term: an evaluation needs none
        model.set_perceptual(lpips_loss(args.lpips_weights))
    return model


MODELS["loopvae"] = build_loopvae
# How a model's images are normalized, when not by the dataset's mean and std (data.build_datasets).
NORMALIZATION = {"loopvae": ((0.5,) * 3, (0.5,) * 3)}  # [0, 1] -> [-1, 1], LoopVAE's image range (App. A.4)
# LPIPS's backbone (lpips_loss): torchvision's ImageNet VGG16, file name = torchvision's cache name, whose
# 8 hex digits start its SHA-256 (torchvision checks them on download; lpips_loss on a given file).
VGG16_FILE, VGG16_SHA256 = "vgg16-397923af.pth", "397923af"
VGG16_URL = "https://download.pytorch.org/models/" + VGG16_FILE


def lpips_loss(weights_file=None):
    """--perceptual lpips: LPIPS (Zhang et al. 2018) from the maintained `lpips` package, an optional
    extra: VGG16 backbone (our choice, as the LDM autoencoders train with; the LoopVAE paper does not
    name it) with the package's own calibrated linear layers, frozen, in eval mode. The backbone's
    ImageNet weights come from `weights_file` (--lpips-weights, checked against VGG16_FILE's SHA-256
    prefix), else torchvision's cache (TORCH_HOME), else a download by torchvision. Returns
    fn(x_hat, x) -> 0-d mean LPIPS of images (B, 3, H, W) in [-1, 1], which moves the network to the
    images' device. Raises Fail (one line) when the package or the weights cannot be had: never a
    network with random weights."""
    try:
        import lpips
    except ImportError:
        raise Fail("--perceptual lpips needs the lpips package, an optional extra not in requirements.txt: "
                   "pip install lpips (or train with --perceptual none)")
    import hashlib
    import torchvision
    cache = os.path.join(torch.hub.get_dir(), "checkpoints")
    how = (f"download {VGG16_URL} on a connected machine, then pass --lpips-weights FILE or put the file in "
           f"{cache} (torchvision's cache, $TORCH_HOME/hub/checkpoints)")
    path = weights_file or os.path.join(cache, VGG16_FILE)
    if weights_file is None and not os.path.isfile(path):
        try:
            with warnings.catch_warnings():  # as below
                warnings.simplefilter("ignore", UserWarning)
                net = lpips.LPIPS(net="vgg", verbose=False)  # torchvision downloads the backbone into the cache
        except OSError as e:  # no network (urllib's URLError), a full disk, ...
            raise Fail(f"--perceptual lpips: LPIPS's VGG16 ImageNet weights are not in {cache} and could not be "
                       f"downloaded ({getattr(e, 'reason', None) or e}); {how}")
    else:
        try:
            weights = read_weights(path, "--lpips-weights")
        except Fail as e:
            raise Fail(f"{e}; {how}")
        vgg = torchvision.models.vgg16()  # the architecture only: no weights, no download
        try:
            vgg.load_state_dict(weights)
        except (RuntimeError, AttributeError, TypeError) as e:
            raise Fail(f"--lpips-weights {path}: not torchvision's VGG16 weights ({type(e).__name__}); {how}")
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if not digest.startswith(VGG16_SHA256):
            raise Fail(f"--lpips-weights {path}: VGG16 weights, but not torchvision's ImageNet ones (SHA-256 "
                       f"{digest[:8]}..., expected {VGG16_SHA256}...); {how}")
        with warnings.catch_warnings():  # torchvision's notice that lpips uses its old `pretrained` argument
            warnings.simplefilter("ignore", UserWarning)
            net = lpips.LPIPS(net="vgg", pnet_rand=True, verbose=False)  # no download; given the weights below
        features = vgg.features.state_dict()  # lpips' slice k holds features[i] under the name "slicek.i"
        net.net.load_state_dict({k: features[k.split(".", 1)[1]] for k in net.net.state_dict()})
    net.eval().requires_grad_(False)

    def perceptual(x_hat, x):
        if next(net.parameters()).device != x.device:
            net.to(x.device)
        return net(x_hat, x).mean()  # lpips takes images in [-1, 1]
    return perceptual


def build_model(args, img_size, num_classes, dynamic_img_size=False):
    """The model of resolved flags `args`: the keyword arguments every model file takes, then
    its MODELS builder. Raises Fail (one line) for sizes the model refuses."""
    common = dict(img_size=img_size, patch_size=args.patch_size, num_classes=num_classes,
                  embed_dim=args.embed_dim, depth=args.depth, num_heads=args.num_heads,
                  mlp_ratio=args.mlp_ratio, class_token=not args.gap, layer_scale=args.layer_scale,
                  drop_path_rate=args.drop_path)
    if args.init != "default":  # only then: a model without init= support fails with its own message
        common["init"] = args.init
    if args.bce:  # likewise: loss="bce" only when asked for
        common["loss"] = "bce"
    if dynamic_img_size:
        common["dynamic_img_size"] = True
    try:
        return MODELS[args.model](args, common)
    except ValueError as e:
        raise Fail(str(e))


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


def below_one(s):
    v = non_negative(s)
    if v >= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {s}")
    return v


def count(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}")
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {s}")
    return v


def int_list(s):
    try:
        v = [int(t) for t in s.split(",") if t.strip()]
    except ValueError:
        v = []
    if not v or min(v) < 1:  # one message for both mistakes: not integers, or not positive
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 (e.g. 1,2,4), got {s!r}")
    return v


def float_list(s):
    try:
        return [float(t) for t in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 1,1,2, got {s!r}")


def diffaug_policy(s):
    v = [] if s == "none" else [t.strip() for t in s.split(",") if t.strip()]
    if not set(v) <= set(adversarial.DIFFAUG):
        raise argparse.ArgumentTypeError(f"expected none or comma-separated of {', '.join(adversarial.DIFFAUG)}, got {s!r}")
    return v


def get_parser():
    p = Parser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter,
               usage="train.py [--preset NAME] [--FLAG VALUE ...]   (the flags by group below)")
    a = p.add_argument_group('reproduction', 'presets.py; docs/presets.md').add_argument
    a("--preset", help="fill every flag of a paper's protocol; flags given on the command line still win. "
      "c100-mini-*: the CIFAR-100 study sized for 2 CPU cores (README \"Results\"); c100-gpu-*, c100-*, "
      "in1k-*: GPU-sized (--list-presets describes each, with its time)")
    a("--list-presets", action="store_true", help="print one line per preset (what it reproduces, the model, "
      "the paper's number, its time on 2 CPU cores and on one H200) and exit")
    a("--print-config", action="store_true", help="print the resolved configuration (JSON) and exit")
    a("--seed", type=int, default=0, help="initial weights, data order and augmentation")
    a = p.add_argument_group('model').add_argument
    a("--model", default="bvit", choices=list(MODELS), help="model family")
    a("--size", choices=list(SIZES), help="named width: ti D=192 h=3, s 384/6, b 768/12, l 1024/16 "
      "(depth 12, 24 for l); explicit flags override it (default: ti; s for loopvae, the paper's width 384)")
    a("--embed-dim", type=positive(int), help="token width D (default: by --size)")
    a("--depth", type=positive(int), help="block applications (steps) (default: by --size: 12, 24 for l)")
    a("--num-heads", type=positive(int), help="attention heads (default: by --size)")
    a("--mlp-ratio", type=positive(float), default=4.0, help="MLP hidden width / D")
    a("--patch-size", type=positive(int), help="(default: 4 for images up to 64 px, else 16)")
    a("--num-blocks", type=positive(int), help="distinct blocks in contiguous phases; loopvae: K, the "
      "blocks of its core (default: 1 for bvit, depth for vit, 4 for loopvae)")
    a("--stages", type=positive(int), default=1, help="deep-supervision stages; must divide --depth")
    a("--stage-weights", type=float_list, help="comma-separated loss weight per stage")
    a("--detach-stages", action="store_true", help="stop gradients between stages")
    a("--step-embed", action="store_true", help="learned per-step embedding (ablation)")
    a("--gap", action="store_true", help="global average pooling instead of a class token")
    a("--layer-scale", type=positive(float), help="LayerScale init (DeiT III) (default: off)")
    a("--drop-path", type=below_one, default=0.0, help="stochastic depth rate, in [0, 1)")
    a("--init", default="default", choices=["default", "mimetic", "structured"], help="attention "
      "init: default = timm; mimetic: W_q W_k^T ~ I, W_v W_o ~ -I; structured: each head "
      "a 3x3 impulse (shift) filter on the position embedding")
    a = p.add_argument_group('model: SR-ViT', 'srvit.py').add_argument
    a("--recursions", type=positive(int), default=4, help="srvit: times the --depth-layer stack is "
      "applied, outputs mixed per token; --eval-depths then counts recursions")
    a = p.add_argument_group('model: reViT', 'revit.py, revit_moe.py').add_argument
    a("--experts", type=positive(int), default=4, help="revit: FFN experts merged per step by "
      "normalized depth (1 = the tied bViT block)")
    a("--depth-dropout", type=non_negative, default=0.3, help="revit: per-image probability of "
      "dropping each step in training (elastic depth; dropped = identity), in [0, 1), 0 = off")
    a("--routing", default="depth", choices=["depth", "smear", "lory", "token", "mixture"], help="revit: "
      "how experts are chosen (revit_moe.py): depth = reViT; smear / lory = one FFN merged per image "
      "from the step's FFN input / the previous state; token = top-1 of E routed + 1 shared expert "
      "(hidden ratio 2); mixture = all E experts per token (compute grows with E)")
    a("--lora-rank", type=int, default=0, help="revit with --experts 1: layer-wise LoRA baseline, a "
      "rank-r update per step on qkv, proj, fc1, fc2 (0 = off)")
    a("--lambda-bal", type=non_negative, default=1e-2, help="revit: weight of the expert usage "
      "balance loss E*sum_e mean_k(g_e)^2 (E > 1 only)")
    a("--lambda-z", type=non_negative, default=1e-3, help="revit: weight of the router z-loss "
      "mean_k logsumexp(logits)^2 (E > 1 only)")
    a("--lambda-div", type=non_negative, default=1e-3, help="revit: weight of the mean pairwise "
      "cosine similarity of the experts' parameters (E > 1 only)")
    a = p.add_argument_group('model: ODEViT', 'odevit.py').add_argument
    a("--solver", default="euler", choices=["euler", "midpoint", "heun", "rk4"], help="odevit: "
      "fixed-step solver; block evaluations (NFE) per step 1, 2, 2, 4")
    a("--ode-steps", type=positive(int), help="odevit: solver steps (default: --depth); for odevit "
      "a depth (--depth, --eval-depths) counts solver steps, not block evaluations")
    a("--horizon", type=positive(float), help="odevit: integration horizon T (default: the number "
      "of steps, so h = T/steps = 1, which with euler is the bViT recurrence)")
    a("--field", default="subtracted", choices=["subtracted", "blackbox"], help="odevit: "
      "subtracted = dz/dt = F(z) - z; blackbox = dz/dt = F(z)")
    a("--extend", default="time", choices=["time", "refine"], help="odevit: what a depth L other "
      "than the trained steps means: time = L steps at the trained h (T grows), refine = L steps "
      "over the trained T (h = T/L)")
    a = p.add_argument_group('model: LoopVAE', 'loopvae.py: a tokenizer, trained to reconstruct its images '
                             '(Stage 1); --size, --embed-dim, --num-blocks (K), --mlp-ratio and --num-heads '
                             '(--operator vit) apply; the classification flags are refused').add_argument
    a("--loops", type=int_list, default="1,2,4", help="loopvae: passes of the core at each scale in traversal "
      "order (encoder 2x, 4x, 8x; decoder 8x, 4x, 2x), one scale per entry; K x their sum block applications "
      "per branch")
    a("--share", default="global", choices=["global", "scale", "none"], help="loopvae: which passes share "
      "the core's K blocks: global = all (K stored), scale = the passes of one scale (S x K), none = no "
      "two passes (K x sum of --loops); the same block applications")
    a("--operator", default="cnn", choices=["cnn", "vit"], help="loopvae: the core's block: cnn = AdaGN "
      "ConvNeXt-style (the paper's main model); vit = AdaLN attention with 2-D RoPE, --num-heads heads (its "
      "ablation)")
    a("--latent-dim", type=positive(int), default=16, help="loopvae: latent channels, at 1/2^len(--loops) "
      "of the image side (f8d16: 16 at 1/8)")
    a("--kl-weight", type=non_negative, default=1e-6, help="loopvae: lambda_KL, the weight of the KL term")
    a("--perceptual", default="none", choices=["none", "lpips"], help="loopvae: the perceptual term of the "
      "Stage-1 loss: lpips = LPIPS-VGG through the lpips package (an optional extra: pip install lpips), "
      "with ImageNet weights that torchvision downloads or --lpips-weights gives; none = L1 + KL only")
    a("--perceptual-weight", type=non_negative, default=1.0, help="loopvae: lambda_p, the weight of "
      "--perceptual lpips")
    a("--lpips-weights", metavar="FILE", help=f"loopvae --perceptual lpips: torchvision's VGG16 ImageNet "
      f"weights, {VGG16_FILE}, for a machine that cannot download them (default: torchvision's cache, "
      "$TORCH_HOME/hub/checkpoints, else a download)")
    a("--rfid", action="store_true", help="loopvae: also the validation rFID of each evaluation (reconstructions "
      "against their images, Inception features), through torchmetrics' FrechetInceptionDistance, an optional "
      "extra (pip install 'torchmetrics[image]') whose Inception weights torch-fidelity downloads once")
    a = p.add_argument_group('model: LoopVAE Stage 2', 'adversarial.py; sec. 3.5 and App. A.1 of the paper: '
                             'the Stage-1 loss + an adaptive hinge GAN term').add_argument
    a("--stage2", metavar="CKPT", help="loopvae: Stage 2 from this Stage-1 checkpoint (or run folder): its weights "
      "and architecture flags (unless given); optimizer, schedule and step count start fresh (as --finetune), "
      "the discriminator is new; the paper's Stage-2 lr is 5e-5 (--lr). --resume a Stage-2 run with the same "
      "flags: one ckpt.pt holds generator and discriminator")
    a("--disc", default="conv", choices=["conv", "dinov2"], help="--stage2: the discriminator: conv = a small "
      "PatchGAN (loopvae.PatchDiscriminator, our default: no weights to fetch); dinov2 = frozen DINOv2-small "
      "features + a trained head (the paper's main run), from --disc-weights")
    a("--disc-weights", metavar="FILE", help="--disc dinov2: DINOv2-small weights in timm's ViT-S/14 layout "
      "(vit_small_patch14_dinov2), a local file read with weights_only")
    a("--gan-weight", type=non_negative, default=0.5, help="--stage2: the adaptive weight's multiplier (the "
      "paper's 0.5)")
    a("--gan-start", type=count, default=5000, help="--stage2: the Stage-2 step from which the adversarial "
      "term is on (the paper's 5,000; before it the discriminator warms up)")
    a("--r1-gamma", type=non_negative, default=10.0, help="--stage2: lazy R1 weight (the paper's 10)")
    a("--r1-every", type=positive(int), default=16, help="--stage2: R1 every N discriminator updates (the "
      "paper's 16)")
    a("--disc-lr", type=positive(float), help="--stage2: the discriminator's constant learning rate (default: "
      "--lr; the paper gives one Stage-2 rate, 5e-5)")
    a("--diffaug", type=diffaug_policy, default=",".join(adversarial.DIFFAUG), help="--stage2: DiffAugment-style "
      "augmentation of what the discriminator sees, comma-separated of color, translation, cutout, or none "
      "(the paper: probability 1, cutout 0.2; the policy is our choice, DiffAugment's)")
    a = p.add_argument_group('data').add_argument
    a("--data", default="cifar100", choices=data.DATASETS, help="dataset (imagenet: any image folder)")
    a("--data-dir", help="dataset root (default: $RVITS_DATA, else ./data)")
    a("--download", action="store_true", help="download CIFAR-100 through torchvision")
    a("--img-size", type=positive(int), help="(default: 32 for cifar100 and synthetic, 224 for imagenet)")
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
      "CIFAR (its files are shuffled), N evenly spaced ones for image folders (sorted by class)")
    a = p.add_argument_group('optimization').add_argument
    a("--epochs", type=positive(int), default=100, help="training epochs")
    a("--max-steps", type=positive(int), help="stop after this many optimizer steps; the "
      "warmup + cosine schedule is compressed to end there")
    a("--batch-size", type=positive(int), default=128, help="global batch size (all ranks)")
    a("--grad-accum", type=positive(int), default=1, help="split each process's share of the batch "
      "into N micro-batches whose gradients add up to one optimizer step (same global batch)")
    a("--opt", default="adamw", choices=["adamw", "lamb"], help="optimizer: AdamW or LAMB (DeiT III)")
    a("--lr", type=positive(float), default=1e-3, help="peak learning rate")
    a("--min-lr", type=non_negative, default=1e-5, help="learning rate at the end of the cosine")
    a("--warmup-epochs", type=non_negative, default=5.0, help="linear warmup, in epochs")
    a("--weight-decay", type=non_negative, default=0.05, help="decoupled weight decay (none on 1-D parameters)")
    a("--clip-grad", type=non_negative, default=1.0, help="max gradient norm, 0 = off")
    a("--label-smoothing", type=below_one, default=0.1, help="label smoothing epsilon (loopvae: ignored, "
      "no labels reach its loss)")
    a("--bce", action=argparse.BooleanOptionalAction, default=False, help="binary cross-entropy "
      "(DeiT III) instead of cross-entropy; MixUp/CutMix targets become 1 for every class in the "
      "mix (targets > 0), as DeiT's code does")
    a("--ema", type=below_one, default=0.0, help="EMA decay of the weights, e.g. 0.9999; 0 = off")
    a("--max-nonfinite", type=positive(int), default=20,
      help="stop after N consecutive steps with a non-finite gradient (those steps are skipped)")
    a = p.add_argument_group('augmentation').add_argument
    a("--mixup", type=non_negative, default=0.0, help="MixUp alpha, 0 = off")
    a("--cutmix", type=non_negative, default=0.0, help="CutMix alpha, 0 = off")
    a("--randaug", type=non_negative, default=0, help="RandAugment magnitude (2 ops), 0 = off, at most 30")
    a("--three-augment", action=argparse.BooleanOptionalAction, default=False, help="DeiT III's "
      "simple random crop + 3-Augment (grayscale / solarize / blur, color jitter 0.3) for training")
    a = p.add_argument_group('distillation', 'distill.py').add_argument
    a("--teacher", metavar="CKPT", help="distill from this rvits checkpoint: frozen, in eval mode, on the "
      "same augmented images (distill.py); the loss becomes the task loss + --distill-weight x the term")
    a("--distill", choices=["feature", "logits"], help="with --teacher: feature: match the final "
      "post-LayerNorm tokens (MSE; a learned projection when the widths differ), the reViT paper's "
      "final-feature objective; logits: soft KD, KL at --distill-temperature (default: feature)")
    a("--distill-weight", type=non_negative, default=1.0, help="with --teacher: the loss is the task loss + this "
      "x the distillation term")
    a("--distill-temperature", type=positive(float), default=3.0, help="--distill logits (DeiT: 3)")
    a = p.add_argument_group('system and distributed', 'kernels.py; torchrun').add_argument
    a("--device", default="auto", help="auto (cuda when available), cpu, cuda")
    a("--amp", default="auto", choices=["auto", "none", "bf16", "fp16"],
      help="autocast dtype; auto = bf16 on CUDA, none on CPU")
    a("--compile", action="store_true", help="torch.compile the model (before DDP); see --compile-scope")
    a("--compile-scope", choices=list(kernels.SCOPES), help="with --compile: blocks = each distinct "
      "block compiled once, the step loop eager (regional compilation); model = the whole training "
      "forward at the trained depth as one graph (CUDA graphs on CUDA), blocks compiled too for "
      "evaluation at any depth; not under DDP, with --teacher or --eval-only, nor for reViT's elastic "
      "depth or token routing; auto = model where it applies, else blocks (kernels.py) (default: auto; "
      "blocks for loopvae, whose unrolled forward takes minutes to compile)")
    a("--grad-checkpoint", action="store_true", help="activation checkpointing of each recurrent "
      "step (torch.utils.checkpoint): a step keeps only its input state (B, N, D) for the backward "
      "instead of all its activations, at the cost of about one more forward")
    a("--dist-timeout", type=positive(float), default=600.0,
      help="seconds a process waits for its peers before failing (DDP)")
    a = p.add_argument_group('checkpoints', 'checkpoints.py; docs/cluster.md "Resuming and failures"').add_argument
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
    a("--eval-depths", type=int_list, help="after training (or with --eval-only), evaluate at these "
      "depths, e.g. 3,6,12,24,48: block applications for vit/bvit, solver steps for odevit (see "
      "--extend); prints a table and writes OUT/depth_eval.json (and a PNG if matplotlib is installed)")
    a("--eval-only", action="store_true", help="no training: evaluate --resume CKPT at --eval-depths "
      "(without them: 0.5, 1, 2, 4, 8 x its depth); model flags come from the checkpoint unless given; "
      "another --img-size interpolates the position embedding (dynamic_img_size); "
      "writes only depth_eval.json (+ PNG) in --out-dir; loopvae: its validation PSNR, SSIM, L1, KL and "
      "out-of-range pixels, written to reconstruction_eval.json")
    a("--eval-ema", action="store_true", help="--eval-depths and --eval-only use the EMA weights "
      "(a run trained with --ema)")
    return p


def resolve(args, p, img_size):
    """Fill size defaults and check every flag combination, naming the flag on error."""
    dim, heads = SIZES[args.size or ("s" if args.model == "loopvae" else "ti")]
    args.embed_dim = args.embed_dim or dim
    args.num_heads = args.num_heads or heads
    resolve_stage2(args, p)  # (first: Stage 2 of a classifier says so, not what its sizes lack)
    if args.model == "loopvae":
        resolve_loopvae(args, p)
    else:
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
    if args.randaug > 30:
        p.error(f"--randaug {args.randaug:g}: RandAugment magnitudes go from 0 to 30")
    if args.min_lr > args.lr:
        p.error(f"--min-lr {args.min_lr:g} is above --lr {args.lr:g}")
    if args.model != "revit" and (args.routing != "depth" or args.lora_rank):
        p.error("--routing and --lora-rank are reViT options; add --model revit")
    if args.lora_rank and args.routing != "depth":
        p.error(f"--lora-rank is the baseline on the tied block (--routing depth --experts 1); got --routing {args.routing}")
    if args.lora_rank and args.experts != 1:
        p.error(f"--lora-rank needs --experts 1 (the tied block plus one adapter per step), got --experts {args.experts}")
    if args.lora_rank < 0:
        p.error(f"--lora-rank must be >= 0, got {args.lora_rank}")
    if args.distill and not args.teacher:
        p.error("--distill needs --teacher CKPT, the checkpoint to distill from")
    args.distill = args.distill or ("feature" if args.teacher else None)
    if args.stage_weights and len(args.stage_weights) != args.stages:
        p.error(f"--stage-weights needs {args.stages} values (one per stage)")
    return args


def changed_flags(args, names):
    """The flags (--name) among `names` whose value differs from the parser's default (not a preset's)."""
    plain = vars(get_parser().parse_args([]))
    return [f"--{k.replace('_', '-')}" for k in names if getattr(args, k) != plain[k]]


STAGE2_FLAGS = ("disc", "disc_weights", "gan_weight", "gan_start", "r1_gamma", "r1_every", "disc_lr", "diffaug")


def resolve_stage2(args, p):
    """Check the flags of LoopVAE's Stage 2 (--stage2) and --rfid, naming the flag (p.error, one line)."""
    if args.rfid and args.model != "loopvae":
        p.error(f"--rfid is a tokenizer's metric; --model {args.model} is a classifier")
    if not args.stage2:
        on = changed_flags(args, STAGE2_FLAGS)
        if on:
            p.error(f"{', '.join(on)}: Stage-2 flags; add --stage2 CKPT, the Stage-1 loopvae checkpoint to continue")
        return
    if args.model != "loopvae":
        p.error(f"--stage2 {args.stage2}: Stage 2 continues a loopvae checkpoint; this run is --model {args.model} "
                "(the checkpoint's, or given)")
    if args.finetune:
        p.error("--stage2 starts from its checkpoint's weights; leave out --finetune")
    if args.disc == "dinov2" and not args.disc_weights:
        p.error("--disc dinov2 needs --disc-weights FILE: DINOv2-small weights in timm's ViT-S/14 layout "
                "(vit_small_patch14_dinov2), downloaded on a connected machine")
    if args.disc_weights and args.disc != "dinov2":
        p.error(f"--disc-weights is for --disc dinov2; this run has --disc {args.disc}")
    if args.grad_accum > 1:
        p.error("--grad-accum with --stage2: the discriminator steps once per micro-batch; use --grad-accum 1")
    if args.amp == "fp16":
        p.error("--amp fp16 with --stage2: the discriminator has no GradScaler; use --amp bf16 or none")


# Flags of a classifier that would change a LoopVAE run silently (a tokenizer has no classes, patches or
# depths to vary); resolve_loopvae refuses each one that differs from the parser's default.
CLASSIFIER_FLAGS = ("patch_size", "gap", "layer_scale", "drop_path", "init", "stages", "stage_weights", "detach_stages",
                    "step_embed", "mixup", "cutmix", "bce", "eval_depths", "teacher")


def resolve_loopvae(args, p):
    """loopvae's part of resolve: --num-blocks is K (default 4), args.depth becomes the block
    applications per branch, K x sum(--loops) (eq. 5; --depth may only repeat it); --compile
    compiles the blocks unless --compile-scope says otherwise. p.error (one line) for a classification
    flag (CLASSIFIER_FLAGS) that is on; --label-smoothing is ignored (no labels reach the loss)."""
    on = changed_flags(args, CLASSIFIER_FLAGS)
    if on:
        p.error(f"{', '.join(on)}: classification flags; loopvae is a tokenizer (it reconstructs its images: "
                "no classes, patches or depths to vary), leave them out")
    args.num_blocks = args.num_blocks or 4
    depth = args.num_blocks * sum(args.loops)
    if args.depth not in (None, depth):
        p.error(f"--depth {args.depth} (given, or a checkpoint's): loopvae's depth is --num-blocks x the sum of "
                f"--loops = {args.num_blocks} x {sum(args.loops)} = {depth} block applications per branch; leave "
                "--depth out")
    args.depth = depth
    if args.compile and not args.compile_scope:  # the whole unrolled model compiles for minutes
        args.compile_scope = "blocks"


def parse_args(p, argv=None):
    """Parse argv; with --preset NAME, parse again with the preset's flags as the defaults, so the
    flags given on the command line override them. --list-presets describes them and exits."""
    args = p.parse_args(argv)
    if args.list_presets:
        list_presets()
        sys.exit(0)
    if args.preset is not None:
        if args.preset not in PRESETS:
            p.error(f"--preset {args.preset} is unknown; allowed: {', '.join(PRESETS)}")
        p.set_defaults(**PRESETS[args.preset][1])
        args = p.parse_args(argv)
    return args


def list_presets():
    """--list-presets: one line per preset: its name, what it reproduces, the model (built on the meta
    device: shapes only, no memory, no init), the paper's number (presets.PAPER) and the time a run
    takes (presets.TIMES, which says where each figure comes from)."""
    print("# NAME  what it reproduces | model | the paper's number | time on CPU-2 (2 cores), on one H200: "
          "measured, est. = estimated, ? = not measured (presets.TIMES)")
    for name, (what, flags) in PRESETS.items():
        p = get_parser()
        args = parse_args(p, ["--preset", name])
        img_size = args.img_size or (224 if args.data == "imagenet" else 32)
        args = resolve(args, p, img_size)
        with torch.device("meta"):
            model = build_model(argparse.Namespace(**{**vars(args), "init": "default", "perceptual": "none"}),
                                img_size, 1000 if args.data == "imagenet" else 100)
        cpu, gpu = TIMES[name]
        shape = (f"patch {args.patch_size} depth {args.depth}" if args.model != "loopvae" else
                 f"K={args.num_blocks} loops {','.join(map(str, args.loops))} share {args.share} (depth {args.depth}), "
                 f"latent {args.latent_dim}x{img_size >> len(args.loops)}x{img_size >> len(args.loops)}")
        print(f"{name}  {what} | {args.model} D={args.embed_dim} {shape}, "
              f"{model.num_params() / 1e6:.3g} M params | paper: {PAPER[name]} | CPU-2 {cpu}, H200 {gpu}")


# ----------------------------------------------------------------------------- helpers
@torch.no_grad()
def evaluate(model, loader, device, amp_ctx, depth=None, stop=None, rfid=None):
    """Top-1/top-5 (percent) and cross-entropy of the final logits, summed over all ranks; a model
    with `metrics` (a tokenizer: LoopVAE) is evaluated by evaluate_reconstruction instead (with
    `rfid`, rfid_metric's FID, its rFID too). Raises
    EmptyEvaluation when no rank had a usable image. Returns None, after the batch in flight, once
    `stop` (a Stop; one process only) holds a stop request."""
    if hasattr(model, "metrics"):
        return evaluate_reconstruction(model, loader, device, amp_ctx, stop, rfid)
    model.eval()
    sums, count = torch.zeros(3, device=device, dtype=torch.float64), 0  # loss, top1, top5; images
    for x, y in eval_batches(loader, device):
        if stop:
            model.train()
            return None
        with amp_ctx:
            logits, _ = model(x, depth=depth)
        logits = logits.float()
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hit = top5 == y[:, None]
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"), hit[:, 0].sum(), hit.any(1).sum()]).double()
        count += len(y)
    model.train()
    loss, a1, a5, n = summed_over_ranks(sums, count)
    return {"val_loss": loss / n, "val_acc1": 100 * a1 / n, "val_acc5": 100 * a5 / n}


RECONSTRUCTION = ("l1", "psnr", "psnr_raw", "ssim", "kl", "out_of_range")  # loopvae's metrics(), as logged


@torch.no_grad()
def evaluate_reconstruction(model, loader, device, amp_ctx, stop=None, rfid=None):
    """A tokenizer's validation metrics in eval mode (LoopVAE: the posterior mode decoded, `reconstruct`,
    then loopvae.reconstruction_metrics), means over the images of all ranks: val_l1 (mean |x - x_hat|
    in [-1, 1] units), val_psnr and val_psnr_raw (dB, output clipped to the valid range or not),
    val_ssim, val_kl (per latent element) and val_out_of_range (fraction of pixels); with `rfid`
    (rfid_metric) val_rfid, the FID of the clipped reconstructions against their images (App. A.3: the
    validation images are both the real set and the sources). Raises EmptyEvaluation when no rank had
    a usable image; None once `stop` holds a request (as evaluate)."""
    import loopvae
    model.eval()
    sums, count = torch.zeros(len(RECONSTRUCTION), device=device, dtype=torch.float64), 0
    if rfid is not None:
        rfid.reset()
    for x, _ in eval_batches(loader, device):
        if stop:
            model.train()
            return None
        with amp_ctx:
            x_hat, mean, logvar = model.reconstruct(x)
            m = loopvae.reconstruction_metrics(x, x_hat, mean, logvar)
        if rfid is not None:  # images in [0, 1] (normalize=True)
            rfid.update(loopvae.to_unit(x), real=True)
            rfid.update(loopvae.to_unit(x_hat).clamp(0, 1), real=False)
        sums += torch.stack([m[k].double().sum() for k in RECONSTRUCTION])
        count += len(x)
    model.train()
    *totals, n = summed_over_ranks(sums, count)
    out = {f"val_{k}": v / n for k, v in zip(RECONSTRUCTION, totals)}
    if rfid is not None:  # (torchmetrics gathers the features of every rank)
        out["val_rfid"] = float(rfid.compute())
    return out


def rfid_metric(device):
    """--rfid: torchmetrics' FrechetInceptionDistance (2048-d pool features of the FID Inception network,
    images in [0, 1]) on `device`, an optional extra; its weights come from torch-fidelity's cache
    ($TORCH_HOME/hub/checkpoints), else a download. Raises Fail (one line) when the package or the
    weights cannot be had: never an Inception network with random weights."""
    how = ("on a connected machine, pip install 'torchmetrics[image]' and run once with --rfid (torch-fidelity "
           f"caches the weights in {os.path.join(torch.hub.get_dir(), 'checkpoints')}), or train without --rfid")
    try:
        from torchmetrics.image.fid import FrechetInceptionDistance
        fid = FrechetInceptionDistance(feature=2048, normalize=True)
    except ImportError as e:  # torchmetrics, or its torch-fidelity
        raise Fail(f"--rfid needs torchmetrics with torch-fidelity, an optional extra not in requirements.txt "
                   f"({e.name or e}); {how}")
    except OSError as e:  # no network (urllib's URLError), a full disk, ...
        raise Fail(f"--rfid: the FID Inception weights are not cached and could not be downloaded "
                   f"({getattr(e, 'reason', None) or e}); {how}")
    return fid.to(device)


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


def epoch_line(epoch, rec, step, total_steps):
    """The line printed after an epoch's evaluation (`rec`: its log.jsonl record): top-1/top-5 of a
    classifier, PSNR/SSIM/L1 of a tokenizer."""
    if "val_psnr" in rec:
        said = f"PSNR {rec['val_psnr']:.2f} dB, SSIM {rec['val_ssim']:.4f}, L1 {rec['val_l1']:.4f}" + (
            f", rFID {rec['val_rfid']:.3f}" if "val_rfid" in rec else "")
    else:
        said = f"top-1 {rec['val_acc1']:.2f} %, top-5 {rec['val_acc5']:.2f} %"
    return f"epoch {epoch}: validation {said} (step {step} of {total_steps})"


class EmptyEvaluation(Fail):
    """An evaluation without a single usable image (all undecodable): one line, exit status 2."""


def model_log(model):
    """Model-specific values for log.jsonl: the last step's auxiliary terms (`model.aux`, e.g. the
    per-stage losses) and whatever `model.log_extras()` returns (e.g. reViT's gate table)."""
    out = {k: float(v) for k, v in getattr(model, "aux", {}).items()}
    if hasattr(model, "log_extras"):
        out.update(model.log_extras())
    return out


class Preempted(Exception):
    """A stop request (Stop) was honoured: the step in flight finished and a checkpoint was written,
    or an evaluation was cut short; printed as one line, exit status PREEMPTED."""


PREEMPTED = 75  # EX_TEMPFAIL (sysexits.h): a temporary failure, run the same command again
INTERRUPTED = 130  # 128 + SIGINT, the shell's status of a process ended by Ctrl-C


class Stop:
    """The run's stop requests and what a stopped run keeps (docs/cluster.md "Resuming and failures").

    As the signal handler of SIGTERM (what schedulers send before a kill), SIGUSR1 (SLURM's
    --signal) and SIGINT (Ctrl-C), from the start of the run to its end, it records a request;
    the run honours it at its next safe point: after the optimizer step in flight (with a
    checkpoint), after a checkpoint being written, after the evaluation batch in flight (one
    process; under DDP the processes agree between depths). A second Ctrl-C stops at once
    (KeyboardInterrupt), when it comes AGAIN_S or more after the first: torchrun relays the
    terminal's Ctrl-C to processes that the terminal has signalled already. `checkpoint`, `step`
    and `hint` (how to continue) name the last checkpoint written, for the line that ends the run."""
    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    AGAIN_S = 1.0

    def __init__(self):
        self.got, self.first_int = [], None
        self.checkpoint, self.step, self.hint, self.eval_only = None, None, "run the command again", False

    def __call__(self, signum, frame):
        now = time.monotonic()
        if signum == signal.SIGINT:
            if self.first_int is not None and now - self.first_int >= self.AGAIN_S:
                raise KeyboardInterrupt
            self.first_int = self.first_int or now
        self.got.append(signum)

    def __bool__(self):
        return bool(self.got)

    def line(self, when):
        """The one line of a run stopped `when` (e.g. "after step 40"): the signal, what is kept."""
        name = signal.Signals(self.got[0]).name if self.got else "a stop signal to another process"
        name += " (Ctrl-C)" if name == "SIGINT" else ""
        return f"stopped by {name} {when}; {self.kept()}"

    def kept(self):
        """The last checkpoint and how to continue from it, in words."""
        if self.eval_only:
            return "nothing was written; run the same command again"
        if self.checkpoint is None:
            return "no checkpoint was written; run the command again"
        return f"checkpoint {self.checkpoint} (step {self.step}); {self.hint}"


def continue_hint(p, argv, ddp, ckpt_path):
    """How to continue this run from `ckpt_path` once stopped: the same command when it resumes
    that checkpoint by itself (--resume auto, or --resume of that file), else the command with
    --resume CKPT added (argparse takes the last value of a flag)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    given = p.parse_args(argv).resume
    if given == "auto":
        return "continue with the same command (its --resume auto continues the checkpoint)"
    if given and os.path.abspath(checkpoint_file(given, "--resume")) == os.path.abspath(ckpt_path):
        return "continue with the same command"
    if ddp:
        return f"continue with the same torchrun command and --resume {ckpt_path}"
    return "continue with: python train.py " + shlex.join(argv + ["--resume", ckpt_path])


# The CPU-sized preset of each model (the mini study; measured times in presets.TIMES), named when a
# GPU-sized run starts on a CPU.
CPU_PRESETS = {"vit": "c100-mini-vit", "bvit": "c100-mini-bvit", "revit": "c100-mini-revit-e4",
               "srvit": "c100-mini-srvit-r2", "odevit": "c100-mini-odevit-euler", "loopvae": "c100-mini-loopvae-global"}


def pace_point(pace, step, now):
    """Whether a synced check at `step` (time `now`, seconds) is one of the two (step, time) points
    the estimated time is measured between: the first check, then one 10+ steps later, or 30+ s
    later for slow steps (a GPU-sized model on a CPU: 11 steps can take minutes)."""
    return len(pace) < 2 and (not pace or step - pace[0][0] >= 10 or (step > pace[0][0] and now - pace[0][1] >= 30))


def estimate_line(args, device, pace, total_steps):
    """One line: the time the rest of the run should take at the pace measured between the two
    (step, seconds) points of `pace`, evaluation not included; on a CPU, when that is more than
    3 hours, the model's CPU-sized preset."""
    (s0, t0), (s1, t1) = pace
    per_step = (t1 - t0) / (s1 - s0)
    left = per_step * (total_steps - s1)
    d, rest = divmod(int(left), 86400)
    h, rest = divmod(rest, 3600)
    took = (f"{d} d {h} h" if d else f"{h} h {rest // 60} min" if h else f"{rest // 60} min {rest % 60} s")
    line = (f"estimated time: {took} for the {total_steps - s1} steps left ({per_step:.3g} s per step; "
            "evaluations not included)")
    if device.type == "cpu" and left > 3 * 3600 and not (args.preset or "").startswith("c100-mini-"):
        cpu = CPU_PRESETS[args.model]
        said = "" if TIMES[cpu][0].startswith("est.") else " as measured"  # (LoopVAE's: estimated)
        line += (f"; a GPU-sized run on a CPU: --preset {cpu} is this model's CPU-sized protocol "
                 f"({TIMES[cpu][0]} on 2 cores{said}; --list-presets)")
    return line


def new_run_dir(model, kind=None):
    """runs/MODEL[-KIND]-YYYYmmdd-HHMMSS, the default --out-dir: a new folder per run (as timm's
    output/train/<time>-<model>), with -2, -3, ... when that second already has one."""
    base = os.path.join("runs", "-".join([model, *([kind] if kind else []), time.strftime("%Y%m%d-%H%M%S")]))
    path, n = base, 2
    while os.path.exists(path):
        path, n = f"{base}-{n}", n + 1
    return path


def trained_depth(args):
    """The trained depth in the unit of --eval-depths: recursions for srvit, solver steps for odevit
    (its args.depth), block applications for the others."""
    return args.recursions if args.model == "srvit" else args.depth


def depth_report(args, model, rows, step):
    """Print accuracy by depth, write OUT/depth_eval.json, and OUT/depth_eval.png if matplotlib
    happens to be installed (it is optional). rows: [{depth, nfe, val_acc1, val_acc5, val_loss}]."""
    print(f"{'depth':>6} {'nfe':>5} {'acc@1':>7} {'acc@5':>7} {'loss':>7}")
    for r in rows:
        print(f"{r['depth']:>6} {r['nfe']:>5} {r['val_acc1']:>7.2f} {r['val_acc5']:>7.2f} {r['val_loss']:>7.3f}")
    res = {"checkpoint": args.resume if args.eval_only else os.path.join(args.out_dir, "ckpt.pt"),
           "model": args.model, "trained_depth": trained_depth(args), "step": step,
           "solver": getattr(model, "solver", None), "extend": getattr(model, "extend", None),
           "val_subset": args.val_subset, "img_size": args.img_size or getattr(model, "img_size", None),
           "weights": rows[0].get("weights") if rows else None, "results": rows}
    with open(os.path.join(args.out_dir, "depth_eval.json"), "w") as f:
        json.dump(res, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["depth"] for r in rows], [r["val_acc1"] for r in rows], "o-")
    ax.axvline(trained_depth(args), color="gray", linestyle="--", label=f"trained depth {trained_depth(args)}")
    ax.set_xscale("log", base=2)
    what = f"{args.model} {res['solver']}, extend={res['extend']}" if res["solver"] else args.model
    ax.set(xlabel="depth at evaluation", ylabel="val top-1 (%)", title=f"{what}: accuracy vs depth")
    ax.legend()
    fig.savefig(os.path.join(args.out_dir, "depth_eval.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def runtime(args, p):
    """The processes (torchrun's RANK / WORLD_SIZE / LOCAL_RANK), the device and the precision of a run,
    checking the flags that depend on them (p.error, one line). Resolves --device, --amp and --workers
    in `args`. Returns (ddp, rank, world, local_rank, device, micro-batch per process, autocast context)."""
    ddp = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank, world, local_rank = 0, 1, 0
    if ddp:
        try:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            local_rank = int(os.environ.get("LOCAL_RANK", 0))
        except ValueError:
            p.error(f"RANK={os.environ['RANK']!r}, WORLD_SIZE={os.environ['WORLD_SIZE']!r} in the environment: "
                    "expected integers (torchrun sets them); unset them to run one process")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cpu", "cuda"):
        p.error(f"--device {args.device}: allowed: auto, cpu, cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available; use --device cpu")
    device = torch.device(f"cuda:{local_rank}" if args.device == "cuda" else "cpu")
    if args.amp == "auto":
        args.amp = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "none"
    if args.compile_scope and not args.compile:
        p.error(f"--compile-scope {args.compile_scope} needs --compile")
    if args.eval_ema and not args.ema:
        p.error("--eval-ema needs EMA weights: train with --ema DECAY (--eval-only takes it from the checkpoint)")
    if args.amp == "fp16" and device.type == "cpu":
        p.error("--amp fp16 needs a CUDA device; use --amp bf16 or none on CPU")
    if args.batch_size % (world * args.grad_accum):
        p.error(f"--batch-size {args.batch_size} is not divisible by the {world} processes x "
                f"--grad-accum {args.grad_accum}")
    micro = args.batch_size // world // args.grad_accum  # images per forward pass on one process
    if args.workers is None:  # a GPU consumes images faster than 2 workers decode them
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        args.workers = 2 if device.type == "cpu" else max(2, min(16, (os.cpu_count() or 2) // per_node))
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    amp_ctx = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else nullcontext()
    return ddp, rank, world, local_rank, device, micro, amp_ctx


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
    for flag in ("resume", "finetune", "teacher", "stage2"):  # a run folder means its ckpt.pt
        setattr(args, flag, checkpoint_file(getattr(args, flag), "--" + flag))
    # Which value a flag takes (docs/cluster.md "Resuming and failures"): the command line, else the preset,
    # else the checkpoint's (--eval-only: the run's flags; --resume: its model; --finetune: its
    # architecture), else the default.
    preset = PRESETS[args.preset][1] if args.preset else {}  # a preset's flags count as given
    if args.eval_only:
        if not args.resume:
            p.error("--eval-only needs --resume CKPT, the checkpoint to evaluate")
        args = checkpoint_args(p, args, argv, args.resume, lambda k: k not in EVAL_RUN_FLAGS, "--resume", preset)
    elif args.resume or args.finetune or args.stage2:  # with --resume, --finetune/--stage2 are ignored: the run continues
        source = next((f"--{k}", getattr(args, k)) for k in ("resume", "finetune", "stage2") if getattr(args, k))
        if not (args.print_config and source[0] == "--stage2" and not os.path.exists(source[1])):
            # (a preset's Stage 2 printed before its Stage-1 run exists: the preset's flags describe the model)
            args = checkpoint_args(p, args, argv, source[1], lambda k: k in ARCH_FLAGS, source[0], preset)
        if args.resume and not args.out_dir:  # a run continues in its own folder
            args.out_dir = os.path.dirname(args.resume) or "."
    if args.print_config:  # what this command would train; reads no data, builds no model
        args.img_size = args.img_size or (224 if args.data == "imagenet" else 32)
        print(json.dumps(vars(resolve(args, p, args.img_size)), indent=1))
        return None
    return args


def announce(args, model, world, device, compiled, total_steps, steps_per_epoch, warmup, distilling, step,
             start_epoch, start_batch):
    """The run's first lines (rank 0): the preset, the model's size and FLOPs, the processes, precision,
    compilation and schedule, where a resumed run continues, the run folder; writes OUT/args.json
    (not for --eval-only, which leaves the training run's files alone)."""
    if args.preset:
        print(f"preset {args.preset}: {PRESETS[args.preset][0]}; paper: {PAPER[args.preset]}")
    flops = model.flops_per_image()
    print(f"{args.model}: {model.num_params() / 1e6:.3f} M params, {flops / 1e9:.3f} GFLOPs/img, "
          f"depth {args.depth}, {world} process(es) on {device.type}, amp {args.amp}{compiled}"
          + ("" if args.eval_only else f", {total_steps} steps ({steps_per_epoch}/epoch), warmup {warmup}")
          + (f", distilling from {args.teacher} ({args.distill})" if distilling else "")
          + (f", Stage 2 from {args.stage2} (--disc {args.disc}, adversarial term from step {args.gan_start})"
             if args.stage2 and not args.eval_only else ""))
    if args.resume and not args.eval_only:
        print(f"resumed from {args.resume} at step {step} (epoch {start_epoch}, step {start_batch} of it)"
              + ("; nothing left to train" if step >= total_steps or start_epoch >= args.epochs else ""))
    print(f"run folder: {args.out_dir}")
    if not args.eval_only:  # --eval-only leaves the training run's files alone
        with open(os.path.join(args.out_dir, "args.json"), "w") as f:
            json.dump(vars(args), f, indent=1)


def main(argv=None, stop=None):
    """The run of the flags `argv` (None: sys.argv), in the order of events. `stop`: the run's Stop,
    the handler of its stop signals (cli installs it)."""
    stop = stop if stop is not None else Stop()
    p = get_parser()
    args = configure(p, argv)
    if args is None:  # --print-config
        return
    stop.eval_only = args.eval_only

    # --- set-up: distributed, device, precision ---
    ddp, rank, world, local_rank, device, micro, amp_ctx = runtime(args, p)

    # --- data (before the process group, so a bad path fails fast on every rank), processes ---
    args, train_set, val_set, num_classes, img_size = load_data(args, p)
    master = rank == 0
    start_processes(args, ddp, device, master)
    train_loader, val_loader = data.build_loaders(args, train_set, val_set, micro, rank, world, device)
    if train_loader is not None and len(train_loader) < args.grad_accum:
        raise Fail(f"--batch-size {args.batch_size} is larger than the training set ({len(train_set)})")

    # --- model, optimizer, schedule ---
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts them)
    model_img = getattr(args, "model_img_size", None) if args.eval_only else None
    if model_img and model_img != img_size:  # --eval-only at another --img-size: timm's dynamic size
        model = build_model(args, model_img, num_classes, dynamic_img_size=True)
    else:
        model = build_model(args, img_size, num_classes)
    if (args.finetune or args.stage2) and not args.resume:  # before .to(device): the weights are read on the CPU
        if args.stage2:
            check_stage1(args.stage2)
        source = ("--finetune", args.finetune) if args.finetune else ("--stage2", args.stage2)
        report = finetune_weights(source[1], model, source[0])
        if master:
            print(report)
    model = model.to(device)
    if args.grad_checkpoint:
        model.set_grad_checkpointing(True)
    raw_model = model
    distiller, adversary = trainers_beside_the_model(args, p, model, img_size, device)
    rfid = rfid_metric(device) if args.rfid else None  # (before anything is written: one line if it cannot be had)
    scope, why = "blocks", None  # --compile: checked here, before anything is written
    if args.compile:
        blockers = [why for why, on in (("DDP", ddp), ("--teacher", distiller is not None),
                                        ("--stage2", adversary is not None), ("--eval-only", args.eval_only)) if on]
        try:
            scope, why = kernels.choose_scope(raw_model, args.compile_scope or "auto", blockers)
        except ValueError as e:
            raise Fail(f"--compile-scope {args.compile_scope}: {e}")
    if args.opt == "lamb":  # eps 1e-8: DeiT's --opt-eps default (our reading of its code)
        optimizer = Lamb(param_groups(model, args.weight_decay), lr=args.lr, eps=1e-8)
    else:
        # fused (CPU and CUDA): it skips a non-finite step on the device (optimizer_step)
        optimizer = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr, fused=True)
    if distiller is not None and list(distiller.parameters()):  # the feature projection trains too
        optimizer.add_param_group({"params": list(distiller.parameters()), "weight_decay": args.weight_decay})
    steps_per_epoch = len(train_loader) // args.grad_accum if train_loader is not None else 0  # (--eval-only)
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    warmup = round(total_steps * min(args.warmup_epochs / args.epochs, 1.0))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(total_steps, warmup, args.lr, args.min_lr))
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    ema = EMA(model, args.ema) if args.ema else None

    # --- resume ---
    ckpt_path, log_path = os.path.join(args.out_dir, "ckpt.pt"), os.path.join(args.out_dir, "log.jsonl")
    check_out_dir(args.out_dir)
    lock = lock_out_dir(args.out_dir) if master and not args.eval_only else None
    start_epoch, start_batch, step, progress = resume_or_start(
        args, world, rank, ckpt_path, model, optimizer, scheduler, scaler, ema, distiller, adversary)
    if args.resume and not args.eval_only:  # what a stopped run keeps, until its first checkpoint
        stop.checkpoint, stop.step = args.resume, step
    stop.hint = continue_hint(p, argv, ddp, ckpt_path)

    raw_distiller = distiller  # (DDP wraps `distiller` below; the checkpoint holds the plain one)

    def save(epoch, batch, progress, step):
        """Atomic checkpoint of everything a bit-exact resume needs (rank 0 writes it), and the class
        names (image folders), which are all that --eval-only needs of the training set. Raises Fail
        when the file cannot be written (a full disk): the previous checkpoint is kept."""
        rngs = [None] * world
        if ddp:
            dist.all_gather_object(rngs, rng_state())
        else:
            rngs = [rng_state()]
        if master:
            try:
                save_atomic({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                             "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                             "ema": ema.state_dict() if ema is not None else None, "epoch": epoch,
                             "distill": raw_distiller.state_dict() if distiller is not None else None,
                             "adversary": adversary.state_dict() if adversary is not None else None,
                             "batch": batch, "step": step, "progress": progress, "rng": rngs,
                             "args": vars(args), "classes": getattr(train_set, "classes", None)}, ckpt_path)
            except OSError as e:
                raise Fail(f"writing the checkpoint at step {step} failed ({e.strerror or e}); its partial file "
                           f"{ckpt_path}.tmp was removed; free space in {args.out_dir}; {stop.kept()}")
            tqdm.write(f"saved checkpoint at step {step}")  # below a progress bar, on a line of its own
            sys.stdout.flush()
        stop.checkpoint, stop.step = ckpt_path, step

    compiled = ""
    if args.compile:  # before DDP: the blocks (regional), and the training forward whole where it can be
        model = kernels.compile_for_training(model, scope, device)
        compiled = ", compiled: " + (f"each block (not the whole forward: {why})" if scope == "blocks" else
                                     "the whole training forward" + (" (CUDA graphs)" if device.type == "cuda"
                                                                     else "") + " and each block")
    if ddp:
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
        if distiller is not None and list(distiller.parameters()):
            distiller = DDP(distiller, device_ids=[local_rank] if device.type == "cuda" else None)

    mix = build_mix(args, num_classes)

    if master:
        announce(args, raw_model, world, device, compiled, total_steps, steps_per_epoch, warmup,
                 distiller is not None, step, start_epoch, start_batch)

    # --- the loop ---
    if not args.eval_only:
        step = train(
            args=args, device=device, ddp=ddp, world=world, master=master, model=model, raw_model=raw_model,
            distiller=distiller, adversary=adversary, rfid=rfid, optimizer=optimizer, scheduler=scheduler,
            scaler=scaler, ema=ema, mix=mix,
            amp_ctx=amp_ctx, num_classes=num_classes, train_set=train_set, train_loader=train_loader,
            val_loader=val_loader, save=save, ckpt_path=ckpt_path, log_path=log_path, steps_per_epoch=steps_per_epoch,
            total_steps=total_steps, start_epoch=start_epoch, start_batch=start_batch, step=step, progress=progress,
            stop=stop)

    # --- evaluation: a classifier at other depths ("beyond the training horizon"); a tokenizer's
    # reconstruction metrics with --eval-only (a training run logged them every epoch) ---
    if not hasattr(raw_model, "metrics"):
        evaluate_depths(args, raw_model, ema, val_loader, device, amp_ctx, master, log_path, step, stop)
    elif args.eval_only:
        reconstruction_report(args, raw_model, ema, val_loader, device, amp_ctx, master, step, stop, rfid)
    if master:
        files = sorted(f for f in os.listdir(args.out_dir) if not f.startswith("."))
        print(f"done: {args.out_dir} holds {', '.join(files)}")
    if ddp:
        dist.destroy_process_group()
    if lock is not None:
        lock.close()


def trainers_beside_the_model(args, p, model, img_size, device):
    """(distiller, adversary), each None unless the run asks for it: --teacher's distill.Distiller
    (the teacher from its checkpoint) and --stage2's adversarial.Adversary (the discriminator, its
    optimizer and the adversarial terms). An evaluation needs neither. Raises Fail."""
    if args.eval_only:
        return None, None
    distiller = adversary = None
    if args.teacher:
        import distill
        teacher = model_from_checkpoint(args.teacher, "--teacher", p, img_size).to(device)
        try:
            distiller = distill.Distiller(model, teacher, args.distill, args.distill_temperature).to(device)
        except ValueError as e:
            raise Fail(str(e))
    if args.stage2:
        adversary = adversarial.build(model, args.disc, args.disc_weights, device, lr=args.disc_lr or args.lr,
                                      weight=args.gan_weight, start=args.gan_start, r1_gamma=args.r1_gamma,
                                      r1_every=args.r1_every, policy=args.diffaug)
    return distiller, adversary


def load_data(args, p):
    """The datasets of the flags, --val-subset applied, and the flags resolved against the data's
    image size: (args, train_set (None for --eval-only), val_set, num_classes, img_size). Raises
    Fail for bad data."""
    try:  # --eval-only reads no training set: an image folder's class names come from the checkpoint
        train_set, val_set, num_classes, img_size = data.build_datasets(
            args.data, args.data_dir, args.img_size, args.download, int(args.randaug), seed=args.seed,
            three_aug=args.three_augment, val_labels=args.val_labels, train=not args.eval_only,
            classes=getattr(args, "model_classes", None) if args.eval_only else None,
            mean_std=NORMALIZATION.get(args.model))
    except (data.DataError, ValueError) as e:
        raise Fail(str(e))
    args = resolve(args, p, img_size)
    if args.val_subset:  # CIFAR: the first N images; image folders: N evenly spaced (the set is ordered by class)
        n = min(args.val_subset, len(val_set))
        keep = range(n) if args.data != "imagenet" else [i * len(val_set) // n for i in range(n)]
        val_set = torch.utils.data.Subset(val_set, keep)
    return args, train_set, val_set, num_classes, img_size


def start_processes(args, ddp, device, master):
    """Join the DDP process group (NCCL on CUDA, gloo on the CPU; a dead or hung peer fails the others
    after --dist-timeout instead of a hang), and name the run folder when --out-dir is not given:
    rank 0 picks runs/MODEL-time and broadcasts it, so every process writes to the same one."""
    if ddp:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:  # (left in the shell by an earlier job, with plain python)
            raise Fail(f"RANK={os.environ['RANK']} and WORLD_SIZE={os.environ['WORLD_SIZE']} are set in the "
                       f"environment, {' and '.join(missing)} not: start the processes with torchrun, or unset RANK "
                       "and WORLD_SIZE to run one process")
        if device.type == "cuda":  # bind the device first: NCCL's communicator then uses it
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=args.dist_timeout),
                                device_id=device if device.type == "cuda" else None)
    if not args.out_dir:
        name = [new_run_dir(args.model, "eval" if args.eval_only else None) if master else None]
        if ddp:
            dist.broadcast_object_list(name, src=0)
        args.out_dir = name[0]


def resume_or_start(args, world, rank, ckpt_path, model, optimizer, scheduler, scaler, ema, distiller, adversary):
    """With --resume: restore every object from the checkpoint (rank 0 prints what changed since it
    was written; Stage 2: the discriminator and its optimizer too) and this rank's RNG state; else
    refuse an existing OUT/ckpt.pt and seed this rank.
    Returns (start_epoch, start_batch, step, progress). Raises Fail for a checkpoint that cannot be
    resumed with these flags."""
    if not args.resume:
        if os.path.exists(ckpt_path):
            raise Fail(f"{ckpt_path} exists; pass --resume {ckpt_path} (or --resume auto) to continue it, or "
                       "choose another --out-dir")
        torch.manual_seed(args.seed + rank)  # rank-specific randomness (drop path, MixUp)
        return 0, 0, 0, {}
    ck = load_checkpoint(args.resume, args)
    if args.eval_ema and ck.get("ema") is None:
        raise Fail(f"--eval-ema: {args.resume} holds no EMA weights (its run trained without --ema); "
                   "leave out --eval-ema to evaluate its model weights")
    for line in [] if args.eval_only else resume_changes(ck, args, world, args.resume):
        if rank == 0:
            print(line)
    restore(ck, args.resume, args.lr, model, optimizer, scheduler, scaler, ema, distiller, opt=args.opt)
    stage2 = ck.get("adversary") is not None
    if not args.eval_only and stage2 != (adversary is not None):
        raise Fail(f"--resume {args.resume}: a Stage-2 checkpoint (its run had --stage2 {ck['args'].get('stage2')}); "
                   "give its Stage-2 flags" if stage2 else f"--resume {args.resume}: a Stage-1 checkpoint; start "
                   f"Stage 2 from it in a new --out-dir with --stage2 {args.resume}, or leave out --stage2")
    if adversary is not None:
        adversary.load_state_dict(ck["adversary"])
    if len(ck["rng"]) == world:
        set_rng_state(ck["rng"][rank])
    else:  # another number of processes (an epoch boundary): fresh per-rank randomness
        torch.manual_seed(args.seed + rank + 7919 * ck["step"])
    return ck["epoch"], ck["batch"], ck["step"], ck["progress"]


def evaluate_depths(args, raw_model, ema, val_loader, device, amp_ctx, master, log_path, step, stop):
    """Top-1/top-5 at --eval-depths (with --eval-only and none given: 0.5x-8x the trained depth in the
    model's unit), "beyond the training horizon" (Training Crossroads): one log.jsonl line each
    (training runs), then depth_report's table, depth_eval.json and figure. Raises Fail for a depth
    the model cannot run, Preempted for a stop request (`stop`): after the batch in flight (one
    process), or before the next depth (DDP: the processes agree there)."""
    depths, rows = args.eval_depths or [], []
    weights, eval_model = ("ema", ema.module) if args.eval_ema else ("model", raw_model)
    if args.eval_only and not depths:  # 0.5, 1, 2, 4, 8 x the trained depth, in the model's own unit
        depths = sorted({max(1, round(f * trained_depth(args))) for f in (0.5, 1, 2, 4, 8)})
    ddp = dist.is_initialized()
    for depth in depths:
        try:
            r = None if stopping(stop, ddp, device) else evaluate(eval_model, val_loader, device, amp_ctx, depth=depth,
                                                                   stop=None if ddp else stop)
        except ValueError as e:
            raise Fail(f"--eval-depths {depth}: {e}")
        if r is None:
            done = "" if args.eval_only else f", after training to step {step}"
            raise Preempted(stop.line(f"in the evaluation at depth {depth} ({len(rows)} of {len(depths)} depths "
                                      f"done{done})"))
        rec = {"depth": depth, "val_acc1": r["val_acc1"], "val_acc5": r["val_acc5"], "weights": weights}
        # block evaluations per image: counted by the model if it can (odevit), else the depth
        rows.append({**rec, "nfe": getattr(raw_model, "nfe", depth), "val_loss": r["val_loss"]})
        if master and not args.eval_only:
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(json.dumps(rec))
    if master and rows:
        depth_report(args, raw_model, rows, step)


def reconstruction_report(args, raw_model, ema, val_loader, device, amp_ctx, master, step, stop, rfid=None):
    """--eval-only of a tokenizer: its validation metrics (evaluate_reconstruction; the EMA weights with
    --eval-ema) printed as one line and written to OUT/reconstruction_eval.json. Raises Preempted for
    a stop request (one process: after the batch in flight)."""
    weights, model = ("ema", ema.module) if args.eval_ema else ("model", raw_model)
    r = evaluate_reconstruction(model, val_loader, device, amp_ctx, None if dist.is_initialized() else stop, rfid)
    if r is None:
        raise Preempted(stop.line("in the evaluation"))
    if not master:
        return
    print(f"{args.resume} (step {step}, {weights} weights): validation PSNR {r['val_psnr']:.2f} dB (unclipped "
          f"{r['val_psnr_raw']:.2f}), SSIM {r['val_ssim']:.4f}, L1 {r['val_l1']:.4f}, KL {r['val_kl']:.4g}, "
          f"out-of-range pixels {100 * r['val_out_of_range']:.2f} %" + (f", rFID {r['val_rfid']:.3f}" if rfid else ""))
    res = {"checkpoint": args.resume, "model": args.model, "step": step, "weights": weights,
           "val_subset": args.val_subset, "img_size": args.img_size or raw_model.img_size, **r}
    with open(os.path.join(args.out_dir, "reconstruction_eval.json"), "w") as f:
        json.dump(res, f, indent=1)


def train(*, args, device, ddp, world, master, model, raw_model, distiller, adversary, rfid, optimizer, scheduler,
          scaler, ema, mix, amp_ctx, num_classes, train_set, train_loader, val_loader, save, ckpt_path, log_path,
          steps_per_epoch, total_steps, start_epoch, start_batch, step, progress, stop):
    """The training loop (docs/training.md): epochs of optimizer steps from `step` on, each epoch
    evaluated, logged and checkpointed. What happens around a step has its own helper: the loader's
    undecodable images (data.UsableImages), the epoch's running sums (EpochSums), and the progress
    bar, the estimated time, the device reads, the stop requests and mid-epoch checkpoints
    (Monitor: `stop`, a Stop, honoured after a step and after a checkpoint; an epoch's evaluation
    finishes first). Stage 2 (`adversary`, adversarial.py): each micro-batch's call updates the
    discriminator and adds the generator's adversarial term. Takes what main() built, by name;
    returns the optimizer step reached."""
    if stopping(stop, ddp, device):  # a stop request during the set-up
        raise Preempted(stop.line(f"before the first step (at step {step})"))
    usable = data.UsableImages(train_set, args.max_bad_images) if args.data == "imagenet" else None
    monitor = Monitor(args, device, ddp, master, stop, save, scheduler, step, total_steps, steps_per_epoch, ckpt_path)
    epoch = start_epoch
    while step < total_steps and epoch < args.epochs:
        first = start_batch if epoch == start_epoch else 0  # optimizer steps of this epoch already done
        train_loader.sampler.set_epoch(epoch)
        train_loader.sampler.set_start(first * (args.batch_size // world))
        sums, progress = EpochSums(progress, device), {}
        left = min(steps_per_epoch - first, total_steps - step)
        batches = monitor.epoch(epoch, first, left, train_loader)
        for i in range(left):
            step_loss, seen = 0.0, 0  # seen: micro-batches with a usable image
            for j in range(args.grad_accum):  # micro-batches of one optimizer step (gradients add up)
                x, y = next(batches)
                x, y, empty = usable_batch(x, y, usable, sums, ddp, ckpt_path)
                if empty and not ddp:
                    continue  # nothing to learn from: no forward, no backward, no step below if all are
                x, y = mix_and_smooth(x.to(device, non_blocking=True), y.to(device, non_blocking=True), mix, args,
                                      num_classes)
                accumulating = ddp and j < args.grad_accum - 1  # DDP all-reduces in the last backward only
                with no_sync(model, accumulating), no_sync(distiller, accumulating):
                    with amp_ctx:
                        logits, loss = model(x, y)
                        if distiller is not None:
                            term = distiller(x, logits)
                            raw_model.aux["distill_loss"] = term.detach()  # logged with the model's terms
                            loss = loss + args.distill_weight * term
                        if adversary is not None:  # Stage 2: a discriminator update, then + lambda_a L_adv
                            loss, terms = adversary(x, logits, loss, step)
                            raw_model.aux.update(terms)
                    scaler.scale(loss * (0.0 if empty else 1.0 / args.grad_accum)).backward()  # the batch mean
                if not empty:
                    step_loss, seen = step_loss + loss.detach() / args.grad_accum, seen + 1
                    sums.images += x.shape[0] * world
            bad = None  # (0-d, device) 1 when the step was skipped as non-finite (optimizer_step)
            if seen or ddp:  # gradients are all-reduced, so every rank skips the same steps
                bad = optimizer_step(raw_model, optimizer, scaler, args.clip_grad)
                sums.add(step_loss, bad)
            else:  # one process, no usable image in the whole step: no optimizer step, nothing logged
                optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            if ema is not None:
                ema.update(raw_model)
            step += 1
            monitor.after_step(step, epoch, first + i + 1, loss, bad, sums)
        epoch_time = sums.seconds()  # training only: the evaluation below is not counted
        monitor.end_epoch(step, len(val_loader.dataset))
        # the last step's model terms, read now: under CUDA graphs (--compile, whole model) they live in
        # the graph's memory, which the next replay overwrites; evaluation forwards may set them too
        extras = model_log(raw_model)
        inside = first + left < steps_per_epoch  # stopped inside the epoch by --max-steps: resumable there
        position = (epoch, first + left, sums.state()) if inside else (epoch + 1, 0, {})  # where it continues
        rec = {"epoch": epoch, "step": step, "lr": scheduler.get_last_lr()[0], "train_loss": sums.mean_loss(world, ddp)}
        try:
            rec.update(evaluate(raw_model, val_loader, device, amp_ctx, rfid=rfid))
            if ema is not None:
                rec.update({f"ema_{k}": v for k, v in evaluate(ema.module, val_loader, device, amp_ctx, rfid=rfid).items()})
        except EmptyEvaluation as e:  # the epoch's training is kept first
            save(*position, step)
            raise EmptyEvaluation(f"{e}; the training of epoch {epoch} is saved in {ckpt_path} (--resume it)")
        rec.update({"img_per_s": sums.images / epoch_time, "epoch_time_s": epoch_time, **extras})
        if args.data == "imagenet":
            rec["skipped_images"] = sums.total_skipped(ddp)
        if master:
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(json.dumps(rec))
            print(epoch_line(epoch, rec, step, total_steps), flush=True)
        save(*position, step)
        if inside:
            break
        epoch += 1
        if step < total_steps and epoch < args.epochs and stopping(stop, ddp, device):  # during the evaluation or save
            raise Preempted(stop.line(f"after step {step} of {total_steps}, the end of epoch {epoch - 1}"))
    return step


def usable_batch(x, y, usable, sums, ddp, ckpt_path):
    """A micro-batch without its undecodable images (image folders: `usable`, a data.UsableImages;
    counted in `sums`): (x, y, empty). Under DDP an empty micro-batch becomes a zero-weighted stand-in
    image, which keeps this rank in the gradient all-reduce. Raises Fail past --max-bad-images."""
    if usable is None:
        return x, y, False
    try:
        x, y, skipped = usable(x, y)
    except data.TooManyUndecodable as e:
        again = f"--resume {ckpt_path}" if os.path.exists(ckpt_path) else "run again"
        raise Fail(f"{e}; fix or remove them, then {again}")
    sums.skipped += skipped
    empty = not len(y)
    if empty and ddp:
        x, y = torch.zeros((1, *x.shape[1:])), torch.zeros(1, dtype=torch.long)
    return x, y, empty


class EpochSums:
    """The running sums of one epoch, restored from a checkpoint's `progress` when a run resumes
    mid-epoch: seconds and images so far, undecodable images skipped, and, on the device (read at the
    epoch's end only), the loss sum of the good (finite) steps and their count."""

    def __init__(self, progress, device):
        self.t_spent, self.images = progress.get("time", 0.0), progress.get("imgs", 0)
        self.skipped = progress.get("skipped", 0)
        self.loss_sum = torch.tensor(progress.get("loss_sum", 0.0), device=device, dtype=torch.float64)
        self.steps = torch.tensor(float(progress.get("steps", 0)), device=device, dtype=torch.float64)
        self.device, self.t0 = device, time.time()

    def add(self, step_loss, bad):
        """One optimizer step's loss; `bad` (0-d, device): 1 when it was skipped as non-finite."""
        self.loss_sum += torch.where(bad > 0, 0.0, step_loss)  # (a NaN loss times 0 would still be NaN)
        self.steps += 1 - bad

    def seconds(self):
        return self.t_spent + time.time() - self.t0

    def state(self):
        """What a mid-epoch checkpoint keeps of the epoch (its `progress`)."""
        return {"time": self.seconds(), "imgs": self.images, "steps": int(self.steps.item()),
                "loss_sum": self.loss_sum.item(), "skipped": self.skipped}

    def mean_loss(self, world, ddp):
        """The epoch's mean training loss over the good steps of every rank."""
        total = self.loss_sum.clone()
        if ddp:
            dist.all_reduce(total)
        return total.item() / max(1, self.steps.item() * world)

    def total_skipped(self, ddp):
        """Undecodable images skipped in the epoch, summed over the ranks."""
        n = torch.tensor(float(self.skipped), device=self.device, dtype=torch.float64)
        if ddp:
            dist.all_reduce(n)
        return int(n.item())


class Monitor:
    """Everything the loop does between optimizer steps that is not training: the progress bar (on a
    terminal; written to a file, a line every tenth of the epoch instead), the loader-bottleneck note,
    the host's reads of the device (the loss and the count of consecutive non-finite steps: every
    CHECK_EVERY steps on a GPU, every step on the CPU where a read costs nothing, at the end of an
    epoch and before a checkpoint, so that the host queues steps ahead of the GPU), the estimated
    time (after the first 10 steps or 30 s, then again after every epoch at that epoch's pace), the
    stop requests (a checkpoint, then Preempted) and the --save-every checkpoints."""

    def __init__(self, args, device, ddp, master, stop, save, scheduler, step, total_steps, steps_per_epoch,
                 ckpt_path):
        self.args, self.device, self.ddp, self.master, self.stop, self.save = args, device, ddp, master, stop, save
        self.scheduler, self.total_steps, self.steps_per_epoch, self.ckpt_path = (scheduler, total_steps,
                                                                                  steps_per_epoch, ckpt_path)
        self.check_every = CHECK_EVERY if device.type == "cuda" else 1
        self.bad_run = torch.zeros((), device=device)  # consecutive non-finite steps, counted on the device
        self.waited, self.probe = 0.0, (step, time.perf_counter())  # time spent waiting for batches, from here
        self.pace = []  # (step, time) at the first two checks 10+ steps or 30+ s apart: the estimated time
        self.tty = sys.stderr.isatty()

    def epoch(self, epoch, first, left, loader):
        """Start an epoch of `left` steps (`first` done before a resume): its bar; returns its batches,
        timing the waits for them."""
        self.epoch_no, self.first, self.left, self.t_epoch = epoch, first, left, time.perf_counter()
        self.next_line = max(1, left // 10)  # without a terminal: the step of the next progress line
        self.bar = tqdm(total=left, desc=f"epoch {epoch}", disable=not self.master or not self.tty,
                        dynamic_ncols=True)
        return self._timed(iter(loader))

    def _timed(self, batches):
        while True:
            t = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
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
        i = done - 1 - self.first  # this epoch's steps since the start (or the resume)
        if bad is not None:
            self.bad_run = (self.bad_run + 1) * bad
        self.bar.update()
        if self.master and step == probe[0] + 50 and self.waited > 0.2 * (time.perf_counter() - probe[1]):
            self.note(f"note: the data loader is the bottleneck: {self.waited / (time.perf_counter() - probe[1]):.0%} "
                      f"of the first 50 steps waited for images with --workers {args.workers}; raise --workers, or "
                      "leave out per-image augmentations (CIFAR then uses the batched loader)")
        saving = args.save_every and step % args.save_every == 0 and done < self.steps_per_epoch \
            and step < self.total_steps
        if not (i % self.check_every == 0 or i == self.left - 1 or saving or (self.stop and not self.ddp)):
            return  # (one process reads its signal flag every step: a host list, no sync)
        last_loss, nonfinite = torch.stack([loss.detach().float(), self.bad_run]).tolist()
        now = time.perf_counter()  # (the device has caught up: a synced time)
        if self.master and pace_point(self.pace, step, now):
            self.pace.append((step, now))
            if len(self.pace) == 2 and step < self.total_steps:  # (nothing to estimate at the last step)
                self.note(estimate_line(args, self.device, self.pace, self.total_steps))
        if nonfinite >= args.max_nonfinite:
            self.bar.close()
            kept = (f"the last good checkpoint is {self.ckpt_path}" if os.path.exists(self.ckpt_path)
                    else "no checkpoint was written before them")
            raise Fail(f"{int(nonfinite)} consecutive non-finite steps (the last at step {step}); {kept}; "
                       "lower --lr or use --amp bf16/none")
        if self.master:
            self.bar.set_postfix(loss=f"{last_loss:.3f}", lr=f"{self.scheduler.get_last_lr()[0]:.2e}")
            if not self.tty and i + 1 >= self.next_line:  # a log file: a line per tenth (at the next check)
                print(f"epoch {epoch}: step {done} of {self.steps_per_epoch}, loss {last_loss:.3f}", flush=True)
                self.next_line = i + 1 + max(1, self.left // 10)
        stopped = stopping(self.stop, self.ddp, self.device)  # preempted: keep this step, exactly where it is
        if stopped or (saving and nonfinite == 0):
            self.save(epoch, done, sums.state(), step)
            if stopped or stopping(self.stop, self.ddp, self.device):  # (or the request came during the save)
                self.bar.close()
                raise Preempted(self.stop.line(f"after step {step} of {self.total_steps}"))

    def end_epoch(self, step, val_images):
        """Close the epoch's bar; with steps left, the estimated time again at this epoch's pace (so the
        figure sharpens as the run goes, not only from its first steps); then say that the evaluation
        of `val_images` images runs (it has no bar)."""
        self.bar.close()
        if self.master and self.left and step < self.total_steps and len(self.pace) == 2:
            per_step = (time.perf_counter() - self.t_epoch) / self.left
            line = estimate_line(self.args, self.device, [(0, 0.0), (1, per_step)], self.total_steps - step + 1)
            self.note(line.replace("estimated time:", "estimated time, at the last epoch's pace:", 1))
        self.note(f"epoch {self.epoch_no}: evaluating on {val_images} validation images")


def no_sync(module, accumulating):
    """DDP's no_sync() while gradients accumulate over micro-batches (nothing for a plain module)."""
    return module.no_sync() if accumulating and isinstance(module, DDP) else nullcontext()


def check_stage1(path):
    """Raise Fail unless `path` (--stage2) is an rvits checkpoint of a LoopVAE run."""
    ck = read_weights(path, "--stage2")
    model = ck["args"].get("model") if isinstance(ck, dict) and isinstance(ck.get("args"), dict) else None
    if model != "loopvae":
        raise Fail(f"--stage2 {path}: not a LoopVAE checkpoint ({f'a --model {model} run' if model else 'no rvits run flags'}); "
                   "Stage 2 continues the ckpt.pt of a train.py --model loopvae run")


def model_from_checkpoint(path, flag, p, img_size):
    """The model of an rvits checkpoint, rebuilt from its saved flags, with its weights, in eval
    mode; at another image size than it was trained at, built with dynamic_img_size=True (its
    position embedding interpolated on the fly). Raises Fail naming `flag` for a bad file."""
    ck = read_weights(path, flag)
    if not (isinstance(ck, dict) and isinstance(ck.get("model"), dict) and isinstance(ck.get("args"), dict)
            and ck["args"].get("model") in MODELS and "head.weight" in ck["model"]):
        raise Fail(f"{flag} {path}: not an rvits checkpoint (model weights and the flags of its run)")
    saved = p.parse_args([])
    vars(saved).update(ck["args"])
    own = saved.img_size or (224 if saved.data == "imagenet" else 32)
    model = build_model(saved, own, ck["model"]["head.weight"].shape[0], dynamic_img_size=own != img_size)
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as e:
        raise Fail(f"{flag} {path}: its weights do not fit the model its flags describe "
                   f"({str(e).strip().splitlines()[-1].strip()})")
    return model.eval()


CHECK_EVERY = 20  # optimizer steps between the loop's reads of a GPU (loss, non-finite count, DDP stop flag)


def build_mix(args, num_classes):
    """--mixup / --cutmix as one torchvision v2 transform of a batch (one of the two, chosen per batch,
    when both are on), or None."""
    if not (args.mixup or args.cutmix):
        return None
    from torchvision.transforms import v2
    mixes = ([v2.MixUp(alpha=args.mixup, num_classes=num_classes)] if args.mixup else []) + \
            ([v2.CutMix(alpha=args.cutmix, num_classes=num_classes)] if args.cutmix else [])
    return v2.RandomChoice(mixes)


def mix_and_smooth(x, y, mix, args, num_classes):
    """MixUp/CutMix (torchvision v2, `mix` or None) and label smoothing of a batch on its device:
    x (B, C, H, W), y (B,) class indices -> x, y with y (B,) indices or (B, classes) probabilities."""
    if mix is not None:
        x, y = mix(x, y)  # y becomes (B, classes) probabilities
        if args.bce:  # DeiT III's code: every class in the mix is a positive
            y = (y > 0).to(y.dtype)
    eps = args.label_smoothing
    if eps:
        y = (y if y.ndim == 2 else F.one_hot(y, num_classes).float()) * (1 - eps) + eps / num_classes
    return x, y


def optimizer_step(model, optimizer, scaler, clip_grad):
    """Unscale (fp16), clip the gradient norm to `clip_grad` (0 = no clipping) and step, without a
    host sync. Returns `bad`, a 0-d float tensor on the device: 1 when the gradient norm is not
    finite, in which case the update was skipped on the device (weights, moments and step counts
    keep their values): the optimizer reads `found_inf` as it does from GradScaler (torch's fused
    AdamW, optim.Lamb). The gradients are cleared either way. The host used to read the norm
    (`if torch.isfinite(gnorm)`) and so could never queue work ahead of the GPU."""
    scaler.unscale_(optimizer)
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad or float("inf"))
    bad = (~torch.isfinite(gnorm)).float()
    if scaler.is_enabled():  # fp16: GradScaler skips an overflowed step by the same mechanism
        scaler.step(optimizer)
    else:
        optimizer.found_inf = bad
        optimizer.step()
        del optimizer.found_inf
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return bad


def stopping(stop, ddp, device):
    """True once any process holds a stop request (`stop`, a Stop: SIGINT, SIGTERM, SIGUSR1). The flag
    is all-reduced, so every rank stops after the same step and takes part in the checkpoint; the
    training loop asks every CHECK_EVERY steps on a GPU."""
    if not ddp:
        return bool(stop)
    flag = torch.tensor(float(bool(stop)), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


def say(line):
    """One line on stderr, on a line of its own below an open progress bar (tqdm.write)."""
    tqdm.write(line, file=sys.stderr)


def cli(argv=None):
    """Run main(argv) with the run's Stop as the handler of its stop signals, and turn user-fixable
    problems into one line on stderr: returns the exit status (0 ok, 2 bad input, non-finite
    training, a full disk or /dev/shm, 1 a failed or timed-out DDP peer, 75 stopped by SIGINT,
    SIGTERM or SIGUSR1 at a safe point, 130 stopped at once by a second Ctrl-C). The loader workers
    end with the process (data.worker_signals, data.end_workers)."""
    stop = Stop()
    handlers = {s: signal.signal(s, stop) for s in Stop.SIGNALS}
    try:
        main(argv, stop)
    except SystemExit as e:  # argparse errors (status 2) and --help (status 0)
        return e.code
    except Fail as e:
        say(f"train.py: error: {e}")
        return 2
    except Preempted as e:
        say(f"train.py: {e}")
        return PREEMPTED
    except KeyboardInterrupt:
        say(f"train.py: stopped at once by a second Ctrl-C; {stop.kept()}")
        return INTERRUPTED
    except Exception as e:
        shm = data.out_of_shared_memory(e)
        if shm:
            say(f"train.py: error: {shm}; {stop.kept()}")
            return 2
        if not (dist.is_available() and dist.is_initialized()):
            raise
        msg = (str(e).strip().splitlines() or [""])[0]  # (gloo and NCCL raise a plain RuntimeError too)
        say(f"train.py: error: rank {dist.get_rank()}: this process or a peer failed or timed out "
            f"({type(e).__name__}: {msg[:200]}); resume from the last checkpoint with --resume")
        return 1
    finally:  # the run's signal handlers end with it (cli may be called again in-process)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        kernels.release_compile_workers()  # a compiled run exits now, not never (kernels.py)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
