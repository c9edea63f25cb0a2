"""torch.export of the classifiers (issue 65, item 3; export.py): at a fixed depth with a dynamic
batch, and with the loop count a runtime input (torch.while_loop), each program against the eager model;
and the reason, pinned, where a model cannot."""
import pytest
import torch

import bvit
import export
import odevit
import revit
import revit_moe
import srvit

TINY = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=4)
MODELS = {"bvit": lambda: bvit.BViT(**TINY, depth=6),
          "vit": lambda: bvit.BViT(**TINY, depth=3, num_blocks=3),
          "revit": lambda: revit.ReViT(**TINY, depth=6, experts=3),
          "revit_moe-lora": lambda: revit_moe.ReViTMoE(**TINY, depth=6, experts=1, lora_rank=2),
          "revit_moe-softmoe": lambda: revit_moe.ReViTMoE(**TINY, depth=6, experts=2, routing="softmoe"),
          "srvit": lambda: srvit.SRViT(**TINY, depth=2, recursions=3),
          "odevit": lambda: odevit.ODEViT(**TINY, depth=6, solver="heun")}
LOOPS = ("bvit", "revit", "revit_moe-lora", "srvit", "odevit")  # the loop count as an input


def model(name):
    torch.manual_seed(0)
    m = MODELS[name]().eval()
    with torch.no_grad():  # gates and adapters that differ from step to step (zero at init)
        for n, p in m.named_parameters():
            if n.startswith(("router.", "blocks.0.lora")) and "norms" not in n:
                p.normal_(0, 0.5)
    return m


def images(b):
    return torch.randn(b, 3, 16, 16, generator=torch.Generator().manual_seed(b))


@pytest.mark.parametrize("name", sorted(MODELS))
@torch.no_grad()
def test_every_classifier_exports_at_a_fixed_depth_with_a_dynamic_batch(name):
    m = model(name)
    program = export.export_fixed(m, depth=m.depth if name == "vit" else 4).module()
    for b in (1, 5):  # exported with 2 images: the batch is a dimension of the program, not a constant
        x = images(b)
        assert torch.allclose(program(x), m(x, depth=m.depth if name == "vit" else 4), atol=1e-5, rtol=0), b


@pytest.mark.parametrize("name", LOOPS)
@torch.no_grad()
def test_one_export_runs_at_depths_6_12_and_24_as_the_eager_model(name):
    m, x = model(name), images(3)
    program = export.export_loop(m).module()  # exported once, at the trained depth
    for depth in (6, 12, 24):
        assert torch.allclose(program(x, torch.tensor(depth)), m(x, depth=depth), atol=1e-5, rtol=0), depth


def test_what_cannot_export_says_why():
    with pytest.raises(ValueError, match="num_blocks=3: the phase map picks one of the blocks per step"):
        export.export_loop(model("vit"))
    with pytest.raises(ValueError, match="extend='refine': the step size T / n is a Python float"):
        export.export_loop(odevit.ODEViT(**TINY, depth=2, extend="refine"))
    for routing in export.DISPATCH:
        m = revit_moe.ReViTMoE(**TINY, depth=2, experts=2, routing=routing)
        for fn in (export.export_fixed, export.export_loop):
            with pytest.raises(ValueError, match=f"routing='{routing}' cannot be exported: its token dispatch"):
                fn(m)


@pytest.mark.parametrize("name", LOOPS)
def test_the_exported_loop_keeps_eagers_check_of_the_depth(name):
    """Issue 76: every depth eager refuses, the program refuses (n = 0, -3: eager's "depth must be >= 1", a
    RuntimeError of the graph's assert), and every depth eager runs, it runs as eager (n = 1, 2)."""
    m = model(name)
    program = export.export_loop(m).module()
    x = export.example_images(m, 3)
    for depth in (0, -3):
        with pytest.raises(ValueError, match="must be >= 1"):
            m(x, depth=depth)
        with pytest.raises(RuntimeError, match="depth must be >= 1"):
            program(x, torch.tensor(depth))
    for depth in (1, 2):
        assert torch.allclose(program(x, torch.tensor(depth)), m(x, depth=depth), atol=1e-5, rtol=0), depth


def test_a_model_export_does_not_cover_is_refused_with_its_reason():
    import loopvae
    for m in (loopvae.LoopVAE(img_size=16, embed_dim=32, num_groups=8, loops=(1,), num_blocks=1), torch.nn.Linear(2, 2)):
        for fn in (export.export_fixed, export.export_loop):
            with pytest.raises(ValueError, match=f"{type(m).__name__} cannot be exported: export.py exports the "
                                                 "classifiers' logits"):
                fn(m)
