#!/usr/bin/env bash
# The CPU-scale CIFAR-100 study: every c100-mini-* arm (presets.py) for each seed, then
# runs/mini/summary.md and figures (lab/summarize_mini.py). lab/docs/results.md shows the outcome.
#
#     bash lab/reproduce_mini.sh                       # all arms, SEEDS="0 1", 2 runs at a time
#     SEEDS=0 ARMS="vit bvit" bash lab/reproduce_mini.sh
#
# Resumable: a finished run (done.json) is skipped, an interrupted one continues from its last
# checkpoint (the presets save every 100 steps), so re-running the same command finishes the study.
# Arms run in order of priority: the arms of the first three claims (matched FLOPs, matched
# parameters, deep supervision) for every seed first, then the others. Each run is one process with
# one thread; JOBS of them run side by side (2 on a 2-core machine).
# Environment: OUT (runs/mini), SEEDS ("0 1"), ARMS (all 15), JOBS (2), DATA (the folder holding
# cifar-100-python/: $RVITS_DATA, else ../shared/data), EXTRA (flags added to every run; a smoke test
# such as EXTRA="--max-steps 2" belongs in another OUT: summary.md marks shortened runs).
# Arms: the 12 study presets c100-mini-* and the structured-init claims' 3 (c100-mini-init-*: patch 4,
# the PyTorch base init, 2 epochs; ARMS=init runs only them); any ARM+INIT works (vit+default: c100-mini-vit
# with --init default, the earlier init control). UNTESTED below: issue 64's 6 arms (ARMS=untested). MOE below: the 8 comparison presets (Table 3's 7
# baselines at U = 1 as the reViT paper's appendix B adapts them, and layer-wise LoRA) and a distilled
# arm. All arms x 2 seeds: about 30 runs of 20-30 minutes each side by side (11-16 minutes alone),
# i.e. 6-7 hours on 2 cores. Exit status: 0 if every run
# finished, 1 if one failed (its train.log says why; re-running continues it), 2 for bad input.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-}  # default below: runs/mini, or runs/mini-loopvae for ARMS=loopvae
SEEDS=${SEEDS:-"0 1"}
JOBS=${JOBS:-2}
DATA=${DATA:-${RVITS_DATA:-../shared/data}}
EXTRA=${EXTRA:-}
# done.json records where a run ran: the commit (+changes when the tree differs), its date (UTC) and the CPU model,
# as lab/gpu_study.py stamps its results (lab/provenance.py)
where() { python -c "import sys; sys.path.insert(0, 'lab'); import provenance; print(provenance.$1())" | tr -d '"\\'; }
CPU=$(where cpu_model)  # (the commit is read when each run starts: the tree may change during a study)
FIRST="vit bvit bvit-wide vit-narrow bvit-ds"
# The structured-init claims (issue 50): PyTorch's default init, mimetic and structured on it, 8 x 8 patches.
INIT="init-pytorch init-mimetic init-structured"
REST="odevit-euler odevit-heun odevit-rk4 revit-e1 revit-e4 srvit-r1 srvit-r2 $INIT"
# reViT's comparisons, run on request: ARMS="$MOE". revit-e4+feature distils the vit arm of the
# same seed (+feature-only: from its features alone, --task-weight 0, the paper's DINOv2 regime,
# A.3); a distilled arm runs after the arms it does not need, and its teacher must be done or in ARMS.
MOE="revit-lory revit-smear revit-deepseek revit-qwen3 revit-moeut revit-remoe revit-softmoe revit-lora revit-e4+feature"
# reViT's elastic depth, the paper's second stage (A.2-A.3): revit-eN continued with depth dropout 0.3, and
# its control continued at fixed depth (presets.elastic_arms); each starts from revit-eN of the same seed.
ELASTIC="revit-e4-elastic revit-e4-cont revit-e1-elastic revit-e1-cont"
# The papers' claims never tested before (issue 64; lab/claims.py): Training Crossroads' black-box field beside
# odevit-euler, the solver arms at NFE 4 beside those at NFE 8, bViT's width trend at D=48 beside vit / bvit at D=96.
# ARMS=untested runs them with the arms they are compared with (a finished run is skipped); 3 seeds: SEEDS="0 1 2".
UNTESTED="odevit-blackbox odevit-euler-nfe4 odevit-heun-nfe4 odevit-rk4-nfe4 vit-d48 bvit-d48"
# The reViT paper's Fig. 2 (sec. 4.4, A.2-A.3; presets.fig2_arms): two students of the vit arm of the same seed
# (its final features alone), the depth-only gate and the feature-only gate (smear), at L = 6, then the same
# elastic-depth stage for both. ARMS=fig2 runs vit (skipped when done) and these four; the probes at each depth
# afterwards: python lab/summarize_fig2.py OUT (lab/README.md).
FIG2="revit-e4-fig2 revit-smear-fig2 revit-e4-fig2-elastic revit-smear-fig2-elastic"
# The search for a supervised recipe on which reViT E=4's experts engage (presets.SEARCH; ARMS=search): each candidate
# changes one thing of revit-e4, at most ~60 min; summarize_mini.py's comparison table shows its eq. 6 / eq. 9 terms.
SEARCH="revit-search-e2 revit-search-long revit-search-wide revit-search-p4 revit-search-router"
# LoopVAE's study (docs/models.md): ARMS=loopvae runs its arms into runs/mini-loopvae and summarizes
# them with lab/summarize_loopvae.py (PSNR/SSIM, loop interventions, cost ledger): the four CNN arms,
# Stage 2 of the global arm of each seed (loopvae-gan, after it), then the Transformer-core arms of
# Table 2 (loopvae-vit-*, ~1.5x a CNN arm's time).
LOOPVAE="loopvae-global loopvae-scale loopvae-none loopvae-unlooped loopvae-gan loopvae-vit-global loopvae-vit-none"
ARMS=${ARMS:-"$FIRST $REST"}
if [ "$ARMS" = loopvae ]; then ARMS=$LOOPVAE; OUT=${OUT:-runs/mini-loopvae}; fi
if [ "$ARMS" = init ]; then ARMS=$INIT; fi
if [ "$ARMS" = untested ]; then ARMS="vit bvit odevit-euler odevit-heun odevit-rk4 $UNTESTED"; fi
if [ "$ARMS" = fig2 ]; then ARMS="vit $FIG2"; fi
if [ "$ARMS" = search ]; then ARMS=$SEARCH; fi
OUT=${OUT:-runs/mini}
needs() {  # the arm that ARM starts from (its teacher or its Stage-1 run), same seed; nothing if none
  case "$1" in *+feature|*+feature-only|*+logits|*-fig2) echo vit ;; loopvae-gan) echo loopvae-global ;;
    *-fig2-elastic) echo "${1%-elastic}" ;;
    revit-e*-elastic|revit-e*-cont) echo "${1%-*}" ;; esac
}

