"""Distillation from a frozen teacher for train.py (--teacher CKPT, --distill feature|logits).

feature: the student's final post-LayerNorm tokens are matched to the teacher's (mean squared
    error over tokens and channels; our choice, the reViT paper, section 3.2 and appendix A.3,
    names the target, "final post-LayerNorm teacher tokens", not the distance), through a
    learned linear projection when the widths differ. No intermediate features (reViT's
    "final-feature distillation").
logits: soft knowledge distillation (Hinton et al. 2015): KL(softmax(t / T) || softmax(s / T)) * T^2.

The teacher sees the same images as the student, after augmentation, in eval mode without
gradients. The tokens are read with a forward hook on each model's final `norm`: the class-token
models of rvits normalize every token there; GAP models (norm = Identity, timm's fc_norm after
pooling) get a LayerNorm without affine parameters instead.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class FinalTokens:
    """Keeps the last output of `model.norm`, as post-LayerNorm tokens (B, T, D)."""

    def __init__(self, model):
        self.tokens = None
        self.affine = isinstance(model.norm, nn.LayerNorm)
        model.norm.register_forward_hook(self.keep)

    def keep(self, module, inputs, output):
        self.tokens = output if self.affine else F.layer_norm(output, output.shape[-1:], eps=1e-6)


class Distiller(nn.Module):
    """The distillation term for one batch: `distiller(images, student_logits)` after the student's
    forward pass on the same images. Its parameters (the projection, when the widths differ) train
    with the student. Raises ValueError when teacher and student cannot be compared."""

    def __init__(self, student, teacher, kind="feature", temperature=3.0):
        super().__init__()
        if kind not in ("feature", "logits"):
            raise ValueError(f"--distill {kind}: allowed: feature, logits")
        if kind == "logits" and teacher.head.out_features != student.head.out_features:
            raise ValueError(f"--distill logits: the teacher has {teacher.head.out_features} classes and the "
                             f"student {student.head.out_features}; use --distill feature")
        tokens = [(student.img_size // m.patch_size) ** 2 + int(m.cls_token is not None) for m in (student, teacher)]
        if kind == "feature" and tokens[0] != tokens[1]:
            raise ValueError(f"--distill feature: the student has {tokens[0]} tokens and the teacher {tokens[1]}; give "
                             "both the same patch grid and class token (--patch-size, --gap), or use --distill logits")
        self.kind, self.temperature = kind, temperature
        self.teacher = [teacher.eval().requires_grad_(False)]  # a list: not a submodule (no state, no DDP)
        self.student_tokens, self.teacher_tokens = FinalTokens(student), FinalTokens(teacher)
        ds, dt = student.embed_dim, teacher.embed_dim
        self.proj = nn.Linear(ds, dt) if kind == "feature" and ds != dt else nn.Identity()

    def forward(self, images, student_logits):
        teacher = self.teacher[0]
        with torch.no_grad():
            teacher_logits, _ = teacher(images)
        if self.kind == "logits":
            t = self.temperature
            return F.kl_div(F.log_softmax(student_logits.float() / t, -1), F.log_softmax(teacher_logits.float() / t, -1),
                            reduction="batchmean", log_target=True) * t * t
        return F.mse_loss(self.proj(self.student_tokens.tokens).float(), self.teacher_tokens.tokens.float())
