#!/usr/bin/env bash
# "Training Crossroads" CPU study (issue 4): recurrence vs neural-ODE solvers at equal block
# evaluations (NFE = 12), and naive recurrence vs stage-wise deep supervision beyond the horizon.
#
#   bash lab/crossroads_study.sh                              # 200 steps, ~35 min, runs/crossroads/
#   STEPS=800 OUT=runs/crossroads_800 bash lab/crossroads_study.sh  # ~1 epoch, ~65 min
#   ONLY="bvit12 bvit12_s3" bash lab/crossroads_study.sh      # only the named runs
#
# Every run: same width, same data order (seed 0), same optimizer and schedule, real CIFAR-100.
# Each run writes log.jsonl, ckpt.pt and depth_eval.json (a table of accuracy by depth); this
# script appends "name wall_s" to $OUT/times.txt. Single-threaded (OMP_NUM_THREADS=1):
# on a shared, oversubscribed 2-core CPU that was 4x faster than the default two threads.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/crossroads}
DIM=${DIM:-64}; HEADS=${HEADS:-2}; STEPS=${STEPS:-200}; BATCH=${BATCH:-64}; VAL=${VAL:-2000}
DEPTHS=${DEPTHS:-3,6,12,24,48}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
COMMON=(--data cifar100 --data-dir "$DATA" --embed-dim "$DIM" --num-heads "$HEADS" --patch-size 4
        --batch-size "$BATCH" --max-steps "$STEPS" --val-subset "$VAL" --workers 0 --device cpu --seed 0)
mkdir -p "$OUT"

run() {  # run NAME ARGS...: one train.py call, skipped once its depth_eval.json exists
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  if [ -f "$OUT/$name/depth_eval.json" ]; then echo "skip $name (done)"; return; fi
  local t0=$(date +%s)
  python train.py "${COMMON[@]}" --out-dir "$OUT/$name" "$@" > "$OUT/$name.out" 2>&1
  echo "$name $(( $(date +%s) - t0 ))" | tee -a "$OUT/times.txt"
}

# 1. 12 block evaluations each: bViT 12 steps, ODE Euler 12, Heun 6, RK4 3, all over T = 12.
#    (Euler with h = 1 is bViT bit for bit, so bvit12 and euler12 must agree: a sanity check.)
run bvit12    --model bvit --depth 12 --eval-depths "$DEPTHS"
run euler12   --model odevit --solver euler --depth 12 --horizon 12 --eval-depths "$DEPTHS"
run heun6     --model odevit --solver heun  --depth 6  --horizon 12 --eval-depths 6
run rk4_3     --model odevit --solver rk4   --depth 3  --horizon 12 --eval-depths 3
# 2. Deep supervision: bViT 12 steps with 3 stages (read-outs after steps 4, 8, 12).
run bvit12_s3 --model bvit --depth 12 --stages 3 --eval-depths "$DEPTHS"
# 3. Beyond the horizon, the ODE view: the Euler model with h = 12/L (same T) instead of same h.
run euler12_refine --eval-only --resume "$OUT/euler12/ckpt.pt" --extend refine --eval-depths "$DEPTHS"

python - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
for name in sorted(os.listdir(out)):
    p = os.path.join(out, name, "depth_eval.json")
    if os.path.isfile(p):
        r = json.load(open(p))
        print(f"{name:16s}", "  ".join(f"L={x['depth']}:{x['val_acc1']:.2f}" for x in r["results"]))
PY
