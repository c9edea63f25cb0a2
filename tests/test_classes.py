"""Issue 76: failures fixed by class, each class walked through all its members: every size a flag becomes
through a conversion, every width a model class is built with directly, every optional extra, every checkpoint-write failure, every writer into an existing
run folder, every way a default run folder is chosen, every duplicate in a labels file. (The config-file
class, every flag through a file with null, a wrong type and boundary values, is in test_config.py.)"""
import argparse
import importlib.util

import pytest
import torch

import hubconf
import train
import train_loopvae
from loopvae_train import flags as lvflags
from presets import PRESETS
from training import flags, registry
from training.exits import Fail

TINY = ["--data", "synthetic", "--embed-dim", "32", "--num-heads", "2"]


# ----------------------------------------------------------------------------- 10. sizes after their conversion
LOOPVAE = ["--model", "loopvae", "--num-groups", "8", "--num-blocks", "1", "--loops", "1"]  # (train_loopvae.py's)
MODELS = [["--model", m, "--patch-size", "8", "--depth", "2"] for m in registry.MODELS] + [
    ["--model", "revit", "--routing", r, "--experts", "2", "--patch-size", "8", "--depth", "2"]
    for r in ("deepseek", "remoe", "softmoe", "qwen3")] + [LOOPVAE]
SMALLEST = {"deepseek": 2, "remoe": 4}  # the MLP width at which the experts' width (// 2, // 4) is 1


def entry_of(model):
    """The entry point of the flags `model` (--model X ...): train.py's (None) or train_loopvae.py's."""
    return lvflags.ENTRY if model[1] == "loopvae" else None


def build(args, entry, img_size=32, classes=10):
    """The model of resolved flags `args` as its entry point builds it."""
    return lvflags.build_model(args, img_size) if entry else registry.build_model(args, img_size, classes)


def refused(argv, capsys, entry=None):
    try:
        flags.resolved(argv, entry=entry)
    except SystemExit as e:
        err = capsys.readouterr().err
        assert e.code == 2 and err.count("\n") == 1 and "must be >= 1" in err, err
        return True
    return False


@pytest.mark.parametrize("model", MODELS, ids=lambda m: "-".join(m[1::2]))
def test_every_width_a_ratio_makes_is_checked_after_rounding(model, capsys):
    """--mlp-ratio at the width that rounds to 1 builds a model with no empty layer; just below it, the flags
    are refused in one line (not a model whose MLPs have width 0); the builder refuses an empty layer too
    (train.py's registry.build_model and train_loopvae.py's)."""
    entry = entry_of(model)
    one = SMALLEST.get(model[3] if model[2] == "--routing" else None, 1)  # the smallest MLP width that builds
    ok = TINY + model + ["--mlp-ratio", str(one / 32)]
    args = flags.resolved(ok, entry=entry)
    built = build(args, entry)
    assert not registry.empty_layers(built) and min(p.numel() for p in built.parameters()) >= 1
    assert refused(TINY + model + ["--mlp-ratio", str((one - 0.5) / 32)], capsys, entry)
    assert refused(TINY + model + ["--mlp-ratio", "0.001"], capsys, entry)
    if model[2] == "--routing":  # (revit_moe.py divides by the width first: flags.too_small refuses it above)
        return
    with pytest.raises(Fail, match="must be >= 1"):  # the model file refuses it too (its ValueError, one line)
        build(argparse.Namespace(**{**vars(args), "mlp_ratio": 0.001}), entry)


def test_no_preset_and_no_hub_entry_builds_an_empty_layer():
    for name in PRESETS:
        entry = lvflags.ENTRY if PRESETS[name][1].get("model") == "loopvae" else None
        args = flags.resolved(["--preset", name], entry=entry)
        with torch.device("meta"):
            model = build(argparse.Namespace(**{**vars(args), "init": "default", "perceptual": "none"}), entry,
                          flags.default_img_size(args), 100)
        assert not registry.empty_layers(model), name
    for name in ("vit_ti16", "bvit_ti16", "revit_ti16", "srvit_ti16", "odevit_ti16"):
        with pytest.raises(ValueError, match="must be >= 1"):
            getattr(hubconf, name)(mlp_ratio=0.001, depth=1)


