"""The models train.py can build, by name (--model): one record each (Model), and what train.py asks of them.

MODELS maps a --model name to its Model record: the builder `build(args, common) -> nn.Module` (`args`
the resolved flags, training/flags.py, which it reads and never changes; `common` the keyword arguments
every model file takes: img_size, patch_size, num_classes, embed_dim, depth, num_heads, mlp_ratio,
class_token, layer_scale, drop_path_rate, and init (inits.py) / init_base / loss / dynamic_img_size only when asked
for), and what the rest of rvits derives from it: the flags only it reads (flags.resolve refuses them for
another model), the ones of those that shape its weights (--finetune takes them from a checkpoint,
--resume refuses a change: arch_flags), the trained depth in --eval-depths' unit (trained_depth), its
CPU-sized preset (the estimate's hint on a CPU), and how its images are normalized. A model that another
entry point trains (LoopVAE, a tokenizer: train_loopvae.py) is not here; ELSEWHERE names its script.
A new model is a model file and one record, registered once
(docs/models.md "Add your own model"); tests/test_registry.py runs every registered model through the
interface below, so a new model passes the same test.

The interface (a model file implements it; nothing is inherited):
    forward(x, targets, depth=None) -> (out, loss); forward(x, depth=None) -> logits (a classifier, as timm)
        x (B, 3, H, W) normalized images; targets (B,) class indices or (B, classes) probabilities
        (MixUp/CutMix, label smoothing); loss a 0-d tensor. `out` is logits (B, classes), alone without
        targets, and `depth` (None: as trained) the steps to run at evaluation.
    aux: dict of 0-d tensors set by the last forward with targets (e.g. per-stage losses), logged
        in log.jsonl after each epoch (monitor.model_log).
    num_params() -> int (a shared block counts once); flops_per_image() -> float (analytic forward).
    head: the final nn.Linear, whose weight's rows count the classes of a checkpoint.
  Optional, each used where present:
    log_extras() -> dict of floats for log.jsonl (reViT: its gate table);
    compile_regions() -> self: compile each distinct block (else torch.compile of the whole module);
    trains_as_one_graph() -> bool: may the training forward compile whole (kernels.choose_scope);
    set_grad_checkpointing(enable) -> self (--grad-checkpoint; refused by name where absent);
    nfe (block evaluations per image at the last depth run), solver, extend (ODEViT), img_size:
        read into the depth report.
"""
from dataclasses import dataclass
from typing import Callable, Optional

from training.exits import Fail


@dataclass(frozen=True)
class Model:
    """What rvits knows about one --model, in one place (MODELS maps the name to it).

    build: (args, common) -> nn.Module, the model of resolved flags `args` (it reads them, never
        changes them: a flag's value is decided in flags.resolve) and of `common` (build_model);
        ValueError for sizes it refuses (build_model turns it into Fail, one line).
    flags: the flags (argparse dests) only this model reads; flags.resolve refuses them for another.
    arch: of `flags`, those that shape the model: --finetune takes them from a checkpoint
        unless given, --resume refuses a change (arch_flags adds SHARED_ARCH_FLAGS).
    defaults: run (a dict of resolved flags) -> {flag: value}: what a flag of `flags` left out (None)
        stands for, so that a command spelling the value out equals one that leaves it out (the builder
        resolves it the same way; flags.effective).
    depth_flag: the flag holding the trained depth in --eval-depths' unit (trained_depth).
    size: --size when none is given (flags.resolve).
    cpu_preset: its CPU-sized preset (presets.py), named when a run's estimate on a CPU passes 3 hours
        (monitor.estimate_line); None: no hint.
    normalization: (mean, std) of its images when not the dataset's (data.build_datasets); None: the
        dataset's."""
    build: Callable
    flags: tuple = ()
    arch: tuple = ()
    defaults: Callable = lambda run: {}
    depth_flag: str = "depth"
    size: str = "ti"
    cpu_preset: Optional[str] = None
    normalization: Optional[tuple] = None


def build_bvit(args, common):
    import bvit
    num_blocks = args.num_blocks or MODELS[args.model].defaults(vars(args))["num_blocks"]  # vit: depth, bvit: 1
    return bvit.BViT(num_blocks=num_blocks, stages=args.stages, **common)


