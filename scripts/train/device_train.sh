#!/usr/bin/env bash
# The H200 reference-checkpoint run (docs/gpu.md): set up (scripts/gpu/device_setup.sh: wheels, the
# SmolLM2 GGUF joined from its stashed/carried parts, conversion), train the default recipe alone (the speed figure), then the other recipes
# concurrently on the same GPU until a common deadline, and tar the checkpoints (new params + log +
# config + loss.png) into $OUT.
# Env: GGUF_SHA (expected sha256), BUDGET and the phase knobs below, BUDGET_FLAG (--time-budget-s: fit the
# schedule to the budget, the default; --stop-at-s: keep the full schedule, stop at the budget, resume later),
# RECIPES (recipe file, default scripts/train/recipes.txt), EXTRA_ARGS (appended to every `golinear train`; a CPU dry run uses e.g. "--seq-len 64 --steps 20").
set -u
T0=$(date +%s)
BUDGET=${BUDGET:-530}                 # every training ends by T0 + BUDGET
DEFAULT_BUDGET=${DEFAULT_BUDGET:-380} # the default recipe's own budget (from its start)
PHASE2_AT=${PHASE2_AT:-1800}          # launch the other recipes when the default reaches this step
PHASE2_LATEST=${PHASE2_LATEST:-360}   # ... or at this many seconds after T0 at the latest
TOKENS=.device/train/books-smollm2-10m.npz
source scripts/gpu/device_setup.sh || exit $?
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(0))"
echo "setup done after $(( $(date +%s) - T0 )) s"
mkdir -p /tmp/ck /tmp/logs
declare -A PIDS
launch() {  # name, budget seconds, options...
  local name=$1 budget=$2; shift 2
  # a run stopped in an earlier session resumes from its folder (state.pt + log), carried as .device/resume/<name>
  [ -d .device/resume/$name ] && [ ! -d /tmp/ck/$name ] && cp -r .device/resume/$name /tmp/ck/ && echo "resuming $name"
  python3 -m bench.cli train --base smollm2-135m --tokens $TOKENS --out /tmp/ck/$name ${BUDGET_FLAG:---time-budget-s} $budget \
    --note "$NOTE" "$@" ${EXTRA_ARGS:-} > /tmp/logs/$name.log 2>&1 &
  PIDS[$name]=$!
  echo "t=$(( $(date +%s) - T0 ))s launched $name (budget ${budget}s)"
}
step_of() { local s; s=$(tail -1 /tmp/ck/$1/train_log.jsonl 2>/dev/null | grep -o '"step": [0-9]*' | grep -o '[0-9]*'); echo ${s:-0}; }
# Phase 1: the default recipe (first line of the recipe file) alone on the GPU, for a clean speed figure.
read -r FIRST FIRST_ARGS < <(grep -v '^#' ${RECIPES:-scripts/train/recipes.txt} | grep -v '^ *$' | head -1)
NOTE=${NOTE1:-"H200 reference run; the default recipe trained first, alone on the GPU"}
launch $FIRST $DEFAULT_BUDGET $FIRST_ARGS
# Phase 2: the other recipes start once the default is past PHASE2_AT steps (or done, or out of time),
# all sharing the GPU until the common deadline.
while kill -0 ${PIDS[$FIRST]} 2>/dev/null && [ "$(step_of $FIRST)" -lt $PHASE2_AT ] \
      && [ $(( $(date +%s) - T0 )) -lt $PHASE2_LATEST ]; do sleep 5; done
REMAIN=$(( BUDGET - ($(date +%s) - T0) ))
NOTE=${NOTE2:-"H200 reference run; trained with 7 other recipes sharing one GPU under a ${REMAIN}s budget (fewer tokens than the paper's 10M)"}
while read -r name args; do
  [[ -z "$name" || "$name" == \#* || "$name" == "$FIRST" ]] && continue
  launch $name $REMAIN $args
done < ${RECIPES:-scripts/train/recipes.txt}
TICK=0
while true; do
  sleep 10; TICK=$((TICK + 1))
  running=0; line="t=$(( $(date +%s) - T0 ))s gpu=$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | tr -d ' ')"
  for name in "${!PIDS[@]}"; do
    kill -0 ${PIDS[$name]} 2>/dev/null && running=$((running + 1))
    line="$line $name:$(step_of $name)"
  done
  [ $((TICK % 6)) -eq 0 ] && echo "$line"
  [ $running -eq 0 ] && break
  if [ $(( $(date +%s) - T0 )) -gt $(( BUDGET + 30 )) ]; then
    for name in "${!PIDS[@]}"; do kill ${PIDS[$name]} 2>/dev/null && echo "killed $name (past budget)"; done
    sleep 2; break
  fi
done
for name in "${!PIDS[@]}"; do echo "== $name"; grep -E '^\{"out"|Error|error' /tmp/logs/$name.log | tail -3; done
python3 - <<'PY'
import json, pathlib
for d in sorted(pathlib.Path("/tmp/ck").iterdir()):
    f = d / "train_config.json"
    if f.exists():
        r = json.loads(f.read_text()); s, res = r["summary"], r["results"]
        print(d.name, json.dumps({k: s.get(k) for k in ("tokens", "step", "train_wall_s", "tokens_per_s",
              "steady_tokens_per_s", "budget_note", "stopped_at_deadline", "cuda_graph")}), json.dumps(res))
PY
# two archives: every file back from the device must stay under 16 MiB
cd /tmp/ck && A=$(ls | head -4) && B=$(ls | tail -n +5)
X=--exclude=state.pt; [ "${KEEP_STATE:-0}" = 1 ] && X=  # KEEP_STATE=1: bring state.pt back to resume later
[ -n "$A" ] && tar czf $OUT/ckpt_a.tgz $X $A
[ -n "$B" ] && tar czf $OUT/ckpt_b.tgz $X $B
cd /tmp/logs && tar czf $OUT/logs.tgz . ; ls -l $OUT
echo "total $(( $(date +%s) - T0 )) s"
