"""LoopVAE's Stage 2 for train_loopvae.py (--stage2 CKPT): adversarial fine-tuning of a Stage-1 tokenizer.
Paper: arXiv 2609.11516, sec. 3.5 (eq. 11) and App. A.1; the tensor math is loopvae.py's "Stage 2" section.

    L_G = L_rec + lambda_a L_adv,  L_adv = -mean D(aug(x_hat))                               (eq. 11)
    lambda_a = 0 before Stage-2 step `start`, then m clamp(|grad_w L_rec| / |grad_w L_adv|, 0, 1e4),
               w = the decoder's output conv weight, m = 0.5                                   (App. A.1)
    L_D = 0.5 (mean relu(1 - D(aug(x))) + mean relu(1 + D(aug(x_hat)))) + lazy R1 (10, every 16)

aug: DiffAugment-style augmentation (loopvae.diff_augment, policy loopvae.DIFFAUG) of real and fake
images alike, probability 1, cutout 0.2 (App. A.1). Each training step makes one discriminator update on
the detached reconstruction, then the generator's term through the updated discriminator, whose weights
get no gradient from it (our order; VQGAN computes both terms from one forward). Before `start` the
discriminator warms up and the generator's loss is L_rec alone. The discriminator's optimizer is its
own: AdamW at a constant learning rate, betas (0.5, 0.9) and no weight decay (VQGAN's Adam settings; our
choice, the paper gives only the Stage-2 learning rate, 5e-5).

Discriminators: conv, loopvae.PatchDiscriminator (our default, a small PatchGAN); dinov2, the paper's
main run: frozen DINOv2-small features (timm's ViT-S/14 layout, loaded into bvit.BViT) and a trained
head on each patch token.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import loopvae
from training.weights import timm_vit

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # DINOv2's input normalization


class DINOv2Discriminator(nn.Module):
    """Frozen DINOv2 features + a trained head (App. A.1): images (B, 3, H, W) in [-1, 1] -> [0, 1],
    ImageNet-normalized, resized bilinearly to `img_size` (224: a 16 x 16 grid of 14-pixel patches; our
    choice, DINOv2's training crop), the backbone's final normalized patch tokens (B, N, D), and per
    token Linear(D, D) -> LeakyReLU(0.2) -> Linear(D, 1) (our choice): patch logits (B, N). The
    backbone stays in eval mode with requires_grad False; gradients still reach the images (R1)."""

    def __init__(self, backbone, img_size=224):
        super().__init__()
        self.backbone, self.img_size = backbone.eval().requires_grad_(False), img_size
        dim = backbone.embed_dim
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.LeakyReLU(0.2), nn.Linear(dim, 1))
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def train(self, mode=True):  # the frozen backbone stays in eval mode
        super().train(mode)
        self.backbone.eval()
        return self

    def forward(self, x):
        x = ((x + 1) / 2 - self.mean) / self.std
        x = F.interpolate(x, size=(self.img_size, self.img_size), mode="bilinear", align_corners=False)
        z = self.backbone.embed(x)  # (B, 1 + N, D)
        for blk in self.backbone.blocks:
            z = blk(z)
        return self.head(self.backbone.norm(z)[:, 1:]).squeeze(-1)  # (B, N)


def dinov2_backbone(path, img_size=224):
    """bvit.BViT holding the DINOv2 weights of `path` (--disc-weights): a state dict in timm's ViT layout
    (vit_small_patch14_dinov2: patch 14, width 384, 12 blocks, LayerScale, a class token, no head), read by
    training/weights.py's timm_vit (weights_only; pos_embed resized to the img_size / 14 grid). Raises Fail."""
    return timm_vit(path, "--disc-weights", img_size=img_size)


class Adversary:
    """The discriminator, its optimizer and Stage 2's two terms. `adversary(x, x_hat, rec_loss, step)`
    after the generator's forward on images x (B, 3, H, W) in [-1, 1], x_hat its reconstruction (with
    its graph), rec_loss the Stage-1 loss (0-d): one discriminator update, then (loss, terms): loss =
    rec_loss + lambda_a L_adv (rec_loss itself before `start`), terms the detached d_loss, g_loss
    (from `start` on), gan_weight (lambda_a) and r1 (the last lazy R1 term) for the log. Under DDP the
    discriminator's gradients are averaged over the ranks by hand: its R1 term is a double backward,
    which DDP's hooks do not follow."""

    def __init__(self, model, disc, *, lr, weight=0.5, start=5000, r1_gamma=10.0, r1_every=16,
                 policy=loopvae.DIFFAUG, max_weight=1e4):
        self.model, self.disc, self.policy = model, disc, tuple(policy)
        self.weight, self.start, self.max_weight, self.r1_gamma, self.r1_every = weight, start, max_weight, r1_gamma, r1_every
        self.trainable = [p for p in disc.parameters() if p.requires_grad]
        # fused: a non-finite update is skipped on the device (found_inf), as optim.optimizer_step does
        self.optimizer = torch.optim.AdamW(self.trainable, lr=lr, betas=(0.5, 0.9), weight_decay=0.0, fused=True)
        self.lr, self.d_steps, self.r1 = lr, 0, torch.zeros((), device=self.trainable[0].device)
        if dist.is_initialized():  # every rank starts from rank 0's discriminator (as DDP does for the model)
            with torch.no_grad():
                for t in self.disc.state_dict().values():
                    dist.broadcast(t, 0)

    def augment(self, x):
        return loopvae.diff_augment(x, self.policy) if self.policy else x

    def __call__(self, real, fake, rec_loss, step):
        d_loss = self.discriminator_step(real, fake.detach())
        terms = {"d_loss": d_loss, "r1": self.r1}
        # `step` counts Stage-2 optimizer steps, one discriminator update each; the paper's 5,000 (App. A.1)
        # may count the updates of both networks, which would be 2,500 of these steps
        if step < self.start:  # lambda_a = 0 (App. A.1): the discriminator warms up
            terms["gan_weight"] = torch.zeros((), device=real.device)
            return rec_loss, terms
        for p in self.trainable:  # the generator's term trains the generator only
            p.requires_grad_(False)
        g_loss = loopvae.hinge_g_loss(self.disc(self.augment(fake)))
        for p in self.trainable:
            p.requires_grad_(True)
        weight = loopvae.adaptive_gan_weight(rec_loss, g_loss, self.model.last_layer(), step, self.start,
                                             self.max_weight, self.weight)
        terms.update(g_loss=g_loss.detach(), gan_weight=weight)
        return rec_loss + weight * g_loss, terms

    def discriminator_step(self, real, fake):
        """One update of the hinge loss (+ lazy R1 every r1_every updates) on augmented images. Returns
        the hinge loss (0-d, detached)."""
        real, fake = self.augment(real), self.augment(fake)
        loss = loopvae.hinge_d_loss(self.disc(real), self.disc(fake))
        with sdpa_kernel(SDPBackend.MATH):  # R1's double backward: the math attention kernel has one
            r1 = loopvae.lazy_r1_loss(self.disc, real, self.d_steps, self.r1_gamma, self.r1_every)
        if r1 is not None:
            self.r1 = r1.detach()
        self.optimizer.zero_grad(set_to_none=True)
        (loss if r1 is None else loss + r1).backward()
        if dist.is_initialized():
            for p in self.trainable:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        gnorm = torch.nn.utils.clip_grad_norm_(self.trainable, float("inf"))
        self.optimizer.found_inf = (~torch.isfinite(gnorm)).float()
        self.optimizer.step()
        del self.optimizer.found_inf
        self.d_steps += 1
        return loss.detach()

    def state_dict(self):
        """What a bit-exact resume needs: the discriminator (a frozen backbone included), its optimizer,
        the update count (lazy R1's phase) and the last R1 term."""
        return {"disc": self.disc.state_dict(), "optimizer": self.optimizer.state_dict(), "d_steps": self.d_steps,
                "r1": self.r1}

    def load_state_dict(self, state):
        self.disc.load_state_dict(state["disc"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.d_steps, self.r1 = state["d_steps"], state["r1"].to(self.r1.device)
        for g in self.optimizer.param_groups:  # this run's --disc-lr and implementation (as checkpoints.restore)
            g.update(lr=self.lr, fused=self.optimizer.defaults["fused"])


def build(model, kind, weights, device, **kw):
    """The Adversary of --disc `kind` (conv, or dinov2 from `weights`) for LoopVAE `model`, on `device`;
    kw: Adversary's. Raises Fail for a bad weights file."""
    disc = loopvae.PatchDiscriminator() if kind == "conv" else DINOv2Discriminator(dinov2_backbone(weights))
    return Adversary(model, disc.to(device), **kw)


def from_flags(args, model, device):
    """The Adversary of --stage2 for LoopVAE `model` on `device`, from the run's flags (--disc, --disc-weights,
    --disc-lr, else --lr, --gan-weight, --gan-start, --r1-gamma, --r1-every, --diffaug); None without --stage2
    and for --eval-only (an evaluation trains no discriminator). Raises Fail for a bad --disc-weights file."""
    if args.eval_only or not args.stage2:
        return None
    return build(model, args.disc, args.disc_weights, device, lr=args.disc_lr or args.lr, weight=args.gan_weight,
                 start=args.gan_start, r1_gamma=args.r1_gamma, r1_every=args.r1_every, policy=args.diffaug)
