#!/usr/bin/env bash
# The one command for a lent CUDA machine (one H200; at most 9 minutes, the step limits add up to
# 540 s with the unpacking; it needs only the repository and gpu_data/):
#   (a) unpack CIFAR-100 from gpu_data/cifar-100-device (../shared/data/README.md section 3),
#   (b) the CUDA tests and each model's compiled bf16 training step (224 px, synthetic data; bvit,
#       odevit and srvit train their whole forward as one CUDA graph, revit's elastic depth compiled
#       blocks; each must exit right after its last line),
#   (c) one full CIFAR-100 preset (c100-gpu-bvit-ti, all its epochs, compiled, GPU-resident loader),
#   (d) bench.py --device cuda, most important first: the matmul peak, the CIFAR preset's img/s and
#       MFU and its new path over the f937315 step, a compiled process's exit delay, then MFU of
#       bViT-B/16 and the ratios against timm as time allows (bench.json keeps every finished key).
# Every step has a time limit and the script goes on after a failure. What comes back from the
# machine (at most 8 files): $OUT/summary.md (each step's status and time, the CIFAR result),
# $OUT/gpu_run.log (every step's output), $OUT/bench.json, $OUT/cifar_log.jsonl. Checkpoints and run
# folders stay in $WORK on the machine.
#
#   cp -r ../shared/data/cifar-100-device gpu_data/      # here, once (gpu_data/ is git-ignored)
#   device run, carry gpu_data:  PYTHONUNBUFFERED=1 bash scripts/gpu_run.sh     (OUT is set there)
#   bash scripts/gpu_run.sh --dry-run      # any CPU, ~1 minute: every step shrunk (test_reproduce.py)
#
# Environment: OUT (gpu_run_out), WORK (/tmp/rvits_gpu_run), GPU_DATA (gpu_data), PRESET
# (c100-gpu-bvit-ti), PYTHON (python3, the GPU image's interpreter; unset, the dry run falls back
# to python when python3 has no torch).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-gpu_run_out}
WORK=${WORK:-/tmp/rvits_gpu_run}
GPU_DATA=${GPU_DATA:-gpu_data}
PRESET=${PRESET:-c100-gpu-bvit-ti}
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  if [ $DRY = 1 ] && ! python3 -c "import torch" 2>/dev/null; then
    PYTHON=python  # a CPU machine whose python3 is another interpreter than the project's
  fi
fi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1  # a step killed with ABRT dumps its Python stacks
mkdir -p "$OUT" "$WORK"
LOG="$OUT/gpu_run.log"
SUMMARY="$OUT/summary.md"
: > "$LOG"
echo "# scripts/gpu_run.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)$([ $DRY = 1 ] && echo ' (dry run)')" > "$SUMMARY"
status=0

step() {  # step NAME SECONDS CMD...: run CMD with a time limit, output to $LOG, a line in $SUMMARY
  local name=$1 limit=$2; shift 2
  [ $DRY = 1 ] && limit=300  # a busy CPU: generous; the dry run checks the script, not speed
  echo "=== $name (limit $limit s): $*" >> "$LOG"
  local t0=$SECONDS
  "$@" >> "$LOG" 2>&1 &
  local pid=$! rc
  while kill -0 $pid 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 1; done
  if kill -0 $pid 2>/dev/null; then  # over its limit: TERM (train.py checkpoints after the step),
    kill -TERM $pid                  # then ABRT (faulthandler writes every thread's stack to the
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 $pid 2>/dev/null && sleep 1; done  # log: where a
    kill -0 $pid 2>/dev/null && kill -ABRT $pid && sleep 3  # first step hangs), then KILL
    kill -KILL $pid 2>/dev/null
    wait $pid
    rc=124
  else
    wait $pid
    rc=$?
  fi
  local what="ok"
  [ $rc -eq 124 ] && what="TIMED OUT"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && what="FAILED"
  echo "- $name: $what (exit $rc, $((SECONDS - t0)) s)" | tee -a "$SUMMARY"
  if [ $rc -ne 0 ]; then
    status=1
    echo "  last line: $(tail -n 1 "$LOG" | cut -c1-300)" | tee -a "$SUMMARY"
  fi
}

