"""pytest's configuration. README's test command runs the suite in 2 processes (pytest-xdist, -n 2):
each then computes with one thread, as the study runs of studies/ do, since two processes with
two threads each on two cores spend much of their time waiting for each other. (pytest imports this file
while it collects tests/, in every worker, so the setting holds for test_models.py too.)"""
import os

if os.environ.get("PYTEST_XDIST_WORKER"):  # set by pytest-xdist in each of its processes
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # for the subprocesses the tests start
    import torch
    torch.set_num_threads(1)
