"""Look inside a trained rvits checkpoint: depthwise self-CKA and what the recurrent block does at each step.

    python analyze.py --resume runs/bvit/ckpt.pt --out-dir runs/bvit/analysis [--num-images 512]
        [--data-dir ../shared/data] [--device cpu|cuda] [--depth L] [--batch-size 128]

The model is rebuilt from the run's saved flags through train.py's registry (training/registry.py) and
evaluated on the first N images of the validation set it was trained on (no augmentation).
Writes OUT/cka.json and OUT/steps.json, and OUT/cka.png and OUT/steps.png when matplotlib is
installed. Any bad input is one line `analyze.py: error: ...` and exit status 2.

A LoopVAE checkpoint (the tokenizer) gets loop_interventions instead (loops.json, loops.png).
With --teacher FILE (an rvits checkpoint or a timm-layout ViT file, run as --teacher runs in train.py),
the teacher-alignment analyses of reViT (arXiv 2610.12448, sec. 5.1 and App. D) instead (alignment.json,
alignment.png; function `alignment`): the student-depth x teacher-layer cross-CKA map, its maximum-CKA
path with Spearman's rho and the mean absolute deviation from proportional depth, and for reViT with
E > 1: each expert deleted against `--draws` random gate changes of the same merged-weight
displacement, and every permutation of the gate columns (E > 5: 119 drawn at random), each scored by
its teacher CKA.

1. Depthwise self-CKA (cka.json): linear CKA (Kornblith et al. 2019, "Similarity of Neural
   Network Representations Revisited", eq. 5 with a linear kernel) between the mean-pooled patch
   tokens (class token excluded) after the embedding and after every step, before the final norm,
   as the layer-by-layer CKA maps of Raghu et al. 2021 ("Do Vision Transformers See Like
   Convolutional Neural Networks?"). reViT checkpoints also get their gate table g_e(t_k).
2. The mechanistic analyses of the bViT paper (Byra et al., arXiv 2605.10661,
   abstract: "analyses of activations, attention and step-specific pruning
   show that the shared block changes its effective behavior across recurrent steps"), per step k
   (steps.json): the mean L2 norm of the tokens (all of them) after step k; the attention entropy
   of each head in nats (mean over queries, class token included, and images; a uniform map over
   T tokens has log T); the mean attention distance of each head in patches (Dosovitskiy et al.
   2021, fig. 7; Raghu et al. 2021: the attention-weighted Euclidean distance between query and
   key patches on the patch grid, class token excluded; our choice: the patch-to-patch weights
   are renormalized to sum to 1, so the value is an expected distance); and the top-1 on the N
   images with step k skipped (the step maps its state to itself), next to the unpruned top-1.

What a "step" is (its state = the tokens the next step receives):
    vit, bvit, revit  one block application: step k runs blocks[phase_map(k)] (the shared block
                      for bvit/revit, block k for the untied vit). State: the block's output.
    srvit             one recursion h_r = f(h_{r-1}): a pass through the `depth` untied layers.
                      State: h_r (before the token mixture). Attention: mean over the layers.
    odevit            one solver step of odeint (NFE_PER_STEP block evaluations: euler 1,
                      midpoint/heun 2, rk4 4). State: the solver's z(t_k) = the input of the next
                      step's first evaluation (the final norm's input after the last step).
                      Attention: mean over the step's evaluations (at z and the solver's stages).
    Skipping step k: its block evaluations return their input (vit/bvit/revit/srvit: the identity;
    odevit's subtracted field F(z) - z is then 0),
    for odevit's black-box field dz/dt = F(z) they return 0, so z(t_{k+1}) = z(t_k) either way.
    For a model whose step k is a function of the state alone (bvit with one block, odevit), skipping ANY one step is running L - 1 steps, so its pruning curve is flat
    by construction (a test checks it); steps differ under pruning only where the block depends on
    k (the untied vit, bvit's phases, reViT's gates g(t_k), srvit's per-recursion router, the
    per-step LoRA adapters). revit_moe's content routings (lory, smear, deepseek, qwen3, moeut, remoe,
    softmoe) route on the state alone, so their curves are flat by construction too.
    --depth L analyses the model run at L steps (L recursions for srvit, L solver steps for odevit).

How, without editing a model file: forward hooks. A shared block is called once per evaluation,
in order, so a counter over the calls of all blocks gives the step; a pre-hook on a block sees the
state it receives and a hook its output; a hook on `attn.qkv` recomputes the attention
probabilities softmax(q k^T / sqrt(d_head)) (the models call F.scaled_dot_product_attention, which
returns no weights); a block hook that returns the block's input skips the step. revit_moe's
routings and LoRA run a step as the method `_step_fn` on the block's parts, not as a block call:
the probe wraps that method (and, for LoRA, `_attend`, whose qkv is not the attn.qkv module) on the
model instance for the analysis and removes the wrappers after. Their content routings have no
depth gate table: "gates" is then their mean gate per step over the analysed images (and tokens,
for the token-level routings: revit_moe's `_last_gates`, as in its log_extras); LoRA checkpoints
get "lora_norms" (revit_moe.log_extras: one per trained adapter, whatever --depth is analysed).
"""
import argparse
import json
import math
import os
import sys
import types

import torch
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

import data
from training import flags, registry
from training.weights import read_weights
from training.exits import Fail, printable_output


