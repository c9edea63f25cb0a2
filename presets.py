"""Reproduction presets: name -> (what it is, train.py flags by argparse name); PAPER: the paper's
number each aims at; TIMES: what each costs, measured or estimated. Data only: `python train.py
--preset NAME` makes these flags the parser's defaults, so flags given on the command line still
win; `--list-presets` prints one line per preset, `--print-config` shows one resolved.

Three families:
- `c100-mini-*`: the CPU-scale CIFAR-100 protocol (README "Results"; lab/reproduce_mini.sh),
  sized for 2 CPU cores (each arm's measured time in TIMES), every paper claim as a pair of arms;
  `c100-mini-init-*`, the structured-init claims' arms on an 8 x 8 patch grid and the paper's base init;
- `c100-*`: the Training Crossroads study arms at full scale (200 epochs; GPU), and `c100-gpu-*`,
  every arm of the mini study and of reViT's comparisons at Ti width on that recipe without
  per-image RandAugment and with 50 epochs, so that it runs on the GPU-resident loader
  (lab/gpu_study.sh);
- `in1k-*`: the papers' ImageNet-1k protocols (the DeiT III recipe; reViT's: its paper's Table 6; SR-ViT's: the DeiT recipe, our reading);
- LoopVAE, a tokenizer (Stage 1): `c100-mini-loopvae-*`, its sharing scopes and an unlooped hierarchy
  at 32 px, sized for 2 CPU cores, and `c100-mini-loopvae-gan`, Stage 2 (adversarial) of the global arm;
  `in256-loopvae-cnn`, the paper's ImageNet-256 recipe (GPU).
"""
# A paper's protocol as one flag: name -> (what it is and the paper number it aims at, flags by
# argparse name). The flags become the parser's defaults, so flags given explicitly still win.
# CIFAR-100 arms of the Training Crossroads study, whose protocol was not found: one recipe for all,
# our choice: the 32x32 recipe of the structured-init authors' earlier code (github.com/osiriszjq/
# structured_init: AdamW 1e-3, batch 512, 200 epochs, warmup 10, clip 3.0, RandAugment m9) plus their
# later recipe's MixUp, CutMix, label smoothing and drop path; Ti width, patch 4, 12 steps, evaluated
# at 0.5x to 4x the trained depth ("beyond the training horizon").
CIFAR = dict(data="cifar100", size="ti", patch_size=4, depth=12, epochs=200, batch_size=512, opt="adamw",
             lr=1e-3, min_lr=1e-6, weight_decay=0.05, warmup_epochs=10.0, clip_grad=3.0, randaug=9.0,
             mixup=0.8, cutmix=1.0, label_smoothing=0.1, drop_path=0.1, eval_depths=[6, 12, 24, 48])
