"""--config FILE: a run's args.json, --print-config's output or a user's JSON file of flags, under the command
line; --print-config's output loads back to the same run; a bad file is one line naming it, exit 2."""
import json

import pytest

import train
import train_loopvae
from loopvae_train import flags as lvflags
from presets import PRESETS
from training import flags

SYNTH = ["--data", "synthetic", "--embed-dim", "32", "--num-heads", "2", "--depth", "2", "--device", "cpu",
         "--workers", "0", "--batch-size", "8", "--val-subset", "16", "--eval-batch-size", "16", "--epochs", "1",
         "--max-steps", "3", "--lr", "0.002", "--seed", "3"]


def printed(capsys, argv, cli=None):
    assert (cli or train.cli)(argv + ["--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_print_config_loads_back_to_the_same_run(tmp_path, capsys, preset):
    cli = train_loopvae.cli if PRESETS[preset][1]["model"] == "loopvae" else None  # (LoopVAE's: its own script's)
    first = printed(capsys, ["--preset", preset], cli)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(first))
    again = printed(capsys, ["--config", str(path)], cli)
    assert again.pop("config") == str(path) and first.pop("config") is None
    assert again == first


def test_a_runs_args_json_trains_the_same_run_again_in_a_new_folder(tmp_path, capsys):
    assert train.cli(SYNTH + ["--out-dir", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    assert train.cli(["--config", str(tmp_path / "a" / "args.json"), "--out-dir", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().err.startswith(f"note: --config {tmp_path / 'a' / 'args.json'}: not taken: out_dir "
                                              f"{tmp_path / 'a'} (where the run that wrote it lives")
    logs = [[json.loads(line) for line in open(tmp_path / d / "log.jsonl")] for d in "ab"]
    timing = ("img_per_s", "epoch_time_s")
    assert [[{k: v for k, v in r.items() if k not in timing} for r in log] for log in logs] == \
        [[{k: v for k, v in r.items() if k not in timing} for r in logs[0]]] * 2
    a, b = (json.load(open(tmp_path / d / "args.json")) for d in "ab")
    assert {k for k in a if a[k] != b[k]} == {"out_dir", "config"}


def test_the_command_line_wins_and_so_does_what_it_sets(tmp_path, capsys):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"preset": "c100-bvit-ti", "--embed-dim": 64, "num_heads": 2, "depth": 4,
                                "lr": 0.005, "eval_depths": [2, 4], "three-augment": True}))
    got = printed(capsys, ["--config", str(path), "--seed", "5"])
    preset = PRESETS["c100-bvit-ti"][1]
    assert (got["embed_dim"], got["num_heads"], got["depth"], got["lr"], got["eval_depths"], got["three_augment"],
            got["seed"], got["epochs"]) == (64, 2, 4, 0.005, [2, 4], True, 5, preset["epochs"])  # the preset's, under it
    # --size on the command line sets the width, heads and depth the file gives: the file's are dropped (what is
    # left is the preset's, as for --preset c100-bvit-ti --size s; without a preset, the size's)
    keys = ("embed_dim", "num_heads", "depth", "lr", "eval_depths")
    got = printed(capsys, ["--config", str(path), "--size", "s", "--lr", "0.01"])
    assert [got[k] for k in keys] == [printed(capsys, ["--preset", "c100-bvit-ti", "--size", "s", "--lr", "0.01"])[k]
                                      for k in keys[:4]] + [[2, 4]]
    path.write_text(json.dumps({"embed_dim": 64, "num_heads": 2, "depth": 4}))
    got = printed(capsys, ["--config", str(path), "--size", "s"])
    assert (got["embed_dim"], got["num_heads"], got["depth"]) == (384, 6, 12)


@pytest.mark.parametrize("text, says", [
    ('{"lr": 0.001, "epoch": 3, "widht": 2}', "epoch, widht: not flags of train.py"),
    ('{"lr": -1}', "lr: must be > 0, got -1"),
    ('{"model": "resnet"}', "model: 'resnet' is not one of vit, bvit"),
    ('{"gap": "yes"}', '"yes" is not a value of --gap (true or false)'),
    ('{"depth": true}', "depth: true is not a value of --depth"),
    ('{"eval_depths": [1, 0]}', "eval_depths: expected comma-separated integers >= 1"),
    ('{"model": "loopvae"}', "a --model loopvae run, which train.py does not train: python train_loopvae.py --config"),
    ('{"step_embed": true}', "step_embed: set in the file, and rvits no longer has it"),
    ('{"preset": "c100-nope"}', "--preset c100-nope is unknown (in --config"),
    ('[1, 2]', "a JSON list, not an object of flags"),
    ('{"lr": 0.001,', "not JSON (Expecting"),
])
def test_a_bad_config_file_is_one_line_naming_it(tmp_path, capsys, text, says):
    path = tmp_path / "bad.json"
    path.write_text(text)
    assert train.cli(["--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train.py: error: ") and says in err, err
    assert f"--config {path}" in err or "--preset" in says


def test_a_missing_config_file_and_another_models_flag(tmp_path, capsys):
    assert train.cli(["--config", str(tmp_path / "none.json"), "--print-config"]) == 2
    assert "No such file or directory" in capsys.readouterr().err
    path = tmp_path / "old.json"  # an older bViT run's args.json: reViT's --depth-dropout at 0.3, cut flags unset
    path.write_text(json.dumps({"model": "bvit", "depth_dropout": 0.3, "step_embed": False, "model_img_size": 32}))
    got = printed(capsys, ["--config", str(path)])
    assert got["depth_dropout"] == 0.3 and "step_embed" not in got and "model_img_size" not in got
    assert capsys.readouterr().err == ""  # (printed() read it: check the note below on a fresh call)
    assert train.cli(["--config", str(path), "--print-config"]) == 0
    assert "depth_dropout 0.3: not read by --model bvit" in capsys.readouterr().err

