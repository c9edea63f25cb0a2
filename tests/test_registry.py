"""The model interface of training/registry.py, run on every registered model: what train.py asks of a
model, checked the way train.py builds it (flags.resolved, then registry.build_model). A new model
file registered in MODELS is tested here without a line added. A model is one record: every --model
has one, every model-specific flag is in one, and a new model registered in that one place (the
example of docs/models.md "Add your own model") trains, resumes, evaluates and is estimated."""
import json
import os
import re
import sys
from types import SimpleNamespace

import pytest
import torch

import presets
from training import flags, monitor, registry
from test_train import ROOT, fake_cifar
from test_train import TINY as TINY_RUN

# The smallest flags of each family; a family not listed here gets the classifier's.
TINY = {"revit": ["--experts", "2"], "odevit": ["--solver", "midpoint"]}
CLASSIFIER = ["--embed-dim", "16", "--num-heads", "2", "--depth", "2"]
IMG, CLASSES = 16, 10


def build(name):
    args = flags.resolved(["--model", name, *CLASSIFIER, *TINY.get(name, [])], IMG)
    torch.manual_seed(0)
    return registry.build_model(args, IMG, CLASSES)


@pytest.mark.parametrize("name", list(registry.MODELS))
def test_every_registered_model_keeps_the_interface_train_py_relies_on(name):
    model = build(name).train()
    tokenizer = hasattr(model, "metrics")
    x = torch.randn(4, 3, IMG, IMG)
    y = torch.randint(0, CLASSES, (4,))
    out, loss = model(x, y)
    assert out.shape == ((4, 3, IMG, IMG) if tokenizer else (4, CLASSES))
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    # the last forward's terms, logged; train.py adds its own (distill_loss, Stage 2's) to the same dict
    assert isinstance(model.aux, dict) and all(torch.is_tensor(v) and v.ndim == 0 for v in model.aux.values())
    # soft targets (MixUp/CutMix, label smoothing) take the same path
    _, soft = model(x, torch.softmax(torch.randn(4, CLASSES), 1))
    assert soft.ndim == 0 and torch.isfinite(soft)
    model.eval()
    with torch.no_grad():
        out = model(x)
    assert torch.is_tensor(out) if not tokenizer else out[1] is None
    # sizes: distinct parameters (a shared tensor counts once), analytic forward FLOPs
    assert model.num_params() == sum(p.numel() for p in model.parameters())
    assert float(model.flops_per_image()) > 0
    if not tokenizer:  # a checkpoint's class count is read from its head
        assert model.head.weight.shape[0] == CLASSES
        with torch.no_grad():
            assert model(x, depth=1).shape == (4, CLASSES)  # evaluation at another depth
    else:
        with torch.no_grad():
            x_hat, mean, logvar = model.reconstruct(x)
        assert x_hat.shape == x.shape and mean.shape == logvar.shape
    # the optional parts, where present
    if hasattr(model, "log_extras"):
        json.dumps(model.log_extras())  # values for a log.jsonl record
    if hasattr(model, "trains_as_one_graph"):
        assert isinstance(model.trains_as_one_graph(), bool)
    if hasattr(model, "set_grad_checkpointing"):
        assert model.set_grad_checkpointing(True) is model
    assert callable(getattr(model, "compile_regions", model.compile))


def test_the_interface_test_fails_for_a_model_that_breaks_it(monkeypatch):
    """The test above can fail: a registered model whose loss is not a scalar is caught."""
    class Broken(torch.nn.Module):
        def __init__(self, **common):
            super().__init__()
            self.head, self.aux = torch.nn.Linear(3, common["num_classes"]), {}

        def forward(self, x, targets=None, depth=None):
            logits = self.head(x.mean((2, 3)))
            return logits, (None if targets is None else logits.sum(1))  # (B,), not 0-d

        def num_params(self):
            return sum(p.numel() for p in self.parameters())

        def flops_per_image(self):
            return 1.0
    monkeypatch.setitem(registry.MODELS, "bvit", registry.Model(lambda args, common: Broken(**common)))
    with pytest.raises(AssertionError):
        test_every_registered_model_keeps_the_interface_train_py_relies_on("bvit")


