"""The lab's study arms (issue 78): name -> (what it is, train.py flags by argparse name), and what each
cost (TIMES, measured or estimated). The product's presets.py holds the papers' protocols and the first
run only; the lab turns an arm into a flags file and runs `python ENTRY --config FILE` (ENTRY: train.py
unless ENTRIES names another entry point for it):

    python lab/arms.py c100-mini-bvit            # writes runs/arms/c100-mini-bvit.json, prints "train.py FILE"
    python lab/arms.py --list                    # every arm, its time on 2 CPU cores and its description

The file is named after the arm, so a run's args.json records which arm ran ("config": ".../ARM.json").

Families:
- `c100-mini-*`: the CPU-scale CIFAR-100 protocol (lab/docs/results.md; lab/reproduce_mini.sh), sized for 2 CPU
  cores (each arm's measured time in TIMES), every paper claim as a pair of arms; `c100-mini-init-*`, the
  structured-init claims' arms on an 8 x 8 patch grid and the paper's base init;
- `c100-gpu-*`: every arm of the mini study and of reViT's comparisons at Ti width on the c100-* recipe
  (presets.CIFAR) without per-image RandAugment and with 50 epochs, so that it runs on the GPU-resident loader
  (lab/gpu_study.sh);
- `c100-mini-loopvae-*`: LoopVAE's sharing scopes and an unlooped hierarchy at 32 px, and `c100-mini-loopvae-gan`,
  Stage 2 (adversarial) of the global arm;
- PROBES: the frozen-backbone probe protocols of lab/probe.py --preset.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from presets import CIFAR  # noqa: E402  (the product's c100-* recipe, the GPU study's base)

ARMS = {}  # name -> (what it is, flags): filled below, in the order --list prints them
PAPER = {}  # name -> the paper's number an arm aims at, where it is not "none (an arm of a claim)"

# CPU-scale CIFAR-100 protocol ("mini"). Chosen for time to accuracy on 2 CPU cores (docs/presets.md
# "the mini protocol (issue 11), what was tried"): a small ViT (D=96, 3 heads, patch 8: 16 tokens, so 3.8x
# the images/s of patch 4, which buys 10 epochs instead of 3 in the same time), 8 block applications
# (so that Euler, Heun and RK4 all fit 8 block evaluations), batch 128, a warmup of half an epoch
# and a cosine decay to ~0, crop + flip only (the batched loader: --workers 0), label smoothing, no
# MixUp/RandAugment/drop path (they pay off only over long schedules), the class token and the
# structured attention init (vit+default in lab/reproduce_mini.sh is the default-init control). Every recurrent arm is evaluated at 0.5x,
# 1x, 2x and 4x its trained depth.
MINI = dict(data="cifar100", embed_dim=96, num_heads=3, mlp_ratio=4.0, patch_size=8, depth=8, epochs=10,
            batch_size=128, opt="adamw", lr=2e-3, min_lr=1e-5, weight_decay=0.05, warmup_epochs=0.5,
            clip_grad=1.0, label_smoothing=0.1, mixup=0.0, cutmix=0.0, randaug=0.0, three_augment=False,
            drop_path=0.0, ema=0.0, init="structured", bce=False, gap=False, workers=0, save_every=100,
            eval_depths=[4, 8, 16, 32])


def study_arms(family, steps, wide, narrow, stages, lora_rank):
    """The arms of the CIFAR-100 study at one scale, name -> (what it is, model flags): every paper
    claim as a pair of arms, and reViT's comparisons. steps: block applications of the recurrent
    arms (depth of the untied ones); wide / narrow: the width flags of the matched-parameter pair
    (a one-block bViT vs an untied ViT); stages: deep-supervision stages; lora_rank: the LoRA
    baseline's rank. Arm names as in lab/summarize_mini.py's claims."""
    other = lambda arm: f"c100-{family}-{arm}"  # noqa: E731
    flags = lambda kw: " ".join(f"--{k.replace('_', '-')} {v}" for k, v in kw.items())  # noqa: E731
    arms = {
        "vit": (f"untied ViT, {steps} blocks; matched FLOPs with {other('bvit')}", dict(model="vit", eval_depths=None)),
        "bvit": (f"bViT: one block x {steps} steps; matched FLOPs with {other('vit')}", dict(model="bvit")),
        "bvit-wide": (f"bViT, one wider block x {steps} steps ({flags(wide)}); matched parameter memory with "
                      f"{other('vit-narrow')}", dict(model="bvit", **wide)),
        "vit-narrow": (f"untied ViT, {steps} narrower blocks ({flags(narrow)}); matched parameter memory with "
                       f"{other('bvit-wide')}", dict(model="vit", **narrow, eval_depths=None)),
        "bvit-ds": (f"{other('bvit')} with stage-wise deep supervision, {stages} stages of {steps // stages} steps",
                    dict(model="bvit", stages=stages)),
        # reViT at fixed depth: Table 6, the supervised recipe of Tables 1, 3, 5 and 10, has no depth dropout
        "revit-e1": ("reViT E=1 (the tied block), fixed depth", dict(model="revit", experts=1)),
        "revit-e4": ("reViT E=4 depth-programmed FFN experts, fixed depth", dict(model="revit", experts=4)),
        # SR-ViT: a body of half the steps applied R times; R=2 has the FLOPs of the other arms
        "srvit-r1": (f"SR-ViT, {steps // 2}-layer body x 1 recursion (0.5x the FLOPs of the {steps}-step arms)",
                     dict(model="srvit", depth=steps // 2, recursions=1, eval_depths=[1, 2, 4])),
        "srvit-r2": (f"SR-ViT, {steps // 2}-layer body x 2 recursions, mixed per token",
                     dict(model="srvit", depth=steps // 2, recursions=2, eval_depths=[1, 2, 4, 8])),
    }
    # reViT's comparisons (Table 3 at U = 1 as appendix B adapts each baseline; revit_moe.py): the revit-e4 arm
    # with its FFN chosen as each baseline's rule, and the layer-wise LoRA baseline on the E=1 block (Table
    # 10). Same backbone, fixed depth and recipe.
    for routing, what in (("lory", "merged per image from the pooled state entering the step (Lory)"),
                          ("smear", "merged per image from its input's token mean, no auxiliary loss (SMEAR)"),
                          ("deepseek", "sigmoid top-1 of 4 routed + 1 shared expert at ehr 2, bias balancer "
                                       "(DeepSeek-V3)"),
                          ("qwen3", "softmax top-1 of 4 experts at ehr 4, renormalized (Qwen3)"),
                          ("moeut", "sigmoid-gated top-1 of 4 experts at ehr 4 (MoEUT)"),
                          ("remoe", "4 experts at ehr 1 on every token, ReLU gates, sparsity controller (ReMoE)"),
                          ("softmoe", "patch-count slots over 4 full-width experts (Soft-MoE)")):
        arms[f"revit-{routing}"] = (f"reViT E=4 with its FFN {what}, U = 1; compare {other('revit-e4')}",
                                    dict(model="revit", experts=4, routing=routing))
    arms["revit-lora"] = (f"reViT E=1 + layer-wise LoRA, rank {lora_rank} per step on qkv, proj, fc1, fc2",
                          dict(model="revit", experts=1, lora_rank=lora_rank))
    for solver, n in (("euler", steps), ("heun", steps // 2), ("rk4", steps // 4)):  # equal NFE: `steps`
        arms[f"odevit-{solver}"] = (
            f"ODE-ViT, dz/dt = F(z) - z, {solver} x {n} steps over T = {steps} (NFE {steps})",
            dict(model="odevit", solver=solver, depth=n, horizon=float(steps),  # odevit: depth = solver steps
                 eval_depths=[max(1, n // 2), n, 2 * n, 4 * n]))
    return arms


def elastic_arms(family, recipe):
    """reViT's elastic depth as the paper's second stage (A.2-A.3: the trained models "subsequently undergo
    the elastic-depth training", per-image depth dropout 0.3): the fixed-depth revit-e1 / revit-e4 run of the
    same seed (runs/FAMILY/ARM/seed0; the study scripts pass each seed's) continued with --finetune, and a
    control continued identically at depth dropout 0, so that what elastic depth changes is not the extra
    training. How long is our choice (the paper does not say): 30 % of the recipe's epochs at a quarter
    of its peak lr, warmup a twentieth of the continuation. name -> (what it is, flags)."""
    epochs = max(1, round(0.3 * recipe["epochs"]))
    cont = dict(epochs=epochs, lr=recipe["lr"] / 4, warmup_epochs=epochs / 20)
    arms = {}
    for e in (1, 4):
        src = f"runs/{family}/revit-e{e}/seed0"
        arms[f"revit-e{e}-elastic"] = (
            f"c100-{family}-revit-e{e} continued {epochs} epochs with elastic depth (depth dropout 0.3, A.2) "
            f"from its fixed-depth run ({src})", dict(model="revit", experts=e, depth_dropout=0.3, finetune=src, **cont))
        arms[f"revit-e{e}-cont"] = (
            f"c100-{family}-revit-e{e} continued {epochs} epochs at fixed depth from its run ({src}): the control of "
            f"c100-{family}-revit-e{e}-elastic", dict(model="revit", experts=e, depth_dropout=0.0, finetune=src, **cont))
    return arms


# Matched parameter memory at this scale: bViT D=112 (187,140 params) vs untied ViT D=42 (186,958);
# rank 16 at D=96 is the paper's LoRA rank 64 at D=384 (appendix B.1; like there, LoRA stores more than E=4).
MINI_ARMS = study_arms("mini", 8, dict(embed_dim=112, num_heads=4), dict(embed_dim=42, num_heads=3), 4, 16)
MINI_ARMS.update(elastic_arms("mini", MINI))
# The papers' claims never tested before (issue 64; lab/claims.py registers them). Training Crossroads'
# black-box field dz/dt = F(z) beside the state-subtracted c100-mini-odevit-euler, at the same NFE (8); the solver
# arms again at a second NFE budget, 4 block evaluations over T = 4 (Euler h = 1, Heun h = 2, RK4 h = 4: the same
# step size per block evaluation as at NFE 8), so that the RK4-minus-Euler and Heun-minus-Euler gains are measured
# in two settings; and bViT's width trend, the matched-FLOPs pair (vit, bvit) again at half the width (D=48 in 3
# heads of 16): the ViT-minus-bViT gap at D = 48 and 96, same recipe, steps and tokens.
MINI_ARMS["odevit-blackbox"] = ("ODE-ViT with the black-box field dz/dt = F(z), euler x 8 steps over T = 8 (NFE 8); "
                                "compare c100-mini-odevit-euler (dz/dt = F(z) - z)",
                                dict(MINI_ARMS["odevit-euler"][1], field="blackbox"))
for solver, n in (("euler", 4), ("heun", 2), ("rk4", 1)):  # equal NFE: 4
    MINI_ARMS[f"odevit-{solver}-nfe4"] = (
        f"ODE-ViT, dz/dt = F(z) - z, {solver} x {n} steps over T = 4 (NFE 4): the solver claim's second setting",
        dict(model="odevit", solver=solver, depth=n, horizon=4.0, eval_depths=sorted({max(1, n // 2), n, 2 * n, 4 * n})))
NARROW = dict(embed_dim=48, num_heads=3)  # the width trend's narrow pair: half the mini width, 3 heads of 16
MINI_ARMS["vit-d48"] = ("untied ViT D=48 h=3, 8 blocks; matched FLOPs with c100-mini-bvit-d48 (bViT's width trend: the "
                        "gap at D=48 beside c100-mini-vit / -bvit at D=96)", dict(model="vit", **NARROW, eval_depths=None))
MINI_ARMS["bvit-d48"] = ("bViT D=48 h=3: one block x 8 steps; matched FLOPs with c100-mini-vit-d48",
                         dict(model="bvit", **NARROW))
ARMS.update({f"c100-mini-{arm}": (f"mini study arm: {what}", {**MINI, **flags})
                for arm, (what, flags) in MINI_ARMS.items()})


def fig2_arms(family, recipe, depth):
    """The reViT paper's Fig. 2 comparison (sec. 4.4, A.2-A.3) in the second regime: two students distilled
    from the final features alone (--task-weight 0, eq. 5) of the same seed's `vit` teacher (runs/FAMILY/vit/seed0;
    the study scripts pass each seed's), E=4 at a fixed depth `depth` (L): the depth-only gate (reViT) and the
    feature-only gate (--routing smear: a SMEAR-style gate from the step's input, no depth signal, no
    auxiliary loss; B "SMEAR"); then the same elastic-depth stage for both (per-image depth dropout 0.3, retained
    steps renumbered, A.2), continued with the same objective as elastic_arms continues (our length). Every
    arm is evaluated, and probed (probe.py --depth), at 2/3 L, L, 4/3 L and 2 L (the paper's 8, 12, 16, 24 for
    L=12) plus 1/2 L and 4 L (ours). name -> (what it is, flags)."""
    if depth % 3:
        raise ValueError(f"Fig. 2's probe depths 2/3 L and 4/3 L need L divisible by 3, got {depth}")
    teacher = f"runs/{family}/vit/seed0"
    student = dict(model="revit", experts=4, depth=depth, teacher=teacher, distill="feature", task_weight=0.0,
                   eval_depths=[depth // 2, 2 * depth // 3, depth, 4 * depth // 3, 2 * depth, 4 * depth])
    epochs = max(1, round(0.3 * recipe["epochs"]))
    cont = dict(epochs=epochs, lr=recipe["lr"] / 4, warmup_epochs=epochs / 20, depth_dropout=0.3)
    arms = {}
    for arm, routing, gate in (("e4", "depth", "depth-only gate (reViT: the normalized depth, eq. 1)"),
                               ("smear", "smear", "feature-only gate (SMEAR-style: the step input's token mean)")):
        src = f"runs/{family}/revit-{arm}-fig2/seed0"
        arms[f"revit-{arm}-fig2"] = (
            f"Fig. 2 student: reViT E=4, {gate}, L={depth}, distilled from {teacher}'s final features alone "
            "(task weight 0), fixed depth", dict(student, routing=routing))
        arms[f"revit-{arm}-fig2-elastic"] = (
            f"Fig. 2 elastic stage: c100-{family}-revit-{arm}-fig2 continued {epochs} epochs with per-image depth "
            f"dropout 0.3 (A.2), the same objective, from its run ({src})",
            dict(student, routing=routing, finetune=src, **cont))
    return arms


# Fig. 2 at L = 6 (probes at 3, 4, 6, 8, 12, 24), chosen for cost: a student and an elastic stage each fit ~35 min
# of one core of CPU-2 at L = 6 (TIMES below); at L = 12, the paper's own depth (probes at 8, 12, 16, 24), a student
# would take about twice that (its steps cost ~L), so L = 12 is the choice where more time is available.
FIG2_L = 6
ARMS.update({f"c100-mini-{arm}": (f"mini study arm: {what}", {**MINI, **flags})
                for arm, (what, flags) in fig2_arms("mini", MINI, FIG2_L).items()})

# The search for a supervised CPU recipe on which reViT E=4's experts engage (issue 63): on c100-mini-revit-e4 they do
# not (lab/results/revit: eq. 9 term 0.84-0.85, eq. 6 term <= 0.01 at the end). Each candidate changes one thing and is
# sized to at most 60 CPU minutes (TIMES); it engages when its last epoch shows eq. 6 >= 0.1 and eq. 9 <= 0.7
# (lab/claims.py REVIT_E4). Not a protocol of the paper: candidates, run once (seed 0) by lab/README.md's queue.
SEARCH = {"e2": ("E=2 experts (Table 5's largest single step is E=1 -> 2)", dict(experts=2)),
          "long": ("13 epochs instead of 10 (the schedule that fits 60 min)", dict(epochs=13)),
          "wide": ("D=192 in 3 heads (Ti width), 3 epochs", dict(embed_dim=192, num_heads=3, epochs=3, warmup_epochs=0.15)),
          "p4": ("patch 4 (64 tokens, the init arms' grid), 2 epochs", dict(patch_size=4, epochs=2, warmup_epochs=0.25)),
          "router": ("the router (A.1) at 10x the learning rate (--router-lr-scale 10)", dict(router_lr_scale=10.0))}
ARMS.update({f"c100-mini-revit-search-{k}": (f"mini study arm, engagement search: c100-mini-revit-e4 with {what}",
                                                {**ARMS["c100-mini-revit-e4"][1], **flags}) for k, (what, flags) in SEARCH.items()})

# The structured-init claims (issue 50) where a 3x3 prior is local and against the paper's baseline: the mini
# recipe at patch 4, an 8 x 8 grid of patches (the paper's small-dataset runs: 14 x 14 at 224 px; its earlier
# version 16 x 16 at 32 px; patch 8's 4 x 4 grid is nearly covered by one 3 x 3 window), D=96 in 3 heads of 32
# (the structured init puts every head on its offset at head_dim 32 on this grid, docs/models.md), 8 untied blocks.
# Every arm on the paper's base init, PyTorch's defaults (--init-base pytorch; its commands pass
# weight_init=skip), so the "pytorch" arm is its default-init baseline and the others differ only in the
# attention. 65 tokens cost 4.3x patch 8's 17 per image, so 2 epochs instead of 10 (our choice: the whole
# training set for fewer epochs, since a subset needs a loader we do not have), warmup a quarter epoch.
INIT = dict(MINI, model="vit", patch_size=4, epochs=2, warmup_epochs=0.25, init_base="pytorch", eval_depths=None)
INIT_ARMS = {"pytorch": ("PyTorch's default init on every layer, the structured-init paper's baseline", "default"),
             "mimetic": ("mimetic attention init (Q K^T ~ I, V O ~ -I) on the PyTorch base", "mimetic"),
             "structured": ("structured attention init (3x3 impulses, pos_embed x18) on the PyTorch base", "structured")}
ARMS.update({f"c100-mini-init-{arm}": (f"init study arm: untied ViT D=96, 8 blocks, patch 4 (8x8 grid), 2 epochs; "
                                          f"{what}", dict(INIT, init=init)) for arm, (what, init) in INIT_ARMS.items()})

# The study at GPU scale (`c100-gpu-*`, lab/gpu_study.sh): the c100-* recipe made GPU-fast, no
# RandAugment (per-image, CPU-bound), so CIFAR stays on the GPU-resident loader (crop + flip on the
# device; MixUp/CutMix are batch operations there anyway), and 50 epochs instead of 200, so that a
# run takes minutes of an H200. Every arm of the mini study and of reViT's comparisons at Ti width
# (D=192, 3 heads, patch 4: 65 tokens), 12 block applications, evaluated at 0.5x, 1x, 2x and 4x
# its trained depth. The timm (default) init, as the first GPU run; "vit+structured" in
# lab/gpu_study.sh is the init claim's arm (`--init structured`).
GPU = dict(CIFAR, randaug=0.0, epochs=50, warmup_epochs=5.0)
# Matched parameter memory as in the full study (bViT D=384, 1.86 M params, vs untied ViT D=112, 1.85 M);
# rank 32 at D=192 is the paper's rank 64 at D=384.
GPU_ARMS = study_arms("gpu", 12, dict(size="s"), dict(embed_dim=112, num_heads=4), 3, 32)
# bViT's width trend at GPU scale (issue 64): the matched-FLOPs pair again at half the Ti width (D=96 in 3 heads of
# 32), so that the ViT-minus-bViT gap is measured at D=96 and D=192 (vit, bvit), same recipe, steps and tokens.
# (The pair at D=384, an untied ViT-S beside bvit-wide, has 3.9x bvit's FLOPs: est. 13 H200-minutes a run (3.9 x c100-gpu-bvit's 3.3),
# more than a GPU window's 500 s.)
for arm, model, what in (("vit-d96", "vit", "untied ViT D=96 h=3, 12 blocks; matched FLOPs with c100-gpu-bvit-d96"),
                         ("bvit-d96", "bvit", "bViT D=96 h=3: one block x 12 steps; matched FLOPs with c100-gpu-vit-d96")):
    GPU_ARMS[arm] = (f"{what} (bViT's width trend: the gap at D=96 beside c100-gpu-vit / -bvit at D=192)",
                     dict(model=model, embed_dim=96, num_heads=3, **({"eval_depths": None} if model == "vit" else {})))
ARMS.update({f"c100-gpu-{arm}": (f"GPU study arm: {what}; 50 epochs, crop + flip on the GPU",
                                    {**GPU, **flags}) for arm, (what, flags) in GPU_ARMS.items()})
ARMS["c100-gpu-bvit-ti"] = ("GPU study arm c100-gpu-bvit under its first name (the first H200 run: 51.92 % top-1)",
                               ARMS["c100-gpu-bvit"][1])

# The frozen-backbone probes of the same regime (A.3), for probe.py --preset NAME (its flags, filled where the
# command line leaves them out): ImageNet-1k linear, ADE20k linear segmentation, NYUv2 linear + MLP depth, at
# 224 px (our choice: the paper does not give the probes' resolution); and their CPU-scale analogues on
# CIFAR-100 and its mosaics (data.Mosaics: named as our analogue, not as ADE20k or NYUv2).
PROBES = {"in1k-probe-linear": dict(task="linear", data="imagenet", img_size=224),
          "ade20k-probe-seg": dict(task="seg", data="ade20k", img_size=224),
          "nyu-probe-depth": dict(task="depth", data="nyu", img_size=224),
          "c100-probe-linear": dict(task="linear", data="cifar100"),
          "c100-probe-seg": dict(task="seg", data="cifar100", num_train=5000, num_test=1000),
          "c100-probe-depth": dict(task="depth", data="cifar100", num_train=5000, num_test=1000)}

# LoopVAE Stage 1 (loopvae.py; arXiv 2609.11516, sec. 3.5 and App. A.1: L1 + 1.0 LPIPS + 1e-6 KL, global
# batch 32, clip 1.0, bf16, 600k steps; the optimizer and the Stage-1 learning rate are not given).
# CPU scale: CIFAR-100 at 32 px with the paper's f8d16 latent (16 x 4 x 4: 3072 / 256 = the paper's 12x
# compression), K = 4 blocks, width 32 in 4 GroupNorm groups (8 channels per group, the nearest at this width to
# the paper's 384 / 32 = 12; 32 groups would be one channel per group, InstanceNorm), batch 32, 1000 steps
# (0.64 epoch: what fits 10-25 minutes, est. in TIMES), one evaluation at the end on all 10k
# validation images. Our choices: AdamW without weight decay (plain Adam, as latent-diffusion
# autoencoders train), lr 2e-3 (of 1e-3 and 3e-3 over 150 steps, 3e-3 reconstructed better: 15.5 vs
# 14.0 dB; 2e-3 keeps a margin for the longer run), 5 % warmup, cosine to 1e-5; crop + flip on the
# batched loader. The perceptual term is OFF (--perceptual none): LPIPS needs ImageNet weights that
# this CPU machine cannot download, so the loss is L1 + 1e-6 KL only. Arms: the three sharing scopes
# of Table 2 (same 28 block applications per branch, 4 / 12 / 28 stored blocks) and an unlooped
# hierarchy, one pass per scale with a stage per scale (12 applications, 12 stored blocks).
LOOPVAE_MINI = dict(model="loopvae", data="cifar100", embed_dim=32, num_heads=4, num_blocks=4, num_groups=4,
                    latent_dim=16, operator="cnn", kl_weight=1e-6, perceptual="none", epochs=1, max_steps=1000,
                    batch_size=32, opt="adamw", lr=2e-3, min_lr=1e-5, weight_decay=0.0, warmup_epochs=0.05,
                    clip_grad=1.0, ema=0.0, randaug=0.0, three_augment=False, workers=0, save_every=100,
                    eval_batch_size=250)
LOOPVAE_ARMS = {"global": ("global sharing: one 4-block core for every scale and pass (4 stored blocks)",
                           dict(share="global", loops=[1, 2, 4])),
                "scale": ("scale-wise sharing: a 4-block core per scale (12 stored blocks)",
                          dict(share="scale", loops=[1, 2, 4])),
                "none": ("no sharing: 4 blocks per pass (28 stored blocks)", dict(share="none", loops=[1, 2, 4])),
                "unlooped": ("the unlooped hierarchy: one pass per scale, 4 blocks per scale (12 stored blocks, "
                             "12 applications)", dict(share="scale", loops=[1, 1, 1])),
                # Table 2's operator: the Transformer core (4 heads of 8, 8 x 8 windows at the two finest scales,
                # loopvae.py's defaults); ~1.5x a CNN arm's step on the CPU (docs/presets.md, 2026-12-01)
                "vit-global": ("global sharing, Transformer core (4 stored blocks)",
                               dict(share="global", loops=[1, 2, 4], operator="vit")),
                "vit-none": ("no sharing, Transformer core (28 stored blocks)",
                             dict(share="none", loops=[1, 2, 4], operator="vit"))}
for arm, (what, flags) in LOOPVAE_ARMS.items():
    ARMS[f"c100-mini-loopvae-{arm}"] = (
        f"LoopVAE mini study arm: {what}; Stage 1 at 32 px, latent 16x4x4, width 32 in 4 groups, 1000 steps of 32, "
        "perceptual term off (L1 + KL)", {**LOOPVAE_MINI, **flags})
    PAPER[f"c100-mini-loopvae-{arm}"] = (
        "none at 32 px (Table 2, Transformer core, ImageNet-256 Stage 1: PSNR global 31.163, scale-wise 30.412, "
        "unshared 31.043 dB)" if arm != "unlooped" else
        "none (the cost ledger's baseline, sec. 4.7: the looped CNN has 1.57x the MACs of an unlooped one)")
# LoopVAE Stage 2 (training/adversarial.py; sec. 3.5, App. A.1) at the CPU scale, continuing the global arm's Stage-1
# run as lab/reproduce_mini.sh writes it (ARMS=loopvae, seed 0): 200 steps of 32 at the paper's Stage-2 lr
# 5e-5 (generator and discriminator), adaptive weight x 0.5, lazy R1 10 every 16, DiffAugment; our choices:
# the small conv discriminator (the paper's frozen DINOv2 needs weights this machine cannot download), the
# adversarial term from step 50 (the paper's 5,000 of ~600k Stage-2 steps would leave it off for all 200), 5 %
# warmup, cosine to 1e-6.
ARMS["c100-mini-loopvae-gan"] = (
    "LoopVAE mini study arm: Stage 2 (adversarial) of the global arm, 200 steps of 32 from its Stage-1 checkpoint "
    "(runs/mini-loopvae/loopvae-global/seed0), conv discriminator, GAN term from step 50",
    {**LOOPVAE_MINI, **LOOPVAE_ARMS["global"][1], "stage2": "runs/mini-loopvae/loopvae-global/seed0", "max_steps": 200,
     "lr": 5e-5, "min_lr": 1e-6, "disc": "conv", "disc_lr": 5e-5, "gan_weight": 0.5, "gan_start": 50,
     "r1_gamma": 10.0, "r1_every": 16})
PAPER["c100-mini-loopvae-gan"] = ("none at 32 px (Table 1, ImageNet-256 after Stage 2: rFID 0.28, PSNR 32.54 dB, "
                                  "LPIPS 0.048, SSIM 0.91)")

# The paper's number each arm aims at (lab/claims.py compares the arms; none has its own paper number but LoopVAE's).
PAPER = {name: PAPER.get(name, "none (an arm of a claim, lab/docs/results.md)") for name in ARMS}

# What an arm costs, one figure per run: (CPU-2, one H200). CPU-2 = 2 x86_64 cores (lab/docs/results.md).
# Measured figures are lab/docs/results.md's, as written there: the c100-mini-* wall minutes of the
# mini table (CPU-2 AMD EPYC, 2026-11-30, two runs side by side with one thread each, so slower than
# one run alone: c100-mini-srvit-r1 took about 8 min alone on the Intel Xeon, lab/docs/reproduce.md 2026-12-01);
# reViT's comparison arms have only training minutes ("train"; a third run shared the cores for part
# of them); c100-gpu-bvit's training minutes on the H200 (commit f937315). "?": not measured.
TIMES = {name: ("?", "?") for name in ARMS}
MINI_WALL_MIN = {"vit": 23.5, "bvit": 25.7, "bvit-wide": 31.9, "vit-narrow": 10.2, "bvit-ds": 18.9,
                 "odevit-euler": 30.5, "odevit-heun": 29.8, "odevit-rk4": 50.5,
                 "srvit-r1": 13.4, "srvit-r2": 23.6}
TIMES.update({f"c100-mini-{arm}": (f"{m} min, pair", "?") for arm, m in MINI_WALL_MIN.items()})
# Issue 64's arms, measured (lab/results/untested, seeds 0-2, 2026-12-05/06, CPU-2 AMD EPYC, one thread, two runs side by
# side): the mean of done.json's wall minutes (the spread: 16-18, 8-12, 8-10, 8-9, 6-9, 6-9). They were estimated
# before their runs at 0.84x odevit-euler, 0.45x / 0.44x / 0.51x the NFE-8 solver arms, 0.36x vit and 0.37x bvit
# (training steps timed 2026-12-04, docs/presets.md "the arms of issue 64"). (D=192 at this recipe: 3.5x
# c100-mini-vit's step, est. 82 min, pair: over the ~45 CPU-minutes a study run may take, so the wider pair of the
# width trend is the GPU study's, c100-gpu-vit-d96 / -bvit-d96 beside vit / bvit.)
UNTESTED_MIN = {"odevit-blackbox": 16.9, "odevit-euler-nfe4": 9.5, "odevit-heun-nfe4": 8.8, "odevit-rk4-nfe4": 8.5,
                "vit-d48": 7.1, "bvit-d48": 7.0}
TIMES.update({f"c100-mini-{arm}": (f"{m} min, pair", "?") for arm, m in UNTESTED_MIN.items()})
# the GPU width pair: a quarter of c100-gpu-bvit's FLOPs (0.19 vs 0.73 GFLOPs per image): a quarter of its 3.3 min
# by FLOPs, ~1 min (a small model leaves the GPU idle: at most the 3.3)
TIMES.update({f"c100-gpu-{arm}": ("?", "est. 1 min") for arm in ("vit-d96", "bvit-d96")})
# The init arms, estimated (2026-12-03, CPU-2 AMD EPYC, one thread, niced, beside four training runs): a training
# step of batch 128 (forward, backward, AdamW) at patch 4 took 4.0x and 4.5x c100-mini-vit's in two timings
# (median 1.72 vs 0.40 s), so 2 of c100-mini-vit's 10 epochs (23.5 min, pair) x 4.3 = 20 min, pair.
# Measured (lab/results/init, seeds 0-2, 2026-12-03/06, CPU-2 AMD EPYC, two runs side by side): 13-17 min, mean 14.9.
TIMES.update({f"c100-mini-init-{arm}": ("14.9 min, pair", "?") for arm in INIT_ARMS})
# The reViT arms at their paper's protocol (issue 49, 2026-12-03, CPU-2 AMD EPYC; lab/results/revit): the mean wall
# minutes of seeds 0 and 1 (done.json's wall_s), two runs side by side with other jobs on the cores at times
# ("loaded": a quiet pair is faster). E=1's continuations, which the study did not run, are estimated as 3 of the
# 10 epochs.
REVIT_WALL_MIN = {"e1": 43.5, "e4": 43.4, "lory": 68.4, "smear": 68.4, "deepseek": 27.9, "qwen3": 29.1, "moeut": 30.6,
                  "remoe": 22.7, "softmoe": 205.0, "lora": 41.5, "e4-elastic": 10.0, "e4-cont": 10.1}
TIMES.update({f"c100-mini-revit-{r}": (f"{m} min, pair, loaded", "?") for r, m in REVIT_WALL_MIN.items()})
TIMES.update({f"c100-mini-revit-e1-{kind}": (f"est. {0.3 * REVIT_WALL_MIN['e1']:.0f} min, pair", "?") for kind in ("elastic", "cont")})
# The Fig. 2 arms at L = 6, estimated (2026-12-04, CPU-2 AMD EPYC, one thread, beside two training runs): 40 training
# steps took 0.22 s (depth-only gate) and 0.37 s (feature-only gate) a step against 0.32 s for the second regime's
# revit-e4+feature-only at depth 8, whose runs took 23 and 35 min (lab/results/revit-teacher): x 0.68 and x 1.13 of their
# mean, 29 min; the elastic stages 3 of the 10 epochs.
# Fig. 2's chain, measured (lab/results/revit-fig2, 2026-12-05, CPU-2 AMD EPYC, b2aad27, one thread, two lanes): the
# depth-gate students 17-19 min, the feature-gate students 33 min alone on a lane and ~45 beside another run, the
# elastic stages 4.7-5 and 9-10 min.
TIMES.update({"c100-mini-revit-e4-fig2": ("18 min, pair", "?"), "c100-mini-revit-smear-fig2": ("33-45 min, pair", "?"),
              "c100-mini-revit-e4-fig2-elastic": ("5 min, pair", "?"),
              "c100-mini-revit-smear-fig2-elastic": ("10 min, pair", "?")})
# The engagement search was estimated from c100-mini-revit-e4's 43.4 min (pair, loaded): E=2 the same; 13 epochs x 1.3;
# D=192 ~4x a step's FLOPs at 3 of 10 epochs; patch 4 ~4.3x a step (the init arms' measured 4.0-4.5x) at 2 of 10.
# The router at 10x: as c100-mini-revit-e4 (the same step).
# Measured (lab/results/revit-search, seed 0, 2026-12-05 at b8351a4, CPU-2 AMD EPYC, two runs side by side): 14-20 min,
# each under its estimate (e2 43, long 56, wide 52, p4 37, router 43: a quieter machine than the loaded reViT runs).
TIMES.update({"c100-mini-revit-search-e2": ("14.2 min, pair", "?"), "c100-mini-revit-search-long": ("19.9 min, pair", "?"),
              "c100-mini-revit-search-wide": ("16.4 min, pair", "?"), "c100-mini-revit-search-p4": ("14.1 min, pair", "?"),
              "c100-mini-revit-search-router": ("15.3 min, pair", "?")})
TIMES["c100-gpu-bvit"] = TIMES["c100-gpu-bvit-ti"] = ("?", "3.3 min train")
# LoopVAE: estimated from runs of 40-150 steps (CPU-2 AMD EPYC, 2026-12-01, one thread each, two runs
# side by side, other load on the cores for some): 1.07-1.26 s per step of 32 and 2-4 min for the 10k
# validation images with 28 block applications per branch; unlooped 0.57 s per step and 2.3 min; 1000
# steps. in256: 19.2M images at ~9.5 img/s (the paper's 28.5 img/s forward / 3) on one GPU.
# Measured wall times (CPU-2 AMD EPYC, 2026-12-01, one thread, two runs side by side; seed 1 of the first study,
# at 32 GroupNorm groups, whose seed-0 runs shared the cores with more work: 41-54 min; docs/models.md): training +
# evaluation. The group count does not change a step's cost: at 4 groups (2026-12-02) unlooped seed 1 trained in
# 18.2 min beside a third process for part of the time (14.7 min at 32 groups), the gan runs in 9.2 and 9.0 min.
TIMES.update({"c100-mini-loopvae-global": ("32.4 min, pair", "?"), "c100-mini-loopvae-scale": ("33.0 min, pair", "?"),
              "c100-mini-loopvae-none": ("35.9 min, pair", "?"), "c100-mini-loopvae-unlooped": ("17.2 min, pair", "?"),
              "c100-mini-loopvae-gan": ("10.2 min, pair", "?")})
# The Transformer-core arms, measured: seed 1 of the study, the two side by side and nothing else for all but ~1 min
# (CPU-2 AMD EPYC, 2026-12-02; 25.0 and 25.3 min of training). Seed 0 took 59.9 and 60.9 min with more work on the
# cores (48.8 and 49.5 min of training); the estimate was 48 and 53.
TIMES.update({"c100-mini-loopvae-vit-global": ("30.6 min, pair", "?"), "c100-mini-loopvae-vit-none": ("31.6 min, pair", "?")})

# The entry point of an arm, where it is not train.py: LoopVAE, a tokenizer, trains through train_loopvae.py (issue 78,
# item 4).
ENTRIES = {name: "train_loopvae.py" for name in ARMS if name.startswith("c100-mini-loopvae-")}


def entry(name):
    """The script (a path under the repository root) that trains arm `name`: ENTRIES', else train.py."""
    return ENTRIES.get(name, "train.py")


def flags(name):
    """The train.py flags of arm `name` as a --config file holds them ({dest: value}). Raises KeyError naming
    the arm and where the arms are listed."""
    if name not in ARMS:
        raise KeyError(f"{name}: not an arm of lab/arms.py (python lab/arms.py --list lists them)")
    return dict(ARMS[name][1])


def write_config(name, folder=os.path.join(ROOT, "runs", "arms")):
    """Write arm `name`'s flags to FOLDER/NAME.json (atomically: two studies writing one arm at once leave
    one whole file) and return its path; the file is named after the arm, so that a run's args.json
    (its "config") names the arm that ran."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(flags(name), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def kept_config(saved):
    """A kept run's args.json (a dict) as a --config train.py reads today: the runs of the studies recorded
    the study arm as "preset" (c100-mini-..., a preset until issue 78), which presets.py no longer holds;
    their args.json holds every flag anyway, so the preset is dropped where it names an arm of this table."""
    return {k: v for k, v in saved.items() if not (k == "preset" and v in ARMS)}


def main(argv=None):
    p = argparse.ArgumentParser(prog="lab/arms.py", description="Write a study arm's train.py --config file and "
                                "print its entry point and path (or --list the arms).")
    p.add_argument("name", nargs="?", help="an arm, e.g. c100-mini-bvit")
    p.add_argument("--dir", default=os.path.join("runs", "arms"), help="where the file goes (default: runs/arms)")
    p.add_argument("--list", action="store_true", help="print every arm: name, time on CPU-2 / one H200, description")
    a = p.parse_args(argv)
    if a.list:
        for name, (what, _) in ARMS.items():
            cpu, gpu = TIMES[name]
            print(f"{name:36s} {cpu:>24s} {gpu:>14s}  {what}")
        return 0
    if a.name not in ARMS:
        p.error(f"{a.name}: not an arm; python lab/arms.py --list lists them")
    print(entry(a.name), write_config(a.name, a.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
