"""timm_models.py (issue 79): every rvits classifier in timm's registry, built by timm.create_model with its
pretrained_cfg reaching resolve_data_config; pretrained=True refused in one line; features_only through timm's
FeatureGetterNet; timm's own Block as the recurrent block (the same logits as rvits' Block on the same weights,
and it trains)."""
import pytest
import torch

timm = pytest.importorskip("timm")
timm_models = pytest.importorskip("timm_models")

import bvit  # noqa: E402

TINY = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=4)
SMALL = {"vit": dict(depth=2), "bvit": dict(depth=2), "revit": dict(depth=2, experts=2), "srvit": dict(depth=1, recursions=2),
         "odevit": dict(depth=2), "revit_moe": dict(depth=2, experts=2, routing="lory")}


@pytest.mark.parametrize("family", sorted(SMALL))
@torch.no_grad()
def test_timm_create_model_builds_every_classifier_with_its_data_config(family):
    torch.manual_seed(0)
    m = timm.create_model(f"{family}_ti16", pretrained=False, **TINY, **SMALL[family]).eval()
    assert f"{family}_s16" in timm.list_models() and m.default_cfg is m.pretrained_cfg
    x = torch.randn(2, 3, 16, 16)
    assert m(x).shape == (2, 10) and m(x).argmax(-1).shape == (2,)
    cfg = timm.data.resolve_data_config({}, model=m)
    assert cfg["input_size"] == (3, 16, 16) and cfg["mean"] == timm_models.IMAGENET_MEAN
    with pytest.raises(ValueError, match=f"{family}_ti16: pretrained=True, but rvits has released no weight file; .*from_run"):
        timm.create_model(f"{family}_ti16", pretrained=True)


@torch.no_grad()
def test_features_only_gives_the_steps_out_indices_names_as_timms_getter():
    torch.manual_seed(0)
    f = timm.create_model("vit_ti16", features_only=True, out_indices=(0, 2), depth=3, **TINY)
    x = torch.randn(2, 3, 16, 16)
    feats = f(x)
    assert [t.shape for t in feats] == [(2, 32, 4, 4)] * 2 and f.feature_info.channels() == [32, 32]
    want = f.model.forward_intermediates(x, [0, 2], intermediates_only=True)
    assert all(torch.equal(a, b) for a, b in zip(feats, want))


def test_timms_block_is_a_recurrent_block_with_rvits_weights_and_trains():
    kw = dict(**TINY, depth=3, layer_scale=0.1)
    torch.manual_seed(0)
    ref = bvit.BViT(**kw).eval()
    m = bvit.BViT(**kw, block_fn=timm_models.timm_block()).eval()
    assert all(type(b) is timm.models.vision_transformer.Block for b in m.blocks)
    m.load_state_dict(ref.state_dict(), strict=True)  # the same parameter names
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(m(x), ref(x), atol=1e-6)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    before = m.blocks[0].attn.qkv.weight.clone()
    m.train()(x, torch.tensor([1, 2, 3]))[1].backward()
    opt.step()
    assert not torch.equal(before, m.blocks[0].attn.qkv.weight)
    with pytest.raises(TypeError, match="layer_scale"):  # without the adapter: timm's Block has no layer_scale
        bvit.BViT(**kw, block_fn=timm.models.vision_transformer.Block)


def test_a_clean_end_removes_the_lock_file_and_the_lock_still_refuses_a_second_run(tmp_path):
    """Issue 79, item 7: no .lock is left in a finished run folder (release_out_dir), while a held lock still
    refuses a second process, and a taker after the release gets a fresh lock of its own."""
    import os
    import subprocess
    import sys
    from training import checkpoints
    root = os.path.dirname(os.path.dirname(os.path.abspath(checkpoints.__file__)))
    take = [sys.executable, "-c", f"from training import checkpoints; checkpoints.lock_out_dir({str(tmp_path)!r})"]
    lock = checkpoints.lock_out_dir(str(tmp_path))
    lock.seek(0)  # (read through the lock's own file: closing another descriptor of it would drop a POSIX lock)
    assert lock.read().strip() == str(os.getpid()) and (tmp_path / ".lock").exists()
    held = subprocess.run(take, capture_output=True, text=True, cwd=root)
    assert held.returncode != 0 and "in use" in held.stderr, held.stderr[-500:]
    checkpoints.release_out_dir(lock)
    assert not (tmp_path / ".lock").exists() and lock.closed
    after = subprocess.run(take, capture_output=True, text=True, cwd=root)  # a later run locks the folder anew
    assert after.returncode == 0, after.stderr[-500:]