if [ $DRY = 1 ]; then  # tiny sizes on the CPU, no compilation: checks the script, not the GPU
  DEV=(--device cpu --amp none)
  SIZE=(--embed-dim 16 --num-heads 2 --depth 2 --img-size 32 --patch-size 8 --batch-size 4 --max-steps 1
        --val-subset 8 --eval-batch-size 8 --workers 0)
  COMPILE=()
  CIFAR=(--epochs 1 --max-steps 2 --batch-size 8 --val-subset 16 --embed-dim 16 --num-heads 2 --depth 2
         --workers 0)
  BENCH=(--device cpu --smoke --workers 0)
  TESTS=(test_speed.py -k cuda)
else
  DEV=(--device cuda --amp bf16)
  SIZE=(--size s --img-size 224 --patch-size 16 --batch-size 128 --max-steps 10 --val-subset 256 --workers 8)
  COMPILE=(--compile)
  CIFAR=()
  BENCH=(--device cuda)
  TESTS=(test_speed.py test_revit.py test_models.py test_folders.py -k "cuda or timm or bf16")
fi

step env 20 "$PYTHON" -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', \
torchvision.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
grep -E "^torch" "$LOG" | tail -1 | sed 's/^/  /' >> "$SUMMARY"

# (a) data
if [ ! -f "$GPU_DATA/cifar-100-python/train" ]; then
  if [ -d "$GPU_DATA/cifar-100-device" ]; then
    step unpack_cifar 40 "$PYTHON" "$GPU_DATA/cifar-100-device/cifar100_pack.py" unpack "$GPU_DATA/cifar-100-device" "$GPU_DATA"
  else
    echo "- unpack_cifar: FAILED: neither $GPU_DATA/cifar-100-python nor $GPU_DATA/cifar-100-device; copy ../shared/data/cifar-100-device into $GPU_DATA/ and carry it" | tee -a "$SUMMARY"
    status=1
  fi
fi

# (b) CUDA tests, and each model's compiled bf16 training step at ImageNet size
step cuda_tests 60 "$PYTHON" -m pytest -q -x "${TESTS[@]}"  # 14 passed in 112 s with Triton's autotuning, now gone
for m in bvit revit odevit srvit; do
  rm -rf "$WORK/step_$m"  # a warm machine may hold an earlier attempt's run
  limit=35; [ $m = revit ] && limit=30; [ $m = bvit ] && limit=60  # bvit's first compilation fills caches
  step "compiled_step_$m" $limit "$PYTHON" train.py --model "$m" --data synthetic "${SIZE[@]}" "${COMPILE[@]}" "${DEV[@]}" \
    --out-dir "$WORK/step_$m"
done

# (c) one full CIFAR-100 preset (all its epochs), the log and a summary back in $OUT
rm -rf "$WORK/cifar"
step "cifar_$PRESET" 150 "$PYTHON" train.py --preset "$PRESET" --data-dir "$GPU_DATA" "${CIFAR[@]}" "${COMPILE[@]}" \
  "${DEV[@]}" --out-dir "$WORK/cifar"
cp "$WORK/cifar/log.jsonl" "$OUT/cifar_log.jsonl" 2>/dev/null
"$PYTHON" - "$OUT/cifar_log.jsonl" "$PRESET" >> "$SUMMARY" <<'EOF'
import json, sys
try:
    recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
except OSError:
    sys.exit(print("  no log.jsonl: the CIFAR run did not finish an epoch"))
ep = [r for r in recs if "epoch" in r]
if ep:
    last = ep[-1]
    print(f"  {sys.argv[2]}: {len(ep)} epoch(s), step {last['step']}, top-1 {last['val_acc1']:.2f} %, "
          f"top-5 {last['val_acc5']:.2f} %, {sum(r['epoch_time_s'] for r in ep):.0f} s training, "
          f"{ep[-1]['img_per_s']:.0f} img/s in the last epoch")
for r in recs:
    if "depth" in r:
        print(f"  depth {r['depth']}: top-1 {r['val_acc1']:.2f} %")
EOF

# (d) the benchmark (ratios against peers in the same run)
step bench 110 "$PYTHON" bench.py "${BENCH[@]}" --json "$OUT/bench.json"
grep -E "^[a-z_0-9]+ +[0-9.]+ " "$LOG" | sed 's/^/  /' >> "$SUMMARY"

echo "status $status; full output in $LOG" | tee -a "$SUMMARY"
exit $status
