"""How does a classifier leave Python? torch.export (TorchScript is deprecated in torch: not a path).

- export_fixed: the logits of `model(x, depth=L)` at one depth L, the batch dimension dynamic: every
  classifier except revit_moe's token-dispatch routings (deepseek, qwen3, moeut), whose experts' token
  counts are data (Python lists of sizes) and so cannot be a graph.
- export_loop: the loop count as a runtime input, `program(x, n)` for any n >= 1 from one export: the
  recurrence as torch.while_loop (a higher-order op that torch.export keeps as a loop), its body one
  step. Where a step depends on n it is computed from n in the graph (reViT's t_k = k / (n - 1)).
  Refused, with the reason, where a step is chosen by a Python value of n: bViT with num_blocks > 1 (the
  phase map picks a module per step: a module cannot be selected by a tensor), ODEViT with extend="refine"
  (its step size T / n is a Python float of the solver), and the token-dispatch routings (as above).

- export_policy: an anytime exit policy (anytime.py) in the graph, `program(x)` -> (logits, steps) as
  policy(model, x) gives them: the steps as torch.while_loop up to the policy's budget, the rule read after
  each step, an image's logits and step count kept when it exits, the loop ending once every image has.
  A graph's batch cannot shrink, so an image that has left is still computed until the last one leaves:
  the same numbers as the eager exit path, not its saving per image (that is the eager path's, anytime.run).

All are for inference: the model in eval mode (no drop path, no depth dropout), float32 or the
model's dtype. docs/models.md ("From Python") lists what each model exports; tests/test_export.py checks
the programs against eager at depths 6, 12 and 24.
"""
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

DISPATCH = ("deepseek", "qwen3", "moeut")  # revit_moe's token dispatch: data-dependent sizes


class FixedDepth(nn.Module):
    """logits = model(x, depth=depth): x (B, C, H, W) -> (B, classes)."""

    def __init__(self, model, depth):
        super().__init__()
        self.model, self.depth = model, depth

    def forward(self, x):
        return self.model(x, depth=self.depth)


def _refuse_dispatch(model):
    """ValueError, with the reason, for a model that export does not cover: anything but the classifiers of
    bvit.py, revit.py (revit_moe.py), srvit.py and odevit.py (LoopVAE, a tokenizer, returns reconstructions and
    its loss terms, not logits), and revit_moe's token-dispatch routings."""
    import bvit
    import odevit
    import revit
    import srvit
    if not isinstance(model, (bvit.BViT, revit.ReViT, srvit.SRViT, odevit.ODEViT)):
        raise ValueError(f"{type(model).__name__} cannot be exported: export.py exports the classifiers' logits "
                         "(bvit, vit, revit, srvit, odevit); a tokenizer such as LoopVAE has no logits to export")
    if getattr(model, "routing", None) in DISPATCH:
        raise ValueError(f"routing={model.routing!r} cannot be exported: its token dispatch splits the tokens by "
                         "the number each expert gets, which is data (a graph needs it symbolic)")


def example_images(model, batch=2):
    """A batch of `batch` images (B, C, H, W) of the model's size, dtype and device: export's example input."""
    p = model.pos_embed
    return torch.randn(batch, model.in_chans, model.img_size, model.img_size, device=p.device, dtype=p.dtype)


def export_fixed(model, depth=None, batch=2):
    """torch.export.export of `model`'s logits at a fixed `depth` (default: as trained; SR-ViT: recursions,
    ODEViT: solver steps), the batch dimension dynamic (any B >= 1 at run time; the example has `batch`
    >= 2 images, so that torch does not specialize it). Returns the ExportedProgram: program.module()(x)
    -> logits (B, classes). Sets model.eval(). ValueError for a model it does not cover (_refuse_dispatch: LoopVAE; revit_moe's token dispatch)."""
    _refuse_dispatch(model)
    model.eval()
    batch_dim = torch.export.Dim("batch", min=1)
    with torch.no_grad(), warnings.catch_warnings():
        # SR-ViT's mix_weights and revit_moe's _last_gates, set by forward for analyze.py, are no outputs of
        # the program (it returns the logits): torch's advice to make them buffers does not apply
        warnings.filterwarnings("ignore", message="The tensor attributes? .* assigned during export")
        return torch.export.export(FixedDepth(model, depth), (example_images(model, batch),),
                                   dynamic_shapes={"x": {0: batch_dim}})


