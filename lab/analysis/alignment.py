"""Does a distilled student follow its teacher's depth? The teacher-alignment analyses of reViT (Bulat et
al., arXiv 2610.12448, sec. 5.1 and App. D) of a student checkpoint against a teacher (analyze.py --teacher:
alignment.json; `alignment` returns its numbers).

The student-depth x teacher-layer cross-CKA map (linear CKA, lab/analysis/steps.linear_cka, of the mean-pooled
patch tokens after the embedding and after each step / layer), its maximum-CKA path (App. D, fig. 9) with
Spearman's rho and the mean absolute deviation from proportional depth, the teacher CKA at proportional
depth (our reading of App. D's figure), and for reViT with E > 1: each expert deleted against random gate
changes of the same merged-weight displacement, and every permutation of the gate columns (E > 5: 119
drawn at random), each scored by its teacher CKA.
"""
import itertools

import torch
from tqdm import tqdm

from analysis.anytime import tokens
from analysis.steps import linear_cka


def spearman(a, b):
    """Spearman's rho of two sequences: the Pearson correlation of their ranks (ties: mean ranks)."""
    def ranks(v):
        v = torch.as_tensor(v, dtype=torch.float64)
        r = torch.empty_like(v)
        r[v.argsort()] = torch.arange(len(v), dtype=torch.float64)
        for u in v.unique():  # ties share their mean rank
            r[v == u] = r[v == u].mean()
        return r
    x, y = ranks(a), ranks(b)
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x.norm() * y.norm()))


def cka_path(cross):
    """The maximum-CKA path of a cross-CKA map (reViT App. D, fig. 9): cross ((L_s + 1) x (L_t + 1), row 0 /
    column 0 the embeddings) -> {path: the teacher layer j in 1..L_t of largest CKA for each student depth
    k = 1..L_s, proportional: k L_t / L_s, rho: Spearman's rho of path against k, mad: mean |path -
    proportional| in teacher layers}. rho = 1 and mad = 0 for a student that follows the teacher's depth."""
    c = torch.as_tensor(cross, dtype=torch.float64)[1:, 1:]
    ls, lt = c.shape
    path = [int(j) + 1 for j in c.nan_to_num(-1).argmax(1)]
    prop = [k * lt / ls for k in range(1, ls + 1)]
    return {"path": path, "proportional": prop, "rho": spearman(path, range(ls)),
            "mad": sum(abs(j - q) for j, q in zip(path, prop)) / ls}


def teacher_cka(cross):
    """A student's teacher CKA (our reading of App. D's figure): the mean over student depths k = 1..L_s
    of the CKA with the teacher layer at the proportional depth, round(k L_t / L_s)."""
    c = torch.as_tensor(cross, dtype=torch.float64)
    ls, lt = c.shape[0] - 1, c.shape[1] - 1
    return float(sum(c[k, max(1, round(k * lt / ls))] for k in range(1, ls + 1)) / ls)


def block_states(model, x):
    """The mean-pooled patch tokens (B, D) after the embedding and after every step (a block call for the
    one-block-per-step models the analyses take: vit, bvit, revit), before the final norm: the model's
    `begin` and forward_intermediates."""
    prefix = int(getattr(model, "cls_token", None) is not None)
    states = model.forward_intermediates(x, output_fmt="NLC", intermediates_only=True)  # (B, N, D): the patches
    return [tokens(model.begin(x))[:, prefix:].float().mean(1)] + [z.float().mean(1) for z in states]


def with_gates(model, gates):
    """reViT `model` whose steps merge their FFN with the gate table `gates` (L, E) instead of the
    router's (an instance attribute over ReViT.ffn_weights; `del model.ffn_weights` restores it)."""
    model.ffn_weights = lambda t, g=gates: model.blocks[0].mlp.merge(g.to(model.pos_embed.device))
    return model


@torch.no_grad()
def displacement(model, delta):
    """The merged-weight displacement of a gate change `delta` (L, E): sqrt(sum over steps and the four
    FFN tensors of ||sum_e delta_ke W_e||^2) (merge is linear in the gates)."""
    return float(sum(t.double().square().sum() for t in model.blocks[0].mlp.merge(delta)) ** 0.5)


@torch.no_grad()
def alignment(student, teacher_model, to_teacher, images, batch_size=128, draws=8, seed=0):
    """The teacher-alignment analyses of reViT (arXiv 2610.12448, sec. 5.1 and App. D) on `images`
    (N, 3, H, W), both models in eval mode; to_teacher maps the student's images to the teacher's input.
    Returns {cross: linear CKA (L_s + 1) x (L_t + 1) of mean-pooled patch tokens (embedding, then each
    step / layer; App. D), path, proportional, rho, mad (cka_path), teacher_cka (teacher_cka)} and, for a
    reViT student with E > 1 experts and gates G (L, E): gates; deletions [{expert, displacement, teacher_cka,
    random: [teacher_cka of `draws` random gate changes of the same displacement (rows summing to 0)]}],
    expert e's column of G zeroed and the rows renormalized; permutations [{perm, teacher_cka}] for every
    permutation of G's columns (expert e takes column perm[e]; the identity first)."""
    def states(model, prep=lambda v: v):
        out = None
        for i in range(0, len(images), batch_size):
            st = block_states(model, prep(images[i:i + batch_size]))
            out = [[] for _ in st] if out is None else out
            for keep, v in zip(out, st):
                keep.append(v.cpu())
        return [torch.cat(v) for v in out]
    t_states = states(teacher_model, to_teacher)
    cross_of = lambda s: [[linear_cka(a, b) for b in t_states] for a in s]
    cross = cross_of(states(student))
    res = {"cross": cross, **cka_path(cross), "teacher_cka": teacher_cka(cross)}
    if getattr(student, "experts", 1) < 2 or not hasattr(student, "gates"):
        return res
    g = student.gates().cpu()
    L, E = g.shape
    score = lambda gates: teacher_cka(cross_of(states(with_gates(student, gates))))
    gen = torch.Generator().manual_seed(seed)
    res.update(gates=g.tolist(), deletions=[], permutations=[])
    try:
        for e in tqdm(range(E), desc="expert deletions", leave=False):
            kept = g.clone()
            kept[:, e] = 0
            kept = kept / kept.sum(1, keepdim=True).clamp_min(1e-12)
            d = displacement(student, kept - g)
            rand = []
            for _ in range(draws):
                r = torch.randn(L, E, generator=gen, dtype=torch.float64)
                r = (r - r.mean(1, keepdim=True)).float()
                rand.append(score(g + r * (d / max(displacement(student, r), 1e-12))))
            res["deletions"].append({"expert": e, "displacement": d, "teacher_cka": score(kept), "random": rand})
        perms = list(itertools.permutations(range(E))) if E <= 5 else [tuple(range(E))] + [
            tuple(torch.randperm(E, generator=gen).tolist()) for _ in range(119)]  # E > 5: 119 drawn at random
        for perm in tqdm(perms, desc="gate permutations", leave=False):
            res["permutations"].append({"perm": list(perm), "teacher_cka": score(g[:, list(perm)])})
    finally:
        if "ffn_weights" in vars(student):
            del student.ffn_weights
    return res
