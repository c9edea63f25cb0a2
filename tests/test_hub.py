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
                          } | {"revit_b14", "from_run"}
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


def tiny_run(folder, argv, img_size=16, num_classes=10, args_json=True):
    """A run folder as train.py leaves it (training/monitor.py's args.json, checkpoints.Saver's ckpt.pt: weights,
    flags, pretrained_cfg), of the resolved flags `argv`, with seeded random weights; returns the model."""
    import json
    from training.flags import resolved
    from training.registry import build_model
    args = resolved(argv + ["--data", "synthetic", "--img-size", str(img_size)], img_size)
    torch.manual_seed(3)
    model = build_model(args, img_size, num_classes)
    os.makedirs(folder, exist_ok=True)
    torch.save({"model": model.state_dict(), "args": vars(args), "classes": None,
                "pretrained_cfg": model.pretrained_cfg}, os.path.join(folder, "ckpt.pt"))
    if args_json:
        with open(os.path.join(folder, "args.json"), "w") as f:
            json.dump(vars(args), f)
    return model.eval()


@pytest.mark.parametrize("argv", [["--model", "revit", "--experts", "2"], ["--model", "srvit", "--recursions", "2"]])
@torch.no_grad()
def test_from_run_rebuilds_a_run_from_its_folder_alone(tmp_path, argv):
    """Issue 79, item 6: the architecture from args.json (nothing restated by hand), the weights from ckpt.pt, the
    same logits; timm's data config (pretrained_cfg) the run's, not ImageNet's fallback."""
    import hubconf
    src = tiny_run(tmp_path / "run", argv + ["--embed-dim", "32", "--num-heads", "2", "--depth", "2", "--patch-size", "4"])
    model = torch.hub.load(ROOT, "from_run", source="local", run=str(tmp_path / "run"))
    x = torch.randn(2, 3, 16, 16)
    assert type(model) is type(src) and not model.training and torch.equal(model(x), src(x))
    assert model.pretrained_cfg["input_size"] == (3, 16, 16) and model.pretrained_cfg["num_classes"] == 10
    assert model.pretrained_cfg["mean"] == (0.5, 0.5, 0.5)  # synthetic data's normalization
    assert torch.equal(hubconf.from_run(str(tmp_path / "run" / "ckpt.pt"))(x), src(x))  # the file itself
    assert hubconf.from_run(str(tmp_path / "run"), img_size=32)(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_from_run_takes_the_architecture_from_args_json(tmp_path):
    """args.json is what decides the model: a checkpoint whose flags say another width than args.json's is rebuilt at
    args.json's (and then refused in one line: its weights do not fit); without args.json, its own flags."""
    import json
    import hubconf
    tiny = ["--embed-dim", "32", "--num-heads", "2", "--depth", "2", "--patch-size", "4"]
    src = tiny_run(tmp_path / "run", ["--model", "bvit"] + tiny, args_json=False)
    assert torch.equal(hubconf.from_run(str(tmp_path / "run")).head.weight, src.head.weight)
    flags = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["args"]
    with open(tmp_path / "run" / "args.json", "w") as f:
        json.dump({**flags, "embed_dim": 64}, f)
    with pytest.raises(Fail, match="from_run: run .*ckpt.pt: its weights do not fit the model its flags describe"):
        hubconf.from_run(str(tmp_path / "run"))


def test_from_run_refuses_a_folder_without_a_checkpoint_in_one_line(tmp_path):
    import hubconf
    with pytest.raises(Fail, match="from_run: run .*: a folder without ckpt.pt"):
        hubconf.from_run(str(tmp_path))


@pytest.mark.parametrize("entry", ["bvit_s16", "revit_b14", "odevit_ti16", "from_run"])
def test_pretrained_true_is_refused_in_one_line_on_every_entry(entry):
    """There is no released rvits weight file: pretrained=True names the entry and the two ways to weights, instead
    of a TypeError from the model class (hub) or a silently untrained model."""
    import hubconf
    with pytest.raises(ValueError, match=f"^{entry}: pretrained=True, but rvits has released no weight file; give a "
                                         "run folder to from_run .* or a checkpoint path"):
        getattr(hubconf, entry)(pretrained=True) if entry != "from_run" else hubconf.from_run("x", pretrained=True)


@pytest.mark.slow
def test_from_run_loads_what_train_py_wrote(tmp_path):
    """A real run folder (train.py, one step on synthetic data): from_run gives the model whose weights ckpt.pt
    holds and whose flags args.json holds."""
    import subprocess
    import sys
    import hubconf
    out = str(tmp_path / "run")
    subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--data", "synthetic", "--model", "revit",
                    "--experts", "2", "--embed-dim", "32", "--num-heads", "2", "--depth", "2", "--device", "cpu",
                    "--workers", "0", "--batch-size", "8", "--val-subset", "8", "--max-steps", "1", "--out-dir", out],
                   check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT, timeout=300)
    model = hubconf.from_run(out)
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert type(model) is revit.ReViT and model.experts == 2 and model.embed_dim == 32
    assert all(torch.equal(v, ck["model"][k]) for k, v in model.state_dict().items())
    assert model.pretrained_cfg == {**ck["pretrained_cfg"], "fixed_input_size": True}


@pytest.mark.parametrize("dataset, size", [("folder", 224), ("imagenet", 224), ("cifar100", 32)])
def test_a_run_without_img_size_is_rebuilt_at_its_datas_default_size(tmp_path, dataset, size):
    """A run that left --img-size out trained at its data's default (224 for every image folder, --data folder as
    --data imagenet; 32 for CIFAR): from_run (registry.model_from_checkpoint) rebuilds it there, not at another."""
    import json
    import hubconf
    from training.flags import resolved
    from training.registry import build_model
    args = resolved(["--data", dataset, "--embed-dim", "32", "--num-heads", "2", "--depth", "1", "--patch-size", "16"])
    with torch.device("meta"):
        src = build_model(args, size, 10)
    args.img_size = None  # (as args.json holds it when the flag was left out)
    os.makedirs(tmp_path / "run")
    torch.save({"model": {k: torch.zeros(v.shape) for k, v in src.state_dict().items()}, "args": vars(args)},
               tmp_path / "run" / "ckpt.pt")
    (tmp_path / "run" / "args.json").write_text(json.dumps(vars(args)))
    model = hubconf.from_run(str(tmp_path / "run"))
    assert model.img_size == size and model.pretrained_cfg["input_size"] == (3, size, size)
    assert model.pretrained_cfg["fixed_input_size"]  # (at its own size: no interpolation)
