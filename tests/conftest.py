"""pytest's configuration. README's test command runs the suite in 2 processes (pytest-xdist, -n 2):
each computes with one thread (also without -n), as the study runs of lab/ do, since two processes with
two threads each on two cores spend much of their time waiting for each other. (pytest imports this file
while it collects tests/, in every worker, so the setting holds for test_models.py too.)

`--test-order reverse` or `--test-order random:SEED` runs the collected tests in reverse or in a seeded
random order (the same on every xdist worker, which xdist requires): no test may depend on what ran
before it, and these orders find one that does (README, "Install and test"). The default keeps the files'
order, which README's command and CI use."""
import os
import random

import pytest

# One thread in every pytest process, with or without -n: tests compare the weights of runs in subprocesses
# (one thread) with runs in pytest's own process bit for bit, and a float sum over 2 threads is not the
# one over 1 (a pytest without -n on 2 cores failed test_cluster's Ctrl-C test on a run that crossed an epoch).
os.environ.setdefault("OMP_NUM_THREADS", "1")  # for the subprocesses the tests start
import torch  # noqa: E402
torch.set_num_threads(1)

# The real data the tests read where present (README: $RVITS_DATA, else ../shared/data beside the repository):
# CIFAR-100 (cifar-100-python/) and the ImageNet sample (imagenet-sample/); tests that need them skip without.
DATA = os.environ.get("RVITS_DATA") or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    "..", "shared", "data")
SAMPLE = os.path.join(DATA, "imagenet-sample")


def pytest_addoption(parser):
    parser.addoption("--test-order", default="files", metavar="ORDER",
                     help="files (default), reverse, or random:SEED: the order tests run in")


def order_items(items, order):
    """Reorder pytest's collected `items` in place by `order` ("files", "reverse", "random:SEED");
    raises ValueError for another value."""
    if order == "files":
        return
    if order == "reverse":
        items.reverse()
        return
    kind, _, seed = order.partition(":")
    if kind != "random" or not seed.lstrip("-").isdigit():
        raise ValueError(f"--test-order {order!r}: use files, reverse or random:SEED (an integer)")
    random.Random(int(seed)).shuffle(items)


def pytest_collection_modifyitems(config, items):
    try:
        order_items(items, config.getoption("--test-order"))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


class HostReads:
    """Records every read of a tensor's value by the host inside the block (.item(), bool(), ==, a copy to the
    CPU): on a GPU each is a sync that stops the host from queueing work ahead; a CPU stand-in for
    torch.cuda.set_sync_debug_mode("error") (tests/test_speed.py, tests/test_step_logs.py: `from conftest import
    HostReads`). With meta=True the tensors under test live on the `meta` device (a GPU-like device without data):
    only reads of those are recorded, each answered with zeros."""
    READS = ("_local_scalar_dense", "is_nonzero", "equal", "item")

    def __init__(self, meta=False):
        self.meta = meta

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        import torch
        seen = self.seen = []
        meta, reads = self.meta, self.READS

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = func.__name__.split(".")[0]
                if not meta:
                    if name in reads:
                        seen.append(func.__name__)
                    return func(*args, **kwargs)
                if args and torch.is_tensor(args[0]) and args[0].is_meta:
                    if name == "_to_copy" and kwargs.get("device", torch.device("meta")) != torch.device("meta"):
                        seen.append(name)
                        return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
                    if name == "_local_scalar_dense":
                        seen.append(name)
                        return 0
                return func(*args, **kwargs)
        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