class Loop(nn.Module):
    """logits = program(x, n), n a 0-d int64 tensor: begin, n steps as torch.while_loop, readout."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.start, self.body, self.end = loop_parts(model)

    def forward(self, x, n):
        # eager's check of the depth (bvit.check_depth: "depth must be >= 1"), kept in the graph: a RuntimeError
        # at run time, where without it n <= 0 would run no step and return the logits of the stem
        torch._assert_async(n >= 1, "depth must be >= 1 (the loop count n of the exported program)")
        state = self.start(x, n)
        i = torch.zeros((), dtype=torch.int64, device=x.device)
        out = torch.while_loop(lambda i, *s: i < n, lambda i, *s: (i + 1, *self.body(i, n, *s)), (i, *state))
        return self.end(out[1:])


def loop_parts(model):
    """(start(x, n) -> the state as a tuple of tensors, body(i, n, *state) -> the next state, end(state) ->
    logits) of `model`'s recurrence, step i of n, each step exactly the model's own step (see the module
    docstring). ValueError, with the reason, where the loop count cannot be a runtime input."""
    import bvit
    import odevit
    import revit
    import srvit
    _refuse_dispatch(model)
    readout = lambda s: model.readout(s[0])
    if isinstance(model, bvit.BViT):
        if model.num_blocks > 1:
            raise ValueError(f"num_blocks={model.num_blocks}: the phase map picks one of the blocks per step from the "
                             "depth, a Python choice of a module that a graph cannot make at run time; export_fixed "
                             "exports it at each depth")
        return lambda x, n: (model.begin(x),), lambda i, n, z: (model.blocks[0](z),), readout
    if isinstance(model, odevit.ODEViT):
        if model.extend == "refine":
            raise ValueError("extend='refine': the step size T / n is a Python float of the solver (exact Euler at "
                             "h = 1), fixed in the graph; export_fixed exports it at each depth")
        _, h = model.time_grid()  # extend="time": the same h at every depth, and F ignores t (autonomous)
        f, subtracted = lambda t, z: model.blocks[0](z), model.field == "subtracted"  # (field_fn less its count)
        return (lambda x, n: (model.begin(x),),
                lambda i, n, z: (odevit.solver_step(f, z, 0.0, h, model.solver, subtracted),), readout)
    if isinstance(model, revit.ReViT):
        return (lambda x, n: (model.begin(x),)), revit_body(model), readout
    if isinstance(model, srvit.SRViT):
        return srvit_parts(model)
    raise ValueError(f"{type(model).__name__}: no loop for export (a classifier of bvit, revit, srvit or odevit)")


def revit_body(model):
    """reViT's step i of n with t_i = i / max(n - 1, 1) computed in the graph (revit.ReViT.grid's float32
    division): its merged FFN (default), or the routed step with the nearest trained LoRA adapter."""
    def coord(i, n):
        return (i.float() / (n - 1).clamp(min=1).float()).reshape(1)  # (1,)

    if getattr(model, "default", True):
        def body(i, n, z):
            w1, b1, w2, b2 = model.ffn_weights(coord(i, n))  # (1, H, D), (1, H), (1, D, H), (1, D)
            return (model.blocks[0](z, w1[0], b1[0], w2[0], b2[0]),)
        return body

    def routed(i, n, z):
        adapters = model.adapter_index(coord(i, n)).expand(z.shape[0]) if model.lora_rank else None
        return (model._step_fn(z, adapters)[0],)
    return routed


def srvit_parts(model):
    """SR-ViT's recursions with the streaming mixture in the loop: the state (h, m, den, num) starts at
    (tokens, -inf, 0, 0), so that the first update gives mix_add's first state exactly (weight
    exp(s - s) = 1, the old sums times exp(-inf) = 0); recursion i's router is that of min(i, R - 1)
    (as Router.forward), its LayerNorms stacked so that the graph indexes them with the tensor i."""
    import srvit
    router = model.router

    def score(h, i):
        if router is None:  # R = 1: a uniform mixture (recursion's zeros)
            return h.new_zeros(h.shape[:-1] + (1,))
        r = i.clamp(max=len(router.norms) - 1).reshape(1)  # (index_select: a tensor index, no Python int)
        w, b = (torch.stack([getattr(n, k) for n in router.norms]).index_select(0, r)[0] for k in ("weight", "bias"))
        return F.linear(F.layer_norm(h, h.shape[-1:], w, b, router.norms[0].eps), router.weight.index_select(0, r)
                        ).float()

    def start(x, n):
        h = model.embed(x)
        s = score(h, torch.zeros((), dtype=torch.int64, device=h.device))  # (B, T, 1): the shape and dtype
        return h, torch.full_like(s, float("-inf")), torch.zeros_like(s), torch.zeros_like(h, dtype=s.dtype)

    def body(i, n, h, m, den, num):
        for blk in model.blocks:
            h = blk(h)
        return (h, *srvit.mix_add(m, den, num, h, score(h, i)))

    return start, body, model.readout


def export_loop(model, batch=2):
    """torch.export.export of `model`'s logits with the loop count a runtime input: program.module()(x, n),
    x (B, C, H, W) with B dynamic, n a 0-d int64 tensor >= 1 (the depth: SR-ViT's recursions, ODEViT's
    solver steps), -> logits (B, classes), as model(x, depth=n) (loop_parts); n < 1 raises RuntimeError
    "depth must be >= 1" at run time, where eager raises ValueError. Sets model.eval().
    ValueError, with the reason, where the loop count cannot be a runtime input (module docstring)."""
    _refuse_dispatch(model)
    model.eval()
    loop = Loop(model)
    x, n = example_images(model, batch), torch.tensor(getattr(model, "recursions", model.depth))
    with torch.no_grad():
        return torch.export.export(loop, (x, n), dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1)},
                                                                 "n": None})


class ExitLoop(nn.Module):
    """(logits (B, classes), steps (B,) long) = program(x) under an exit policy (export_policy)."""

    def __init__(self, model, rule, threshold, budget):
        super().__init__()
        self.model, self.rule, self.threshold, self.budget = model, rule, threshold, budget
        self.start, self.body, self.end = loop_parts(model)

    def forward(self, x):
        import anytime
        n = torch.full((), self.budget, dtype=torch.int64, device=x.device)
        state = self.start(x, n)
        B = x.shape[0]
        logits = x.new_zeros(B, self.model.num_classes)
        carry = (torch.zeros((), dtype=torch.int64, device=x.device), torch.ones(B, dtype=torch.bool, device=x.device),
                 logits, torch.zeros(B, dtype=torch.int64, device=x.device),
                 torch.zeros(B, self.model.num_classes, device=x.device),  # the previous step's log-probabilities
                 torch.zeros(B, device=x.device), *state)  # the previous step's RMS change of the tokens

        def step(i, active, out, steps, logp, d_prev, *s):  # (s[0]: the previous step's tokens, the embedding at 0)
            h_prev, s = s[0], self.body(i, n, *s)
            logits = self.end(s)
            st = anytime.stats(logits, s[0], {"h": h_prev, "logp": logp, "d": d_prev})  # (anytime.run's)
            fire = anytime.fires(self.rule, st, self.threshold)
            if self.rule in ("kl", "second-order"):  # (no previous step at i = 0: eager's nan never fires)
                fire = fire & (i >= 1)
            done = active & (fire | (i == n - 1))
            return (i + 1, active & ~done, torch.where(done[:, None], logits.to(out.dtype), out),
                    torch.where(done, i + 1, steps), st["logp"], st["d"], *s)

        out = torch.while_loop(lambda i, active, *_: (i < n) & active.any(), step, carry)
        return out[2], out[3]


def export_policy(model, policy=None, batch=2):
    """torch.export.export of `model` under the anytime exit policy `policy` (an anytime.Policy or its JSON file;
    None: the policy of an anytime.Exiting model, what hubconf.from_run(run, policy=...) returns):
    program.module()(x), x (B, C, H, W) with B dynamic, -> (logits (B, classes), steps (B,) long, 1..budget), as
    policy(model, x) (module docstring: every image is computed until the last one exits). Sets model.eval().
    anytime.PolicyError for a model whose weights are not the policy's or an unreadable policy file; ValueError,
    with the reason, where the loop cannot be a graph (export_loop's cases) or the model has no class head."""
    import anytime
    if isinstance(model, anytime.Exiting):
        model, policy = model.model, model.policy if policy is None else policy
    if policy is None:
        raise ValueError("export_policy(model, policy): give the policy (anytime.Policy or its JSON file), or the "
                         "model from hubconf.from_run(run, policy=FILE)")
    if not isinstance(policy, anytime.Policy):
        policy = anytime.Policy.load(policy)
    policy.check_model(model)
    if not getattr(model, "num_classes", 0):
        raise ValueError("num_classes=0: the model has no class head, so no logits for an exit rule to read")
    model.eval()
    threshold = anytime.NEVER[policy.rule] if policy.threshold is None else policy.threshold
    program = ExitLoop(model, policy.rule, threshold, policy.budget)
    with torch.no_grad():
        return torch.export.export(program, (example_images(model, batch),),
                                   dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1)}})
