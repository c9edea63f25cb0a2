#!/usr/bin/env bash
# The CIFAR-100 study at GPU scale, one GPU window at a time (lab/gpu_study.py says what it does):
#   cp -r ../shared/data/cifar-100-device gpu_data/    # here, once (gpu_data/ is git-ignored)
#   device run, carry gpu_data:  PYTHONUNBUFFERED=1 bash lab/gpu_study.sh     (OUT is set there)
#   then here:  python lab/summarize_gpu.py --add <fetched OUT>/results.jsonl --results lab/docs/results.md
#   bash lab/gpu_study.sh --dry-run    # any CPU: every arm shrunk to a few steps (lab/tests/test_reproduce.py)
# On the GPU machine CIFAR-100 is unpacked from gpu_data/cifar-100-device first, as gpu_run.sh does.
# Environment: see lab/gpu_study.py (OUT, WORK, GPU_DATA, BUDGET_S, SEEDS, ARMS, JOBS, RESULTS).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  "$PYTHON" -c "import torch" 2>/dev/null || PYTHON=python  # a CPU machine whose python3 lacks torch
fi
export PYTHON PYTHONUNBUFFERED=1
GPU_DATA=${GPU_DATA:-gpu_data}
if [ "${1:-}" != "--dry-run" ] && [ ! -f "$GPU_DATA/cifar-100-python/train" ] && [ -d "$GPU_DATA/cifar-100-device" ]; then
  "$PYTHON" "$GPU_DATA/cifar-100-device/cifar100_pack.py" unpack "$GPU_DATA/cifar-100-device" "$GPU_DATA" || exit 2
fi
exec "$PYTHON" lab/gpu_study.py "$@"