for arm in $ARMS; do  # every arm must name a preset (and, after a +, an --init choice)
  case " $FIRST $REST $MOE $ELASTIC $FIG2 $SEARCH $UNTESTED $LOOPVAE " in *" ${arm%%+*} "*) ;; *) echo "reproduce_mini.sh: error: ARMS: unknown arm '$arm'; allowed: $FIRST $REST $MOE $ELASTIC $FIG2 $SEARCH $UNTESTED $LOOPVAE, loopvae, init, fig2, untested, search (or ARM+default|mimetic|structured|feature|feature-only|logits)" >&2; exit 2 ;; esac
  case "$arm" in *+*) case "${arm#*+}" in default|mimetic|structured|feature|feature-only|logits) ;; *) echo "reproduce_mini.sh: error: ARMS: '$arm': the part after + must be an --init (default, mimetic, structured) or a --distill (feature, feature-only, logits)" >&2; exit 2 ;; esac ;; esac
done
for arm in $ARMS; do  # the arm a run starts from: finished, or trained in this call
  src=$(needs "$arm")
  [ -n "$src" ] || continue
  for seed in $SEEDS; do
    if [ ! -f "$OUT/$src/seed$seed/done.json" ] && [[ " $ARMS " != *" $src "* ]]; then
      echo "reproduce_mini.sh: error: ARMS: '$arm' seed $seed starts from the $src arm of seed $seed, which has not finished in $OUT; add $src to ARMS" >&2
      exit 2
    fi
  done
done
if [ ! -f "$DATA/cifar-100-python/train" ]; then
  echo "reproduce_mini.sh: error: no CIFAR-100 in DATA=$DATA (expected $DATA/cifar-100-python/train); set DATA=/path/to/data" >&2
  exit 2
fi

