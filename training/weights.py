"""Weights from a file, into a model: what a file holds and how it fits (checkpoints.py is a run's own
training state; this is any weights file a flag names).

- read_weights: the one reader of every weights file rvits loads (--resume, --eval-only, --finetune,
  --stage2, --teacher, --disc-weights, --lpips-weights, analyze.py, probe.py): the zip's CRC-32 of every
  record checked (bad_record), then torch.load(weights_only=True), tensors and plain values, never code;
  one Fail per way a file can be wrong, naming the flag (checkpoint_file: a run folder means its ckpt.pt).
  What it returns is interpreted elsewhere (flags.checkpoint_args, registry.model_from_checkpoint, ...),
  which read no file themselves.
- finetune_weights: an rvits checkpoint's, DeiT/MAE's or timm's ViT weights loaded into a model, the
  head and the position embedding adapted (--finetune, --stage2, --disc-weights, a teacher).
- timm_vit: a ViT file in timm's layout (DINOv2, DeiT, AugReg) as a bvit.BViT (--teacher, --disc-weights,
  probe.py --weights).
"""
import argparse
import math
import os
import pickle
import zipfile

import torch

from training.exits import Fail

# Globals a checkpoint written by other training code may hold besides tensors and plain values:
# DeiT's and MAE's main.py save their argparse.Namespace of flags under "args" (as timm allows it).
# Nothing else: any other class or function is refused by name.
SAFE_GLOBALS = [argparse.Namespace]
CLEAN_PREFIXES = ("module.", "_orig_mod.")  # DDP's wrapper and torch.compile's, as timm strips them


def checkpoint_file(path, flag):
    """`path`, or for a run folder its ckpt.pt (what train.py writes there). Raises Fail for a folder
    without one, naming `flag`."""
    if path and os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "ckpt.pt")):
            raise Fail(f"{flag} {path}: a folder without ckpt.pt; give a checkpoint file, or the --out-dir "
                       "of an rvits run (which holds its ckpt.pt)")
        return os.path.join(path, "ckpt.pt")
    return path


def clean_state_dict(sd):
    """Keys without the wrapper prefixes of a model saved under DDP (module.) or torch.compile
    (_orig_mod.), in any order and number, as timm's clean_state_dict does."""
    def clean(k):
        while k.startswith(CLEAN_PREFIXES):
            k = k.split(".", 1)[1]
        return k
    return {clean(k): v for k, v in sd.items()}


def read_weights(path, flag):
    """The contents of the weights file at `path` (a run folder: its ckpt.pt), on the CPU: every record
    of torch.save's zip archive checked against its CRC-32 first (bad_record; torch.load itself skips
    the check, so a flipped bit in a weight would load as a changed weight), then
    torch.load(weights_only=True): tensors and plain values only (and SAFE_GLOBALS), never code.
    Raises Fail, one line naming `flag` (--resume, --finetune, --teacher, ...) and the file: a missing
    file, a record that fails its CRC-32 (named), a class or function in the pickle, anything else
    unreadable."""
    path = checkpoint_file(path, flag)
    try:
        bad = bad_record(path)
        if bad is None:
            with torch.serialization.safe_globals(SAFE_GLOBALS):
                return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise Fail(f"{flag} {path}: no such file")
    except Exception as e:
        raise Fail(f"{flag} {path}: {_why_unreadable(path, e)}")
    what = "its pickled structure" if bad.endswith("data.pkl") else "a tensor's bytes" if "/data/" in bad else "a record"
    raise Fail(f"{flag} {path}: corrupt, its record {bad} ({what}) fails the zip's CRC-32 check (changed on the disk "
               "or in a copy), so nothing was loaded; use an intact copy of the file")