def test_mlp_ratio_0_01_is_refused_by_train_py(capsys):
    """The issue's case: --mlp-ratio 0.01 at width 32, in train.py and in train_loopvae.py."""
    assert train.cli(TINY + ["--depth", "2", "--patch-size", "8", "--mlp-ratio", "0.01", "--print-config"]) == 2
    assert "hidden width 0" in capsys.readouterr().err
    assert train_loopvae.cli(TINY[2:] + LOOPVAE[2:] + ["--mlp-ratio", "0.01", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train_loopvae.py: error: ") and "hidden width 0" in err, err


# ----------------------------------------------------------------------------- 10b. widths of 0, built directly
import inspect  # noqa: E402

import bvit  # noqa: E402
import loopvae  # noqa: E402
import odevit  # noqa: E402
import revit  # noqa: E402
import revit_moe  # noqa: E402
import srvit  # noqa: E402

# Every size argument of a model class that a layer takes as a width, or a constructor divides by (img_size %
# patch_size, embed_dim % num_heads, ...): 0 (or a ratio that rounds to 0) was a ZeroDivisionError or an empty layer.
WIDTHS = ("img_size", "patch_size", "in_chans", "embed_dim", "num_heads", "latent_dim", "num_groups", "kernel_size",
          "window_size")
CLASSIFIER = dict(img_size=8, patch_size=4, num_classes=3, depth=2, embed_dim=4, num_heads=1, mlp_ratio=1.0)
TOKENIZER = dict(img_size=8, loops=(1,), num_blocks=1, embed_dim=4, num_groups=4, latent_dim=2, num_heads=1,
                 mlp_ratio=1.0)


def arguments(cls):
    """The keyword arguments of `cls`'s constructor, with its base's where it passes **kw on (ReViTMoE)."""
    params = inspect.signature(cls.__init__).parameters
    more = any(p.kind == p.VAR_KEYWORD for p in params.values()) and cls.__mro__[1] is not torch.nn.Module
    return set(params) | (arguments(cls.__mro__[1]) if more else set())


def model_classes():
    """Every model class of the model files: a module class whose constructor takes embed_dim (DenseReViT, made from
    a ReViT, takes none)."""
    return sorted({c for m in (bvit, revit, revit_moe, srvit, odevit, loopvae) for _, c in inspect.getmembers(m)
                   if inspect.isclass(c) and c.__module__ == m.__name__ and issubclass(c, torch.nn.Module)
                   and "embed_dim" in arguments(c)}, key=lambda c: c.__qualname__)


def variants():
    """(name, constructor, smallest kwargs that build, the size arguments it uses) of every model class: ReViTMoE per
    routing (and with LoRA), LoopVAE per operator (num_heads and window_size are the attention operator's)."""
    out = []
    for cls in model_classes():
        if cls is revit_moe.ReViTMoE:
            out += [(f"ReViTMoE-{r}", cls, {**CLASSIFIER, "routing": r, "experts": 2}) for r in revit_moe.ROUTINGS]
            out += [("ReViTMoE-lora", cls, {**CLASSIFIER, "lora_rank": 1, "experts": 1})]
        elif cls is loopvae.LoopVAE:
            out += [(f"LoopVAE-{op}", cls, {**TOKENIZER, "operator": op}) for op in loopvae.OPERATORS]
        else:
            out += [(cls.__qualname__, cls, CLASSIFIER)]
    return [(name, cls, kw, [w for w in WIDTHS if w in arguments(cls)
                             if not (kw.get("operator") == "cnn" and w in ("num_heads", "window_size"))])
            for name, cls, kw in out]


def test_the_walk_finds_every_model_class():
    assert [c.__qualname__ for c in model_classes()] == ["BViT", "LoopVAE", "ODEViT", "ReViT", "ReViTMoE", "SRViT"]


@pytest.mark.parametrize("name, cls, kw, sizes", variants(), ids=[v[0] for v in variants()])
def test_every_model_class_refuses_a_width_of_0_with_a_value_error_naming_it(name, cls, kw, sizes):
    """Built directly (not through train.py's flags): each size argument at 0, an MLP ratio that rounds the width
    to 0 (or below), and revit_moe.py's narrower experts (H // 2, H // 4) at 0 raise ValueError naming the
    argument, "every width must be >= 1" (hubconf.py's and training/flags.py's words), not ZeroDivisionError
    nor a model with an empty layer; the smallest sizes build with none."""
    built = cls(**kw)
    assert not [n for n, p in built.named_parameters() if p.numel() == 0], name
    assert "embed_dim" in sizes and len(sizes) >= 4, sizes
    for size in sizes:
        with pytest.raises(ValueError, match=rf"\b{size}=0\b.*every width must be >= 1"):
            cls(**{**kw, size: 0})
    for ratio in (0.1, 0.0, -1.0):
        with pytest.raises(ValueError, match=rf"int\(embed_dim x mlp_ratio\)={int(4 * ratio)}: every width must be >= 1"):
            cls(**{**kw, "mlp_ratio": ratio})
    narrower = {"deepseek": 2, "remoe": 4}.get(kw.get("routing"))
    if narrower:  # the dense width builds at `narrower`, its experts' width is 0 just below
        cls(**{**kw, "mlp_ratio": narrower / 4})
        with pytest.raises(ValueError, match=rf"routing='{kw['routing']}': its experts' width int\(embed_dim x "
                                             rf"mlp_ratio\) // {narrower} = {narrower - 1} // {narrower} = 0: every"):
            cls(**{**kw, "mlp_ratio": (narrower - 1) / 4})


# ----------------------------------------------------------------------------- 6. every failure of a checkpoint write
import errno  # noqa: E402
import os  # noqa: E402

from training import checkpoints, exits  # noqa: E402


def fails_with(err, where):
    """A fault at `where` of a checkpoint write, raising OSError(err) as the OS does (or, inside torch.save,
    as torch's zip writer wraps it: a RuntimeError whose context is the OSError, or one with none)."""
    def raise_it(*a, **k):
        if where == "save wrapped":
            try:
                raise OSError(err, os.strerror(err))
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        if where == "save bare":
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        raise OSError(err, os.strerror(err))
    return raise_it


@pytest.mark.parametrize("where", ["open", "save", "save wrapped", "save bare", "fsync", "replace"])
@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EFBIG, errno.EDQUOT, errno.EIO, errno.EACCES])
def test_every_failure_of_a_checkpoint_write_is_one_line_and_keeps_the_previous(tmp_path, monkeypatch, err, where):
    """Whatever errno, wherever in the write (opening the temporary file, torch.save's writes, as OSError or
    as the zip writer's RuntimeError around it, the fsync, the rename), the save is a Fail naming the file,
    the previous checkpoint is intact and no temporary file is left."""
    path = tmp_path / "ckpt.pt"
    stop = exits.Stop()
    run = argparse.Namespace(ckpt_path=str(path), stop=stop, ddp=False, world=1, master=True)
    save = checkpoints.Saver(run, {"model": torch.nn.Linear(2, 2)}, argparse.Namespace(out_dir=str(tmp_path)), None)
    save(0, 1, {}, 1)
    before = path.read_bytes()
    target = {"open": (checkpoints, "open"), "save": (torch, "save"), "save wrapped": (torch, "save"),
              "save bare": (torch, "save"), "fsync": (os, "fsync"), "replace": (os, "replace")}[where]
    monkeypatch.setattr(*target, fails_with(err, where), raising=False)
    with pytest.raises(Fail) as e:
        save(0, 2, {}, 2)
    monkeypatch.undo()
    line = str(e.value)
    assert "\n" not in line and f"writing the checkpoint {path} at step 2 failed" in line, line
    assert (where == "save bare" or os.strerror(err) in line) and "step 1" in line  # what is kept
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["ckpt.pt"]


