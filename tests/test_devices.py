"""--device: auto picks CUDA, else an Apple GPU (MPS), else the CPU; a device torch does not see is one
line and exit 2 (training/run.py choose_device). Tested on the CPU with torch's answers patched."""
import pytest
import torch

import train
from training import exits, flags
from training.run import choose_device


def sees(monkeypatch, cuda, mps):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


@pytest.mark.parametrize("cuda, mps, chosen", [(True, True, "cuda:0"), (True, False, "cuda:0"),
                                               (False, True, "mps"), (False, False, "cpu")])
def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch, cuda, mps, chosen):
    sees(monkeypatch, cuda, mps)
    assert choose_device("auto") == torch.device(chosen)
    assert choose_device("cpu") == torch.device("cpu")  # a named device is taken as named


def test_auto_under_torchrun_leaves_out_mps_and_cuda_takes_the_local_rank(monkeypatch):
    sees(monkeypatch, False, True)
    assert choose_device("auto", ddp=True) == torch.device("cpu")  # no process group runs on MPS
    sees(monkeypatch, True, False)
    assert choose_device("auto", local_rank=3, ddp=True) == torch.device("cuda:3")


@pytest.mark.parametrize("name, cuda, mps, ddp, says", [
    ("mps", True, False, False, "--device mps: torch sees no Apple GPU"),
    ("cuda", False, True, False, "--device cuda: no CUDA device is available"),
    ("mps", False, True, True, "--device mps: one process only"),
    ("tpu", False, False, False, "--device tpu: allowed: auto, cpu, cuda, mps")])
def test_a_device_torch_does_not_see_is_one_line(monkeypatch, name, cuda, mps, ddp, says):
    sees(monkeypatch, cuda, mps)
    with pytest.raises(ValueError, match=says):
        choose_device(name, ddp=ddp)


def test_train_on_mps_resolves_its_precision_and_refuses_it_when_absent(monkeypatch, capsys):
    """train.runtime: --device auto on a Mac becomes mps with --amp auto = none (fp32); fp16 is allowed
    there (torch's GradScaler has MPS); without an Apple GPU --device mps is one line, exit 2."""
    sees(monkeypatch, False, True)
    p = flags.get_parser()
    run = train.runtime(p.parse_args([]), p, exits.Stop())
    assert run.device == torch.device("mps") and run.amp_ctx is not None
    args = p.parse_args(["--amp", "fp16"])
    train.runtime(args, p, exits.Stop())
    assert args.device == "mps" and args.amp == "fp16"
    sees(monkeypatch, False, False)
    with pytest.raises(SystemExit) as e:
        train.runtime(p.parse_args(["--device", "mps"]), p, exits.Stop())
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "train.py: error: --device mps: torch sees no Apple GPU" in err
