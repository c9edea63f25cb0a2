#!/usr/bin/env bash
# The one command for a GPU window (scripts/gpu_run.py says what it runs, in which order, under which
# limits; at most 545 s in all):
#   cp -r ../shared/data/cifar-100-device gpu_data/      # here, once (gpu_data/ is git-ignored)
#   device run, carry gpu_data:  PYTHONUNBUFFERED=1 bash scripts/gpu_run.sh     (OUT is set there)
#   bash scripts/gpu_run.sh --dry-run      # any CPU: every step at tiny width (lab/tests/test_reproduce.py)
# PYTHON: python3 (the GPU image's interpreter); a CPU machine whose python3 has no torch uses python.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  "$PYTHON" -c "import torch" 2>/dev/null || PYTHON=python
fi
export PYTHON PYTHONUNBUFFERED=1
exec "$PYTHON" scripts/gpu_run.py "$@"
