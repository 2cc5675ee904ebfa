#!/usr/bin/env bash
# Call 2 of issue #16 (nvidia-h200-x2): FSDP2 training at Qwen3-32B dimensions, frozen backbone sharded over two
# GPUs, each rank drawing only its shards (models/random_base.py; nothing read, nothing broadcast). 1) a run killed
# (SIGKILL to the launcher's process group) after its first state.pt, then the same command again: it resumes;
# tokens/s and peak memory per GPU from the resumed invocation. 2) the same files as a one-process run: a 4-layer
# variant of the same dimensions trained on one GPU and under FSDP2, compared by scripts/scaling/compare_runs.py.
# 3) as time allows, a deeper variant (PROBE_LAYERS, default 96 = ~48B parameters) for the largest that fits.
# Carry: .whl .device/scaling/inputs .device/scaling/chunk/01. Env: STEPS (12), SEQ (4096), DEADLINE (450 s);
# tests: BASE, TOK, QWEN_SET (config overrides, e.g. tiny dimensions), PORT, SCALING_TMP, SCALING_DRY.
set -u
T0=$(date +%s); DEADLINE=${DEADLINE:-450}
SCALING_TMP=${SCALING_TMP:-/tmp/scaling}
source scripts/scaling/device_common.sh || exit $?
R=$SCALING_TMP/fsdp; B=$SCALING_TMP/bases; mkdir -p $R $B
TOK=${TOK:-.device/scaling/inputs/tokens.npz}; L8=${BASE:-.device/scaling/inputs/llama-3.1-8b}
python3 -m models.random_base_write $B/qwen3-32b qwen3-32b --tokenizer-from $L8 --set ${QWEN_SET:-}
python3 -m models.random_base_write $B/qwen3-32b-l4 qwen3-32b --tokenizer-from $L8 --set ${QWEN_SET:-} num_hidden_layers=4
ARGS="--tokens $TOK --seq-len ${SEQ:-4096} --eval-sequences 1 --log-every 2 --save-every-s 3600"
FSDP="accelerate launch --config_file scripts/scaling/accelerate/fsdp2.yaml --num_processes 2"
# 1. kill after the first saved state, then resume
CMD="$FSDP --main_process_port $((${PORT:-29510}+11)) scripts/scaling/train_peak.py $R/fsdp-32b.peak train --base $B/qwen3-32b $ARGS
     --steps ${STEPS:-12} --save-every 4 --out $R/fsdp-32b"
tree() {  # a process and all its descendants (from /proc: no ps needed), children first
  local c; for c in $(awk -v p=$1 '$4 == p {print $1}' /proc/[0-9]*/stat 2>/dev/null); do tree $c; done; echo $1; }
$CMD > $SCALING_TMP/fsdp-32b-killed.log 2>&1 & PID=$!   # start new sessions: a process-group kill misses them
while kill -0 $PID 2>/dev/null && [ ! -f $R/fsdp-32b/state.pt ] && [ $(left) -gt 200 ]; do sleep 0.5; done
ALL=$(tree $PID); kill -9 $ALL 2>/dev/null; wait $PID 2>/dev/null  # state.pt appears whole (atomic rename)
sleep 1; for p in $ALL; do kill -0 $p 2>/dev/null && echo "process $p survived the kill"; done
echo "killed at t=$(( $(date +%s) - T0 ))s; state.pt: $(ls -l $R/fsdp-32b/state.pt 2>&1)"; tail -2 $R/fsdp-32b/train_log.jsonl 2>/dev/null
log_tail $SCALING_TMP/fsdp-32b-killed.log 3; sleep 3
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader 2>/dev/null
step fsdp-32b-resume $CMD
: > $R/checks.txt
python3 - $R/fsdp-32b >> $R/checks.txt <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1]); rec = json.loads((run / "train_config.json").read_text()); s = rec["summary"]
log = [json.loads(l) for l in (run / "train_log.jsonl").read_text().splitlines() if l.strip()]
start = s["step"] - s["tokens_this_invocation"] * s["step"] // max(s["tokens"], 1)
print(f"{run.name}: FSDP2 on {s['world_size']} processes, killed (SIGKILL) after a saved state, resumed from step "
      f"{start}: step {s['step']}/{s['total_steps']} finished={s['finished']}; logged steps {[r['step'] for r in log]}")
PY
# 2. the same checkpoint files as a one-process run (4-layer variant: fits one GPU)
L4="--base $B/qwen3-32b-l4 $ARGS --steps 4 --save-every 0"
step l4-single env CUDA_VISIBLE_DEVICES=0 python3 scripts/scaling/train_peak.py $R/l4-single.peak train $L4 \
  --batch-size 2 --no-cuda-graph --out $R/l4-single
step l4-fsdp $FSDP --main_process_port $((${PORT:-29510}+12)) scripts/scaling/train_peak.py $R/l4-fsdp.peak train $L4 --out $R/l4-fsdp
python3 scripts/scaling/compare_runs.py $R/l4-single $R/l4-fsdp >> $R/checks.txt 2>&1
# 3. the largest that fits: a deeper variant, a few steps
RUNS="$R/fsdp-32b"
if [ $(left) -gt 200 ] && [ "${PROBE_LAYERS:-96}" != 0 ]; then
  python3 -m models.random_base_write $B/probe qwen3-32b --tokenizer-from $L8 --set ${QWEN_SET:-} num_hidden_layers=${PROBE_LAYERS:-96}
  step fsdp-probe $FSDP --main_process_port $((${PORT:-29510}+13)) scripts/scaling/train_peak.py $R/fsdp-probe.peak train \
    --base $B/probe $ARGS --steps 6 --save-every 0 --out $R/fsdp-probe && RUNS="$RUNS $R/fsdp-probe"
  grep -m1 -o "OutOfMemoryError.*" $SCALING_TMP/fsdp-probe.log >> $R/checks.txt
fi
cat $R/checks.txt; cat $R/*.peak.rank*.json
OK=""; for r in $RUNS; do [ -f $r/train_config.json ] && OK="$OK $r"; done
python3 -m bench.scaling --runs $OK --checks $R/checks.txt --commit "$GOLINEAR_GIT_COMMIT" --out $OUT/lb
cat $OUT/lb/scaling.md
tar czf $OUT/runs-fsdp.tgz -C $R --exclude='*.safetensors' --exclude=state.pt --exclude=loss.png .
tar czf $OUT/logs-fsdp.tgz -C $SCALING_TMP --exclude=ddp --exclude=fsdp --exclude=bases .
echo "total $(( $(date +%s) - T0 )) s"
