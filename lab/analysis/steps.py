"""What does the recurrent block do at each step? Depthwise self-CKA and the per-step mechanistic
analyses of a classifier (analyze.py's default: cka.json, steps.json).

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
    odevit's subtracted field F(z) - z is then 0), for odevit's black-box field dz/dt = F(z) they
    return 0, so z(t_{k+1}) = z(t_k) either way. For a model whose step k is a function of the state
    alone (bvit with one block, odevit), skipping ANY one step is running L - 1 steps, so its pruning
    curve is flat by construction (a test checks it); steps differ under pruning only where the block
    depends on k (the untied vit, bvit's phases, reViT's gates g(t_k), srvit's per-recursion router, the
    per-step LoRA adapters). revit_moe's content routings (lory, smear, deepseek, qwen3, moeut, remoe,
    softmoe) route on the state alone, so their curves are flat by construction too.
    --depth L analyses the model run at L steps (L recursions for srvit, L solver steps for odevit).

How: the states are the model's own forward_intermediates (the embedding, `begin`, before them),
its logits forward_head's; the rest, without editing a model file, are forward hooks. A shared block
is called once per evaluation, in order, so a counter over the calls of all blocks gives the step; a
pre-hook on a block sees the state it receives and a hook its output; a hook on `attn.qkv` recomputes the attention
probabilities softmax(q k^T / sqrt(d_head)) (the models call F.scaled_dot_product_attention, which
returns no weights); a block hook that returns the block's input skips the step. revit_moe's
routings and LoRA run a step as the method `_step_fn` on the block's parts, not as a block call:
the probe wraps that method (and, for LoRA, `_attend`, whose qkv is not the attn.qkv module) on the
model instance for the analysis and removes the wrappers after. Their content routings have no
depth gate table: "gates" is then their mean gate per step over the analysed images (and tokens,
for the token-level routings: revit_moe's `_last_gates`, as in its log_extras); LoRA checkpoints
get "lora_norms" (revit_moe.log_extras: one per trained adapter, whatever --depth is analysed).
"""
import types

import torch
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

import data
from analysis.anytime import tokens
from training import registry
from training.exits import Fail


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
        """Before a forward: record what the blocks receive and return (record=True), or skip step `skip`."""
        self.call, self.record, self.skip = -1, record, skip
        self.inputs, self.outputs, self.attn, self.final = [], [], [], None

    def summary(self, z):
        """z (B, T, D) -> (the mean patch token (B, D), the mean token norm (B,)), on the CPU, in float32."""
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
    steps, cps, _ = step_structure(model, name, depth)
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
            probe.reset(record=True)  # the attention of every block call; the states: forward_intermediates
            final, states = model.forward_intermediates(x, output_fmt="NLC", return_prefix_tokens=True, depth=depth)
            states = [torch.cat([s[1], s[0]], 1) if isinstance(s, tuple) else s for s in states]  # (B, T, D) again
            logits = model.forward_head(final)  # forward's logits, bit for bit
            if len(probe.inputs) != steps * cps:
                raise Fail(f"--model {name} made {len(probe.inputs)} block calls for {steps} steps; "
                                 f"analyze.py expects {cps} per step (see its docstring)")
            correct += int((logits.argmax(1) == y).sum())
            for k, (pooled, norm) in enumerate(map(probe.summary, [tokens(model.begin(x)), *states])):
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
                skip_correct[k] += int((model(x, depth=depth).argmax(1) == y).sum())
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
