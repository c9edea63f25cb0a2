"""hubconf.py (issue 65, item 6): torch.hub entry points for each model family and size, built untrained
without fetching anything, or from a weights file or URL read by training/weights.py (weights_only)."""
import os
import pickle

import pytest
import torch

import bvit
import revit
from training.exits import Fail

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def no_download(*args, **kwargs):
    raise AssertionError("nothing may be fetched unless weights= asks for it")


def test_torch_hub_loads_revit_s16_untrained_from_a_local_clone(monkeypatch):
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_download)
    import hubconf  # torch.hub.list's rule (github repositories only): the callables not named _*
    names = [n for n in dir(hubconf) if callable(getattr(hubconf, n)) and not n.startswith("_")]
    assert set(names) == {f"{f}_{s}16" for f in ("vit", "bvit", "revit", "srvit", "odevit") for s in ("ti", "s", "b", "l")
                          } | {"revit_b14"}
    with torch.device("meta"):  # (shapes only: no memory, no init cost)
        model = torch.hub.load(ROOT, "revit_s16", source="local", experts=4)
    assert type(model) is revit.ReViT and (model.experts, model.embed_dim, model.depth) == (4, 384, 12)
    assert (model.img_size, model.patch_size, model.num_classes) == (224, 16, 1000)
    assert "depth-programmed experts" in hubconf.revit_s16.__doc__  # torch.hub.help's text


def test_weights_from_a_file_or_a_url_load_through_the_one_weights_reader(tmp_path, capsys):
    kw = dict(img_size=32, num_classes=10, depth=2)  # bvit_ti16, small
    torch.manual_seed(1)
    src = bvit.bvit_ti(patch_size=16, **kw)
    path = tmp_path / "bvit.pth"
    torch.save({"model": src.state_dict(), "args": {"model": "bvit"}}, path)  # an rvits checkpoint's layout
    hub, before = str(tmp_path / "hub"), torch.hub.get_dir()
    torch.hub.set_dir(hub)
    try:
        for weights in (str(path), path.as_uri()):  # a file, then a URL: downloaded into the hub's cache
            model = torch.hub.load(ROOT, "bvit_ti16", source="local", weights=weights, **kw)
            assert all(torch.equal(v, src.state_dict()[k]) for k, v in model.state_dict().items())
            assert "bvit_ti16: weights" in capsys.readouterr().out
    finally:
        torch.hub.set_dir(before)
    assert os.listdir(os.path.join(hub, "checkpoints")) == ["bvit.pth"]


class Payload:
    def __reduce__(self):  # unpickled by a full torch.load, it would run code
        return (print, ("code ran",))


def test_a_weights_file_that_holds_code_is_refused_and_nothing_runs(tmp_path, capsys):
    import hubconf
    path = tmp_path / "evil.pth"
    torch.save({"model": {}, "payload": Payload()}, path)
    with pytest.raises(Fail, match="refused, it references .*weights_only=True"):
        hubconf.bvit_ti16(weights=str(path), img_size=32, depth=2)
    assert "code ran" not in capsys.readouterr().out
    with pytest.raises(pickle.UnpicklingError):  # (the file does hold code: a plain pickle load would run it)
        torch.load(path, weights_only=True)


@pytest.mark.parametrize("family", ["vit", "bvit", "revit", "srvit", "odevit"])
def test_a_given_width_wins_over_the_entrys_size(family):
    """As timm's size entries: embed_dim= and num_heads= given to an entry (a run trained at another width, e.g. the
    first run's D=128) replace the size's, instead of a TypeError for a keyword given twice."""
    import hubconf
    with torch.device("meta"):
        model = getattr(hubconf, f"{family}_s16")(embed_dim=128, num_heads=2, depth=2, img_size=32)
    assert (model.embed_dim, model.patch_size, model.img_size) == (128, 16, 32)
