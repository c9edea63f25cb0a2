"""Issue 78: each model file can be copied alone into another project (vit-pytorch's promise): it builds, trains
and, for bvit.py, loads timm's weights with nothing of rvits beside it. Slow: a fresh interpreter per file."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository

ALONE = {  # what is copied into an empty folder -> the model built there (TINY-like sizes at 32 px)
    "bvit": (["bvit.py"], "bvit.BViT(**kw, num_blocks=2)"),
    "bvit+inits": (["bvit.py", "inits.py"], "bvit.BViT(**kw, init=inits.structured)"),
    "revit": (["revit.py"], "revit.ReViT(**kw, experts=2, depth_dropout=0.3)"),
    "revit_moe": (["revit.py", "revit_moe.py"], "revit_moe.ReViTMoE(**kw, experts=2, routing='qwen3')"),
    "srvit": (["srvit.py"], "srvit.SRViT(**kw, recursions=2)"),
    "odevit": (["odevit.py"], "odevit.ODEViT(**kw, solver='heun')"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(ALONE))
def test_a_model_file_copied_alone_builds_trains_a_step_and_bvit_loads_timm_weights(case, tmp_path):
    """Issue 78: a model file copied alone into an empty folder (revit_moe.py with revit.py; inits.py beside
    bvit.py for an attention init) builds, trains one step in a fresh interpreter that sees nothing of rvits,
    and bvit.py loads timm's vit_tiny_patch16_224 state dict strictly, with timm's logits."""
    files, build = ALONE[case]
    for f in files:
        shutil.copy(os.path.join(ROOT, f), tmp_path / f)
    script = f"""
import torch, {', '.join(os.path.splitext(f)[0] for f in files)}
assert all(m.__file__.startswith({str(tmp_path)!r}) for m in ({', '.join(os.path.splitext(f)[0] for f in files)},))
torch.manual_seed(0)
kw = dict(img_size=32, patch_size=4, num_classes=10, embed_dim=32, depth=2, num_heads=2)
model = {build}.train()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(4, 3, 32, 32), torch.arange(4)
logits, loss = model(x, y)
loss.backward()
opt.step()
assert logits.shape == (4, 10) and torch.isfinite(loss) and torch.isfinite(model(x, y)[1])
"""
    if case == "bvit":
        timm = pytest.importorskip("timm")
        torch.manual_seed(0)
        ref = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
        x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.save({"state": ref.state_dict(), "x": x, "logits": ref(x)}, tmp_path / "timm.pt")
        script += """
ck = torch.load("timm.pt", weights_only=True)
vit = bvit.vit_ti().eval()
vit.load_state_dict(ck["state"], strict=True)
with torch.no_grad():
    assert torch.allclose(vit(ck["x"])[0], ck["logits"], atol=1e-4)
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**env, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
