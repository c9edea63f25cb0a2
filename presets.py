"""Reproduction presets: name -> (what it is, train.py flags by argparse name); PAPER: the paper's
number each aims at; TIMES: what each costs, measured or estimated. Data only: `python train.py
--preset NAME` makes these flags the parser's defaults, so flags given on the command line still
win; `--list-presets` prints one line per preset, `--print-config` shows one resolved.

The papers' protocols and the first run:
- `cpu-first-bvit`: README's first run, on a laptop's CPU;
- `c100-*`: the Training Crossroads study arms at full scale (CIFAR-100, 200 epochs; GPU);
- `in1k-*`: the papers' ImageNet-1k protocols (the DeiT III recipe; reViT's: its paper's Table 6; SR-ViT's: the
  DeiT recipe, our reading), and reViT's DINOv2-distilled second regime;
- `in256-loopvae-cnn(-gan)`: LoopVAE's ImageNet-256 recipe, Stage 1 and Stage 2 (GPU).
The lab's study arms (the CPU-scale `c100-mini-*`, the GPU-scale `c100-gpu-*`) are lab/arms.py's: the lab
runs them as `train.py --config FILE`.
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


# The paper's main model and Stage-1 recipe (App. A.1, Table 6) on ImageNet at 256 px: 600k steps of 32
# (15 epochs), LPIPS weight 1.0 (LPIPS-VGG: our choice of backbone). The optimizer and the Stage-1 learning rate
# are not given; our choices: AdamW without weight decay (plain Adam, as latent-diffusion autoencoders train), lr
# 1e-4 (a common autoencoder rate at batch 32), 0.1 epoch of warmup, cosine to 1e-6, clip 1.0; a tokenizer's crops
# (data.build_transform).
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

# What a preset costs, one figure per run: (CPU-2, one H200). CPU-2 = 2 x86_64 cores. "est.": docs/presets.md's
# ImageNet GPU-hour estimates (scaled by FLOPs from two measured H200 training rates). "?": not measured.
TIMES = {name: ("?", "?") for name in PRESETS}
TIMES["cpu-first-bvit"] = ("3.2 min", "?")  # README's first run: 190 s wall on CPU-2 (AMD EPYC) at 98ab1d2, one thread beside two runs
# (issue 41's new-user trial, 2026-12-01; 2 min 46 s on the Intel Xeon, README's first run)
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
# LoopVAE in256: 19.2M images at ~9.5 img/s (the paper's 28.5 img/s forward / 3) on one GPU.
TIMES["in256-loopvae-cnn"] = ("?", "est. 560 h")
TIMES["in256-loopvae-cnn-gan"] = ("?", "est. 840 h")
