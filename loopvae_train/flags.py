"""Every flag of train_loopvae.py: LoopVAE's model and Stage-2 flags (add_model_flags) beside the flags of
every run (training/flags.py's parser, its Entry machinery: --preset, --config, which value a flag takes
from a checkpoint), their checks and defaults (resolve, resolve_stage2, resolve_loopvae), the model they
build (build_model) and the checks of a checkpoint a run starts from (check_checkpoint). ENTRY is what
training/flags.py needs of this entry point; training/ never imports this file.
"""
import argparse

import loopvae
from loopvae_train.perceptual import VGG16_FILE, lpips_loss
from training import flags
from training.exits import Fail
from training.flags import SIZES, count, given, int_list, non_negative, positive
from training.registry import SHARED_ARCH_FLAGS, empty_layers

DESCRIPTION = "Train LoopVAE, a looped image tokenizer: Stage 1 (reconstruction) and Stage 2 (adversarial)."
NORMALIZATION = ((0.5,) * 3, (0.5,) * 3)  # its images' mean and std: [0, 1] -> [-1, 1] (App. A.4)
CPU_PRESET = None  # (its CPU-sized arms are the lab's, lab/arms.py: no product preset to name when a CPU estimate passes 3 h)
LOOPVAE = ("num_blocks", "loops", "share", "operator", "num_groups", "latent_dim")  # its architecture (K, ...)
# Flags that --stage2 also takes from its Stage-1 checkpoint unless given: the Stage-1 loss (Stage 2 adds
# a term to it: sec. 3.5, eq. 11) and the data it was trained on.
STAGE1_FLAGS = {"kl_weight", "perceptual", "perceptual_weight", "lpips_weights", "data", "data_dir", "img_size",
                "val_labels"}


def diffaug_policy(s):
    v = [] if s == "none" else [t.strip() for t in s.split(",") if t.strip()]
    if not set(v) <= set(loopvae.DIFFAUG):
        raise argparse.ArgumentTypeError(f"expected none or comma-separated of {', '.join(loopvae.DIFFAUG)}, got {s!r}")
    return v


diffaug_policy.comma_separated = True  # (a --config file may give it as a JSON list: flags.config_value)


def get_parser():
    """train_loopvae.py's parser (training/flags.py's, with ENTRY)."""
    return flags.get_parser(ENTRY)


def add_model_flags(p):
    """LoopVAE's model flags: its sizes, its own group and Stage 2's."""
    a = p.add_argument_group('model').add_argument
    a("--model", default="loopvae", choices=["loopvae"], help="model family (args.json names it)")
    a("--size", choices=list(SIZES), help="named width: ti D=192 h=3, s 384/6, b 768/12, l 1024/16; explicit "
      "flags override it (default: s, the paper's width 384)")
    a("--embed-dim", type=positive(int), help="the core's width (default: by --size)")
    a("--depth", type=positive(int), help="block applications per branch, --num-blocks x the sum of --loops "
      "(default: that; another value is refused)")
    a("--num-heads", type=positive(int), help="attention heads of --operator vit (default: by --size)")
    a("--mlp-ratio", type=positive(float), default=4.0, help="MLP hidden width / D")
    a("--num-blocks", type=positive(int), help="K, the blocks of its core (default: 4)")
    a = p.add_argument_group('model: LoopVAE', 'loopvae.py: a tokenizer, trained to reconstruct its images '
                             '(Stage 1)').add_argument
    a("--loops", type=int_list, default="1,2,4", help="loopvae: passes of the core at each scale in traversal "
      "order (encoder 2x, 4x, 8x; decoder 8x, 4x, 2x), one scale per entry; K x their sum block applications "
      "per branch")
    a("--share", default="global", choices=["global", "scale", "none"], help="loopvae: which passes share "
      "the core's K blocks: global = all (K stored), scale = the passes of one scale (S x K), none = no "
      "two passes (K x sum of --loops); the same block applications")
    a("--operator", default="cnn", choices=["cnn", "vit"], help="loopvae: the core's block: cnn = AdaGN "
      "ConvNeXt-style (the paper's main model); vit = AdaLN attention with 2-D RoPE, --num-heads heads (its "
      "ablation)")
    a("--num-groups", type=positive(int), default=32, help="loopvae --operator cnn: GroupNorm groups of the AdaGN "
      "blocks and both heads; must divide --embed-dim. The paper's width 384 has 12 channels per group; at width 32 "
      "(the c100-mini-loopvae-* presets) 32 groups are one channel each, an InstanceNorm")
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
    a = p.add_argument_group('model: LoopVAE Stage 2', 'loopvae_train/adversarial.py; sec. 3.5 and App. A.1 of the paper: '
                             'the Stage-1 loss + an adaptive hinge GAN term').add_argument
    a("--stage2", metavar="CKPT", help="loopvae: Stage 2 from this Stage-1 checkpoint (or run folder): its weights, "
      "and its architecture, loss (--kl-weight, --perceptual ...) and data flags (unless given); optimizer, "
      "schedule and step count start fresh (as --finetune), the discriminator is new; the paper's Stage-2 lr is "
      "5e-5 (--lr). --resume a Stage-2 run with the same flags: one ckpt.pt holds generator and discriminator")
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
    a("--diffaug", type=diffaug_policy, default=",".join(loopvae.DIFFAUG), help="--stage2: DiffAugment-style "
      "augmentation of what the discriminator sees, comma-separated of color, translation, cutout, or none "
      "(the paper: probability 1, cutout 0.2; the policy is our choice, DiffAugment's)")