PRESETS = {
    "c100-vit-ti": ("study arm: untied ViT-Ti/4, 12 blocks; matched FLOPs with c100-bvit-ti",
                    dict(model="vit")),
    "c100-bvit-ti": ("study arm: bViT-Ti/4, one block x 12 steps, naive recurrence; matched FLOPs with "
                     "c100-vit-ti", dict(model="bvit")),
    "c100-bvit-ti-ds3": ("study arm: c100-bvit-ti with deep supervision, 3 stages of 4 steps",
                         dict(model="bvit", stages=3)),
    "c100-bvit-s": ("study arm: bViT-S/4 (wider: D=384, 1.86 M params); matched parameter memory with "
                    "c100-vit-narrow", dict(model="bvit", size="s")),
    "c100-vit-narrow": ("study arm: untied ViT D=112 h=4 (narrower, 1.85 M params), 12 blocks; matched "
                        "parameter memory with c100-bvit-s", dict(model="vit", embed_dim=112, num_heads=4)),
}
for solver, steps in (("euler", 12), ("heun", 6), ("rk4", 3)):  # equal NFE: 12 block evaluations
    PRESETS[f"c100-odevit-{solver}-{steps}"] = (
        f"study arm: ODE-ViT-Ti/4, dz/dt = F(z) - z, {solver} x {steps} steps over T = 12 (NFE 12)",
        dict(model="odevit", solver=solver, depth=steps, horizon=12.0,  # odevit: depth = solver steps
             eval_depths=sorted({max(1, steps // 2), steps, 2 * steps, 4 * steps})))
PRESETS["c100-odevit-blackbox-euler-12"] = (
    "study arm: c100-odevit-euler-12 with the black-box field dz/dt = F(z)",
    dict(PRESETS["c100-odevit-euler-12"][1], field="blackbox"))
PRESETS = {name: (what, {**CIFAR, **flags}) for name, (what, flags) in PRESETS.items()}

# README's first run, the one that fits a laptop: a bViT (one block x 6 steps, D=128) for 300 steps of 64 on
# CIFAR-100 on the CPU (2 min 46 s alone on 2 cores; README "The first run").
FIRST = dict(model="bvit", data="cifar100", embed_dim=128, num_heads=4, patch_size=4, depth=6, batch_size=64,
             max_steps=300, device="cpu")
PRESETS = {"cpu-first-bvit": ("README's first run: bViT D=128, one block x 6 steps, 300 steps of 64 on CIFAR-100, "
                              "on a CPU", FIRST), **PRESETS}  # (listed first: the run a laptop starts with)

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
PRESETS.update({f"c100-mini-{arm}": (f"mini study arm: {what}", {**MINI, **flags})
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
PRESETS.update({f"c100-mini-{arm}": (f"mini study arm: {what}", {**MINI, **flags})
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
PRESETS.update({f"c100-mini-revit-search-{k}": (f"mini study arm, engagement search: c100-mini-revit-e4 with {what}",
                                                {**PRESETS["c100-mini-revit-e4"][1], **flags}) for k, (what, flags) in SEARCH.items()})

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
PRESETS.update({f"c100-mini-init-{arm}": (f"init study arm: untied ViT D=96, 8 blocks, patch 4 (8x8 grid), 2 epochs; "
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
PRESETS.update({f"c100-gpu-{arm}": (f"GPU study arm: {what}; 50 epochs, crop + flip on the GPU",
                                    {**GPU, **flags}) for arm, (what, flags) in GPU_ARMS.items()})
PRESETS["c100-gpu-bvit-ti"] = ("GPU study arm c100-gpu-bvit under its first name (the first H200 run: 51.92 % top-1)",
                               PRESETS["c100-gpu-bvit"][1])

# ImageNet-1k, the reViT paper's Table 1 (arXiv 2610.12448, A.3): "reViT, DeiT III, and Raptor use the same data,
# augmentation, optimizer, and epoch schedule", its Table 6, the DeiT III recipe as it gives it: AdamW, peak lr 4e-3
# (S) / 3e-3 (B, L), weight decay 0.05, batch 2048, cosine, 300 epochs, warmup 5 epochs from 1e-6, binary
# cross-entropy, label smoothing 0, 3-Augment with color jitter 0.3 (--color-jitter's default), MixUp 0.8 / CutMix
# 1.0, repeated augmentation (3 copies, DeiT's RASampler: Table 6 says "yes", not how many), random erasing 0 (none
# here), 224 px for training and evaluation, evaluation crop ratio 1.0, L = 12 (24 for L: --size). So every Table 1
# row, in1k-vit-* (DeiT III), in1k-bvit-*-k4 (Raptor-like) and in1k-revit-*, and bViT (in1k-bvit-*) beside them, is
# TABLE6 with its model: they differ only in the model's flags (and reViT's three regularizer weights, lambdas
# 1e-2 / 1e-3 / 1e-3 for E > 1, Table 6's "expert bank" rows, which only a reViT has). Where Table 6 is silent,
# our choice, from DeiT III: LayerScale init 1e-4, stochastic depth S 0.05 / B 0.1 / L 0.45, clip 1.0, min lr 1e-5,
# AdamW's betas (0.9, 0.999) (torch's).
TABLE6 = dict(data="imagenet", img_size=224, patch_size=16, epochs=300, batch_size=2048, opt="adamw", min_lr=1e-5,
              weight_decay=0.05, warmup_epochs=5.0, warmup_lr=1e-6, clip_grad=1.0, label_smoothing=0.0, mixup=0.8,
              cutmix=1.0, randaug=0.0, three_augment=True, bce=True, layer_scale=1e-4, repeated_aug=3,
              eval_crop_ratio=1.0)
TABLE6_LR = {"s": 4e-3, "b": 3e-3, "l": 3e-3}  # peak lr per size (Table 6)
REVIT_BANK = dict(lambda_bal=1e-2, lambda_z=1e-3, lambda_div=1e-3)  # Table 6's expert-bank rows (reViT only)
DEIT3_DROP_PATH = {"s": 0.05, "b": 0.1, "l": 0.45}  # stochastic depth per size (our reading; Table 6 is silent)
# DeiT III's own release (github.com/facebookresearch/deit, README_revenge.md, its ImageNet-1k training commands)
# differs from Table 6: LAMB (fusedlamb; LAMB eps 1e-8, DeiT's --opt-eps default), 800 epochs, B and L trained at
# 192 px (then fine-tuned 20 epochs at 224, not in this preset), stochastic depth S 0.05 / B 0.2 / L 0.45, no
# gradient clipping and evaluation crop 0.875 (main.py's defaults; the commands set neither); the rest as Table 6
# (lr 4e-3 / 3e-3 / 3e-3, weight decay 0.05, batch 2048, warmup 5 from 1e-6, BCE, 3-Augment, color jitter 0.3,
# MixUp / CutMix, repeated augmentation, no random erasing). Kept as in1k-vit-{s,b,l}16-deit3.
DEIT3_RELEASE = {"s": dict(lr=4e-3, drop_path=0.05, img_size=224), "b": dict(lr=3e-3, drop_path=0.2, img_size=192),
                 "l": dict(lr=3e-3, drop_path=0.45, img_size=192)}
DEIT3 = dict(TABLE6, opt="lamb", epochs=800, clip_grad=0.0, eval_crop_ratio=0.875)
# SR-ViT (SoftMoR, abstract only): the DeiT recipe (Touvron et al. 2021, arXiv 2012.12877, Table 9), our reading
# of the abstract's R = 1 number: 79.83 % is DeiT-S under the original DeiT recipe (79.8), not DeiT III's.
# AdamW, lr 5e-4 x batch / 512 (batch 1024: 1e-3), weight decay 0.05, 300 epochs, warmup 5, cosine to 1e-5, no
# gradient clipping, cross-entropy with label smoothing 0.1, MixUp 0.8 / CutMix 1.0, drop path 0.1, no LayerScale.
# RandAugment m9 as `--randaug 9` (torchvision's RandAugment, 2 ops): timm's mstd 0.5 magnitude noise is not
# implemented. Repeated augmentation: 3 copies (--repeated-aug, DeiT's RASampler). Random erasing 0.25 (--reprob,
# timm's pixel mode, one rectangle, as DeiT's main.py).
DEIT = dict(data="imagenet", img_size=224, patch_size=16, epochs=300, batch_size=1024, opt="adamw",
            lr=5e-4 * 1024 / 512, min_lr=1e-5, weight_decay=0.05, warmup_epochs=5.0, clip_grad=0.0,
            label_smoothing=0.1, mixup=0.8, cutmix=1.0, randaug=9.0, three_augment=False, bce=False, drop_path=0.1,
            repeated_aug=3, reprob=0.25)
# ImageNet-1k top-1 (%) each aims at: reViT's Table 1 (DeiT III, Raptor k=4, reViT E=4, all under Table 6) and Table 5
# (reViT E = 1, 2, 3, 4, 8), SoftMoR's abstract, DeiT III's release (README_revenge.md, 800 epochs).
TABLE1 = {"vit": {"s": "79.9", "b": "82.8", "l": "84.1"}, "raptor": {"s": "78.0", "b": "82.8", "l": "83.7"}}
TABLE5 = {"s": {1: "70.6", 2: "74.2", 3: "76.5", 4: "78.2", 8: "80.2"},
          "b": {1: "76.4", 2: "81.9", 3: "82.5", 4: "83.0", 8: "83.2"},
          "l": {1: "78.3", 2: "83.0", 3: "83.5", 4: "83.8", 8: "84.0"}}
RELEASE_TOP1 = {"s": "81.4 (800 epochs at 224 px)", "b": "83.8 (800 epochs at 192 px, fine-tuned at 224: the "
                "fine-tuning is not in this preset)", "l": "84.9 (800 epochs at 192 px, fine-tuned at 224: the "
                "fine-tuning is not in this preset)"}
AIMS = {"in1k-srvit-s16-r1": "79.83 (SoftMoR abstract; DeiT-S under the DeiT recipe: 79.8)",
        "in1k-srvit-s16-r4": "82.48 (SoftMoR abstract)"}
for size in "sbl":
    AIMS[f"in1k-vit-{size}16"] = f"{TABLE1['vit'][size]} (DeiT III-{size.upper()}/16 under Table 6, reViT Table 1)"
    AIMS[f"in1k-bvit-{size}16-k4"] = (f"{TABLE1['raptor'][size]} (Raptor k=4 under Table 6, reViT Table 1; Raptor's "
                                      "phases are its own, ours equal)")
    AIMS[f"in1k-vit-{size}16-deit3"] = f"{RELEASE_TOP1[size]} (DeiT III's release)"
    for e, top1 in TABLE5[size].items():
        AIMS[f"in1k-revit-{size}16-e{e}"] = f"{top1} (reViT Table 5" + (", Table 1)" if e == 4 else ")")
# The paper's number each preset aims at (train.py prints it with the preset and in --list-presets).
PAPER = {name: "none (an arm of a claim, README \"Results\")" for name in PRESETS}
PAPER["cpu-first-bvit"] = "none (README's first number: top-1 7.30 %, top-5 25.29 % on an Intel Xeon and on CPU-2, AMD EPYC)"
for size in "sbl":
    arms = [("vit", "ViT", {}), ("bvit", "bViT", {}), ("bvit", "Raptor-like bViT", {"k": 4})]
    arms += [("revit", "reViT", {"experts": e}) for e in (1, 2, 3, 4, 8) if e != 3 or size == "s"]  # E=3: Table 5, S
    arms += [("srvit", "SR-ViT", {"recursions": r}) for r in (1, 2, 3, 4)] if size == "s" else []
    for model, title, extra in arms:
        name = f"in1k-{model}-{size}16" + "".join(f"-{k[0]}{v}" for k, v in extra.items())  # -e4, -r2, -k4
        aim = f"ImageNet-1k top-1 {AIMS[name]}" if name in AIMS else "no paper number"
        what = f"{title}-{size.upper()}/16" + "".join(f" {k[0].upper()}={v}" for k, v in extra.items())
        if model == "srvit":  # the DeiT recipe (our reading of SoftMoR's R = 1 number, DEIT above)
            PRESETS[name] = (f"{what}, DeiT recipe (our reading), 300 epochs", dict(DEIT, model=model, size=size, **extra))
        else:
            if "k" in extra:  # Raptor (Jacobs et al. 2026) from scratch: k = 4 distinct blocks, each over one
                # contiguous phase of the L steps; ours are equal phases (bvit.py), Raptor's its own thresholds
                what += f" (4 blocks, each over {(24 if size == 'l' else 12) // 4} contiguous steps)"
                extra = {"num_blocks": 4}
            PRESETS[name] = (f"{what}, reViT's Table 6 recipe (AdamW, repeated augmentation, eval crop 1.0), 300 epochs",
                             dict(TABLE6, lr=TABLE6_LR[size], model=model, size=size, drop_path=DEIT3_DROP_PATH[size],
                                  **(REVIT_BANK if model == "revit" else {}), **extra))
        PAPER[name] = aim
    name = f"in1k-vit-{size}16-deit3"
    PRESETS[name] = (f"ViT-{size.upper()}/16, DeiT III's own release (LAMB, 800 epochs at {DEIT3_RELEASE[size]['img_size']} "
                     "px, eval crop 0.875, no clipping)", dict(DEIT3, model="vit", size=size, **DEIT3_RELEASE[size]))
    PAPER[name] = f"ImageNet-1k top-1 {AIMS[name]}"

# reViT's second regime (arXiv 2610.12448, sec. 3.2 and A.3): a reViT-B/14 student at L = 12 distilled from a
# frozen DINOv2 teacher's final post-LayerNorm tokens alone (--task-weight 0: no labels), the teacher a local
# timm-layout file (timm's vit_base_patch14_dinov2.lvd142m weights), both on a 16 x 16 grid at 224 px. A.3: "the
# complete supervised B-scale optimization (see Table 6). Only the patch size and task objective differ": Table 6's
# B column (TABLE6 above, 300 epochs, MixUp/CutMix on the images both networks see), at fixed depth (the elastic
# stage comes after).
for e in (1, 4, 8):
    name = f"in1k-revit-b14-e{e}-dinov2"
    PRESETS[name] = (f"reViT-B/14 E={e}, L=12, distilled from a frozen DINOv2 ViT-B/14's final tokens alone "
                     "(weights/vit_base_patch14_dinov2.pth, or --teacher FILE), Table 6's B recipe, 300 epochs of "
                     "ImageNet-1k",
                     dict(TABLE6, **REVIT_BANK, lr=TABLE6_LR["b"], model="revit", size="b", patch_size=14, experts=e, depth_dropout=0.0,
                          drop_path=DEIT3_DROP_PATH["b"], teacher="weights/vit_base_patch14_dinov2.pth",
                          distill="feature", task_weight=0.0))
    PAPER[name] = ("its frozen probes (sec. 4.2, 4.4): E=8 \"retains nearly all\" of its teacher's ImageNet "
                   "linear-probe top-1; at L=12 ADE20k 44.4 mIoU" if e == 8 else "no number for E=%d alone" % e)

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
    PRESETS[f"c100-mini-loopvae-{arm}"] = (
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
PRESETS["c100-mini-loopvae-gan"] = (
    "LoopVAE mini study arm: Stage 2 (adversarial) of the global arm, 200 steps of 32 from its Stage-1 checkpoint "
    "(runs/mini-loopvae/loopvae-global/seed0), conv discriminator, GAN term from step 50",
    {**LOOPVAE_MINI, **LOOPVAE_ARMS["global"][1], "stage2": "runs/mini-loopvae/loopvae-global/seed0", "max_steps": 200,
     "lr": 5e-5, "min_lr": 1e-6, "disc": "conv", "disc_lr": 5e-5, "gan_weight": 0.5, "gan_start": 50,
     "r1_gamma": 10.0, "r1_every": 16})
PAPER["c100-mini-loopvae-gan"] = ("none at 32 px (Table 1, ImageNet-256 after Stage 2: rFID 0.28, PSNR 32.54 dB, "
                                  "LPIPS 0.048, SSIM 0.91)")
# The paper's main model and Stage-1 recipe (App. A.1, Table 6) on ImageNet at 256 px: 600k steps of 32
# (15 epochs), LPIPS weight 1.0 (LPIPS-VGG: our choice of backbone). Our choices as above except lr 1e-4
# (a common autoencoder rate at batch 32) and 0.1 epoch of warmup; a tokenizer's crops (data.build_transform).
PRESETS["in256-loopvae-cnn"] = (
    "LoopVAE-CNN f8d16 (the paper's main model: width 384, K=4, loops 1,2,4, latent 16x32x32), Stage 1 on "
    "ImageNet-256: 600k steps of 32, L1 + LPIPS + 1e-6 KL, bf16; est. 560 H200-hours (~70 h on 8): the "
    "paper's 28.5 img/s forward at 256 px / 3 for a training step",
    dict(model="loopvae", data="imagenet", img_size=256, embed_dim=384, num_heads=6, num_blocks=4, loops=[1, 2, 4],
         latent_dim=16, share="global", operator="cnn", kl_weight=1e-6, perceptual="lpips", perceptual_weight=1.0,
         epochs=15, max_steps=600_000, batch_size=32, opt="adamw", lr=1e-4, min_lr=1e-6, weight_decay=0.0,
         warmup_epochs=0.1, clip_grad=1.0, amp="bf16", ema=0.0, randaug=0.0, three_augment=False, save_every=5000))
# The paper's Stage 2 (sec. 3.5, App. A.1): from the Stage-1 run above, lr 5e-5 for both networks, the frozen
# DINOv2-small discriminator (its weights a local file, --disc-weights), LPIPS 1.0, batch 32, bf16, the GAN term
# from step 5,000; ~610k steps (our reading of its schedule).
PRESETS["in256-loopvae-cnn-gan"] = (
    "LoopVAE-CNN f8d16, Stage 2 on ImageNet-256 from the in256-loopvae-cnn run (runs/in256-loopvae-cnn): lr 5e-5 "
    "(generator and discriminator), frozen DINOv2-small discriminator (weights/vit_small_patch14_dinov2.pth, or "
    "--disc-weights FILE), LPIPS 1.0, batch 32, bf16, GAN term from step 5,000, 610k steps; est. 840 H200-hours",
    {**PRESETS["in256-loopvae-cnn"][1], "stage2": "runs/in256-loopvae-cnn", "max_steps": 610_000, "epochs": 16,
     "lr": 5e-5, "min_lr": 1e-6, "disc": "dinov2", "disc_weights": "weights/vit_small_patch14_dinov2.pth",
     "disc_lr": 5e-5, "gan_weight": 0.5, "gan_start": 5000, "r1_gamma": 10.0, "r1_every": 16})
PAPER["in256-loopvae-cnn-gan"] = "ImageNet-256 (Table 1): rFID 0.28, PSNR 32.54 dB, LPIPS 0.048, SSIM 0.91"
PAPER["in256-loopvae-cnn"] = ("ImageNet-256 after Stage 2 (Table 1): rFID 0.28, PSNR 32.54 dB, LPIPS 0.048, SSIM 0.91; "
                              "no Stage-1 number")

# What a preset costs, one figure per run: (CPU-2, one H200). CPU-2 = 2 x86_64 cores (lab/docs/results.md).
# Measured figures are lab/docs/results.md's, as written there: the c100-mini-* wall minutes of the
# mini table (CPU-2 AMD EPYC, 2026-11-30, two runs side by side with one thread each, so slower than
# one run alone: c100-mini-srvit-r1 took about 8 min alone on the Intel Xeon, lab/docs/reproduce.md 2026-12-01);
# reViT's comparison arms have only training minutes ("train"; a third run shared the cores for part
# of them); c100-gpu-bvit's training minutes on the H200 (commit f937315). "est.": docs/presets.md's ImageNet
# GPU-hour estimates (scaled by FLOPs from two measured H200 training rates). "?": not measured.
TIMES = {name: ("?", "?") for name in PRESETS}
TIMES["cpu-first-bvit"] = ("3.2 min", "?")  # README's first run: 190 s wall on CPU-2 (AMD EPYC) at 98ab1d2, one thread beside two runs
# (issue 41's new-user trial, 2026-12-01; 2 min 46 s on the Intel Xeon, README's first run)
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
IN1K_GPU_HOURS = {"s": 19, "b": 32, "l": 111}  # docs/presets.md: est. H200 hours of 300 epochs
for name, (what, flags) in PRESETS.items():
    if name.startswith("in1k-"):
        hours = {2: 39, 3: 58, 4: 77}.get(flags.get("recursions"), IN1K_GPU_HOURS[flags["size"]])  # SR-ViT R>1
        if name.endswith("-deit3"):  # DeiT III's release: 800 epochs, B and L at 192 px (144 tokens of 196, by FLOPs)
            hours *= flags["epochs"] / 300 * ((flags["img_size"] / 224) ** 2 if flags["img_size"] != 224 else 1)
        TIMES[name] = ("?", f"est. {hours:.0f} h")
# DINOv2 distillation: B/16's 300-epoch estimate x 1.33 (256 tokens at patch 14 against 196) x 4/3 (the frozen
# teacher's forward, a third of a training step of its size): est. 57 H200-hours.
TIMES.update({f"in1k-revit-b14-e{e}-dinov2": ("?", "est. 57 h") for e in (1, 4, 8)})
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
TIMES["in256-loopvae-cnn"] = ("?", "est. 560 h")
TIMES["in256-loopvae-cnn-gan"] = ("?", "est. 840 h")