# ----------------------------------------------------------------------------- 9. one image, two classes
import data  # noqa: E402


@pytest.mark.parametrize("first, second", [
    ("a.jpg n01", "a.jpg n02"),  # two label exports concatenated
    ("caf\u00e9.jpg n01", "cafe\u0301.jpg n02"),  # the same name in two Unicode forms (NFC, NFD)
    ("a.jpg n01 12 40 80 90", "a.jpg n02 1 2 3 4"),  # LOC_val_solution's boxes: the class is the first word
])
def test_a_labels_file_that_gives_one_image_two_classes_names_both_lines(tmp_path, first, second):
    path = tmp_path / "labels.txt"
    path.write_text(f"# header\n{first}\nb.jpg n01\n{second}\n", encoding="utf-8")
    with pytest.raises(data.DataError) as e:
        data.read_labels(str(path), {"n01": 0, "n02": 1})
    said = str(e.value)
    assert str(path) in said and "line 2" in said and "line 4" in said and "two classes" in said, said
    path.write_text(f"{first}\n{first}\n", encoding="utf-8")  # the same line twice: one class, kept
    assert list(data.read_labels(str(path), {"n01": 0, "n02": 1}).values()) == [0]


def test_a_name_and_its_name_without_extension_with_two_classes(tmp_path):
    path = tmp_path / "labels.txt"
    path.write_text("a n01\na.jpg n02\nb n01\n")
    labels = data.read_labels(str(path), {"n01": 0, "n02": 1})
    assert labels.of("b.jpg") == 0
    with pytest.raises(data.DataError, match="line 1 'a n01' and line 2 'a.jpg n02' give a.jpg two classes"):
        labels.of("a.jpg")


