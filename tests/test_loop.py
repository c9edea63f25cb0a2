"""The training step and loop end to end (moved from test_models.py, which holds the models' own tests):
a step that reads nothing back from the device (CPU stand-in and CUDA), two DDP processes equal to one,
a short run on real CIFAR-100 that lowers the loss, and bad input through a real `python train.py`.

CPU only except the CUDA test (skipped without a device); real CIFAR-100 from $RVITS_DATA (else
../shared/data), skipped when absent.
"""
import contextlib
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import bvit
import odevit
import revit
import srvit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
from conftest import DATA  # noqa: E402  ($RVITS_DATA, else ../shared/data)
HAVE_CIFAR = os.path.isfile(os.path.join(DATA, "cifar-100-python", "train"))
needs_cifar = pytest.mark.skipif(not HAVE_CIFAR, reason=f"real CIFAR-100 not found in {DATA} (set RVITS_DATA)")

TINY = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=4)


# ----------------------------------------------------------------------------- host syncs
# A training step should only queue GPU work: no value read back to the host (.item(), .tolist(),
# bool(t), nonzero, unique, bincount) and no blocking host-to-device copy (torch.tensor(x, device=),
# new_tensor), each of which makes the CPU wait for the GPU. reViT's elastic depth samples its drop
# mask on the CPU, so the rows and groups of each step are host data. Left out, syncing by
# construction: revit_moe's token-dispatch routings (deepseek, qwen3, moeut: the dropless dispatch reads
# each expert's token count back, one sync per step) and train.py's finite-gradient check (one per
# optimizer step).
def sync_free_models():
    from revit_moe import ReViTMoE
    torch.manual_seed(0)
    kw = dict(TINY, drop_path_rate=0.1)
    moe = {f"revit_moe-{r}": ReViTMoE(routing=r, depth=3, experts=4, depth_dropout=0.5, **kw)
           for r in ("lory", "smear", "remoe", "softmoe")}
    return {"bvit": bvit.BViT(depth=4, stages=2, **kw), "vit": bvit.BViT(depth=2, num_blocks=2, **kw),
            "revit-grid": revit.ReViT(depth=3, experts=3, depth_dropout=0.0, **kw),
            "revit-elastic": revit.ReViT(depth=4, experts=3, depth_dropout=0.5, **kw), **moe,
            "revit_moe-lora": ReViTMoE(lora_rank=2, experts=1, depth=3, depth_dropout=0.5, **kw),
            "srvit": srvit.SRViT(depth=2, recursions=2, **kw),
            "odevit": odevit.ODEViT(depth=4, solver="rk4", stages=2, **kw)}


