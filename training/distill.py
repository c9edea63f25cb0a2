"""Distillation from a frozen teacher for train.py (--teacher CKPT, --distill feature|logits): the term
(Distiller), the teacher (teacher: an rvits checkpoint or timm weights) and the run's distiller (from_flags).

feature: the student's final post-LayerNorm tokens are matched to the teacher's (mean squared
    error over tokens and channels; our choice, the reViT paper, section 3.2 and appendix A.3,
    names the target, "final post-LayerNorm teacher tokens", not the distance), through a
    learned linear projection when the widths differ. No intermediate features (reViT's
    "final-feature distillation").
logits: soft knowledge distillation (Hinton et al. 2015): KL(softmax(t / T) || softmax(s / T)) * T^2.

The teacher sees the same images as the student, after augmentation, in eval mode without
gradients, resized (bicubic) to its own image size when that differs (`teacher` below builds it so that
its patch grid is the student's: a DINOv2 ViT-S/14 sees a 32-px student's images at 8 x 14 = 112 px) and
renormalized to its mean and std when they differ. When only one of the two has a
class token, the patch tokens alone are matched. The tokens are read with a forward hook on each
model's final `norm`: the class-token models of rvits normalize every token there; GAP models
(norm = Identity, timm's fc_norm after pooling) get a LayerNorm without affine parameters instead.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import data
from training.exits import Fail
from training.registry import MODELS, classifier_checkpoint, model_from_checkpoint
from training.weights import read_weights, timm_vit


def post_layernorm(norm, tokens):
    """A model's final tokens (B, T, D), the output of its final `norm`, as post-LayerNorm tokens: as they are
    after a LayerNorm (a class token model), through a LayerNorm without affine parameters after the
    Identity (GAP)."""
    return tokens if isinstance(norm, nn.LayerNorm) else F.layer_norm(tokens, tokens.shape[-1:], eps=1e-6)


class FinalTokens:
    """Keeps the last output of `model.norm`, as post-LayerNorm tokens (B, T, D) (post_layernorm)."""

    def __init__(self, model):
        self.tokens = None
        model.norm.register_forward_hook(self.keep)

    def keep(self, module, inputs, output):
        self.tokens = post_layernorm(module, output)


class Distiller(nn.Module):
    """The distillation term for one batch: `distiller(images, student_logits)` after the student's
    forward pass on the same images. Its parameters (the projection, when the widths differ) train
    with the student. Raises ValueError when teacher and student cannot be compared."""

    def __init__(self, student, teacher, kind="feature", temperature=3.0, renormalize=None):
        """renormalize: None, or ((mean, std) of the student's images, (mean, std) the teacher expects),
        per channel. `matched` says in words which tokens the feature term compares."""
        super().__init__()
        if kind not in ("feature", "logits"):
            raise ValueError(f"--distill {kind}: allowed: feature, logits")
        if kind == "logits" and not getattr(teacher, "has_head", True):
            raise ValueError("--distill logits: the teacher file has no classifier head (a feature extractor such "
                             "as DINOv2); use --distill feature")
        if kind == "logits" and teacher.head.out_features != student.head.out_features:
            raise ValueError(f"--distill logits: the teacher has {teacher.head.out_features} classes and the "
                             f"student {student.head.out_features}; use --distill feature")
        self.size = getattr(teacher, "input_size", teacher.img_size)  # (a dynamic-size teacher: set by its builder)
        grids = [student.img_size // student.patch_size, self.size // teacher.patch_size]
        if kind == "feature" and grids[0] != grids[1]:
            raise ValueError(f"--distill feature: the student's patch grid is {grids[0]}x{grids[0]} and the teacher's "
                             f"{grids[1]}x{grids[1]}; give both the same grid (--patch-size, --img-size), or use "
                             "--distill logits")
        cls = [m.cls_token is not None for m in (student, teacher)]
        self.skip = [int(c and not all(cls)) for c in cls]  # (student, teacher) leading tokens left out
        self.matched = ("" if kind == "logits" else "; matching all tokens" if all(cls) or not any(cls) else
                        f"; matching the {grids[0] ** 2} patch tokens (only the {'student' if cls[0] else 'teacher'} "
                        "has a class token)")
        if renormalize is not None:  # x_teacher = (x * std_s + mean_s - mean_t) / std_t, per channel
            (ms, ss), (mt, st) = [[torch.tensor(v, dtype=torch.float32).view(1, 3, 1, 1) for v in pair]
                                  for pair in renormalize]
            self.register_buffer("scale", ss / st, persistent=False)
            self.register_buffer("shift", (ms - mt) / st, persistent=False)
        self.renormalize = renormalize is not None
        self.kind, self.temperature = kind, temperature
        self.teacher = [teacher.eval().requires_grad_(False)]  # a list: not a submodule (no state, no DDP)
        self.student_tokens, self.teacher_tokens = FinalTokens(student), FinalTokens(teacher)
        ds, dt = student.embed_dim, teacher.embed_dim
        self.proj = nn.Linear(ds, dt) if kind == "feature" and ds != dt else nn.Identity()

    def teacher_input(self, images):
        """The student's images (B, 3, H, W) as the teacher expects them: renormalized, then resized."""
        if self.renormalize:
            images = images * self.scale + self.shift
        if images.shape[-1] != self.size or images.shape[-2] != self.size:
            images = F.interpolate(images, size=(self.size, self.size), mode="bicubic", align_corners=False)
        return images

    def forward(self, images, student_logits):
        teacher = self.teacher[0]
        with torch.no_grad():
            teacher_logits = teacher(self.teacher_input(images))
        if self.kind == "logits":
            t = self.temperature
            return F.kl_div(F.log_softmax(student_logits.float() / t, -1), F.log_softmax(teacher_logits.float() / t, -1),
                            reduction="batchmean", log_target=True) * t * t
        s, t = self.student_tokens.tokens[:, self.skip[0]:], self.teacher_tokens.tokens[:, self.skip[1]:]
        return F.mse_loss(self.proj(s).float(), t.float())


# ----------------------------------------------------------------------------- the teacher of --teacher
def teacher(path, p, student, args):
    """(the frozen teacher of --teacher, its images' normalization, one line saying how it meets the
    student): an rvits checkpoint or a timm-layout ViT file (timm_vit), run on the student's images
    resized so that its patch grid is the student's (reViT A.3: the student matches the teacher's
    token grid). A timm file's images are normalized with ImageNet's mean and std (DINOv2's and
    DeiT's; timm's AugReg ViTs use 0.5, which this does not cover), an rvits teacher's with its run's
    dataset's. Raises Fail."""
    ck = read_weights(path, "--teacher")
    grid = student.img_size // student.patch_size
    if classifier_checkpoint(ck, path, "--teacher"):
        patch = ck["args"].get("patch_size") or 16
        model, what = model_from_checkpoint(ck, path, "--teacher", p, grid * patch), f"--model {ck['args']['model']}"
        model.has_head, model.input_size, norm = True, grid * patch, data.normalization(ck["args"].get("data"))
    else:
        model = timm_vit(path, "--teacher", grid, ck=ck)
        patch, what = model.patch_size, f"timm-layout ViT ({len(model.blocks)} blocks, width {model.embed_dim})"
        norm = (data.IMAGENET_MEAN, data.IMAGENET_STD)
    size = f"at {grid * patch} px" if grid * patch != student.img_size else "at the student's size"
    own = MODELS[args.model].normalization or data.normalization(args.data)
    renorm = None if tuple(map(tuple, own)) == tuple(map(tuple, norm)) else (own, norm)
    return model, renorm, (f"teacher: {what}, patch {patch}, {size}: its {grid}x{grid} patch grid is the student's"
                           + ("; images renormalized to its mean and std" if renorm else ""))


def from_flags(args, p, student, device):
    """The Distiller of --teacher for `student` (on `device`; `p` the parser, for an rvits teacher's saved
    flags), its line printed on rank 0; None without --teacher and for --eval-only (an evaluation needs
    no teacher). Raises Fail for a bad teacher file or a teacher the student cannot be compared with."""
    if args.eval_only or not args.teacher:
        return None
    frozen, renorm, line = teacher(args.teacher, p, student, args)
    try:
        distiller = Distiller(student, frozen.to(device), args.distill, args.distill_temperature,
                              renormalize=renorm).to(device)
    except ValueError as e:
        raise Fail(str(e))
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(line + distiller.matched)
    return distiller
