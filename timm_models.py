"""rvits' classifiers in timm's registry, and timm's Block as an rvits block (issue 79). Needs timm
(requirements-dev.txt); the model files never import this file, nor timm.

    import timm, timm_models                        # one import registers every name below with timm
    model = timm.create_model("bvit_s16", pretrained=False, num_classes=100, img_size=32, patch_size=4)
    config = timm.data.resolve_data_config({}, model=model)   # the model's pretrained_cfg, not a fallback
    feats = timm.create_model("vit_ti16", features_only=True, out_indices=(5, 11))  # timm's FeatureGetterNet
    m = bvit.BViT(depth=6, block_fn=timm_models.timm_block())  # timm's own Block as the recurrent block

Names: {vit, bvit, revit, revit_moe, srvit, odevit}_{ti, s, b, l}16 and revit_b14 (hubconf.py's entries and
revit_moe's sizes), 224 px, 1000 classes unless given; keyword arguments go to the model class. There is no
released rvits weight file: pretrained=True is refused in one line (hubconf's: load a run with hubconf.from_run).
"""
import timm
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

import bvit
import hubconf
import odevit
import revit
import revit_moe
import srvit

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
WIDTHS = {"ti": (192, 3), "s": (384, 6), "b": (768, 12), "l": (1024, 16)}  # (embed_dim, num_heads), timm's sizes


def _builder(family, size):
    """The function (**kwargs) -> an untrained rvits model of `family` at `size` (the model files' size helpers)."""
    if family == "revit_moe":
        dim, heads = WIDTHS[size]
        return lambda **kw: revit_moe.ReViTMoE(**{"embed_dim": dim, "num_heads": heads,
                                                  "depth": 24 if size == "l" else 12, **kw})
    mod = {"vit": bvit, "bvit": bvit, "revit": revit, "srvit": srvit, "odevit": odevit}[family]
    return getattr(mod, f"{family}_{size}")


NAMES = {f"{f}_{s}16": (f, s, 16) for f in ("vit", "bvit", "revit", "revit_moe", "srvit", "odevit") for s in WIDTHS}
NAMES["revit_b14"] = ("revit", "b", 14)

# timm reads a registered name's pretrained_cfg from its module's `default_cfgs` (register_model)
default_cfgs = generate_default_cfgs({name: dict(
    url="", num_classes=1000, input_size=(3, 224, 224), mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bicubic",
    crop_pct=0.875, first_conv="patch_embed.proj", classifier="head", license="mit") for name in NAMES})


def _entry(name):
    family, size, patch = NAMES[name]
    build = _builder(family, size)

    def create(pretrained=False, **kwargs):
        if pretrained:
            raise hubconf._no_release(name)
        out_indices = kwargs.pop("out_indices", 3)  # timm's ViT default for features_only: the last 3 steps
        model = build_model_with_cfg(build, name, False, feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
                                     **{"img_size": 224, "patch_size": patch, **kwargs})
        inner = getattr(model, "model", model)  # (features_only: timm's FeatureGetterNet around it)
        own = dict(input_size=(inner.in_chans, inner.img_size, inner.img_size), num_classes=inner.num_classes,
                   fixed_input_size=not inner.dynamic_img_size)
        inner.pretrained_cfg = inner.default_cfg = {**inner.pretrained_cfg, **own}  # the size this model was built at
        return model
    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = f"rvits {family}, size {size.upper()}, patch {patch}: untrained (timm.create_model's entry)."
    return create


for _name in NAMES:
    globals()[_name] = register_model(_entry(_name))


def timm_block(block_cls=None):
    """A block_fn for an rvits model from a block with timm's constructor (default: timm's own ViT Block, timm
    .models.vision_transformer.Block): rvits calls block_fn(dim=, num_heads=, mlp_ratio=, layer_scale=,
    drop_path=, stochastic=); timm's Block takes init_values for LayerScale and builds qkv without a bias unless
    qkv_bias=True (timm's VisionTransformer passes it; rvits' Attention has one). `stochastic` has no timm
    counterpart (timm's DropPath is the identity at rate 0). Its parameter names are rvits' Block's, so the
    two load each other's state dicts (tests: the same logits)."""
    block_cls = block_cls or timm.models.vision_transformer.Block

    def build(dim, num_heads, mlp_ratio=4.0, layer_scale=None, drop_path=0.0, stochastic=None):
        return block_cls(dim=dim, num_heads=num_heads, mlp_ratio=mlp_ratio, qkv_bias=True, init_values=layer_scale,
                         drop_path=drop_path)
    return build