# ----------------------------------------------------------------------------- resolving
def resolve(args, p, img_size):
    """Fill size defaults and check every flag combination, naming the flag on error (p.error, one line)."""
    dim, heads = SIZES[args.size or "s"]
    args.embed_dim = args.embed_dim or dim
    args.num_heads = args.num_heads or heads
    resolve_stage2(args, p)
    resolve_loopvae(args, p, img_size)
    wrong = flags.too_small(args)  # (the widths after rounding: --mlp-ratio x --embed-dim >= 1)
    if wrong:
        p.error(wrong)
    flags.resolve_run(args, p)
    return args


STAGE2_FLAGS = ("disc", "disc_weights", "gan_weight", "gan_start", "r1_gamma", "r1_every", "disc_lr", "diffaug")


def resolve_stage2(args, p):
    """Check the flags of LoopVAE's Stage 2 (--stage2), naming the flag (p.error, one line)."""
    if not args.stage2:
        on = given(p, STAGE2_FLAGS)
        if on:
            p.error(f"{', '.join(on)}: Stage-2 flags; add --stage2 CKPT, the Stage-1 loopvae checkpoint to continue")
        return
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


# Flags of every entry point's run that are a classifier's (training/flags.py's add_data_flags,
# add_run_flags) and would change a LoopVAE run silently, or do nothing (no labels reach its loss, a
# tokenizer has no depths to vary, its crops are its own): resolve_loopvae refuses each one given.
CLASSIFIER_FLAGS = ("mixup", "cutmix", "bce", "label_smoothing", "eval_depths", "eval_crop_ratio")


def resolve_loopvae(args, p, img_size):
    """loopvae's part of resolve: --num-blocks is K (default 4), args.depth becomes the block
    applications per branch, K x sum(--loops) (eq. 5; --depth may only repeat it); --compile
    compiles the blocks unless --compile-scope says otherwise. p.error (one line) for a classification
    flag (CLASSIFIER_FLAGS) that is given."""
    on = given(p, CLASSIFIER_FLAGS)
    if on:
        p.error(f"{', '.join(on)}: classification flags; loopvae is a tokenizer (it reconstructs its images: "
                "no classes, patches or depths to vary), leave them out")
    if img_size < loopvae.SSIM_WINDOW:  # each evaluation's SSIM: checked now, not after the first epoch
        p.error(f"--img-size {img_size}: loopvae's validation SSIM needs images of at least {loopvae.SSIM_WINDOW}x"
                f"{loopvae.SSIM_WINDOW} (its window); use --img-size {loopvae.SSIM_WINDOW} or more")
    args.num_blocks = args.num_blocks or 4
    depth = args.num_blocks * sum(args.loops)
    if args.depth not in (None, depth):
        p.error(f"--depth {args.depth} (given, or a checkpoint's): loopvae's depth is --num-blocks x the sum of "
                f"--loops = {args.num_blocks} x {sum(args.loops)} = {depth} block applications per branch; leave "
                "--depth out")
    args.depth = depth
    if args.compile and not args.compile_scope:  # the whole unrolled model compiles for minutes
        args.compile_scope = "blocks"


