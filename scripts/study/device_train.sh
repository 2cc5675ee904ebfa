#!/usr/bin/env bash
# Train a set of the study's checkpoints concurrently on one H200 (device `run`), resumable across calls.
# Runs from the repository root. The code comes from a `git archive` snapshot in $SRC (default .device/src), so
# edits in the working tree never reach a run. Carried: .whl (FLA + gguf wheels), the GGUF (stashed or
# .gguf/<part>), .device/train/books-smollm2-10m.npz (`golinear train --prepare-only`), optionally
# .device/triton-cache.tgz and .device/resume*/<name>/ (an earlier call's unfinished run folder, state.pt included;
# any call may bring some, e.g. a stash call: they wait in /tmp/ck for the call that trains).
# Env: NAMES (space-separated recipe names from scripts/study/recipes.txt), MPS (1: through a CUDA MPS server, ~1.5x faster), BUDGET (s from the start for every
# run, default 540; keep it ~40 s under the call's limit), STOP_S (default 25: the runs get a TERM this long before BUDGET
# and stop after their step in flight, state saved; models/train.py catch_sigterm), GGUF_SHA, EXTRA_ARGS (appended to every `golinear train`; a CPU dry run: "--seq-len 64 --steps 20"). BRING (run folders to return, default NAMES; whole folders up to ROOM_MIB, default 58, finished first). Out: $OUT/ck.tgz.part-?? (cat them; state.pt only
# where a run is unfinished), logs.tgz, triton-cache.tgz (if < 12 MB).
set -u
T0=$(date +%s); ROOT=$PWD; SRC=${SRC:-.device/src}; BUDGET=${BUDGET:-540}; NAMES=${NAMES:-}; BRING=${BRING:-}
cd $SRC || exit 2
[ "$SRC" = . ] || { ln -sfn $ROOT/.whl .whl; ln -sfn $ROOT/.gguf .gguf; }; mkdir -p .device
[ "$SRC" = . ] || for d in $ROOT/.device/{train,whl-eval,triton-cache.tgz} $ROOT/.device/resume*; do [ -e $d ] && ln -sfn $d .device/; done
source scripts/gpu/device_setup.sh || exit $?
[ -e .device/train ] || ln -sfn $STASH/train .device/train  # stashed by an earlier call
# carried run folders wait in $DEV/ck (/tmp/ck: the runs' own folders), so a stash call can bring them ahead of training
mkdir -p $DEV/ck $DEV/logs
finished() { grep -qs '"finished": true' $DEV/ck/$1/train_config.json; }  # a run folder at its last step
for d in .device/resume*/*/; do  # .device/resume, .device/resume-<any>: folders of run folders, carried whole
  [ -d "$d" ] || continue; n=$(basename $d)
  [ -d $DEV/ck/$n ] && echo "$n: already on the machine, the carried copy ignored" || { cp -r $d $DEV/ck/ && echo "resumable: $n"; }; done
[ -n "$NAMES$BRING" ] || { echo "nothing to train (NAMES empty): stashed only"; exit 0; }  # BRING alone: return run folders
echo "setup done after $(( $(date +%s) - T0 )) s"
source scripts/gpu/mps.sh; [ "${MPS:-0}" = 1 ] && mps_start  # kernels of the runs overlap (scripts/gpu/mps.sh)
PIDS=()
for name in $NAMES; do
  args=$(awk -v n=$name '$1 == n {$1=""; print}' scripts/study/recipes.txt)
  [ -z "$args" ] && { echo "unknown recipe $name"; continue; }
  # a finished run relaunched would load, re-evaluate and rewrite its record: a warm call's NAMES may keep it
  finished $name && { echo "$name: finished on the machine, not relaunched"; continue; }
  left=$(( BUDGET - ($(date +%s) - T0) ))
  python3 -m bench.cli train --base smollm2-135m --tokens .device/train/books-smollm2-10m.npz --out $DEV/ck/$name \
    --save-every 100 --note "study run (scripts/study/recipes.txt), H200, $(echo $NAMES | wc -w) runs sharing the GPU" \
    $args ${EXTRA_ARGS:-} > $DEV/logs/$name.log 2>&1 &
  PIDS+=($!); echo "t=$(( $(date +%s) - T0 ))s launched $name ($left s)"
done
# A wall-clock deadline: model loading and kernel compilation take 30-300 s before the first step (more for the
# GLA family's first compile), so a per-run --stop-at-s guessed from it stopped session 21's runs 45-70 s early.
# At BUDGET - STOP_S every run still going gets a TERM, ends after its step in flight and saves its state; one
# still alive at BUDGET is killed (it resumes from its last save, every 100 steps).
STOP_AT=$(( BUDGET - ${STOP_S:-25} )); TERMED=0
while [ -n "$(jobs -r)" ] && [ $(( $(date +%s) - T0 )) -lt $BUDGET ]; do
  now=$(( $(date +%s) - T0 ))
  if [ $now -ge $STOP_AT ]; then
    [ $TERMED = 1 ] || { echo "t=${now}s deadline: TERM to the runs still going"; kill -TERM "${PIDS[@]}" 2>/dev/null; TERMED=1; }
    sleep 1; continue
  fi
  sleep $(( STOP_AT - now < 30 ? STOP_AT - now : 30 ))
  line="t=$(( $(date +%s) - T0 ))s $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | tr -d ' ')"
  for name in $NAMES; do line="$line $name:$(tail -1 $DEV/ck/$name/train_log.jsonl 2>/dev/null | grep -o '"step": [0-9]*' | grep -o '[0-9]*')"; done
  echo "$line"
done
for p in "${PIDS[@]}"; do kill -KILL $p 2>/dev/null && echo "killed pid $p at the deadline (no exit after the TERM)"; done; sleep 3
mps_stop
for name in $NAMES; do echo "== $name"; grep -E '^\{"out"|Error|error' $DEV/logs/$name.log | tail -3; done
# the run folders in one archive (state.pt kept only where the run is unfinished), split into <= 15 MiB parts.
# What comes back is at most 64 MiB a call, and an unfinished run's state.pt is 7-18 MB (twelve GLA-family runs:
# 119 MB, session 21; the parts past the limit were dropped, one state.pt cut in two). So whole run folders are
# chosen to fit ROOM_MIB: finished runs first (no state.pt), then the unfinished in BRING's order; the rest stay
# in $DEV/ck on the machine and are named, for a next call on the warm machine (BRING=<them>).
BRING=${BRING:-$NAMES}; ROOM=$(( ${ROOM_MIB:-58} * 1048576 )); X=(); TAKE=(); LEFT=(); used=0
for pass in finished unfinished; do
  for name in $BRING; do
    [ -d $DEV/ck/$name ] || continue
    finished $name && kind=finished || kind=unfinished
    [ $kind = $pass ] || continue
    ex=(); [ $kind = finished ] && ex=(--exclude=state.pt)  # a finished run comes back without its state.pt
    size=$(du -sb "${ex[@]}" $DEV/ck/$name | cut -f1)
    if [ $(( used + size )) -le $ROOM ]; then TAKE+=($name); used=$(( used + size )); [ $kind = finished ] && X+=(--exclude=$name/state.pt)
    else LEFT+=($name); fi
  done
done
[ ${#LEFT[@]} -gt 0 ] && echo "left on the machine (over the ${ROOM_MIB:-58} MiB brought back): ${LEFT[*]}; bring them with BRING=\"${LEFT[*]}\" in a next call while it is warm"
[ ${#TAKE[@]} -gt 0 ] && tar czf - -C $DEV/ck "${X[@]}" "${TAKE[@]}" | split -b 15M - $OUT/ck.tgz.part-
tar czf $OUT/logs.tgz -C $DEV/logs .
tar czf $DEV/triton-cache.tgz -C $DEV/triton-cache . && [ $(stat -c %s $DEV/triton-cache.tgz) -lt 12000000 ] && cp $DEV/triton-cache.tgz $OUT/
ls -l $OUT; echo "total $(( $(date +%s) - T0 )) s"