# busy DIR: whether a training process of another call holds DIR's lock (training/checkpoints.py lock_out_dir: a
# POSIX record lock, tested here without taking it)
busy() { [ -f "$1/.lock" ] && ! python -c "import os, sys; os.lockf(os.open(sys.argv[1], os.O_RDONLY), os.F_TEST, 0)" \
  "$1/.lock" 2>/dev/null; }
# claimed DIR: whether another call's run_one holds DIR/.claim (below; taken for an instant to test it, which a
# run_one waiting up to 2 s for it outlasts)
claimed() { [ -f "$1/.claim" ] && command -v flock > /dev/null && ! flock -n "$1/.claim" true; }

run_one() {  # run_one ARM SEED: train (or continue) one run, then mark it done with its wall time
  local arm=$1 seed=$2 dir="$OUT/$1/seed$2" preset=${1%%+*} flags=()
  # two calls on one OUT (a lane started beside a running call): what the other finished or runs is left to it
  [ -f "$dir/done.json" ] && { echo "skip $arm seed $seed (finished by another call)"; return 0; }
  busy "$dir" && { echo "skip $arm seed $seed (another call is running it: $dir)"; return 0; }
  local src
  src=$(needs "$arm")
  if [ -n "$src" ] && [ ! -f "$OUT/$src/seed$2/done.json" ]; then  # it failed in this call
    echo "FAILED $arm seed $2: it starts from the $src arm of seed $2, which has not finished ($OUT/$src/seed$2); run it first" >&2
    return 1
  fi
  # two calls reaching one run at the same moment (before either train.py holds .lock): the first to take $dir/.claim
  # (flock(1), released when its holder exits, however it ends) runs it; the other leaves the folder as it is
  local claim=""
  if command -v flock > /dev/null; then
    mkdir -p "$dir"
    exec {claim}>> "$dir/.claim"
    flock -w 2 "$claim" || { exec {claim}>&-; echo "skip $arm seed $seed (another call is running it: $dir)"; return 0; }
    [ -f "$dir/done.json" ] && { exec {claim}>&-; echo "skip $arm seed $seed (finished by another call)"; return 0; }
  fi
  case "$arm" in *-fig2|*-fig2-elastic) flags+=(--teacher "$OUT/vit/seed$2/ckpt.pt") ;; esac  # (the objective: the preset's)
  if [ "$src" = vit ] && [[ "$arm" == *+* ]]; then  # ARM+feature|feature-only|logits: distilled from the vit arm of the same seed
    local kind=${arm#*+}
    flags+=(--teacher "$OUT/vit/seed$2/ckpt.pt" --distill "${kind%-only}")
    if [ "$kind" = feature-only ]; then flags+=(--task-weight 0); fi
  elif [ "$src" = vit ]; then  # a Fig. 2 student: its teacher above
    :
  elif [ "$src" = loopvae-global ]; then  # Stage 2 of the global arm's Stage-1 run of the same seed
    flags+=(--stage2 "$OUT/loopvae-global/seed$2")
  elif [ -n "$src" ]; then  # revit-eN-elastic / -cont: the continuation of revit-eN's run of the same seed
    flags+=(--finetune "$OUT/$src/seed$2")
  elif [ "$arm" != "$preset" ]; then  # ARM+INIT: the preset with --init INIT
    flags+=(--init "${arm#*+}")
  fi
  [ -f "$dir/ckpt.pt" ] && flags+=(--resume "$dir/ckpt.pt")
  local commit date
  commit=$(where commit)
  date=$(where commit_date)
  mkdir -p "$dir"
  # wall time: what earlier calls spent (partial.json), plus, when a call was killed with its run (a
  # session's end: running.json left behind), its time up to the run's last line in train.log
  local prior
  prior=$(python -c "import json, os, sys; d = sys.argv[1]; j = lambda f: json.load(open(os.path.join(d, f)))
p = j('partial.json')['wall_s'] if os.path.isfile(os.path.join(d, 'partial.json')) else 0
if os.path.isfile(os.path.join(d, 'running.json')):
    r = j('running.json'); p = r['prior'] + max(0, int(os.path.getmtime(os.path.join(d, 'train.log'))) - r['started'])
print(p)" "$dir" 2>/dev/null || echo 0)
  echo "{\"started\": $(date +%s), \"prior\": $prior}" > "$dir/running.json"
  local t0=$SECONDS
  # shellcheck disable=SC2086  # EXTRA is a list of flags
  local script=train.py  # (LoopVAE, a tokenizer, trains through its own entry point)
  case "$arm" in loopvae-*) script=train_loopvae.py ;; esac
  OMP_NUM_THREADS=1 python "$script" --preset "c100-mini-$preset" --seed "$seed" --data-dir "$DATA" \
    --device cpu --out-dir "$dir" "${flags[@]}" $EXTRA >> "$dir/train.log" 2>&1
  local rc=$?
  local wall=$(( SECONDS - t0 + prior ))
  rm -f "$dir/running.json"
  if [ $rc -eq 0 ]; then
    echo "{\"wall_s\": $wall, \"extra\": \"$EXTRA\", \"commit\": \"$commit\", \"commit_date\": \"$date\", \"cpu\": \"$CPU\"}" > "$dir/done.json"
    rm -f "$dir/partial.json"
    local top1 left  # the last epoch's top-1 (a classifier) or PSNR (LoopVAE)
    top1=$(python -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if '\"epoch\"' in l][-1]; print(f\"top-1 {r['val_acc1']:.2f} %\" if 'val_acc1' in r else f\"PSNR {r['val_psnr']:.2f} dB\")" \
      "$dir/log.jsonl" 2>/dev/null || echo "?")
    left=$(for j in "${queue[@]}"; do set -- $j; [ -f "$OUT/$1/seed$2/done.json" ] || echo x; done | wc -l)
    echo "done $arm seed $seed: $top1, $((wall / 60)) min; $left run(s) left"
  else
    echo "{\"wall_s\": $wall}" > "$dir/partial.json"  # time spent so far, added when it continues
    echo "FAILED $arm seed $seed (exit $rc): $(tail -n 1 "$dir/train.log")" >&2
  fi
  [ -n "$claim" ] && exec {claim}>&-  # the claim ends once done.json or partial.json is written
  [ $rc -eq 0 ]
}