def build_revit(args, common):
    import revit
    if not 0 <= args.depth_dropout < 1:
        raise ValueError(f"--depth-dropout {args.depth_dropout} must be in [0, 1)")
    kw = dict(experts=args.experts, depth_dropout=args.depth_dropout, lambda_bal=args.lambda_bal,
              lambda_z=args.lambda_z, lambda_div=args.lambda_div, **common)
    if args.routing == "depth" and not args.lora_rank:
        return revit.ReViT(**kw)
    import revit_moe  # the paper's comparison baselines (section 4.3, appendix B)
    return revit_moe.ReViTMoE(routing=args.routing, lora_rank=args.lora_rank, **kw)


def build_srvit(args, common):
    import srvit
    return srvit.SRViT(recursions=args.recursions, **common)  # --depth: layers of the recursion body


def build_odevit(args, common):
    import odevit
    # For odevit a depth counts solver steps (block evaluations = steps x 1, 2, 2, 4 for euler, midpoint,
    # heun, rk4): --depth
    return odevit.ODEViT(solver=args.solver, horizon=args.horizon, field=args.field, extend=args.extend,
                         stages=args.stages, **common)


# The registry: --model name -> its record. A new model adds one (in this table, or MODELS["name"] = Model(...)).
REVIT = ("experts", "depth_dropout", "routing", "lora_rank", "router_lr_scale", "lambda_bal", "lambda_z", "lambda_div")
ODEVIT = ("solver", "horizon", "field", "extend")
MODELS = {
    "vit": Model(build_bvit, flags=("num_blocks", "stages"), arch=("num_blocks",),
                 defaults=lambda run: {"num_blocks": run["depth"]}),  # untied: a block per step
    "bvit": Model(build_bvit, flags=("num_blocks", "stages"), arch=("num_blocks",), cpu_preset="cpu-first-bvit",
                  defaults=lambda run: {"num_blocks": 1}),  # one shared block
    "revit": Model(build_revit, flags=REVIT, arch=("experts", "routing", "lora_rank")),
    "srvit": Model(build_srvit, flags=("recursions",), arch=("recursions",), depth_flag="recursions"),
    "odevit": Model(build_odevit, flags=("stages", *ODEVIT), arch=ODEVIT,
                    defaults=lambda run: {"horizon": run["depth"]}),  # T = the steps
}
# Models that another entry point trains, each with its own script, which training/ never imports: train.py
# names the script where a run of theirs (a preset, a checkpoint, a --config file) is given to it.
ELSEWHERE = {"loopvae": "train_loopvae.py"}
# The flags that shape every model (beside each record's `arch`).
SHARED_ARCH_FLAGS = ("model", "size", "embed_dim", "depth", "num_heads", "mlp_ratio", "patch_size", "gap",
                     "layer_scale")


def arch_flags():
    """The flags (dests) that shape a model, a set: SHARED_ARCH_FLAGS and every record's `arch`.
    --finetune takes them from a checkpoint unless given; --resume refuses a change."""
    return set(SHARED_ARCH_FLAGS).union(*(m.arch for m in MODELS.values()))


def model_flags():
    """{flag (dest): the --model names that read it, in MODELS' order}: every record's `flags`, the
    flags flags.resolve refuses for any other model."""
    out = {}
    for name, m in MODELS.items():
        for k in m.flags:
            out[k] = out.get(k, ()) + (name,)
    return out


def script_of(model):
    """The script that trains --model `model`: train.py for a model of MODELS, ELSEWHERE's for another's;
    None for a name rvits does not know."""
    return "train.py" if model in MODELS else ELSEWHERE.get(model)


def trained_depth(run):
    """The trained depth of the run of resolved flags `run` (a Namespace, or a dict: args.json, a
    checkpoint's args) in the unit of --eval-depths: its model's `depth_flag` (recursions for srvit,
    solver steps for odevit, block applications for the others). KeyError for an unknown --model."""
    run = run if isinstance(run, dict) else vars(run)
    return run[MODELS[run["model"]].depth_flag]


