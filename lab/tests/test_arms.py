"""The study arms the lab runs through train.py: their recipes and pairs (issue 78: the lab's table of arms)."""
import pytest

import presets
import revit_moe
from test_presets import build, config


def test_gpu_study_arms_share_one_recipe_and_their_pairs_are_matched(capsys):
    """c100-gpu-*: the arms of the mini study and of reViT's comparisons on the c100-gpu-bvit-ti recipe
    at Ti width; only model flags differ; recurrent arms are evaluated at 0.5x-4x their depth."""
    import gpu_study
    arms = sorted({a.split("+")[0] for a in gpu_study.ARMS})
    assert sorted(n for n in presets.PRESETS if n.startswith("c100-gpu-")) == sorted(
        [f"c100-gpu-{a}" for a in arms] + ["c100-gpu-bvit-ti"])
    assert presets.PRESETS["c100-gpu-bvit-ti"][1] == presets.PRESETS["c100-gpu-bvit"][1]  # its first name
    model_flags = {"model", "eval_depths", "size", "embed_dim", "num_heads", "depth", "stages", "experts",
                   "depth_dropout", "recursions", "solver", "horizon", "routing", "lora_rank"}
    recipe = {k: v for k, v in presets.PRESETS["c100-gpu-bvit"][1].items() if k not in model_flags}
    assert recipe["epochs"] == 50 and recipe["randaug"] == 0.0 and recipe["batch_size"] == 512
    for arm in arms:
        flags = presets.PRESETS[f"c100-gpu-{arm}"][1]
        assert {k: v for k, v in flags.items() if k not in model_flags} == recipe, arm
        cfg = config(capsys, "--preset", f"c100-gpu-{arm}")
        trained = cfg["recursions"] if cfg["model"] == "srvit" else cfg["depth"]
        if cfg["model"] == "vit":
            assert cfg["eval_depths"] is None
        else:
            assert cfg["eval_depths"] == sorted({max(1, int(f * trained)) for f in (0.5, 1, 2, 4)}), arm
    vit, bv = build("c100-gpu-vit"), build("c100-gpu-bvit")
    assert vit.flops_per_image() == bv.flops_per_image() and vit.embed_dim == bv.embed_dim == 192
    wide, narrow = build("c100-gpu-bvit-wide"), build("c100-gpu-vit-narrow")
    assert abs(wide.num_params() / narrow.num_params() - 1) < 0.05 and narrow.num_blocks == 12
    ode = [presets.PRESETS[f"c100-gpu-odevit-{s}"][1] for s in ("euler", "heun", "rk4")]
    assert [f["depth"] * {"euler": 1, "heun": 2, "rk4": 4}[f["solver"]] for f in ode] == [12, 12, 12]
    assert build("c100-gpu-srvit-r2").flops_per_image() == pytest.approx(bv.flops_per_image(), rel=0.01)
    for arm, base, change in [(f"revit-{r}", "revit-e4", {"routing": r}) for r in revit_moe.ROUTINGS[1:]] \
            + [("revit-lora", "revit-e1", {"lora_rank": 32})]:
        assert presets.PRESETS[f"c100-gpu-{arm}"][1] == {**presets.PRESETS[f"c100-gpu-{base}"][1], **change}, arm
