#!/usr/bin/env bash
# Issue 77's replication (lab/claims.py REPLICATION): the four claims' arms on fresh seeds 3, 4, 5, in the order that
# completes whole claims first (per seed: matched FLOPs, deep supervision, the width trend; then matched parameters),
# as two lanes of one thread that share one ordered list (lab/reproduce_mini.sh's .claim lets each run start once),
# then analyze.py's cka.json / steps.json for the bViT arms (the width trend's signature). Resumable: run it again.
#
#     bash lab/replication.sh &  bash lab/replication.sh &     # two lanes
#     python lab/keep_results.py runs/replication lab/results/replication   # keep what finished
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-runs/replication} DATA=${DATA:-${RVITS_DATA:-../shared/data}} JOBS=1
LIST="vit:3 bvit:3 bvit-ds:3 vit-d48:3 bvit-d48:3 vit:4 bvit:4 bvit-ds:4 vit-d48:4 bvit-d48:4 vit:5 bvit:5 bvit-ds:5
vit-d48:5 bvit-d48:5 vit-narrow:3 bvit-wide:3 vit-narrow:4 bvit-wide:4 vit-narrow:5 bvit-wide:5"
for item in $LIST; do
  arm=${item%:*} seed=${item#*:}
  SEEDS=$seed ARMS=$arm bash lab/reproduce_mini.sh
  dir=$OUT/$arm/seed$seed
  case $arm in bvit|bvit-d48)
    if [ -f "$dir/done.json" ] && [ ! -f "$dir/cka.json" ] && [ -f "$dir/ckpt.pt" ]; then
      OMP_NUM_THREADS=1 python lab/analyze.py --resume "$dir/ckpt.pt" --out-dir "$dir" --data-dir "$DATA" \
        >> "$dir/analyze.log" 2>&1 || echo "analyze.py FAILED on $dir (its analyze.log says why)" >&2
    fi ;;
  esac
done