def test_each_model_is_one_record_and_each_flag_of_a_model_is_in_its_record():
    p = flags.get_parser()
    dests = set(vars(p.parse_args([])))
    choices = next(a.choices for a in p._actions if a.dest == "model")
    assert choices == list(registry.MODELS) and all(isinstance(m, registry.Model) for m in registry.MODELS.values())
    # the flags of a model's own group ("model: SR-ViT", ...) and the model group's
    # --num-blocks / --stages: each is read by some models only, so it belongs to their records
    own = {a.dest for g in p._action_groups if g.title.startswith("model: ") for a in g._group_actions} | {
        "num_blocks", "stages"}
    read = registry.model_flags()
    assert own - set(read) == set(), "a model's flag that no record names: other models would not refuse it"
    for name, m in registry.MODELS.items():
        assert set(m.flags) <= dests and set(m.arch) <= set(m.flags) | set(registry.SHARED_ARCH_FLAGS), name
        assert m.depth_flag in dests and set(m.defaults(vars(flags.resolved(["--model", name])))) <= set(m.flags)
        assert m.cpu_preset is None or presets.PRESETS[m.cpu_preset][1]["model"] == name, name
    assert registry.arch_flags() >= set(registry.SHARED_ARCH_FLAGS) | {"recursions", "solver"}
    assert read["num_blocks"] == ("vit", "bvit") and read["recursions"] == ("srvit",)


def docs_new_model():
    """The two code blocks of docs/models.md "Add your own model": the model file, its record."""
    text = open(os.path.join(ROOT, "docs", "models.md"), encoding="utf-8").read()
    section = text[text.index("## Add your own model"):]
    model_file, record = re.findall(r"```python\n(.*?)```", section, re.S)[:2]
    return model_file, record


def test_docs_own_block_example_trains(capsys):
    """docs/models.md "Your own block" (issue 65, item 2): its example runs as written and its loss falls
    from ln 10 to the value the section prints."""
    text = open(os.path.join(ROOT, "docs", "models.md"), encoding="utf-8").read()
    section = text[text.index("### Your own block"):]
    example = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    exec(example, {"__name__": "parallel_bvit"})
    said = float(re.search(r"`loss after 20 steps: ([0-9.]+)`", section).group(1))
    got = float(capsys.readouterr().out.split(":")[-1])
    assert got == pytest.approx(said, abs=0.02) and said < 2.0  # (another CPU: the last digits may differ)


def test_a_new_model_registered_in_one_place_trains_resumes_evaluates_and_is_estimated(tmp_path, monkeypatch,
                                                                                         capsys):
    """docs/models.md's GatedViT, registered as the section says (one record) and nowhere else, through
    train.py: a run, its --resume, --eval-depths, --eval-only (flags from the checkpoint), and the long
    CPU estimate, which names no preset for a model without one (it was a KeyError)."""
    import train
    model_file, record = docs_new_model()
    (tmp_path / "gatedvit.py").write_text(model_file)
    monkeypatch.syspath_prepend(str(tmp_path))
    import gatedvit
    monkeypatch.setitem(sys.modules, "gatedvit", gatedvit)  # (removed again after the test)
    exec(record, {**vars(registry)})  # its MODELS is registry.MODELS: the block adds the record there
    monkeypatch.setitem(registry.MODELS, "gatedvit", registry.MODELS.pop("gatedvit"))
    data = fake_cifar(tmp_path / "data")
    run, out = TINY_RUN + ["--data", "cifar100", "--data-dir", data], str(tmp_path / "run")
    assert train.cli(run + ["--model", "gatedvit", "--epochs", "1", "--out-dir", out]) == 0
    assert train.cli(run + ["--resume", out, "--epochs", "2", "--eval-depths", "1,2,4"]) == 0  # its model: the ckpt's
    said = capsys.readouterr().out
    assert "resumed from" in said and "gatedvit:" in said
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ck["step"] == 16 and ck["args"]["model"] == "gatedvit" and "gate" in ck["model"]
    res = json.load(open(os.path.join(out, "depth_eval.json")))
    assert res["model"] == "gatedvit" and res["trained_depth"] == 2 and [r["depth"] for r in res["results"]] == [1, 2, 4]
    ev = str(tmp_path / "eval")
    assert train.cli(["--data-dir", data, "--device", "cpu", "--workers", "0", "--eval-only", "--resume", out,
                      "--out-dir", ev]) == 0
    res = json.load(open(os.path.join(ev, "depth_eval.json")))
    assert [r["depth"] for r in res["results"]] == [1, 2, 4, 8, 16]  # 0.5x-8x its trained depth
    pace, steps = [(1, 0.0), (11, 100.0)], 100_000  # 10 s per step: days on a CPU
    cpu = torch.device("cpu")
    line = monitor.estimate_line(SimpleNamespace(preset=None, model="gatedvit"), cpu, pace, steps)
    assert line.startswith("estimated time: ") and "--preset" not in line  # no CPU-sized preset: no hint
    assert "--preset cpu-first-bvit" in monitor.estimate_line(SimpleNamespace(preset=None, model="bvit"), cpu, pace,
                                                              steps)
