#!/usr/bin/env bash
# Issue 80's study of the calibrated exit policy (lab/claims.py ANYTIME_SEEDS: fresh seeds 3, 4, 5): trains the arms
# the replication does not have (revit-e4 then its elastic stage revit-e4-elastic, and srvit-r2) into runs/anytime-policy
# as two lanes of one thread sharing one ordered list (lab/reproduce_mini.sh's .claim lets each run start once; an
# elastic run waits for its revit-e4), then runs lab/anytime_study.py (50 splits, --bench) on every finished
# checkpoint of the four arms (bvit and bvit-ds: the replication's, $REPL) that runs/anytime-study lacks. Resumable.
#
#     bash lab/anytime_policy.sh &  bash lab/anytime_policy.sh &     # two lanes
#     python lab/keep_results.py runs/anytime-study lab/results/anytime-policy
#     python lab/summarize_anytime_policy.py lab/results/anytime-policy --results lab/docs/results.md --figure docs/anytime_policy.png
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-runs/anytime-policy} DATA=${DATA:-${RVITS_DATA:-../shared/data}} JOBS=1
REPL=${REPL:-runs/replication} STUDY=${STUDY:-runs/anytime-study}
LIST="revit-e4:3 srvit-r2:3 revit-e4:4 srvit-r2:4 revit-e4:5 srvit-r2:5 revit-e4-elastic:3 revit-e4-elastic:4
revit-e4-elastic:5"
for pass in 1 2; do  # (the second pass: an elastic run whose revit-e4 the other lane was still training)
  for item in $LIST; do
    arm=${item%:*} seed=${item#*:}
    case $arm in *-elastic)  # its revit-e4 of the same seed, trained by either lane (at most 60 min)
      for _ in $(seq 180); do [ -f "$OUT/revit-e4/seed$seed/done.json" ] && break; sleep 20; done ;;
    esac
    SEEDS=$seed ARMS=$arm bash lab/reproduce_mini.sh | grep -v "^|"
  done
done
exec {lock}>> "$STUDY.lock" 2>/dev/null || { mkdir -p "$(dirname "$STUDY")"; exec {lock}>> "$STUDY.lock"; }
flock "$lock"  # one lane studies the checkpoints, the other waits and finds them done
for run in $REPL/bvit/seed{3,4,5} $REPL/bvit-ds/seed{3,4,5} $OUT/revit-e4-elastic/seed{3,4,5} $OUT/srvit-r2/seed{3,4,5}; do
  arm=$(basename "$(dirname "$run")") seed=${run##*/}
  if [ -f "$run/done.json" ] && [ -f "$run/ckpt.pt" ] && [ ! -f "$STUDY/$arm/$seed/anytime_study.json" ]; then
    OMP_NUM_THREADS=1 python lab/anytime_study.py "$run" --out-dir "$STUDY" --bench --data-dir "$DATA" --device cpu \
      || echo "anytime_study.py FAILED on $run" >&2
  fi
done
