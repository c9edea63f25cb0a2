"""--config FILE: a run's args.json, --print-config's output or a user's JSON file of flags, under the command
line; --print-config's output loads back to the same run; a bad file is one line naming it, exit 2."""
import argparse
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


def test_an_older_args_json_with_ode_steps_folds_it_into_depth(tmp_path, capsys):
    """--ode-steps, ODEViT's second name for --depth, left train.py (issue 78): an older run's args.json holds
    ode_steps null or at its depth; both load as the same run, a lone ode_steps gives the depth, and an
    ode_steps that disagrees with depth is refused in one line naming both."""
    base = printed(capsys, SYNTH + ["--model", "odevit", "--solver", "heun"])
    assert "ode_steps" not in base and base["depth"] == 2
    path = tmp_path / "args.json"
    for extra in ({"ode_steps": None}, {"ode_steps": 2}, {"ode_steps": 2, "depth": None}, {"--ode-steps": 2}):
        path.write_text(json.dumps({**base, **extra}))
        again = printed(capsys, ["--config", str(path)])
        assert again.pop("config") == str(path) and again == {k: v for k, v in base.items() if k != "config"}, extra
    path.write_text(json.dumps({**base, "ode_steps": 3}))
    assert train.cli(["--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ode_steps 3 and depth 2" in err[0] and "--ode-steps is --depth now" in err[0], err
    lv = printed(capsys, ["--preset", next(n for n in PRESETS if PRESETS[n][1]["model"] == "loopvae")], train_loopvae.cli)
    path.write_text(json.dumps({**lv, "ode_steps": None}))  # (an older LoopVAE run's args.json held every train.py flag)
    assert printed(capsys, ["--config", str(path)], train_loopvae.cli)["depth"] == lv["depth"]


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


# ----------------------------------------------------------------------------- issue 76: every flag, every value
SWITCHES = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)
NOT_FROM_FILES = set(flags.CONFIG_ACTIONS + flags.CONFIG_PLACE) | {"help"}


def outcome(argv, capsys, entry=None):
    """What train.py (or the entry point `entry`) makes of `argv` (flags resolved as it resolves them): the
    flags, or the one error line."""
    try:
        got = vars(flags.resolved(argv, entry=entry))
    except SystemExit as e:
        err = capsys.readouterr().err
        prog = entry.prog if entry else "train.py"
        assert e.code == 2 and err.count("\n") == 1 and err.startswith(f"{prog}: error: "), err
        return "refused"
    capsys.readouterr()
    return {k: v for k, v in got.items() if k != "config"}


@pytest.mark.parametrize("entry", [None, lvflags.ENTRY], ids=["train.py", "train_loopvae.py"])
def test_every_flag_in_a_config_file_gets_the_checks_of_the_command_line(tmp_path, capsys, entry):
    """Every flag through a config file with null, a wrong JSON type and the values at the boundaries of the
    flags' checks (0, -1, 0.5, 1, 31, 'nope'): the file's value is refused exactly where the same value on the
    command line is (its type, its choices and resolve's later checks), and accepted as the same run where not.
    null is "the flag left out", which only a flag whose default is None can be; a number to a switch, true
    to a value flag, a list to a one-value flag and an object are refused."""
    p, path = flags.get_parser(entry), tmp_path / "c.json"
    readers = p.entry.model_flags()

    def from_file(k, v):
        path.write_text(json.dumps({k: v}))
        return outcome(base + ["--config", str(path)], capsys, entry)

    checked = 0
    for a in p._actions:
        k = a.dest
        if k in NOT_FROM_FILES:
            continue
        # a flag of some models, on one of them (a file's flag of another model is a note: an args.json holds all)
        base = ["--data", "synthetic"] + (["--model", readers[k][0]] if k in readers else [])
        plain = outcome(base, capsys, entry)
        assert from_file(k, None) == (plain if p.get_default(k) is None else "refused"), k
        lists = getattr(a.type, "comma_separated", False)  # (int_list, diffaug_policy: a JSON list is their text)
        wrong = [1, "true", {}] if isinstance(a, SWITCHES) else [True, {}] + ([[1]] if a.nargs is None and not lists
                                                                              else [])
        for v in wrong:
            assert from_file(k, v) == "refused", (k, v)
        if isinstance(a, SWITCHES):
            for v in (True, False):
                cli = [a.option_strings[0] if v else "--no-" + a.option_strings[0][2:]] if v or isinstance(
                    a, argparse.BooleanOptionalAction) else []
                if v == p.get_default(k):  # (a file's default is not "given", an args.json holds every flag: a
                    cli = []  # flag refused when given, as train_loopvae.py's --no-bce, is the default run there)
                assert from_file(k, v) == outcome(base + cli, capsys, entry), (k, v)
            continue
        for v in (0, -1, 0.5, 1, 31, "nope", [1, 2]):
            text = ",".join(map(str, v)) if isinstance(v, list) else str(v)
            if isinstance(v, list) and not lists:
                continue
            if flags.parsed_default(a, p.get_default(k)) == v:  # (a file's default is not "given": args.json)
                continue
            assert from_file(k, v) == outcome(base + [a.option_strings[0], text], capsys, entry), (k, v)
            checked += 1
    assert checked > (300 if entry is None else 250), checked


def test_a_config_file_on_a_base_file(tmp_path, capsys):
    """{"config": "base.json", ...}: the base's flags under the file's (one level); a chain, a cycle, a file on
    itself and a missing base are one line naming the files."""
    (tmp_path / "base.json").write_text(json.dumps({"embed_dim": 32, "num_heads": 2, "depth": 2, "lr": 0.5}))
    (tmp_path / "c.json").write_text(json.dumps({"config": "base.json", "lr": 0.01}))
    got = printed(capsys, ["--config", str(tmp_path / "c.json")])
    assert (got["embed_dim"], got["num_heads"], got["depth"], got["lr"]) == (32, 2, 2, 0.01)
    for name, text, says in [("chain.json", {"config": "c.json"}, "names another, base.json: a base is read one level"),
                             ("self.json", {"config": "self.json"}, "is this file itself"),
                             ("gone.json", {"config": "none.json"}, "its base"),
                             ("odd.json", {"config": 3}, "config: 3 is not a file name")]:
        (tmp_path / name).write_text(json.dumps(text))
        assert train.cli(["--config", str(tmp_path / name), "--print-config"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err and f"--config {tmp_path / name}" in err, err
    # a run's record (args.json, --print-config's output) names the file its flags came from: not read again
    record = printed(capsys, ["--config", str(tmp_path / "c.json")])
    (tmp_path / "base.json").unlink()
    (tmp_path / "record.json").write_text(json.dumps(record))
    assert printed(capsys, ["--config", str(tmp_path / "record.json")])["lr"] == 0.01


def test_a_preset_that_a_config_file_overrides_says_so_and_the_record_names_what_ran(tmp_path, capsys):
    """--preset A --config B: B's flags win; one line names those of A it replaces; when B replaces all of A
    (B is another preset's --print-config), the record names B's preset, the one that ran."""
    other = printed(capsys, ["--preset", "c100-bvit-ti"])
    (tmp_path / "b.json").write_text(json.dumps(other))
    assert train.cli(["--preset", "c100-vit-ti", "--config", str(tmp_path / "b.json"), "--print-config"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert got["preset"] == "c100-bvit-ti" and got["model"] == "bvit" and got == {**other, "config": got["config"]}
    assert err.count("\n") == 1 and "--preset c100-vit-ti has no effect" in err and "model" in err, err
    (tmp_path / "lr.json").write_text(json.dumps({"lr": 0.01}))
    assert train.cli(["--preset", "c100-vit-ti", "--config", str(tmp_path / "lr.json"), "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["preset"] == "c100-vit-ti" and err == (
        f"note: --preset c100-vit-ti: --config {tmp_path / 'lr.json'} sets lr, which win over the preset's\n")
    assert train.cli(["--preset", "c100-vit-ti", "--config", str(tmp_path / "lr.json"), "--lr", "0.002",
                      "--print-config"]) == 0
    assert capsys.readouterr().err == ""  # (the command line wins: the file's lr replaces nothing of the preset's)