queue=()
for group in first rest dependent last; do  # last: LoopVAE's Transformer-core arms, the longest
  for seed in $SEEDS; do
    for arm in $ARMS; do
      case " $FIRST " in *" $arm "*) g=first ;; *) g=rest ;; esac
      [ -n "$(needs "$arm")" ] && g=dependent
      case "$arm" in loopvae-vit-*) g=last ;; esac
      [ "$g" = "$group" ] || continue
      [ -f "$OUT/$arm/seed$seed/done.json" ] && { echo "skip $arm seed $seed (done)"; continue; }
      queue+=("$arm $seed")
    done
  done
done
echo "${#queue[@]} run(s) to do, $JOBS at a time, in $OUT"
todo=("${queue[@]}")  # started in order, each as soon as a lane is free and the run it starts from has finished:
while [ ${#todo[@]} -gt 0 ]; do  # a later seed's runs fill a lane while an earlier chain waits for its stage
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  next=-1
  for i in "${!todo[@]}"; do
    # shellcheck disable=SC2086
    set -- ${todo[$i]}
    src=$(needs "$1")
    if [ -z "$src" ] || [ -f "$OUT/$src/seed$2/done.json" ]; then next=$i; break; fi
  done
  if [ "$next" -lt 0 ]; then
    if [ "$(jobs -rp | wc -l)" -gt 0 ]; then wait -n; continue; fi
    for job in "${todo[@]}"; do run_one $job; done  # nothing runs: what they start from failed (each says so)
    break
  fi
  # shellcheck disable=SC2086
  run_one ${todo[$next]} &
  unset 'todo[next]'
  todo=("${todo[@]}")
  sleep 1
done
wait
failed=0  # a run failed if it left no done.json (a quick failure's exit status may be reaped unseen)
for job in "${queue[@]}"; do
  # shellcheck disable=SC2086
  set -- $job
  [ -f "$OUT/$1/seed$2/done.json" ] || busy "$OUT/$1/seed$2" || claimed "$OUT/$1/seed$2" || failed=1  # (another call's run is not a failure)
done
if compgen -G "$OUT/*/seed*/done.json" > /dev/null; then
  case " $ARMS " in
    *" loopvae-"*) python lab/summarize_loopvae.py "$OUT" || failed=1 ;;
    *) python lab/summarize_mini.py "$OUT" || failed=1 ;;
  esac
fi
exit $failed