def test_training_step_reads_nothing_back_from_the_device(monkeypatch):
    """CPU stand-in for the CUDA test below: the `meta` device plays the GPU (no data, so any read
    back fails or is recorded). A dispatch mode records value reads and blocking copies onto it;
    torch.tensor/new_tensor copy below the dispatcher, so they are watched directly."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    reads = ("_local_scalar_dense", "nonzero", "unique", "bincount", "masked_select", "is_nonzero", "equal")
    seen = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            ts = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            name = func.__name__.split(".")[0]
            if (name in reads or "unique" in name) and any(t.is_meta for t in ts):
                seen.append(name)
            elif name in ("_to_copy", "copy_") and not kwargs.get("non_blocking", len(args) > 2 and args[2]):
                to_meta = kwargs.get("device") == torch.device("meta") or args[0].is_meta
                if to_meta and any(t.device.type == "cpu" for t in ts):
                    seen.append(f"{name} from the CPU")
            return func(*args, **kwargs)

    def watched(fn, label):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            if out.is_meta:
                seen.append(label)
            return out
        return call
    monkeypatch.setattr(torch, "tensor", watched(torch.tensor, "torch.tensor"))
    monkeypatch.setattr(torch.Tensor, "new_tensor", watched(torch.Tensor.new_tensor, "new_tensor"))
    # autocast has no meta device: the models' autocast calls become no-ops there
    autocast, enabled, dtype = torch.autocast, torch.is_autocast_enabled, torch.get_autocast_dtype
    monkeypatch.setattr(torch, "autocast", lambda dev, *a, **k: contextlib.nullcontext() if dev == "meta"
                        else autocast(dev, *a, **k))
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: a != ("meta",) and enabled(*a))
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda dev: torch.bfloat16 if dev == "meta" else dtype(dev))
    for name, m in sync_free_models().items():
        m = m.to("meta").train()
        x, y = torch.empty(4, 3, 16, 16, device="meta"), torch.empty(4, dtype=torch.long, device="meta")
        with Watch():
            m(x, y)[1].backward()
        assert seen == [], (name, seen)
        assert all(p.grad is not None for p in m.parameters()), name
    with Watch():  # the watch sees what it should
        z = torch.ones(3, device="meta")
        for read in (lambda: z.nonzero(), lambda: z.sum().item(), lambda: z.new_tensor([1.0]),
                     lambda: torch.tensor(2.0, device="meta"), lambda: torch.ones(2).to("meta")):
            with contextlib.suppress(Exception):  # meta has no values: some reads raise, after being seen
                read()
    assert len(seen) == 5, seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_training_step_of_each_model_does_not_sync():
    """One bf16 training step (forward, backward, gradient clipping, fused AdamW) of each model
    under torch.cuda.set_sync_debug_mode("error"), after a warm-up step (first calls set up
    cuBLAS, kernels and the optimizer state)."""
    for name, m in sync_free_models().items():
        m = m.cuda().train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
        x, y = torch.randn(4, 3, 16, 16, device="cuda"), torch.arange(4, device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(x, y)[1]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        step()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
        except RuntimeError as e:
            raise AssertionError(f"{name}: {e}") from e
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- train.py
def train(args, nproc=1, timeout=600):
    cmd = [sys.executable, os.path.join(ROOT, "train.py")]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(nproc), os.path.join(ROOT, "train.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd + args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def read_log(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


TINY_RUN = ["--embed-dim", "32", "--num-heads", "2", "--depth", "2", "--device", "cpu",
            "--workers", "0", "--val-subset", "64", "--eval-batch-size", "64"]


@pytest.mark.slow
def test_two_process_ddp_equals_one_process_with_same_global_batch(tmp_path):
    common = TINY_RUN + ["--data", "synthetic", "--batch-size", "16", "--max-steps", "3",
                         "--label-smoothing", "0.1"]
    one = train(common + ["--out-dir", str(tmp_path / "one")])
    assert one.returncode == 0, one.stderr
    two = train(common + ["--out-dir", str(tmp_path / "two")], nproc=2)
    assert two.returncode == 0, two.stderr
    a = torch.load(tmp_path / "one" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "two" / "ckpt.pt", weights_only=True)["model"]
    init = bvit.BViT(img_size=32, patch_size=4, num_classes=100, embed_dim=32, num_heads=2, depth=2)
    moved = 0
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-4), k
        moved += not torch.equal(a[k], init.state_dict()[k])
    assert moved > 0  # the runs trained something


@pytest.mark.slow
@needs_cifar
def test_short_run_on_real_cifar_lowers_the_loss(tmp_path):
    out = tmp_path / "run"
    r = train(TINY_RUN[:-4] + ["--data", "cifar100", "--data-dir", DATA, "--embed-dim", "64",
                              "--num-heads", "2", "--depth", "4", "--batch-size", "64",
                              "--max-steps", "60", "--val-subset", "500", "--eval-depths", "2,8",
                              "--out-dir", str(out)])
    assert r.returncode == 0, r.stderr
    log = read_log(out)
    epoch, depths = log[0], log[1:]
    for key in ("epoch", "step", "lr", "train_loss", "val_loss", "val_acc1", "val_acc5",
                "img_per_s", "epoch_time_s"):
        assert key in epoch
    assert epoch["step"] == 60
    assert epoch["val_loss"] < math.log(100) - 0.1  # below the loss of a uniform guess
    assert epoch["val_acc5"] > 5.0 + 3.0  # chance top-5 is 5%
    assert [d["depth"] for d in depths] == [2, 8]
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["step"] == 60 and ck["args"]["model"] == "bvit"


# Two cases through a real `python train.py` process (a data error, an argparse error); the full list
# of bad inputs (--depth 0, --patch-size 5, ...) is checked in-process in tests/test_train.py.
@pytest.mark.slow
@pytest.mark.parametrize("flags, says", [
    (["--data", "cifar100", "--data-dir", "/nonexistent/rvits"], "/nonexistent/rvits"),
    (["--model", "nosuch"], "--model"),
])
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, flags, says):
    r = train(["--data", "synthetic", "--out-dir", str(tmp_path)] + flags)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert says in lines[0]