class Parser(argparse.ArgumentParser):
    def error(self, message):  # cli() prints it as one line with exit status 2
        raise Fail(message)


def get_parser():
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--resume", required=True, metavar="CKPT", help="an rvits checkpoint (train.py's ckpt.pt)")
    p.add_argument("--out-dir", required=True, help="where cka.json, steps.json (LoopVAE: loops.json) and PNGs "
                   "are written")
    p.add_argument("--num-images", type=flags.positive(int), default=512, help="first N validation images")
    p.add_argument("--data-dir", help="dataset root (default: the checkpoint's --data-dir)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--depth", type=flags.positive(int), help="steps to run (default: the trained depth)")
    p.add_argument("--batch-size", type=flags.positive(int), default=128)
    p.add_argument("--teacher", metavar="FILE", help="instead: the teacher-alignment analyses against this rvits "
                   "checkpoint or timm-layout ViT file (reViT App. D): alignment.json and alignment.png")
    p.add_argument("--draws", type=flags.positive(int), default=8, help="with --teacher: random gate "
                   "perturbations per expert deletion")
    p.add_argument("--anytime", action="store_true", help="instead: per-image early exit (training/anytime.py): "
                   "top-1 against mean block applications per rule, beside fixed depth and the oracle, and the "
                   "per-step diagnostics (anytime.json, anytime.png)")
    p.add_argument("--budget", type=flags.positive(int), help="with --anytime: the step budget, at most 8x the "
                   "trained depth (default: twice the trained depth where a step does not depend on the budget: "
                   "one-block bvit, srvit, odevit without refine; else the trained depth)")
    return p


# ----------------------------------------------------------------------------- the measures
def linear_cka(x, y):
    """Linear CKA (Kornblith et al. 2019, eq. 5 with k(a, b) = a.b): x (n, d1), y (n, d2), n
    examples -> ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) of the column-centered X, Y, in float64.
    1 for x = y; invariant to orthogonal maps and isotropic scaling of either side; nan when one
    side is constant over the examples."""
    x, y = x.double() - x.double().mean(0), y.double() - y.double().mean(0)
    return float((y.T @ x).square().sum() / ((x.T @ x).norm() * (y.T @ y).norm()))


def attention_entropy(attn):
    """Entropy in nats of each query's attention: attn (B, h, T, T) rows summing to 1 -> (B, h),
    the mean over the T queries. log T for a uniform map, 0 for a one-hot one."""
    return -torch.special.xlogy(attn, attn).sum(-1).mean(-1)


def attention_distance(attn, grid, prefix):
    """Mean attention distance in patches (Dosovitskiy et al. 2021, fig. 7): attn (B, h, T, T)
    with `prefix` leading non-patch tokens (the class token) and a grid x grid patch map ->
    (B, h). Per patch query: sum_j a_ij |pos_i - pos_j| over patch keys j, the weights a_ij
    renormalized over the patch keys (our choice); then the mean over the patch queries."""
    a = attn[..., prefix:, prefix:]  # (B, h, n, n): patches only
    a = a / a.sum(-1, keepdim=True).clamp_min(1e-30)
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], 1).to(attn)  # (n, 2) row, column of each patch
    return (a * torch.cdist(pos, pos)).sum(-1).mean(-1)


# ----------------------------------------------------------------------------- LoopVAE's loops (sec. 4.4)
@torch.no_grad()
def loop_interventions(model, images, batch_size=128):
    """The loop interventions of LoopVAE (arXiv 2609.11516, sec. 4.4) on `images` (N, 3, H, W) in
    [-1, 1], in eval mode (posterior mode), for every stage with more than one pass. Returns a dict:
      full: mean psnr (dB), ssim and out_of_range (fraction of pixels) of the full schedule;
      prefix: {stage: [mean PSNR with the first k passes, k = 1..L_s]} (the rest of the model in full;
        k = L_s is the full schedule), monotone: {stage: fraction of images whose PSNR never drops as k
        grows} (the paper: 1.0, "completing the schedule"), prefix_out_of_range: {stage: [mean
        out-of-range fraction after k passes]} (truncation is not early exit);
      prefix_psnr_raw: {stage: [mean unclipped PSNR after k passes]} (Table 7 reports both);
      bypass: {stage: [PSNR lost when pass t's output is replaced by its input, t = 0..L_s-1]}, for
        every stage, single-pass ones included (the paper's 14 bypasses per image),
        most_sensitive: {stage: the pass t losing most}, update: {stage: [mean relative update
        RMS(h_{t+1} - h_t) / RMS(h_t) of pass t]} (eq. 12; small updates that matter);
      per_image: the same per image, so that every verdict can be recomputed per image: full {psnr,
        psnr_raw, ssim, out_of_range: [N]}, prefix {stage: {psnr, psnr_raw, ssim, out_of_range:
        [k][N]}}, bypass {stage: [t][N] PSNR lost}, update {stage: [t][N]}."""
    model.eval()
    schedule = model.schedule()
    multi = {name: n for name, n in schedule.items() if n > 1}
    per = ("psnr", "psnr_raw", "ssim", "out_of_range")
    as_list = lambda t: [round(float(v), 5) for v in t]

    def run(**kw):  # per-image metrics over all images, and the traces of the full schedule
        out, trace = {}, {} if not kw else None
        for i in range(0, len(images), batch_size):
            m = model.metrics(images[i:i + batch_size], trace=trace if trace is not None else None, **kw)
            for k, v in m.items():
                out.setdefault(k, []).append(v)
            if trace is not None:
                for name, r in trace.items():
                    out.setdefault("trace:" + name, []).append(r)
                trace.clear()
        return {k: torch.cat(v) for k, v in out.items()}
    full = run()
    res = {"stages": multi, "num_images": len(images),
           "full": {k: float(full[k].mean()) for k in ("psnr", "ssim", "out_of_range")},
           "prefix": {}, "monotone": {}, "prefix_out_of_range": {}, "prefix_psnr_raw": {}, "bypass": {},
           "most_sensitive": {}, "update": {},
           "per_image": {"full": {k: as_list(full[k]) for k in per}, "prefix": {}, "bypass": {}, "update": {}}}
    for name, passes in multi.items():
        runs = [run(truncate={name: k}) for k in range(1, passes)] + [full]
        psnrs = torch.stack([r["psnr"] for r in runs], 1)  # (N, passes)
        res["prefix"][name] = [float(v) for v in psnrs.mean(0)]
        res["monotone"][name] = float((psnrs.diff(dim=1) >= -1e-4).all(1).float().mean())
        res["prefix_out_of_range"][name] = [float(r["out_of_range"].mean()) for r in runs]
        res["prefix_psnr_raw"][name] = [float(r["psnr_raw"].mean()) for r in runs]
        res["per_image"]["prefix"][name] = {k: [as_list(r[k]) for r in runs] for k in per}
    for name, passes in schedule.items():  # every stage's bypasses, single-pass stages included
        lost = [full["psnr"] - run(bypass=(name, t))["psnr"] for t in range(passes)]  # (N,) each
        res["bypass"][name] = [float(v.mean()) for v in lost]
        res["most_sensitive"][name] = max(range(passes), key=res["bypass"][name].__getitem__)
        res["per_image"]["bypass"][name] = [as_list(v) for v in lost]
        if name in multi:
            res["update"][name] = [float(v) for v in full["trace:" + name].mean(0)]
            res["per_image"]["update"][name] = [as_list(v) for v in full["trace:" + name].T]
    return res


