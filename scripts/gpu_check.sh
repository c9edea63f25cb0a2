#!/usr/bin/env bash
# One script for a CUDA machine (< 8 minutes on an H100/H200): the CUDA-only tests, each model's
# compiled bf16 training step, a short CIFAR run on the GPU-resident loader, and bench.py at real
# sizes. Logs and JSON go to $OUT (default ./gpu_check_out). Needs only the repository; for the
# CIFAR run, pack a subset first on a machine that has the data:
#     python scripts/pack_cifar_subset.py --dst gpu_data     (37 MB; carry gpu_data/ along)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
status=0
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log, keep going
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/summary.txt"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
  tail -n 3 "$OUT/$name.log" | sed 's/^/   /' | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || status=1
}
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"

step tests 150 python -m pytest -q test_speed.py test_revit.py test_models.py -k "cuda or compil or kernel or timm or bf16"
for m in vit bvit revit odevit srvit; do
  step "compiled_$m" 90 python train.py --model "$m" --size s --data synthetic --img-size 224 --patch-size 16 \
    --batch-size 128 --max-steps 20 --val-subset 256 --compile --amp bf16 --workers 8 --out-dir "$OUT/run_$m"
done
if [ -d gpu_data/cifar-100-python ]; then
  step cifar_bvit 90 python train.py --model bvit --data cifar100 --data-dir gpu_data --embed-dim 384 \
    --num-heads 6 --patch-size 4 --depth 12 --batch-size 512 --max-steps 200 --compile --out-dir "$OUT/run_cifar"
fi
step bench 240 python bench.py --device cuda --json "$OUT/bench.json"
echo "done, status $status" | tee -a "$OUT/summary.txt"
exit $status