def build_model(args, img_size, num_classes, dynamic_img_size=False):
    """The model of resolved flags `args`: the keyword arguments every model file takes, then
    its record's builder (MODELS). Raises Fail (one line) for sizes the model refuses."""
    common = dict(img_size=img_size, patch_size=args.patch_size, num_classes=num_classes,
                  embed_dim=args.embed_dim, depth=args.depth, num_heads=args.num_heads,
                  mlp_ratio=args.mlp_ratio, class_token=not args.gap, layer_scale=args.layer_scale,
                  drop_path_rate=args.drop_path)
    if args.init != "default":  # only then: a model without init= support fails with its own message
        import inits  # the attention inits, one file for every model: the hook its constructor runs after its base
        common["init"] = inits.INITS[args.init]
    if args.init_base != "timm":  # likewise
        common["init_base"] = args.init_base
    if args.bce:  # likewise: loss="bce" only when asked for
        common["loss"] = "bce"
    if dynamic_img_size:
        common["dynamic_img_size"] = True
    try:
        model = MODELS[args.model].build(args, common)
    except ValueError as e:
        raise Fail(str(e))
    empty = empty_layers(model)
    if empty:  # (flags.too_small names the flags first; this is what any other conversion to 0 would build)
        raise Fail(f"--model {args.model}: {len(empty)} layer(s) of size 0, e.g. {empty[0]}: a flag's value became a "
                   "width of 0 (--mlp-ratio x --embed-dim, ...); give larger sizes")
    if hasattr(model, "pretrained_cfg"):  # a classifier: timm's data config is its run's, not ImageNet's
        model.pretrained_cfg = model.default_cfg = data_config(args, img_size, num_classes, dynamic_img_size)
    return model


def data_config(args, img_size, num_classes, dynamic_img_size=False):
    """timm's pretrained_cfg of a run of resolved flags `args` (a Namespace): its input size (3, img_size,
    img_size), classes, and the mean and std its images were normalized with (its model record's, else its
    dataset's: data.normalization), what timm.data.resolve_data_config reads; bicubic, crop_pct
    --eval-crop-ratio (image folders' evaluation crop)."""
    import data
    mean, std = MODELS[args.model].normalization or data.normalization(args.data)
    return dict(input_size=(3, img_size, img_size), num_classes=num_classes, mean=tuple(mean), std=tuple(std),
                interpolation="bicubic", crop_pct=getattr(args, "eval_crop_ratio", None) or 0.875,
                fixed_input_size=not dynamic_img_size, first_conv="patch_embed.proj", classifier="head", dataset=args.data)


def empty_layers(model):
    """The names of `model`'s parameters with no element (a width, a count or a size that a ratio made 0: such a
    layer builds, trains and computes nothing)."""
    return [n for n, p in model.named_parameters() if p.numel() == 0]


def is_rvits_checkpoint(ck):
    """Whether `ck` (read_weights' result) is an rvits checkpoint: model weights and its run's flags."""
    return (isinstance(ck, dict) and isinstance(ck.get("model"), dict) and isinstance(ck.get("args"), dict)
            and ck["args"].get("model") in MODELS and "head.weight" in ck["model"])


def classifier_checkpoint(ck, path, flag):
    """Whether `ck` (read_weights' result, from `path`) is an rvits classifier's checkpoint (is_rvits_checkpoint),
    for `flag`, which needs a classifier's or ViT's weights; False for any other file (timm_vit then reads it).
    Raises Fail for an rvits checkpoint of a model another entry point trains (ELSEWHERE: LoopVAE, a
    tokenizer), naming it as such."""
    if is_rvits_checkpoint(ck):
        return True
    kind = ck["args"].get("model") if isinstance(ck, dict) and isinstance(ck.get("args"), dict) else None
    if kind in ELSEWHERE:
        raise Fail(f"{flag} {path}: a --model {kind} checkpoint, a tokenizer (it reconstructs images: no class head, "
                   f"no patch tokens; {ELSEWHERE[kind]} trains it); give a classifier's checkpoint or timm ViT weights")
    return False


def model_from_checkpoint(ck, path, flag, p, img_size):
    """The model of the rvits checkpoint `ck` (read_weights' result, from `path`: named in messages, never
    read here), rebuilt from its saved flags (`p`: train.py's parser, for their defaults), with its weights,
    in eval mode; at another image size than it was trained at, built with dynamic_img_size=True (its
    position embedding interpolated on the fly; img_size None: its own). Raises Fail naming `flag` for a bad file."""
    if not is_rvits_checkpoint(ck):
        raise Fail(f"{flag} {path}: not an rvits checkpoint (model weights and the flags of its run)")
    saved = p.parse_args([])
    vars(saved).update(ck["args"])
    import data
    own = saved.img_size or (224 if saved.data in data.FOLDERS else 32)
    img_size = img_size or own
    model = build_model(saved, own, ck["model"]["head.weight"].shape[0], dynamic_img_size=own != img_size)
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as e:
        raise Fail(f"{flag} {path}: its weights do not fit the model its flags describe "
                   f"({str(e).strip().splitlines()[-1].strip()})")
    if isinstance(ck.get("pretrained_cfg"), dict):  # timm's data config as the run saved it (Saver)
        model.pretrained_cfg = model.default_cfg = {**ck["pretrained_cfg"], "fixed_input_size": own == img_size}
    return model.eval()