# ----------------------------------------------------------------------------- teacher alignment (reViT App. D)
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
    """The mean-pooled patch tokens (B, D) after the embedding (the first block call's input) and after
    every block call, in call order (a shared block: once per step), before the final norm."""
    prefix = int(getattr(model, "cls_token", None) is not None)
    states = []
    pool = lambda z: z[:, prefix:].float().mean(1)
    pre = [blk.register_forward_pre_hook(lambda m, a: states.append(pool(a[0])) if not states else None)
           for blk in model.blocks]
    post = [blk.register_forward_hook(lambda m, a, out: states.append(pool(out))) for blk in model.blocks]
    try:
        model(x)
    finally:
        for h in pre + post:
            h.remove()
    return states


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
    import itertools
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


# ----------------------------------------------------------------------------- model and data
def load(args):
    """(model on args.device in eval mode, validation set, the run's saved flags) of the
    checkpoint args.resume, built as train.py builds it: the saved flags over train.py's parser
    defaults, training.flags.resolve, then training.registry.build_model."""
    ck = read_weights(args.resume, "--resume")  # weights_only: a pickled object is refused
    if not (isinstance(ck, dict) and isinstance(ck.get("model"), dict) and isinstance(ck.get("args"), dict)
            and ck["args"].get("model") in registry.MODELS):
        raise Fail(f"--resume {args.resume}: not an rvits checkpoint (a dict with the model weights "
                         f"under 'model' and the run's flags under 'args', --model one of {', '.join(registry.MODELS)})")
    run = flags.get_parser().parse_args([])
    vars(run).update(ck["args"], teacher=None, distill=None, perceptual="none")  # training-only: an analysis
    # distils nothing and needs no LoopVAE loss term (whose LPIPS weights an offline machine lacks)
    if args.data_dir:
        run.data_dir = args.data_dir
    try:
        _, val_set, num_classes, img_size = data.build_datasets(
            run.data, run.data_dir, run.img_size, seed=run.seed, val_labels=run.val_labels,
            mean_std=registry.MODELS[run.model].normalization,  # as the run saw its images (LoopVAE: [-1, 1])
            reconstruct=registry.MODELS[run.model].reconstructs)
    except (data.DataError, ValueError) as e:
        raise Fail(f"{e} (the checkpoint's data; give --data-dir to read it elsewhere)")
    run = flags.resolve(run, get_parser(), img_size)
    model = registry.build_model(run, img_size, num_classes)
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as e:
        raise Fail(f"--resume {args.resume}: its weights do not fit the model its flags describe "
                   f"({str(e).strip().splitlines()[-1].strip()})")
    return model.to(args.device).eval(), val_set, run


def step_structure(model, name, depth):
    """(number of steps L, block calls per step, does the solver hold the state) for a model of
    train.py's --model `name` run at `depth` (None: as trained, the model's attribute of its record's
    depth_flag: srvit's recursions, odevit's steps, the others' depth); see the module docstring. The
    block calls per step are the model's blocks_per_step (1 without one); an ODE solver (a model with a
    `solver`, odevit) holds the state between its evaluations."""
    trained = getattr(model, registry.MODELS[name].depth_flag)  # (a model keeps its flags' names)
    return depth or trained, getattr(model, "blocks_per_step", 1), hasattr(model, "solver")


