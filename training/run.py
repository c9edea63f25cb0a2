"""What is this run? One record of its facts (Run): its processes, device, precision, stop handler, files,
length and starting point, built once by train.py's main() and passed to what needs them (the loop, the
monitor, the checkpoint, the evaluations, the first lines) instead of long lists of the same values."""
from dataclasses import dataclass, field
from typing import Any

import torch

DEVICES = ("auto", "cpu", "cuda", "mps")  # --device's choices


def choose_device(name, local_rank=0, ddp=False):
    """--device `name` as the torch.device this process trains on: cuda (GPU `local_rank`, torchrun's
    LOCAL_RANK), mps (an Apple GPU, through torch's Metal backend: torch.backends.mps), cpu, or auto =
    cuda where torch sees a CUDA device, else mps where it sees an Apple GPU, else cpu (timm and nanoGPT
    pick the same way). Raises ValueError, one line naming the flag and what to do, for a name not in
    DEVICES, for a device torch does not see, and for mps under torchrun (`ddp`: torch's process groups
    have no MPS backend: NCCL is CUDA's, gloo the CPU's)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() and not ddp \
            else "cpu"
    if name not in DEVICES:
        raise ValueError(f"--device {name}: allowed: {', '.join(DEVICES)}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available; use --device cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device mps: torch sees no Apple GPU (torch.backends.mps.is_available() is False: not "
                         "Apple silicon with macOS 12.3+, or a torch built without MPS); use --device cpu")
    if name == "mps" and ddp:
        raise ValueError("--device mps: one process only (torch's process groups have no MPS backend); run "
                         "train.py without torchrun, or use --device cpu")
    return torch.device(f"cuda:{local_rank}" if name == "cuda" else name)


@dataclass
class Run:
    """The facts of one run of train.py. train.runtime makes it (step 1 of main()); main() fills in the
    rest as the run learns it, in the order of events.

    ddp: under torchrun; rank, world (processes), local_rank (this process's GPU index on its node);
    device: a torch.device; micro: images per forward pass on one process (--batch-size / world /
    --grad-accum); amp_ctx: the forward's autocast context (a nullcontext without --amp);
    stop: the run's exits.Stop (the handler of its stop signals, and what a stopped run keeps);
    ckpt_path, log_path: OUT/ckpt.pt and OUT/log.jsonl, once --out-dir is known;
    steps_per_epoch, total_steps, warmup: its length in optimizer steps (train.optimizer_and_schedule);
    start_epoch, start_batch, start_step, progress: where its steps start (checkpoints.resume_or_start:
        0, 0, 0, {} for a fresh run; progress: a mid-epoch checkpoint's EpochSums state, this process's);
    resumed: what the run folder's log needs of the checkpoint a run resumes from (its path, step and
        epoch record: resume_or_start; {} for a fresh run), for checkpoints.take_out_dir;
    val_images: the validation images of every process (for the run's lines)."""
    ddp: bool
    rank: int
    world: int
    local_rank: int
    device: Any
    micro: int
    amp_ctx: Any
    stop: Any
    ckpt_path: str = ""
    log_path: str = ""
    steps_per_epoch: int = 0
    total_steps: int = 0
    warmup: int = 0
    start_epoch: int = 0
    start_batch: int = 0
    start_step: int = 0
    progress: dict = field(default_factory=dict)
    resumed: dict = field(default_factory=dict)
    val_images: int = 0

    @property
    def master(self):
        """Rank 0: the process that prints the run's lines and writes its files."""
        return self.rank == 0
