"""torch.hub entry points: each model family at each ViT/DeiT size, patch 16 at 224 px (the presets' ImageNet
sizes, presets.py), and reViT-B/14 (the second regime's student):

    model = torch.hub.load("/path/to/rvits", "revit_s16", source="local", experts=4)   # a clone, untrained
    model = torch.hub.load("/path/to/rvits", "bvit_s16", source="local", weights="runs/bvit/ckpt.pt")
    model = torch.hub.load("/path/to/rvits", "from_run", source="local", run="runs/bvit")  # a trained run, eval mode
    model = torch.hub.load("/path/to/rvits", "from_run", source="local", run="runs/bvit", policy="policy.json")
    torch.hub.list("OWNER/rvits")                          # the entry names, from a GitHub repository

{vit, bvit, revit, srvit, odevit}_{ti, s, b, l}16 and revit_b14 build the model untrained (nothing is
fetched), or with the weights of `weights`: a file, an rvits run folder (its ckpt.pt) or a URL, which is
downloaded to torch.hub's cache (torch.hub.get_dir()/checkpoints) only then. Every file is read by
training/weights.py's read_weights (torch.load with weights_only=True: tensors and plain values, never
code) and loaded by its finetune_weights, as --finetune loads it: the head re-initialized for another
number of classes, the position embedding resized to another image size; anything else that does not
fit is one line (training.exits.Fail) naming the first tensor. Keyword arguments go to the model class
(experts=, recursions=, solver=, num_classes=, img_size=, block_fn=, ...). The model is returned in
train mode, as built: call .eval() for inference. rvits has released no weight file: pretrained=True is
refused in one line (ValueError), on every entry and in timm_models.py.

from_run(run) builds a run's model from the run folder alone: its architecture from its args.json (else
the checkpoint's own flags), its weights from its ckpt.pt (read_weights, weights_only), its pretrained_cfg
(timm's data config: the run's input size, mean and std) as the checkpoint saved it, in eval mode.
"""
import os
import urllib.parse

import torch

import bvit
import odevit
import revit
import srvit

dependencies = ["torch", "tqdm"]  # (torch.hub checks these are installed; tqdm: training/exits.py)

FAMILIES = {"vit": (bvit, "ViT (DeiT's untied blocks)"), "bvit": (bvit, "bViT (one shared block)"),
            "revit": (revit, "reViT (one block, E = 4 depth-programmed experts unless experts=)"),
            "srvit": (srvit, "SR-ViT (a 12-layer stack, R = 4 recursions unless recursions=)"),
            "odevit": (odevit, "ODEViT (bViT's block as an ODE, Euler unless solver=)")}
SIZES = ("ti", "s", "b", "l")


def _weights_file(weights, cache=None):
    """The local file of `weights`: a path as given; a URL (http, https, file) downloaded once into
    `cache` (default: torch.hub.get_dir()/checkpoints, as torch.hub.load_state_dict_from_url) and read from
    there afterwards."""
    if not weights.startswith(("http://", "https://", "file://")):
        return weights
    cache = cache or os.path.join(torch.hub.get_dir(), "checkpoints")
    path = os.path.join(cache, os.path.basename(urllib.parse.urlparse(weights).path) or "weights.pth")
    if not os.path.isfile(path):
        os.makedirs(cache, exist_ok=True)
        torch.hub.download_url_to_file(weights, path)
    return path


def _no_release(name):
    """The one line that refuses pretrained=True on entry `name` (hubconf's and timm_models.py's)."""
    return ValueError(f"{name}: pretrained=True, but rvits has released no weight file; give a run folder to "
                      f"from_run (torch.hub.load(rvits, 'from_run', run=DIR)) or a checkpoint path (weights=PATH)")


def from_run(run, img_size=None, pretrained=False, policy=None):
    """The trained model of the rvits run folder `run` (train.py's --out-dir; or its ckpt.pt), in eval mode:
    built from the flags of its args.json (the checkpoint's own when the folder has none), with the weights of
    its ckpt.pt (training/weights.py's read_weights: torch.load with weights_only=True) and its pretrained_cfg
    (timm's data config) as the checkpoint saved it. `img_size`: another input size than the run's (its
    position embedding interpolated on the fly, dynamic_img_size). `policy`: an exit policy's JSON file written
    for this run's checkpoint (`python anytime.py calibrate`): the model under it, anytime.Exiting, whose
    forward(x) gives (logits (B, classes), steps (B,)) with each image leaving at its own step. Raises
    training.exits.Fail (one line) for a folder without ckpt.pt, a file that is no classifier's checkpoint, or
    weights that do not fit the flags; anytime.PolicyError (one line) for a policy of another checkpoint."""
    import json
    from training.flags import get_parser
    from training.registry import classifier_checkpoint, model_from_checkpoint
    from training.weights import checkpoint_file, read_weights
    if pretrained:
        raise _no_release("from_run")
    path = checkpoint_file(run, "from_run: run")
    ck = read_weights(path, "from_run: run")
    flags = os.path.join(os.path.dirname(path), "args.json")
    if os.path.isfile(flags) and classifier_checkpoint(ck, path, "from_run: run"):
        with open(flags, encoding="utf-8") as f:
            ck = {**ck, "args": json.load(f)}  # (plain JSON: the run's resolved flags, monitor.py writes them)
    if policy is not None:
        import anytime
        policy = anytime.Policy.load(policy, checkpoint=path)  # (another checkpoint's: refused, one line)
    model = model_from_checkpoint(ck, path, "from_run: run", get_parser(), img_size)
    if policy is None:
        return model
    policy.check_model(model)
    return anytime.Exiting(model, policy).eval()


def _entry(family, size, patch):
    """The entry point {family}_{size}{patch}: (weights=None, **kwargs) -> the model (module docstring)."""
    mod, what = FAMILIES[family]
    name = f"{family}_{size}{patch}"

    def build(weights=None, pretrained=False, **kwargs):
        if pretrained:
            raise _no_release(name)
        model = getattr(mod, f"{family}_{size}")(**{"img_size": 224, "patch_size": patch, **kwargs})
        empty = [n for n, p in model.named_parameters() if p.numel() == 0]  # (training/registry.py empty_layers)
        if empty:  # a ratio that became a width of 0 (mlp_ratio=0.001): a model that computes nothing there
            raise ValueError(f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}): {len(empty)} layer(s) of "
                             f"size 0, e.g. {empty[0]}: every width (int(embed_dim x mlp_ratio), ...) must be >= 1")
        if weights is not None:
            from training.weights import finetune_weights
            print(finetune_weights(_weights_file(weights), model, flag=f"{name}: weights"))
        return model
    build.__name__ = build.__qualname__ = name
    build.__doc__ = (f"{what}, size {size.upper()} (timm's {size}), patch {patch}, 224 px, 1000 classes unless "
                     "given: untrained, or with the weights of `weights` (a file, a run folder or a URL; "
                     "read with weights_only=True). kwargs: the model class's keyword arguments.")
    return build


for _family in FAMILIES:
    for _size in SIZES:
        globals()[f"{_family}_{_size}16"] = _entry(_family, _size, 16)
revit_b14 = _entry("revit", "b", 14)  # the second regime's student (presets: in1k-revit-b14-e*-dinov2)
