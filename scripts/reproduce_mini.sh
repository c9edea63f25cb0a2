#!/usr/bin/env bash
# The CPU-scale CIFAR-100 study: every c100-mini-* arm (presets.py) for each seed, then
# runs/mini/summary.md and figures (scripts/summarize_mini.py). README "Results" shows the outcome.
#
#     bash scripts/reproduce_mini.sh                       # all arms, SEEDS="0 1", 2 runs at a time
#     SEEDS=0 ARMS="vit bvit" bash scripts/reproduce_mini.sh
#
# Resumable: a finished run (done.json) is skipped, an interrupted one continues from its last
# checkpoint (the presets save every 100 steps), so re-running the same command finishes the study.
# Arms run in order of priority: the arms of the first three claims (matched FLOPs, matched
# parameters, deep supervision) for every seed first, then the others. Each run is one process with
# one thread; JOBS of them run side by side (2 on a 2-core machine).
# Environment: OUT (runs/mini), SEEDS ("0 1"), ARMS (all), JOBS (2), DATA (dataset root: $RVITS_DATA,
# else ../shared/data), EXTRA (flags added to every run, e.g. "--max-steps 2" for a smoke test).
# Arm "vit+default" is c100-mini-vit with --init default (the init claim); any ARM+INIT works.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/mini}
SEEDS=${SEEDS:-"0 1"}
JOBS=${JOBS:-2}
DATA=${DATA:-${RVITS_DATA:-../shared/data}}
EXTRA=${EXTRA:-}
FIRST="vit bvit bvit-wide vit-narrow bvit-ds"
REST="odevit-euler odevit-heun odevit-rk4 revit-e1 revit-e4 srvit-r1 srvit-r2 vit+default"
ARMS=${ARMS:-"$FIRST $REST"}

run_one() {  # run_one ARM SEED: train (or continue) one run, then mark it done with its wall time
  local arm=$1 seed=$2 dir="$OUT/$1/seed$2" preset=${1%%+*} flags=()
  [ "$arm" != "$preset" ] && flags+=(--init "${arm#*+}")  # ARM+INIT: the preset with --init INIT
  [ -f "$dir/ckpt.pt" ] && flags+=(--resume "$dir/ckpt.pt")
  mkdir -p "$dir"
  local t0=$SECONDS
  # shellcheck disable=SC2086  # EXTRA is a list of flags
  OMP_NUM_THREADS=1 python train.py --preset "c100-mini-$preset" --seed "$seed" --data-dir "$DATA" \
    --device cpu --out-dir "$dir" "${flags[@]}" $EXTRA >> "$dir/train.log" 2>&1
  local rc=$?
  local wall=$(( SECONDS - t0 + $(python -c "import json,sys; print(json.load(open(sys.argv[1]))['wall_s'])" \
    "$dir/partial.json" 2>/dev/null || echo 0) ))
  if [ $rc -eq 0 ]; then
    echo "{\"wall_s\": $wall}" > "$dir/done.json"
    rm -f "$dir/partial.json"
    echo "done $arm seed $seed in $wall s"
  else
    echo "{\"wall_s\": $wall}" > "$dir/partial.json"  # time spent so far, added when it continues
    echo "FAILED $arm seed $seed (exit $rc): see $dir/train.log" >&2
  fi
}

queue=()
for group in first rest; do
  for seed in $SEEDS; do
    for arm in $ARMS; do
      case " $FIRST " in *" $arm "*) g=first ;; *) g=rest ;; esac
      [ "$g" = "$group" ] || continue
      [ -f "$OUT/$arm/seed$seed/done.json" ] && { echo "skip $arm seed $seed (done)"; continue; }
      queue+=("$arm $seed")
    done
  done
done
echo "${#queue[@]} run(s) to do, $JOBS at a time, in $OUT"
for job in "${queue[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  # shellcheck disable=SC2086
  run_one $job &
  sleep 1
done
wait
python scripts/summarize_mini.py "$OUT"