# ----------------------------------------------------------------------------- the hooks
class StepProbe:
    """Forward hooks on every block, on each block's attn.qkv and on the final norm.

    `reset(record=True)` before a forward: `inputs[c]`/`outputs[c]` then hold, for block call c
    (in call order, over all blocks), the (mean-pooled patch tokens (B, D), mean token norm (B,))
    of the tensor the call received / returned, `attn[c]` the (entropy, distance) (B, h) of its
    attention and `final` that of the final norm's input. `reset(skip=k)`: the calls of step k
    return their input (zeros with `zero_field`), nothing is recorded."""

    def __init__(self, model, calls_per_step, zero_field=False):
        self.cps, self.zero_field = calls_per_step, zero_field
        self.prefix = int(getattr(model, "cls_token", None) is not None)
        self.grid, self.heads = model.img_size // model.patch_size, model.num_heads
        self.handles = [model.norm.register_forward_pre_hook(self._final)]
        for blk in model.blocks:
            self.handles += [blk.register_forward_pre_hook(self._pre), blk.register_forward_hook(self._post),
                             blk.attn.qkv.register_forward_hook(self._qkv)]
        if getattr(model, "default", True) is False:  # revit_moe.ReViTMoE with a routing or LoRA
            self._wrap_step(model)
        self.reset()

    def _wrap_step(self, model):
        """See the module docstring: the step method gets the block hooks' pre/post calls."""
        step_fn, attend, attn = model._step_fn, model._attend, model.blocks[0].attn

        def step(z, *args):
            self._pre(None, (z,))
            out, logits = step_fn(z, *args)
            new = self._post(None, (z,), out)
            return out if new is None else new, logits

        def attend_(a, lora=None):
            if lora is not None and self.record:  # qkv with the step's adapter, as lora_attention
                import revit_moe
                self._qkv(None, None, revit_moe.lora_linear(a, attn.qkv.weight, attn.qkv.bias, lora["qkv"]))
            return attend(a, lora)

        model._step_fn, model._attend = step, attend_  # instance attributes shadow the methods
        self.handles.append(types.SimpleNamespace(remove=lambda: (delattr(model, "_step_fn"),
                                                                  delattr(model, "_attend"))))

    def reset(self, record=False, skip=None):
        self.call, self.record, self.skip = -1, record, skip
        self.inputs, self.outputs, self.attn, self.final = [], [], [], None

    def summary(self, z):  # z (B, T, D) -> (B, D), (B,) on the CPU
        return z[:, self.prefix:].float().mean(1).cpu(), z.float().norm(dim=-1).mean(1).cpu()

    def _pre(self, blk, args):
        self.call += 1
        if self.record:
            self.inputs.append(self.summary(args[0]))

    def _post(self, blk, args, out):
        if self.skip is not None and self.call // self.cps == self.skip:
            return torch.zeros_like(out) if self.zero_field else args[0]
        if self.record:
            self.outputs.append(self.summary(out))

    def _qkv(self, linear, args, qkv):
        if not self.record:
            return
        B, T, D3 = qkv.shape
        qkv = qkv.float().view(B, T, 3, self.heads, D3 // (3 * self.heads))
        q, k, _ = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, h, T, hd), as the models split it
        a = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)  # (B, h, T, T), as SDPA computes it
        self.attn.append((attention_entropy(a).cpu(), attention_distance(a, self.grid, self.prefix).cpu()))

    def _final(self, norm, args):
        if self.record:
            self.final = self.summary(args[0])

    def states(self, steps, solver_state):
        """The L + 1 summaries embed, step 1, ..., step L of the last recorded forward."""
        c = self.cps
        if solver_state:  # odevit: step k's state is what step k + 1's first evaluation receives
            return [self.inputs[k * c] for k in range(steps)] + [self.final]
        return [self.inputs[0]] + [self.outputs[k * c - 1] for k in range(1, steps + 1)]