# ----------------------------------------------------------------------------- 11. the default run folder
def test_runs_started_at_the_same_moment_each_get_their_own_folder(tmp_path, monkeypatch):
    """Choosing the default folder and claiming it are one step: six runs in the same second, and a rival
    process that takes each name between a run's look and its claim (the race of the old exists-then-create),
    give six distinct folders, each made by its run; a folder claimed and never written to is removed when
    the run ends, one with the run's files is kept."""
    monkeypatch.setattr(checkpoints.time, "strftime", lambda fmt: "20261207-000000")
    mkdir, rival = os.mkdir, []

    def racing_mkdir(path, *a):
        if len(rival) < 3:  # another process claims this name first
            rival.append(path)
            mkdir(path)
        return mkdir(path, *a)
    monkeypatch.setattr(checkpoints.os, "mkdir", racing_mkdir)
    got = [checkpoints.new_run_dir("bvit", root=str(tmp_path)) for _ in range(6)]
    assert len(set(got)) == 6 and not set(got) & set(rival) and all(os.path.isdir(g) for g in got)
    open(os.path.join(got[0], "log.jsonl"), "w").close()
    checkpoints.release_unused()
    assert [g for g in got if os.path.isdir(g)] == [got[0]] and all(os.path.isdir(r) for r in rival)


# ----------------------------------------------------------------------------- 4. every optional extra
import importlib.abc  # noqa: E402
import importlib.util  # noqa: E402
import sys  # noqa: E402

from loopvae_train import perceptual  # noqa: E402
from training import figures  # noqa: E402

BROKEN = {"absent": None, "too old": ImportError("TensorBoard logging requires TensorBoard version 1.15 or above"),
          "raising": AttributeError("module 'numpy' has no attribute 'object'"), "failing": RuntimeError("boom")}


def break_import(monkeypatch, name, how):
    """Importing `name` fails as `how` says (BROKEN): absent (not installed), or raising its error."""
    for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        monkeypatch.delitem(sys.modules, k)
    if BROKEN[how] is None:
        monkeypatch.setitem(sys.modules, name, None)  # (import raises ModuleNotFoundError naming it)
        return

    class Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            return importlib.util.spec_from_loader(fullname, self) if fullname == name else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            raise BROKEN[how]
    monkeypatch.setattr(sys, "meta_path", [Broken()] + sys.meta_path)


