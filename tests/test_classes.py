"""Issue 76: failures fixed by class, each class walked through all its members: every size a flag becomes
through a conversion, every optional extra, every checkpoint-write failure, every writer into an existing
run folder, every way a default run folder is chosen, every duplicate in a labels file. (The config-file
class, every flag through a file with null, a wrong type and boundary values, is in test_config.py.)"""
import argparse

import pytest
import torch

import hubconf
import train
from presets import PRESETS
from training import flags, registry
from training.exits import Fail

TINY = ["--data", "synthetic", "--embed-dim", "32", "--num-heads", "2"]


# ----------------------------------------------------------------------------- 10. sizes after their conversion
MODELS = [["--model", m] + (["--num-groups", "8", "--num-blocks", "1", "--loops", "1"] if m == "loopvae" else ["--patch-size", "8", "--depth", "2"])
          for m in registry.MODELS] + [
    ["--model", "revit", "--routing", r, "--experts", "2", "--patch-size", "8", "--depth", "2"] for r in ("deepseek", "remoe", "softmoe", "qwen3")]
SMALLEST = {"deepseek": 2, "remoe": 4}  # the MLP width at which the experts' width (// 2, // 4) is 1


def refused(argv, capsys):
    try:
        flags.resolved(argv)
    except SystemExit as e:
        err = capsys.readouterr().err
        assert e.code == 2 and err.count("\n") == 1 and "must be >= 1" in err, err
        return True
    return False


@pytest.mark.parametrize("model", MODELS, ids=lambda m: "-".join(m[1::2]))
def test_every_width_a_ratio_makes_is_checked_after_rounding(model, capsys):
    """--mlp-ratio at the width that rounds to 1 builds a model with no empty layer; just below it, the flags
    are refused in one line (not a model whose MLPs have width 0); the builder refuses an empty layer too."""
    one = SMALLEST.get(model[3] if model[2] == "--routing" else None, 1)  # the smallest MLP width that builds
    ok = TINY + model + ["--mlp-ratio", str(one / 32)]
    args = flags.resolved(ok)
    built = registry.build_model(args, 32, 10)
    assert not registry.empty_layers(built) and min(p.numel() for p in built.parameters()) >= 1
    assert refused(TINY + model + ["--mlp-ratio", str((one - 0.5) / 32)], capsys)
    assert refused(TINY + model + ["--mlp-ratio", "0.001"], capsys)
    if model[2] == "--routing":  # (revit_moe.py divides by the width first: flags.too_small refuses it above)
        return
    with pytest.raises(Fail, match="size 0"):  # what any other conversion to 0 would build
        registry.build_model(argparse.Namespace(**{**vars(args), "mlp_ratio": 0.001}), 32, 10)


def test_no_preset_and_no_hub_entry_builds_an_empty_layer():
    for name in PRESETS:
        args = flags.resolved(["--preset", name])
        with torch.device("meta"):
            model = registry.build_model(argparse.Namespace(**{**vars(args), "init": "default", "perceptual": "none"}),
                                         flags.default_img_size(args), 100)
        assert not registry.empty_layers(model), name
    for name in ("vit_ti16", "bvit_ti16", "revit_ti16", "srvit_ti16", "odevit_ti16"):
        with pytest.raises(ValueError, match="size 0"):
            getattr(hubconf, name)(mlp_ratio=0.001, depth=1)


def test_mlp_ratio_0_01_is_refused_by_train_py(capsys):
    """The issue's case: --mlp-ratio 0.01 at width 32, from the command line and from a config file."""
    assert train.cli(TINY + ["--depth", "2", "--patch-size", "8", "--mlp-ratio", "0.01", "--print-config"]) == 2
    assert "hidden width 0" in capsys.readouterr().err