# ----------------------------------------------------------------------------- the analysis
@torch.no_grad()
def analyze(model, name, val_set, num_images, depth=None, batch_size=128, device="cpu"):
    """Run the probe and the L pruned passes over the first `num_images` of val_set. Returns the
    dict of numbers that cka.json and steps.json are written from."""
    steps, cps, solver_state = step_structure(model, name, depth)
    zero_field = getattr(model, "field", None) == "blackbox"  # odevit's dz/dt = F(z): a skipped step returns 0
    probe = StepProbe(model, cps, zero_field)
    subset = Subset(val_set, range(min(num_images, len(val_set))))
    feats, norms = [[] for _ in range(steps + 1)], torch.zeros(steps + 1, dtype=torch.float64)
    ent = torch.zeros(steps, model.num_heads, dtype=torch.float64)
    dist = torch.zeros(steps, model.num_heads, dtype=torch.float64)
    correct, skip_correct, n, mix, routed = 0, torch.zeros(steps, dtype=torch.float64), 0, None, None
    try:
        for x, y in tqdm(DataLoader(subset, batch_size, shuffle=False), desc="analyze", unit="batch"):
            x, y, _ = data.drop_undecodable(x, y, subset)  # image folders only
            x, y = x.to(device), y.to(device)
            probe.reset(record=True)
            logits, _ = model(x, depth=depth)
            if len(probe.inputs) != steps * cps:
                raise Fail(f"--model {name} made {len(probe.inputs)} block calls for {steps} steps; "
                                 f"analyze.py expects {cps} per step (see its docstring)")
            correct += int((logits.argmax(1) == y).sum())
            for k, (pooled, norm) in enumerate(probe.states(steps, solver_state)):
                feats[k].append(pooled)
                norms[k] += norm.double().sum()
            for c, (e, d) in enumerate(probe.attn):
                ent[c // cps] += e.double().sum(0) / cps
                dist[c // cps] += d.double().sum(0) / cps
            if getattr(model, "mix_weights", None) is not None:  # srvit: (B, T, R) token mixture
                w = model.mix_weights.double().mean(1).sum(0).cpu()
                mix = w if mix is None else mix + w
            if getattr(model, "routing", "depth") != "depth":  # revit_moe content routing: (L, E)
                g = torch.stack([gt.float().reshape(len(y), -1, gt.shape[-1]).mean(1).sum(0).cpu()
                                 for gt in model._last_gates]).double()
                routed = g if routed is None else routed + g
            for k in range(steps):
                probe.reset(skip=k)
                skip_correct[k] += int((model(x, depth=depth)[0].argmax(1) == y).sum())
            n += len(y)
    finally:
        for hnd in probe.handles:
            hnd.remove()
    feats = [torch.cat(f) for f in feats]
    cka = [[linear_cka(a, b) for b in feats] for a in feats]
    res = {"model": name, "depth": steps, "calls_per_step": cps, "num_images": n, "cka": cka,
           "top1": 100 * correct / n, "act_norm": (norms / n).tolist(), "attn_entropy": (ent / n).tolist(),
           "attn_distance": (dist / n).tolist(), "top1_skip": (100 * skip_correct / n).tolist(),
           "tokens": probe.grid ** 2 + probe.prefix, "patch_size": model.patch_size}
    if routed is not None:  # revit_moe content routing: mean gate per step, (L, E)
        res["gates"] = (routed / n).tolist()
    elif getattr(model, "lora_rank", 0):  # revit_moe LoRA: ||B_k A_k|| per adapter
        res["lora_norms"] = model.log_extras()["lora_norms"]
    elif hasattr(model, "gates"):  # reViT: expert weights g_e(t_k) of the analysed grid, (L, E)
        res["gates"] = model.gates(steps).tolist()
    if mix is not None:
        res["mix_weights"] = (mix / n).tolist()
    return res


STEP_MEANING = {
    "odevit": "one solver step ({c} block evaluations); state = the solver's z(t_k)",
    "srvit": "one recursion through the {c}-layer stack; state = h_r before the token mixture",
}


def finite(v):  # JSON has no NaN: an undefined CKA (a constant representation) is written as null
    return [finite(u) for u in v] if isinstance(v, list) else (v if math.isfinite(v) else None)


def write(res, checkpoint, out_dir):
    """OUT/cka.json, OUT/steps.json and, with matplotlib, OUT/cka.png and OUT/steps.png."""
    L, name = res["depth"], res["model"]
    layers = ["embed"] + [f"step {k}" for k in range(1, L + 1)]
    cka = {"cka": finite(res["cka"]), "layers": layers, "checkpoint": checkpoint,
           "num_images": res["num_images"], "model": name, "depth": L}
    if "gates" in res:
        cka["gates"] = [[round(g, 4) for g in row] for row in res["gates"]]
    if "lora_norms" in res:
        cka["lora_norms"] = res["lora_norms"]
    rows = []
    for k in range(L):
        row = {"step": k + 1, "act_norm": res["act_norm"][k + 1], "attn_entropy": res["attn_entropy"][k],
               "attn_distance": res["attn_distance"][k], "top1_skip": res["top1_skip"][k]}
        if "gates" in res:
            row["gates"] = res["gates"][k]
        if "mix_weights" in res:
            row["mix_weight"] = res["mix_weights"][k]
        rows.append(row)
    meaning = STEP_MEANING.get(name, "one block application; state = the block's output")
    steps = {"checkpoint": checkpoint, "model": name, "depth": L, "num_images": res["num_images"],
             "step": meaning.format(c=res["calls_per_step"]), "calls_per_step": res["calls_per_step"],
             "top1": res["top1"], "embed_act_norm": res["act_norm"][0], "tokens": res["tokens"],
             "max_entropy": math.log(res["tokens"]), "patch_size": res["patch_size"], "steps": rows}
    os.makedirs(out_dir, exist_ok=True)
    for fname, obj in (("cka.json", cka), ("steps.json", steps)):
        with open(os.path.join(out_dir, fname), "w") as f:
            json.dump(obj, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5 + 0.2 * L, 4 + 0.2 * L))
    im = ax.imshow(torch.tensor(res["cka"]).numpy(), vmin=0, vmax=1, cmap="magma", origin="lower")
    ax.set_xticks(range(L + 1), ["embed"] + list(range(1, L + 1)))
    ax.set_yticks(range(L + 1), ["embed"] + list(range(1, L + 1)))
    ax.set(xlabel="step", ylabel="step", title=f"{name}: linear CKA of mean patch tokens (n={res['num_images']})")
    fig.colorbar(im, ax=ax)
    fig.savefig(os.path.join(out_dir, "cka.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)
    k = list(range(1, L + 1))
    fig, ax = plt.subplots(2, 2, figsize=(11, 8), layout="constrained")
    ax[0, 0].plot(range(L + 1), res["act_norm"], "o-")
    ax[0, 0].set(xlabel="step (0 = embedding)", ylabel="mean token norm", title="activation norm")
    for h, (e, d) in enumerate(zip(zip(*res["attn_entropy"]), zip(*res["attn_distance"]))):
        ax[0, 1].plot(k, e, "o-", label=f"head {h}")
        ax[1, 0].plot(k, d, "o-", label=f"head {h}")
    ax[0, 1].axhline(math.log(res["tokens"]), color="gray", ls="--", label="uniform (log T)")
    ax[0, 1].set(xlabel="step", ylabel="nats", title="attention entropy per head")
    ax[1, 0].set(xlabel="step", ylabel="patches", title="mean attention distance per head")
    ax[1, 1].bar(k, res["top1_skip"], label="step k skipped")
    ax[1, 1].axhline(res["top1"], color="k", ls="--", label=f"no step skipped ({res['top1']:.1f}%)")
    ax[1, 1].set(xlabel="skipped step k", ylabel="top-1 (%)", title="step-specific pruning")
    for a in (ax[0, 1], ax[1, 0], ax[1, 1]):
        a.legend(fontsize=7)
    fig.suptitle(f"{name}, {checkpoint}: {steps['step']} (n={res['num_images']})", fontsize=9)
    fig.savefig(os.path.join(out_dir, "steps.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_loops(res, checkpoint, out_dir):
    """OUT/loops.json (loop_interventions' dict), and OUT/loops.png, PSNR after each prefix of every
    multi-pass stage, when matplotlib is installed."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "loops.json"), "w") as f:
        json.dump({"checkpoint": checkpoint, **res}, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, psnrs in res["prefix"].items():
        ax.plot(range(1, len(psnrs) + 1), psnrs, "o-", label=name)
    ax.set(xlabel="passes kept (k)", ylabel="PSNR (dB)", title=f"LoopVAE: completing the schedule (n={res['num_images']})")
    ax.legend(fontsize=7)
    fig.savefig(os.path.join(out_dir, "loops.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    args = get_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise Fail("--device cuda: no CUDA device is available; use --device cpu")
    if args.budget and not args.anytime:
        raise Fail(f"--budget {args.budget}: the step budget of --anytime; add --anytime or drop --budget")
    model, val_set, run = load(args)
    if args.teacher:
        return main_alignment(args, model, val_set, run)
    if args.anytime:
        return main_anytime(args, model, val_set, run)
    if registry.MODELS[run.model].reconstructs:  # a tokenizer: its loops (sec. 4.4), not CKA and per-step statistics
        if args.depth is not None:
            raise Fail(f"--depth {args.depth}: {args.resume} is a LoopVAE checkpoint, analysed at its trained loops "
                       "(every pass, truncated and bypassed); leave out --depth")
        n = min(args.num_images, len(val_set))
        images = torch.stack([val_set[i][0] for i in range(n)]).to(args.device)
        res = loop_interventions(model, images, args.batch_size)
        try:
            write_loops(res, args.resume, args.out_dir)
        except OSError as e:
            raise Fail(f"--out-dir {args.out_dir} cannot be written ({e.strerror})")
        print(f"PSNR {res['full']['psnr']:.2f} dB on {n} images; most sensitive pass per stage: "
              + ", ".join(f"{k} {v}" for k, v in res["most_sensitive"].items()) + f"; wrote {args.out_dir}/loops.json")
        return
    try:
        res = analyze(model, run.model, val_set, args.num_images, args.depth, args.batch_size, args.device)
    except ValueError as e:  # e.g. a depth the model cannot run
        raise Fail(f"--depth {args.depth}: {e}")
    try:
        write(res, args.resume, args.out_dir)
    except OSError as e:
        raise Fail(f"--out-dir {args.out_dir} cannot be written ({e.strerror})")
    print(f"top-1 {res['top1']:.2f}% on {res['num_images']} images; skipping step k: "
          + " ".join(f"{v:.1f}" for v in res["top1_skip"]) + f"; wrote {args.out_dir}/cka.json, steps.json")


def save(res, out_dir, name, plot):
    """OUT/NAME.json and, with matplotlib, OUT/NAME.png (plot(res, path)); Fail for a folder that cannot
    be written."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(res, f, indent=1)
        plot(res, os.path.join(out_dir, f"{name}.png"))
    except OSError as e:
        raise Fail(f"--out-dir {out_dir} cannot be written ({e.strerror})")


def main_alignment(args, model, val_set, run):
    """analyze.py --teacher: alignment() of the checkpoint against the teacher, written as alignment.json
    (+ alignment.png: the cross-CKA map with its maximum-CKA path and the proportional diagonal)."""
    if registry.MODELS[run.model].reconstructs or step_structure(model, run.model, None)[1:] != (1, False):
        # (a step must be one block call, its state the block's output: not a recursion or a solver step)
        raise Fail(f"--teacher: the alignment analyses read one state per step, a block's output (vit, bvit, revit); "
                   f"{args.resume} is --model {run.model}")
    if args.depth is not None:
        raise Fail("--teacher: leave out --depth (the alignment analyses read the trained depth)")
    from training.distill import Distiller, teacher
    teacher_model, renorm, line = teacher(args.teacher, flags.get_parser(), model, run)
    teacher_model = teacher_model.to(args.device)
    to_teacher = Distiller(model, teacher_model, "feature", renormalize=renorm).to(args.device).teacher_input
    print(line)
    n = min(args.num_images, len(val_set))
    images = torch.stack([val_set[i][0] for i in range(n)]).to(args.device)
    res = alignment(model, teacher_model, to_teacher, images, args.batch_size, args.draws, run.seed)
    res.update(checkpoint=args.resume, teacher=args.teacher, num_images=n, model=run.model,
               experts=getattr(model, "experts", 1), cross=finite(res["cross"]))
    save(res, args.out_dir, "alignment", plot_alignment)
    extra = ""
    if "deletions" in res:
        perm = [p["teacher_cka"] for p in res["permutations"][1:]]
        extra = (f"; gate permutations {sum(v < res['teacher_cka'] for v in perm)} of {len(perm)} lower "
                 f"(mean {sum(perm) / len(perm):.3f})")
    print(f"teacher CKA {res['teacher_cka']:.3f}; max-CKA path rho {res['rho']:.3f}, MAD {res['mad']:.2f} layers"
          f"{extra}; wrote {args.out_dir}/alignment.json")


THRESHOLDS = {"confidence": [0.05 * i for i in range(1, 20)] + [0.97, 0.99, 0.999],
              **{r: [10 ** (e / 4) for e in range(-20, 3)] for r in ("kl", "update", "second-order")}}
PER_IMAGE = 256  # anytime.json keeps the per-image relative updates of the first this many images
MAX_BUDGET = 8  # --budget: at most this many times the trained depth
WITHIN = 0.5  # top-1 points: a rule's operating point keeps full-depth top-1 within this (issue 40)


def anytime_analysis(model, val_set, num_images, budget, trained, batch_size=128, device="cpu"):
    """The anytime curves of a classifier on the first `num_images` of val_set: a trace to `budget`
    steps (training/anytime.py); fixed-depth top-1 at depth 1..budget; per rule its curve over
    THRESHOLDS and its operating point (the fewest mean block applications whose top-1 is within WITHIN
    points of the trained depth's), its exit steps there (histogram; mean per class) and the best gain
    over fixed depth at equal mean compute (the fixed curve interpolated linearly); the oracle; per step
    the readout's top-1, relative update and residual (mean; the update also per image, for the first
    PER_IMAGE images), the behaviour beyond the trained depth (anytime.behaviour), and the best rule's
    gain chosen on half the images and scored on the other half (anytime.heldout_gain: claim (b) of
    issue 40)."""
    from training import anytime
    subset = Subset(val_set, range(min(num_images, len(val_set))))
    parts, labels, fixed_right = [], [], []
    for x, y in tqdm(DataLoader(subset, batch_size, shuffle=False), desc="anytime", unit="batch"):
        x, y, _ = data.drop_undecodable(x, y, subset)
        x = x.to(device)
        parts.append(anytime.trace(model, x, budget))
        labels.append(y)
        with torch.no_grad():  # (B, L): depth d's prediction right (reViT's depth d is not trace step d)
            fixed_right.append(torch.stack([model(x, depth=d)[0].argmax(1).cpu() == y
                                            for d in range(1, budget + 1)], 1))
    tr = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    y, fixed_right = torch.cat(labels), torch.cat(fixed_right)
    n, bps = len(y), model.blocks_per_step
    right = tr["pred"] == y[:, None]
    fixed = [float(100 * v) for v in fixed_right.double().mean(0)]
    full = fixed[trained - 1]
    apps = [(d + 1) * bps for d in range(budget)]

    def at(c):  # the fixed-depth top-1 at mean compute c, interpolated between depths
        return float(100 * anytime.fixed_at(fixed_right, c, bps).mean())

    rules = {}
    for rule, ts in THRESHOLDS.items():
        pts = anytime.curve(tr, right, rule, ts, bps)
        ok = [p for p in pts if p[2] >= full - WITHIN]
        op = min(ok, key=lambda p: p[1]) if ok else None
        res = {"curve": [{"threshold": t, "applications": a, "top1": v} for t, a, v in pts],
               "best_gain_over_fixed": max(v - at(a) for _, a, v in pts), "operating_point": None}
        if op:
            e = anytime.exit_steps({**tr, "right": right}, rule, op[0])
            per_class = {int(c): float((e[y == c] + 1).float().mean()) for c in y.unique()}
            res["operating_point"] = {"threshold": op[0], "applications": op[1], "top1": op[2],
                                      "fraction_of_trained": op[1] / (trained * bps),
                                      "exit_histogram": torch.bincount(e, minlength=budget).tolist(),
                                      "earliest_classes": sorted(per_class, key=per_class.get)[:5],
                                      "latest_classes": sorted(per_class, key=per_class.get)[-5:],
                                      "mean_steps_per_class": per_class}
        rules[rule] = res
    oracle = anytime.exit_steps({**tr, "right": right}, "oracle", None)
    mean = lambda key: [float(v) for v in tr[key].nanmean(0)]
    return {"num_images": n, "budget": budget, "trained_depth": trained, "blocks_per_step": bps,
            "full_top1": full, "fixed": [{"depth": d + 1, "applications": a, "top1": v}
                                         for d, (a, v) in enumerate(zip(apps, fixed))],
            "rules": rules, "heldout": anytime.heldout_gain(tr, right, fixed_right, THRESHOLDS, bps),
            "oracle": {"applications": float((oracle + 1).float().mean()) * bps,
                       "top1": float(100 * right.gather(1, oracle[:, None]).float().mean())},
            "per_step": {"top1": [float(100 * v) for v in right.float().mean(0)], "update": mean("update"),
                         "residual": mean("residual"), "return2": mean("return2"),
                         "update_per_image": [[round(float(v), 5) for v in row] for row in tr["update"][:PER_IMAGE]]},
            "behaviour": anytime.behaviour(mean("residual"), mean("return2"), trained)}


def main_anytime(args, model, val_set, run):
    """analyze.py --anytime: anytime_analysis of the checkpoint, written as anytime.json and anytime.png."""
    from training import anytime
    if registry.MODELS[run.model].reconstructs:
        raise Fail(f"--anytime: {args.resume} is a LoopVAE tokenizer; early exit reads a classifier's predictions")
    trained = registry.trained_depth(run)  # recursions for srvit, solver steps for odevit, else block applications
    # Past the trained depth by default only where step k does not depend on the budget's grid: one block
    # (bvit), a recursion (srvit), a solver step of a fixed size (odevit, extend
    # "time"); reViT's coordinates, bViT's phases and a refined ODE grid change with the budget.
    grid_free = (run.model == "bvit" and model.num_blocks == 1) or run.model == "srvit" \
        or (run.model == "odevit" and model.extend != "refine")
    budget = args.budget or (2 * trained if grid_free else trained)
    try:
        anytime.check(model, budget)
    except ValueError as e:
        raise Fail(f"--budget {budget}: {e}")
    if budget < trained:
        raise Fail(f"--budget {budget}: below the trained depth {trained}; the operating point is read against it")
    if budget > MAX_BUDGET * trained:  # every fixed depth 1..budget is run too: the cost grows as budget^2
        raise Fail(f"--budget {budget}: at most {MAX_BUDGET}x the trained depth ({MAX_BUDGET * trained} steps)")
    res = anytime_analysis(model, val_set, args.num_images, budget, trained, args.batch_size, args.device)
    res.update(checkpoint=args.resume, model=run.model)
    save(res, args.out_dir, "anytime", plot_anytime)
    ops = ", ".join(f"{r} {v['operating_point']['fraction_of_trained']:.0%}" if v["operating_point"] else f"{r} -"
                    for r, v in res["rules"].items())
    print(f"full-depth top-1 {res['full_top1']:.2f} % at {trained} steps; block applications within {WITHIN} "
          f"points: {ops} of the trained depth's; oracle {res['oracle']['applications']:.2f} applications at "
          f"{res['oracle']['top1']:.2f} %; beyond the trained depth: {res['behaviour'] or 'not run'}; wrote "
          f"{args.out_dir}/anytime.json")


def plot_anytime(res, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    ax[0].plot([p["applications"] for p in res["fixed"]], [p["top1"] for p in res["fixed"]], "k.-", label="fixed depth")
    for rule, r in res["rules"].items():
        ax[0].plot([p["applications"] for p in r["curve"]], [p["top1"] for p in r["curve"]], ".-", ms=3, label=rule)
    ax[0].plot([res["oracle"]["applications"]], [res["oracle"]["top1"]], "r*", ms=10, label="oracle")
    ax[0].axhline(res["full_top1"] - WITHIN, color="gray", ls=":", lw=1)
    ax[0].set(xlabel="mean block applications per image", ylabel="top-1 (%)",
              title=f"{res['model']}: per-image exit (n={res['num_images']})")
    ax[0].legend(fontsize=7)
    k = range(1, res["budget"] + 1)
    ax[1].plot(k, res["per_step"]["top1"], "o-", label="readout top-1 (%)")
    ax[1].set(xlabel="step", ylabel="top-1 (%)", title=f"per step (trained depth {res['trained_depth']}; beyond: "
              f"{res['behaviour'] or '-'})")
    ax[1].axvline(res["trained_depth"], color="gray", ls=":", lw=1)
    tw = ax[1].twinx()
    tw.semilogy(k, res["per_step"]["residual"], "s--", color="tab:red", ms=3, label="residual RMS")
    tw.set_ylabel("RMS(h_k - h_{k-1})")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_alignment(res, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    c = torch.tensor([[v if v is not None else float("nan") for v in row] for row in res["cross"]])
    ls, lt = c.shape[0] - 1, c.shape[1] - 1
    fig, ax = plt.subplots(figsize=(4 + 0.2 * lt, 4 + 0.2 * ls))
    im = ax.imshow(c.numpy(), vmin=0, vmax=1, cmap="magma", origin="lower")
    ax.plot(res["path"], range(1, ls + 1), "c.-", label=f"max-CKA path (rho {res['rho']:.3f}, MAD {res['mad']:.2f})")
    ax.plot(res["proportional"], range(1, ls + 1), "w--", lw=1, label="proportional depth")
    ax.set(xlabel="teacher layer (0 = embedding)", ylabel="student step (0 = embedding)",
           title=f"{res['model']} E={res['experts']} vs teacher: cross-CKA (n={res['num_images']})")
    ax.legend(fontsize=7, loc="upper left")
    fig.colorbar(im, ax=ax)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def cli(argv=None):
    """main(argv) with every user-fixable problem as one line on stderr and exit status 2."""
    printable_output()  # (a path or class name on a stdout that cannot encode it: escaped, not an error)
    try:
        main(argv)
    except Fail as e:
        sys.stderr.write(f"analyze.py: error: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
