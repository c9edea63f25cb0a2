"""The models train.py can build, by name (--model), and what it asks of them.

MODELS maps a --model name to a builder `fn(args, common) -> nn.Module`: `args` the resolved flags
(training/flags.py), `common` the keyword arguments every model file takes (img_size, patch_size,
num_classes, embed_dim, depth, num_heads, mlp_ratio, class_token, layer_scale, drop_path_rate, and
init / loss / dynamic_img_size only when asked for). A new model file adds a builder and one line
`MODELS["name"] = build_name`; its flags go in training/flags.py. tests/test_registry.py runs every
registered model through the interface below, so a new model passes the same test.

The interface (a model file implements it; nothing is inherited):
    forward(x, targets=None, depth=None) -> (out, loss)
        x (B, 3, H, W) normalized images; targets (B,) class indices or (B, classes) probabilities
        (MixUp/CutMix, label smoothing); loss a 0-d tensor, None without targets. A classifier's
        `out` is logits (B, classes) and `depth` (None: as trained) the steps to run at evaluation;
        a tokenizer (one with `metrics`) returns its reconstruction (B, 3, H, W) and takes no depth.
    aux: dict of 0-d tensors set by the last forward with targets (e.g. per-stage losses), logged
        in log.jsonl after each epoch (monitor.model_log).
    num_params() -> int (a shared block counts once); flops_per_image() -> float (analytic forward).
    head (classifiers): the final nn.Linear, whose weight's rows count the classes of a checkpoint.
  Optional, each used where present:
    log_extras() -> dict of floats for log.jsonl (reViT: its gate table);
    compile_regions() -> self: compile each distinct block (else torch.compile of the whole module);
    trains_as_one_graph() -> bool: may the training forward compile whole (kernels.choose_scope);
    set_grad_checkpointing(enable) -> self (--grad-checkpoint; refused by name where absent);
    metrics(x) and reconstruct(x) -> (x_hat, mean, logvar): a tokenizer, evaluated by its
        reconstruction metrics (training/evaluation.py) instead of top-1;
    nfe (block evaluations per image at the last depth run), solver, extend (ODEViT), img_size:
        read into the depth report.
"""
from training import adversarial
from training.checkpoints import read_weights
from training.distill import Distiller
from training.monitor import Fail
from training.perceptual import lpips_loss

def build_bvit(args, common):
    import bvit
    num_blocks = args.num_blocks or (common["depth"] if args.model == "vit" else 1)
    return bvit.BViT(num_blocks=num_blocks, stages=args.stages, stage_weights=args.stage_weights,
                     detach_stages=args.detach_stages, step_embed=args.step_embed, **common)


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
    # For odevit a depth counts solver steps (block evaluations = steps x 1, 2, 2, 4 for euler,
    # midpoint, heun, rk4); --ode-steps sets it (default --depth), and args.depth follows so that
    # the log, args.json and the checkpoint state the trained number of steps.
    args.depth = common["depth"] = args.ode_steps or common["depth"]
    return odevit.ODEViT(solver=args.solver, horizon=args.horizon, field=args.field, extend=args.extend,
                         stages=args.stages, stage_weights=args.stage_weights, **common)


def build_loopvae(args, common):
    import loopvae
    # A tokenizer: of `common` only the image size applies (resolve refuses the classifier flags);
    # --num-blocks is K, and args.depth = K sum(--loops), the block applications per branch (resolve).
    model = loopvae.LoopVAE(img_size=common["img_size"], embed_dim=args.embed_dim, num_blocks=args.num_blocks,
                            loops=args.loops, latent_dim=args.latent_dim, share=args.share, operator=args.operator,
                            num_groups=args.num_groups,
                            mlp_ratio=args.mlp_ratio, num_heads=args.num_heads, lambda_kl=args.kl_weight,
                            lambda_p=args.perceptual_weight)
    if args.perceptual == "lpips" and not args.eval_only:  # a loss term: an evaluation needs none
        model.set_perceptual(lpips_loss(args.lpips_weights))
    return model


# The registry: --model name -> builder(args, common). A new model file adds one entry here.
MODELS = {"vit": build_bvit, "bvit": build_bvit, "revit": build_revit, "srvit": build_srvit, "odevit": build_odevit,
          "loopvae": build_loopvae}
# How a model's images are normalized, when not by the dataset's mean and std (data.build_datasets).
NORMALIZATION = {"loopvae": ((0.5,) * 3, (0.5,) * 3)}  # [0, 1] -> [-1, 1], LoopVAE's image range (App. A.4)
# The models that reconstruct their images (tokenizers): image folders resize and crop, not zoom in.
RECONSTRUCTS = {"loopvae"}


def build_model(args, img_size, num_classes, dynamic_img_size=False):
    """The model of resolved flags `args`: the keyword arguments every model file takes, then
    its MODELS builder. Raises Fail (one line) for sizes the model refuses."""
    common = dict(img_size=img_size, patch_size=args.patch_size, num_classes=num_classes,
                  embed_dim=args.embed_dim, depth=args.depth, num_heads=args.num_heads,
                  mlp_ratio=args.mlp_ratio, class_token=not args.gap, layer_scale=args.layer_scale,
                  drop_path_rate=args.drop_path)
    if args.init != "default":  # only then: a model without init= support fails with its own message
        common["init"] = args.init
    if args.bce:  # likewise: loss="bce" only when asked for
        common["loss"] = "bce"
    if dynamic_img_size:
        common["dynamic_img_size"] = True
    try:
        return MODELS[args.model](args, common)
    except ValueError as e:
        raise Fail(str(e))


def model_from_checkpoint(path, flag, p, img_size):
    """The model of an rvits checkpoint, rebuilt from its saved flags, with its weights, in eval
    mode; at another image size than it was trained at, built with dynamic_img_size=True (its
    position embedding interpolated on the fly). Raises Fail naming `flag` for a bad file."""
    ck = read_weights(path, flag)
    if not (isinstance(ck, dict) and isinstance(ck.get("model"), dict) and isinstance(ck.get("args"), dict)
            and ck["args"].get("model") in MODELS and "head.weight" in ck["model"]):
        raise Fail(f"{flag} {path}: not an rvits checkpoint (model weights and the flags of its run)")
    saved = p.parse_args([])
    vars(saved).update(ck["args"])
    own = saved.img_size or (224 if saved.data == "imagenet" else 32)
    model = build_model(saved, own, ck["model"]["head.weight"].shape[0], dynamic_img_size=own != img_size)
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as e:
        raise Fail(f"{flag} {path}: its weights do not fit the model its flags describe "
                   f"({str(e).strip().splitlines()[-1].strip()})")
    return model.eval()


def trainers_beside_the_model(args, p, model, img_size, device):
    """(distiller, adversary), each None unless the run asks for it: --teacher's distill.Distiller
    (the teacher from its checkpoint) and --stage2's adversarial.Adversary (the discriminator, its
    optimizer and the adversarial terms). An evaluation needs neither. Raises Fail."""
    if args.eval_only:
        return None, None
    distiller = adversary = None
    if args.teacher:
        teacher = model_from_checkpoint(args.teacher, "--teacher", p, img_size).to(device)
        try:
            distiller = Distiller(model, teacher, args.distill, args.distill_temperature).to(device)
        except ValueError as e:
            raise Fail(str(e))
    if args.stage2:
        adversary = adversarial.build(model, args.disc, args.disc_weights, device, lr=args.disc_lr or args.lr,
                                      weight=args.gan_weight, start=args.gan_start, r1_gamma=args.r1_gamma,
                                      r1_every=args.r1_every, policy=args.diffaug)
    return distiller, adversary