def bad_record(path):
    """The name of the first record of the zip archive at `path` (torch.save's format) whose bytes do not
    match the CRC-32 its entry stores (zipfile.ZipFile.testzip), None when all do, and None for a file
    that is not a zip archive (a legacy pickle carries no checksum; torch.load judges it). Reads the whole
    file once. Raises OSError (FileNotFoundError) when it cannot be read."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip()
    except zipfile.BadZipFile:  # not a zip, or its directory unreadable: torch.load's error says what it is
        return None


def _why_unreadable(path, e):
    """Why torch.load(weights_only=True) refused the file at `path` with exception `e`, in words."""
    if isinstance(e, pickle.UnpicklingError) and "GLOBAL " in str(e):  # a class or function: code could run
        glob = str(e).split("GLOBAL ")[-1].split(" ")[0]
        return (f"refused, it references {glob} and rvits loads only tensors and plain values "
                "(weights_only=True), so nothing ran; do not load files you do not trust")
    with open(path, "rb") as f:
        head = f.read(2)
    if head != b"PK" and head[:1] != b"\x80":  # torch.save: a zip archive, or (legacy) a pickle
        return "not a checkpoint (torch.save writes a zip archive; this file is neither that nor a pickle)"
    if isinstance(e, pickle.UnpicklingError):
        detail = [ln for ln in str(e).splitlines() if ln.strip() and not ln.startswith(
            ("Weights only load failed", "Check the documentation", "Please file an issue"))] or [str(e)]
        return f"unreadable, truncated or corrupt ({detail[0][:200]})"  # torch's own advice is not ours
    first = (str(e).splitlines() or [""])[0].split(". ")[0][:200]  # the first sentence: torch appends advice
    return f"unreadable, truncated or corrupt ({type(e).__name__}: {first})"


def _shape(t):
    return "x".join(map(str, t.shape))


def finetune_weights(path, model, flag="--finetune", ck=None):
    """--finetune: the model weights of an rvits checkpoint (its `model` entry), a DeiT/MAE file
    (`model` or `state_dict` entry) or a plain state dict (timm's `VisionTransformer`), adapted to
    `model` as DeiT/MAE fine-tuning does: the head is left at its fresh init when the number of
    classes differs, and `pos_embed` (1, prefix + n*n, D) is resized bicubically to this model's
    patch grid (prefix rows as they are; bvit.resample_pos_embed); a `pos_embed` without the class
    token's row (timm's no_embed_class, DeiT III) gets a zero row, which adds nothing to the class
    token, as no_embed_class does. Anything else that does not fit
    raises Fail naming the first mismatching key and both shapes, and `flag` (--stage2 and --disc-weights
    load their weights here too). `ck`: the file's contents when the caller has read them already
    (else read from `path`). Returns a one-line report."""
    from bvit import resample_pos_embed
    ck = read_weights(path, flag) if ck is None else ck
    sd = next((ck[k] for k in ("model", "state_dict") if isinstance(ck, dict) and k in ck), ck)
    if not isinstance(sd, dict) or not sd or not all(torch.is_tensor(v) for v in sd.values()):
        raise Fail(f"{flag} {path}: not a state dict of tensors nor a checkpoint holding one "
                   "(under 'model' or 'state_dict')")
    sd = clean_state_dict(sd)  # saved from a DDP-wrapped or compiled model
    own, done = model.state_dict(), []
    pretrain = [k for k in sd if k not in own and (k == "mask_token" or k.startswith("decoder"))]
    if pretrain:  # an MAE pretraining checkpoint: fine-tuning keeps the encoder (MAE's own recipe)
        done.append(f"MAE decoder and mask token dropped ({len(pretrain)} tensors)")
        sd = {k: v for k, v in sd.items() if k not in pretrain}
    classes = sd["head.weight"].shape[0] if "head.weight" in sd else 0  # 0: saved without a head
    if "head.weight" in own and classes != own["head.weight"].shape[0]:  # (a tokenizer has no class head)
        done.append(f"head re-initialized ({classes} -> {own['head.weight'].shape[0]} classes)")
        sd.update({k: own[k] for k in ("head.weight", "head.bias")})
    prefix = int(getattr(model, "cls_token", None) is not None)
    rows = sd["pos_embed"].shape[1] if "pos_embed" in sd and sd["pos_embed"].ndim == 3 else 0
    if prefix and "cls_token" in sd and rows > 1 and math.isqrt(rows) ** 2 == rows:
        # timm's no_embed_class=True (DeiT III, deit3_*): the class token gets no position embedding
        src = sd["pos_embed"]
        sd["pos_embed"] = torch.cat([src.new_zeros(1, 1, src.shape[2]), src], dim=1)  # the same function
        done.append("pos_embed given a zero class-token row (timm no_embed_class, DeiT III)")
    if "pos_embed" in sd and "pos_embed" in own and sd["pos_embed"].shape != own["pos_embed"].shape:
        src, dst = sd["pos_embed"], own["pos_embed"]
        n, grid = math.isqrt(src.shape[1] - prefix), model.img_size // model.patch_size
        if src.ndim != 3 or src.shape[2] != dst.shape[2] or n * n != src.shape[1] - prefix:
            raise Fail(f"{flag} {path}: pos_embed is {_shape(src)} in the file, {_shape(dst)} in this "
                       f"model: not the same width and token layout{' (class token?)' if prefix else ''}")
        sd["pos_embed"] = resample_pos_embed(src.float(), (grid, grid), prefix).to(src.dtype)
        done.append(f"pos_embed resized {n}x{n} -> {grid}x{grid} patches (bicubic)")
    for k in list(own) + [k for k in sd if k not in own]:
        if k not in sd or k not in own or sd[k].shape != own[k].shape:
            got = "absent" if k not in sd else _shape(sd[k])
            want = "absent" if k not in own else _shape(own[k])
            raise Fail(f"{flag} {path}: {k} is {got} in the file and {want} in this model; "
                       "give the model flags of the run that saved it (--model, --embed-dim, --depth, ...)")
    model.load_state_dict(sd, strict=True)
    return f"{flag.lstrip('-')} {path}: {len(sd)} tensors loaded; " + ("; ".join(done) or "nothing adapted")


def timm_vit(path, flag, grid=None, img_size=None, ck=None):
    """bvit.BViT holding a ViT state dict in timm's layout (`VisionTransformer`: DINOv2's
    vit_*_patch14_dinov2, DeiT, AugReg ...), in eval mode, built at img_size = grid x its patch size
    so that its patch grid is grid x grid (or grid = img_size // its patch size; its `pos_embed`
    resized bicubically by finetune_weights). Width, depth, MLP ratio, patch size, class token and LayerScale
    are read from the file; heads of width 64 (every timm ViT size's). A file without a head gets a
    1-class one (unused: --distill feature reads the tokens). Raises Fail naming `flag` for a file
    of another layout (register tokens, SwiGLU MLPs, ...: the first key that does not fit). `ck`: the
    file's contents when the caller has read them (the file is read once)."""
    from bvit import BViT
    ck = read_weights(path, flag) if ck is None else ck
    sd = next((ck[k] for k in ("model", "state_dict") if isinstance(ck, dict) and k in ck), ck)
    proj = sd.get("patch_embed.proj.weight") if isinstance(sd, dict) else None
    if proj is None or getattr(proj, "ndim", 0) != 4:
        rvits = flag != "--disc-weights"  # (a discriminator takes timm weights only)
        raise Fail(f"{flag} {path}: {'neither an rvits checkpoint nor ' if rvits else 'not '}a ViT state dict in "
                   f"timm's layout (no patch_embed.proj.weight); give {'a train.py ckpt.pt or ' if rvits else ''}"
                   "timm weights (e.g. vit_small_patch14_dinov2)")
    if "reg_token" in sd:
        raise Fail(f"{flag} {path}: a ViT with register tokens (reg_token), which bvit.BViT does not have; give "
                   "weights without registers (vit_small_patch14_dinov2, not ..._reg4_dinov2)")
    dim, patch = proj.shape[0], proj.shape[-1]
    grid = grid or img_size // patch
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    fc1 = sd.get("blocks.0.mlp.fc1.weight")
    vit = BViT(img_size=grid * patch, patch_size=patch, num_classes=sd["head.weight"].shape[0] if "head.weight" in sd
               else 1, embed_dim=dim, depth=depth, num_heads=max(1, dim // 64), num_blocks=depth,
               mlp_ratio=fc1.shape[0] / dim if fc1 is not None else 4.0, class_token="cls_token" in sd,
               layer_scale=1e-5 if "blocks.0.ls1.gamma" in sd else None)  # (LayerScale's values: the file's)
    finetune_weights(path, vit, flag, ck)
    vit.has_head = "head.weight" in sd
    return vit.eval()
