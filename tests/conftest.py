"""pytest's configuration. README's test command runs the suite in 2 processes (pytest-xdist, -n 2):
each then computes with one thread, as the study runs of studies/ do, since two processes with
two threads each on two cores spend much of their time waiting for each other. (pytest imports this file
while it collects tests/, in every worker, so the setting holds for test_models.py too.)

`--test-order reverse` or `--test-order random:SEED` runs the collected tests in reverse or in a seeded
random order (the same on every xdist worker, which xdist requires): no test may depend on what ran
before it, and these orders find one that does (docs/training.md "Tests"). The default keeps the files'
order, which README's command and CI use."""
import os
import random

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # set by pytest-xdist in each of its processes
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # for the subprocesses the tests start
    import torch
    torch.set_num_threads(1)


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