# ----------------------------------------------------------------------------- the model and its checkpoints
def build_model(args, img_size):
    """LoopVAE of the resolved flags `args` at `img_size` (its weights fit any size divisible by
    2^len(--loops)), with the LPIPS term of --perceptual lpips for training (an evaluation needs none).
    Raises Fail (one line) for sizes it refuses."""
    try:
        model = loopvae.LoopVAE(img_size=img_size, embed_dim=args.embed_dim, num_blocks=args.num_blocks,
                                loops=args.loops, latent_dim=args.latent_dim, share=args.share,
                                operator=args.operator, num_groups=args.num_groups, mlp_ratio=args.mlp_ratio,
                                num_heads=args.num_heads, lambda_kl=args.kl_weight, lambda_p=args.perceptual_weight)
    except ValueError as e:
        raise Fail(str(e))
    empty = empty_layers(model)
    if empty:  # (flags.too_small names the flags first; this is what any other conversion to 0 would build)
        raise Fail(f"--model loopvae: {len(empty)} layer(s) of size 0, e.g. {empty[0]}: a flag's value became a "
                   "width of 0 (--mlp-ratio x --embed-dim, ...); give larger sizes")
    if args.perceptual == "lpips" and not args.eval_only:  # a loss term: an evaluation needs none
        model.set_perceptual(lpips_loss(args.lpips_weights))
    return model


def build_listed(args, img_size, num_classes):
    """The model of a preset for --list-presets (its shapes only: no LPIPS weights)."""
    return build_model(argparse.Namespace(**{**vars(args), "perceptual": "none"}), img_size)


def arch():
    """The flags (dests) that shape LoopVAE: --stage2 and --finetune take them from a checkpoint unless
    given; --resume refuses a change."""
    return set(SHARED_ARCH_FLAGS) | set(LOOPVAE)


def check_checkpoint(ck, path, flag, args, said):
    """--stage2 continues a Stage-1 LoopVAE checkpoint (a Stage-2 one is continued with --resume, not restarted
    with a new discriminator); --resume continues a checkpoint of the same stage (Stage 2: --stage2 given).
    Raises Fail naming what the checkpoint is (`said`: flags.check_source's words for it)."""
    saved = ck["args"] if isinstance(ck, dict) and isinstance(ck.get("args"), dict) else {}
    stage2 = isinstance(ck, dict) and ck.get("adversary") is not None
    if flag == "--stage2":
        if saved.get("model") != "loopvae":
            raise Fail(f"--stage2 {path}: {said}, not a LoopVAE one; Stage 2 continues the ckpt.pt of a "
                       "train_loopvae.py Stage-1 run")
        if stage2:
            raise Fail(f"--stage2 {path}: a Stage-2 checkpoint (its run had --stage2 {saved.get('stage2')}); continue "
                       f"it with --resume {path}, or start Stage 2 again from its Stage-1 checkpoint")
    if flag == "--resume" and not args.eval_only and saved.get("model") == "loopvae" and stage2 != bool(args.stage2):
        raise Fail(f"--resume {path}: a Stage-2 checkpoint (its run had --stage2 {saved.get('stage2')}); give its "
                   "Stage-2 flags" if stage2 else f"--resume {path}: a Stage-1 checkpoint; start Stage 2 from it in a "
                   f"new --out-dir with --stage2 {path}, or leave out --stage2")


def train_py_defaults():
    """{dest: default} of train.py's flags: an older LoopVAE run's args.json (train.py trained it) holds each;
    --config leaves out those LoopVAE has not, with a note where one is not at its default (read_config)."""
    return {a.dest: flags.parsed_default(a, a.default) for a in flags.get_parser()._actions if a.dest != "help"}


ENTRY = flags.Entry("train_loopvae.py", DESCRIPTION, add_model_flags, resolve, build_listed, arch,
                    starts={"finetune": set(), "stage2": STAGE1_FLAGS}, checkpoints=("finetune", "stage2"),
                    kind="a LoopVAE one", linked={"loops": ("depth",)}, eval_flags=frozenset({"rfid"}),
                    check=check_checkpoint, foreign=train_py_defaults)
