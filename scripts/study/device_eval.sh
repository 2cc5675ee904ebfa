#!/usr/bin/env bash
# Evaluate full attention + a list of the study's checkpoints on one H200 (device `run`), K `golinear run`
# processes at once, resumable across calls (issue #13). Runs from the repository root; the same command serves
# every call: while the machine lacks the backbone (GGUF parts) it only stashes what was carried and exits 0.
# Work units are (model, suite) pairs, taken from one list by whichever worker is free (a `mkdir` lock per unit),
# so a slow checkpoint does not hold up the others; every unit writes into one store on the machine (the cell
# claims of bench/store.py keep two processes off one cell). The store is seeded from leaderboards/store, so a
# finished cell is never redone; at BUDGET the workers' runs are stopped and the unfinished cells stay for the
# next call (their scored requests in partial/, returned and carried back, so a killed HellaSwag resumes).
# Carried: .whl and .device/whl-eval (first call), .gguf/<part> (one a call), .device/eval-data/<part>
# (scripts/study/prepare_eval.sh), optionally a checkpoint folder CKPT outside the tree and .device/eval-partial.
# Env: NAMES (checkpoint names under CKPT, or model specs such as mechanism=none,window=120,sinks=8; `full` is
#   always added), SUITES (default "cr lambada"), K (workers, default 8), BUDGET (s from the start, default 540),
#   SPLIT (workers per unit, default 1: a model's suite with many tasks, e.g. ruler, spread over SPLIT workers),
#   PLAN (instead of NAMES/SUITES/SPLIT: groups "SUITES[TASKS][/SPLIT]: NAMES" separated by ';', each its own
#   names x suites, optionally only some tasks (golinear run --tasks), e.g. "ruler/3: full gdn-w1016-s8-sc;
#   ruler[MQ,MV,VT]/2: gdn-w1016-s8-sc,window=508,retain=508; cr lambada: gla kgla": one call fills its workers
#   from all; `full` only where a group names it),
#   CKPT (carried folders of checkpoints outside the tree, space-separated, each searched in turn, so calls can
#   carry them apart; a name in none is looked up in the tracked checkpoints/smollm2-135m, then in the machine's
#   stash), BATCH (cr/lambada, 64), BATCH_MMLU (4), BATCH_LONG (32),
#   LONG_ARGS (sniah/ruler: "--context-length 4096 --num-samples 500"), MPS (1: the workers through one CUDA MPS
#   server, scripts/gpu/mps.sh, so that their small generation kernels overlap instead of taking turns), PARTIAL (the
#   carried request caches, default .device/eval-partial), PART_BYTES, PARTS_MAX (below), EXTRA_ARGS (every run; a CPU dry run:
#   "--limit 2"), DRY=1 (CPU: no set-up, DEVICE=cpu, DATA from the data folder), GGUF_SHA, GOLINEAR_GIT_COMMIT.
# Out ($OUT): cells.tgz (the cells this store has and leaderboards/store lacks), partial.tgz.part-?? (request caches
#   of unfinished cells, split into <= 15 MiB parts; cat them), logs.tgz (one log per worker; units-<start>.log: one line per unit and call, with its time; gpu.log).
# Merge here: bash scripts/study/merge_eval.sh <files_at>.
#
# K and batch sizes. A 135M model leaves an H200 idle: lm-eval's per-request Python work and the tokenizer
# bound one process, not the GPU, so throughput comes from processes, not from batch size. K=8 (the training
# call ran 8 processes on this GPU; 16 host cores leave one for each worker's tokenizer). CR/LAMBADA prompts are
# short (< ~300 tokens): batch 64 keeps each forward well-filled at ~2 GB of logits a process (--batch-size auto
# would probe alone, each of K processes believing the whole GPU is its own, and OOM later). 5-shot MMLU holds
# batch x ~1,061 tokens x 49,152 fp32 logits: batch 32 took ~80 GB (docs/gpu.md), so 4 (~10 GB) lets 8 share.
# ESTIMATE (not measured with this script): the committed full-set cells (leaderboards/store, wall_time_s, taken
# beside ~6 other evaluation processes and training) add up to 697 s for full attention and 912 s for the
# default recipe over CR + LAMBADA, i.e. ~700-900 process-seconds per model under similar sharing. With K=8 for
# ~480 s of evaluation in a 540-s budget (set-up, imports and model loads take the rest), one call should finish
# ~4-6 models' CR + LAMBADA (31 models: ~6-8 calls); MMLU took 310-360 s per model. units-*.log give real figures.
set -u
T0=$(date +%s); ROOT=$PWD
BUDGET=${BUDGET:-540}; K=${K:-8}; SUITES=${SUITES:-cr lambada}; CKPT=${CKPT:-checkpoints/smollm2-135m}
WORK=${EVAL_WORK:-/tmp/study-eval}; STORE=$WORK/store; STASH_CK=$WORK/ckpt; OUT=${OUT:-$WORK/out}
PARTIAL=${PARTIAL:-.device/eval-partial}
LOCKS=$WORK/lock-$T0  # one lock folder a call: a warm machine's next call retries unfinished units
mkdir -p $LOCKS $WORK/logs $STORE/cells $STORE/partial $STASH_CK $OUT
# checkpoints: carried ones are stashed (also by a stash call), so a warm machine keeps them for the next call.
# A name may carry cache options after its folder (gdn-w248-s8-sc,window=124,retain=124: models.spec.CACHE_KEYS).
PLAN=${PLAN:-"$SUITES/${SPLIT:-1}: full ${NAMES:-}"}  # one group unless PLAN gives several (full named there)
group_part() {  # group_part GROUP suites|tasks|split|names (tasks: - for all)
  local g=${1%%:*} t=-; [[ $g =~ \[([^]]*)\] ]] && t=${BASH_REMATCH[1]}; g=${g/\[*\]/}
  case $2 in suites) echo ${g%%/*};; tasks) echo $t;; split) [[ $g == */* ]] && echo ${g##*/} || echo 1;;
    names) echo ${1#*:};; esac; }
resolve_specs() {  # resolve_specs NAME... -> SPECS
  SPECS=(); local name base opts src d
  for name in "$@"; do
    base=${name%%,*}; opts=${name:${#base}}
    [[ "$base" == *=* ]] && { SPECS+=($name); continue; }  # a model spec such as mechanism=none,window=120
    src=""; for d in $CKPT checkpoints/smollm2-135m; do [ -z "$src" ] && [ -f "$d/$base/config.json" ] && src=$d/$base; done  # (a sparse checkout leaves empty folders)
    if [ -n "$src" ]; then rm -rf $STASH_CK/$base; cp -r "$src" $STASH_CK/; SPECS+=($STASH_CK/$base$opts)  # carried
    elif [ -d "$STASH_CK/$base" ]; then SPECS+=($STASH_CK/$base$opts)  # carried by an earlier call
    elif [ "$name" = full ]; then SPECS+=($name)
    else echo "no checkpoint $base in $CKPT, checkpoints/smollm2-135m or $STASH_CK: skipped"; fi
  done
}
if [ -n "${DRY:-}" ]; then
  DEVICE=${DEVICE:-cpu}; DATA=${DATA:-$(cd $ROOT/.. && pwd)/shared/data}; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
  PY=${PY:-python3}
else
  DEVICE=${DEVICE:-cuda}; DATA=${DATA:-/tmp/golinear-data}; PY=python3
  mkdir -p $DATA; for d in .device/eval-data/*/; do [ -d "$d" ] && cp -rn "$d". $DATA/; done
  source scripts/gpu/device_setup.sh > $WORK/logs/setup.log 2>&1 || { tail -20 $WORK/logs/setup.log; exit 3; }
  tail -2 $WORK/logs/setup.log
  if [ ! -f /tmp/golinear-cache/.fp ]; then
    IFS=';' read -ra GROUPS_ <<< "$PLAN"; for g in "${GROUPS_[@]}"; do resolve_specs $(group_part "$g" names) > /dev/null; done
    echo "stash call: checkpoints $(ls $STASH_CK | tr '\n' ' '); GGUF parts $(ls /tmp/golinear-stash | tr '\n' ' '); data: $(ls $DATA | tr '\n' ' ')"; exit 0
  fi
fi
export GOLINEAR_GIT_COMMIT=${GOLINEAR_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
# the store: committed cells (finished: skipped), carried request caches, then what earlier calls left here
[ -d leaderboards/store/cells ] && cp -rn leaderboards/store/cells/. $STORE/cells/
[ -d $PARTIAL/partial ] && cp -rn $PARTIAL/partial/. $STORE/partial/
(cd leaderboards/store 2>/dev/null && find cells -name '*.json' | sort) > $WORK/seed.txt
suite_args() { case $1 in sniah|ruler) echo ${LONG_ARGS:---context-length 4096 --num-samples 500};; esac; }
suite_batch() { case $1 in mmlu) echo ${BATCH_MMLU:-4};; sniah|ruler) echo ${BATCH_LONG:-32};; *) echo ${BATCH:-64};; esac; }
# per group, suite-major (list the longest suite first); units with every cell in the store: left out
: > $WORK/units.txt; : > $WORK/all-units.txt
IFS=';' read -ra GROUPS_ <<< "$PLAN"
for g in "${GROUPS_[@]}"; do
  resolve_specs $(group_part "$g" names); split=$(group_part "$g" split); tasks=$(group_part "$g" tasks)
  for s in $(group_part "$g" suites); do
    for spec in "${SPECS[@]}"; do printf '%s\t%s\t%s\n' "$spec" "$s" "$tasks"; done | tee -a $WORK/all-units.txt \
      | $PY scripts/study/pending_units.py -- --store $STORE --data-dir $DATA $(suite_args $s) ${EXTRA_ARGS:-} \
      | awk -v n=$split '{print $0 "\t" n}' >> $WORK/units.txt
  done
done
# a group's SPLIT=n lists each of its units n times: n workers then share one model's tasks (each claims a
# different cell, bench/runner.py); copy-major: every unit's first copy is taken before any second one
for i in $(seq 1 $(cut -f4 $WORK/units.txt | sort -n | tail -1)); do awk -F'\t' -v i=$i -v OFS='\t' '$4 >= i {print $1, $2, $3, i}' \
  $WORK/units.txt; done > $WORK/units.tmp && mv $WORK/units.tmp $WORK/units.txt
NU=$(wc -l < $WORK/units.txt)
echo "t=$(( $(date +%s) - T0 ))s $NU of $(wc -l < $WORK/all-units.txt) units (model x suite) pending, $K workers, budget ${BUDGET}s"
[ $NU -lt $K ] && echo "only $NU units for $K workers: the rest stay idle (a suite's tasks run one after another in a unit; spread them with /N, e.g. PLAN=\"sniah/3: ...\")"
worker() {  # worker W: take each free unit in turn until the list or the budget runs out
  local w=$1 spec s tasks lock left bs args t rc n0
  while IFS=$'\t' read -r spec s tasks copy; do
    lock=$LOCKS/$(printf '%s %s %s %s' "$spec" "$s" "$tasks" "$copy" | md5sum | cut -c1-16)
    mkdir $lock 2>/dev/null || continue
    left=$(( BUDGET - ($(date +%s) - T0) )); [ $left -lt 30 ] && break
    bs=$(suite_batch $s); args=$(suite_args $s); [ "$tasks" != - ] && args="$args --tasks $tasks"
    t=$(date +%s); echo "== t=$(( t - T0 ))s $spec $s $tasks (${left}s left)" >> $WORK/logs/w$w.log; n0=$(wc -l < $WORK/logs/w$w.log)
    timeout -k 10 $left $PY -m bench.cli run --models "$spec" --suites $s --store $STORE --device $DEVICE \
      --batch-size $bs --data-dir $DATA $args ${EXTRA_ARGS:-} < /dev/null >> $WORK/logs/w$w.log 2>&1; rc=$?
    echo "w$w $(basename $spec) $s$([ "$tasks" != - ] && echo "[$tasks]") rc=$rc $(( $(date +%s) - t ))s t=$(( $(date +%s) - T0 ))s $(tail -n +$((n0 + 1)) $WORK/logs/w$w.log | grep -o '[0-9]* evaluated' | tail -1)" \
      | tee -a $WORK/logs/units-$T0.log
  done < $WORK/units.txt
}
source scripts/gpu/mps.sh; [ "${MPS:-0}" = 1 ] && [ -z "${DRY:-}" ] && mps_start
for w in $(seq 1 $K); do worker $w & sleep ${STAGGER_S:-2}; done  # staggered: model loads do not collide
while [ -n "$(jobs -r)" ] && [ $(( $(date +%s) - T0 )) -lt $(( BUDGET + 15 )) ]; do
  sleep 5; [ -z "${DRY:-}" ] && [ $(( ($(date +%s) - T0) % 60 )) -lt 5 ] && echo "t=$(( $(date +%s) - T0 ))s gpu $(nvidia-smi \
    --query-gpu=utilization.gpu,memory.used --format=csv,noheader | tr -d ' ') cells $(find $STORE/cells -name '*.json' | wc -l)" \
    | tee -a $WORK/logs/gpu.log
done
wait; mps_stop
# what comes back: the new cells (not in leaderboards/store), the unfinished cells' request caches, the logs
(cd $STORE && find cells -name '*.json' | sort) > $WORK/now.txt
comm -13 $WORK/seed.txt $WORK/now.txt > $WORK/new.txt
tar czf $OUT/cells.tgz -C $STORE -T $WORK/new.txt
# the request caches in <= 15 MiB parts (a returned file's limit is 16 MiB; an MMLU cache alone passed 15 MB, session
# 23), at most PARTS_MAX of them (what comes back is 64 MiB a call, the cells and logs beside them)
mkdir -p $STORE/partial; tar czf $WORK/partial.tgz -C $STORE partial
PART_BYTES=${PART_BYTES:-15728640}; PARTS_MAX=${PARTS_MAX:-4}
if [ $(stat -c %s $WORK/partial.tgz) -le $(( PART_BYTES * PARTS_MAX )) ]; then
  split -b $PART_BYTES $WORK/partial.tgz $OUT/partial.tgz.part-
else echo "partial.tgz over $PARTS_MAX parts of $PART_BYTES bytes ($(stat -c %s $WORK/partial.tgz) bytes): not returned"; fi
tar czf $OUT/logs.tgz -C $WORK/logs .
echo "$(wc -l < $WORK/new.txt) new cells returned; units finished in this call: $(grep -c 'rc=0' $WORK/logs/units-$T0.log 2>/dev/null) of $(wc -l < $WORK/units.txt)"
ls -l $OUT; echo "total $(( $(date +%s) - T0 )) s"