@pytest.mark.parametrize("how", list(BROKEN))
def test_every_optional_extra_that_cannot_be_used_is_one_line_before_anything_is_written(tmp_path, monkeypatch,
                                                                                      capsys, how):
    """tensorboard (--tensorboard: refused before the run folder exists), matplotlib (a figure left out, with a
    note), lpips (--perceptual lpips) and torchmetrics (--rfid): absent, too old, or an import that raises."""
    break_import(monkeypatch, "torch.utils.tensorboard", how)
    out = tmp_path / "run"
    assert train.cli(TINY + ["--depth", "2", "--patch-size", "8", "--tensorboard", "--out-dir", str(out),
                             "--device", "cpu", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train.py: error: --tensorboard needs") and not out.exists(), err
    assert ("is not installed" if how == "absent" else str(BROKEN[how])) in err
    monkeypatch.undo()
    break_import(monkeypatch, "matplotlib", how)
    assert figures.pyplot("x.png") is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: matplotlib ") and "x.png not drawn" in err, err
    monkeypatch.undo()
    break_import(monkeypatch, "lpips", how)
    with pytest.raises(Fail, match="--perceptual lpips") as e:
        perceptual.lpips_loss()
    assert "\n" not in str(e.value)
    monkeypatch.undo()
    break_import(monkeypatch, "torchmetrics", how)
    with pytest.raises(Fail, match="--rfid") as e:
        perceptual.rfid_metric(torch.device("cpu"))
    assert "\n" not in str(e.value)
    monkeypatch.undo()
    # through train_loopvae.py, which uses lpips and torchmetrics: one line, exit 2, before the run folder exists
    for package, flag in (("lpips", ["--perceptual", "lpips"]), ("torchmetrics", ["--rfid"])):
        break_import(monkeypatch, package, how)
        capsys.readouterr()
        assert train_loopvae.cli(TINY[2:] + LOOPVAE[2:] + flag + ["--data", "synthetic", "--device", "cpu", "--workers",
                                                                 "0", "--out-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"train_loopvae.py: error: {flag[0]}") and not out.exists(), err
        monkeypatch.undo()


# ----------------------------------------------------------------------------- 7. writers into an existing run folder
import json  # noqa: E402

from training import evaluation  # noqa: E402

RUN = TINY + ["--depth", "2", "--patch-size", "8", "--device", "cpu", "--workers", "0", "--batch-size", "8",
              "--val-subset", "8", "--eval-batch-size", "8", "--max-steps", "2", "--epochs", "1"]


def files(folder):
    return {f: (folder / f).read_bytes() for f in sorted(os.listdir(folder)) if not f.startswith(".")}


@pytest.mark.slow
def test_no_writer_into_a_run_folder_replaces_a_record_it_did_not_make(tmp_path, capsys):
    """--eval-only into a training run's folder (the issue's case), a second --eval-only there, and a training run
    into a folder that holds an --eval-only's results: every file there before is byte for byte as it was, and
    each writer's results go to names of their own (depth_eval-2.json, -3; its PNG beside), said in one line."""
    out = tmp_path / "run"
    assert train.cli(RUN + ["--eval-depths", "1,2,4", "--out-dir", str(out)]) == 0
    for n in (2, 3):
        before = files(out)
        assert train.cli(["--eval-only", "--resume", str(out / "ckpt.pt"), "--out-dir", str(out), "--eval-depths", "3",
                          "--workers", "0"]) == 0
        assert f"its results go to depth_eval-{n}.json, depth_eval-{n}.png" in capsys.readouterr().out
        after = files(out)
        figure = {f"depth_eval-{n}.png"} if importlib.util.find_spec("matplotlib") else set()  # (drawn where installed)
        assert {k: after[k] for k in before} == before and set(after) - set(before) == {f"depth_eval-{n}.json", *figure}
        assert [r["depth"] for r in json.loads(after[f"depth_eval-{n}.json"])["results"]] == [3]
    fresh = tmp_path / "fresh"  # a folder holding only an --eval-only's results takes a new run
    assert train.cli(["--eval-only", "--resume", str(out / "ckpt.pt"), "--out-dir", str(fresh), "--eval-depths", "1",
                      "--workers", "0"]) == 0
    before = files(fresh)
    assert train.cli(RUN + ["--eval-depths", "1,2", "--out-dir", str(fresh)]) == 0
    after = files(fresh)
    assert {k: after[k] for k in before} == before and "depth_eval-2.json" in after
    assert [r["depth"] for r in json.loads(after["depth_eval-2.json"])["results"]] == [1, 2]
    assert train.cli(RUN + ["--eval-depths", "1,2", "--out-dir", str(fresh), "--resume", str(fresh / "ckpt.pt")]) == 0


def test_results_files_of_every_writer(tmp_path):
    """results_files for each result a tool writes into OUT (depth_eval.json + .png, reconstruction_eval.json):
    a training run keeps its own names where the file is absent or its own; --eval-only never takes an existing one."""
    ckpt = str(tmp_path / "ckpt.pt")
    for names in (("depth_eval.json", "depth_eval.png"), ("reconstruction_eval.json",)):
        train_args = argparse.Namespace(out_dir=str(tmp_path), eval_only=False)
        eval_args = argparse.Namespace(out_dir=str(tmp_path), eval_only=True)
        assert evaluation.results_files(train_args, True, *names) == [str(tmp_path / n) for n in names]
        (tmp_path / names[0]).write_text(json.dumps({"checkpoint": ckpt}))  # the training run's own
        assert evaluation.results_files(train_args, True, *names) == [str(tmp_path / n) for n in names]
        got = evaluation.results_files(eval_args, True, *names)
        assert got[0].endswith("-2.json") and os.path.getsize(got[0]) == 0
        (tmp_path / names[0]).write_text(json.dumps({"checkpoint": ckpt, "eval_only": True}))  # an --eval-only's
        assert evaluation.results_files(train_args, True, *names)[0].endswith("-3.json")
        assert evaluation.results_files(eval_args, False, *names) == [str(tmp_path / n) for n in names]  # (rank > 0)


# ----------------------------------------------------------------------------- 8. a loader's worker that dies
class Dying:
    """The training loader, whose worker dies (as torch reports it: `error`) when batch `at` of the run is asked for."""

    def __init__(self, loader, at, error):
        self.loader, self.at, self.error, self.sampler = loader, at, error, loader.sampler

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for x in self.loader:
            Dying.asked += 1
            if Dying.asked == self.at:
                raise self.error
            yield x


LOOPVAE_RUN = ["--data", "synthetic", "--embed-dim", "32", "--num-blocks", "1", "--loops", "1,2", "--latent-dim", "4",
               "--device", "cpu", "--workers", "0", "--batch-size", "8", "--val-subset", "8", "--eval-batch-size", "8",
               "--weight-decay", "0"]


@pytest.mark.slow
def test_a_loader_worker_that_dies_in_a_loopvae_run_loses_no_step(tmp_path, monkeypatch, capsys):
    """train_loopvae.py's loop too: a worker killed at step 3 of 6, the 2 steps done saved, one line with the
    command that continues, and the continued run's losses bit for bit those of a straight run."""
    dying(tmp_path, monkeypatch, capsys, RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed."),
          train_loopvae, LOOPVAE_RUN + ["--max-steps", "6", "--epochs", "1", "--log-every", "1"])


@pytest.mark.slow
@pytest.mark.parametrize("error", [RuntimeError("DataLoader worker (pid(s) 4242) exited unexpectedly"),
                                   RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed."),
                                   ConnectionResetError(104, "Connection reset by peer"),
                                   RuntimeError("unable to write to file </torch_4242_0_1>: No space left on device "
                                                "(28)")], ids=["exited", "killed", "reset", "shm"])
def test_a_loader_worker_that_dies_ends_as_any_failure_and_loses_no_step(tmp_path, monkeypatch, capsys, error):
    """Every way torch reports a dead worker (or one out of shared memory), at step 3 of 6: the 2 steps done are
    saved, one line says why and gives the command that continues, and the continued run's losses are those of
    a run that was never stopped, bit for bit."""
    dying(tmp_path, monkeypatch, capsys, error, train, RUN[:-4] + ["--max-steps", "6", "--epochs", "1", "--log-every", "1"])


def dying(tmp_path, monkeypatch, capsys, error, script, job):
    """`script`'s run of the flags `job`, straight, and with a worker that dies (`error`) at step 3, continued."""
    assert script.cli(job + ["--out-dir", str(tmp_path / "straight")]) == 0
    build = train.data.build_loaders
    monkeypatch.setattr(train.data, "build_loaders",
                        lambda *a, **k: (lambda t, v: (Dying(t, 3, error), v))(*build(*a, **k)))
    Dying.asked = 0
    out = tmp_path / "run"
    capsys.readouterr()
    assert script.cli(job + ["--out-dir", str(out)]) == 2
    prog = os.path.basename(script.__file__)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith(prog)]
    assert len(err) == 1 and ("worker process died" in err[0] or "shared memory" in err[0]), err
    assert f"checkpoint {out / 'ckpt.pt'} (step 2)" in err[0] and "--resume" in err[0], err
    monkeypatch.undo()
    assert script.cli(job + ["--out-dir", str(out), "--resume", str(out / "ckpt.pt")]) == 0
    losses = [[(r["step"], r["loss"]) for r in map(json.loads, open(d / "log.jsonl")) if "loss" in r]
              for d in (tmp_path / "straight", out)]
    assert losses[0] == losses[1] and len(losses[0]) == 6
