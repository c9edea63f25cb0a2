"""The model interface of training/registry.py, run on every registered model: what train.py asks of a
model, checked the way train.py builds it (flags.resolved, then registry.build_model). A new model
file registered in MODELS is tested here without a line added."""
import json

import pytest
import torch

from training import flags, registry

# The smallest flags of each family; a family not listed here gets the classifier's.
TINY = {"loopvae": ["--embed-dim", "32", "--num-blocks", "1", "--loops", "1,2", "--latent-dim", "4"],
        "revit": ["--experts", "2"], "odevit": ["--solver", "midpoint"]}
CLASSIFIER = ["--embed-dim", "16", "--num-heads", "2", "--depth", "2"]
IMG, CLASSES = 16, 10


def build(name):
    args = flags.resolved(["--model", name, *(CLASSIFIER if name != "loopvae" else []), *TINY.get(name, [])], IMG)
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
        out, none = model(x)
    assert none is None
    # sizes: distinct parameters (a shared tensor counts once), analytic forward FLOPs
    assert model.num_params() == sum(p.numel() for p in model.parameters())
    assert float(model.flops_per_image()) > 0
    if not tokenizer:  # a checkpoint's class count is read from its head
        assert model.head.weight.shape[0] == CLASSES
        with torch.no_grad():
            assert model(x, depth=1)[0].shape == (4, CLASSES)  # evaluation at another depth
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
