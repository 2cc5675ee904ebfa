#!/usr/bin/env bash
# Call 1 of issue #16 (nvidia-h200-x2): DDP training at Llama-3.1-8B dimensions (random weights drawn on each GPU,
# models/random_base.py), default recipe (GDN + window 56 + 8 sinks + short conv), sequence 4,096, the books
# corpus in the SmolLM2 tokenizer. Same global batch (2) on one GPU (batch 2) and on two (DDP, batch 1 each):
# tokens/s, peak memory per GPU, loss curves. Eager steps in both (--no-cuda-graph: the graph exists only for one
# process), so the ratio is DDP's alone. Then, as time allows: one GPU at batch 1, and the ranks' weights compared.
# Carry: .whl .device/scaling/inputs .device/scaling/chunk/00. Env: STEPS (30), SEQ (4096), DEADLINE (330 s);
# tests: BASE, TOK, PORT, SCALING_TMP, SCALING_DRY.
# Writes $OUT/runs-ddp.tgz (run records, logs, peak files; no weights) and $OUT/lb/scaling.{csv,md}.
set -u
T0=$(date +%s); DEADLINE=${DEADLINE:-330}
SCALING_TMP=${SCALING_TMP:-/tmp/scaling}
source scripts/scaling/device_common.sh || exit $?
R=$SCALING_TMP/ddp; mkdir -p $R
BASE=${BASE:-.device/scaling/inputs/llama-3.1-8b}; TOK=${TOK:-.device/scaling/inputs/tokens.npz}
ARGS="--base $BASE --tokens $TOK --seq-len ${SEQ:-4096} --steps ${STEPS:-30} --eval-sequences 1 --save-every 0
      --save-every-s 3600 --log-every 5 --no-cuda-graph --force"
DDP="accelerate launch --config_file scripts/scaling/accelerate/ddp.yaml --num_processes 2 --main_process_port $((${PORT:-29510}+1))"
step single-b2 env CUDA_VISIBLE_DEVICES=0 python3 scripts/scaling/train_peak.py $R/single-b2.peak train $ARGS \
  --batch-size 2 --out $R/single-b2
step ddp-b1 $DDP scripts/scaling/train_peak.py $R/ddp-b1.peak train $ARGS --batch-size 1 --out $R/ddp-b1
RUNS="$R/single-b2 $R/ddp-b1"
if [ $(left) -gt 150 ]; then
  step single-b1 env CUDA_VISIBLE_DEVICES=0 python3 scripts/scaling/train_peak.py $R/single-b1.peak train $ARGS \
    --batch-size 1 --out $R/single-b1 && RUNS="$RUNS $R/single-b1"
fi
[ $(left) -gt 90 ] && step ranks torchrun --nproc_per_node 2 --master_port $((${PORT:-29510}+3)) scripts/scaling/check_ranks.py $BASE $R/ranks-8b.json
: > $R/checks.txt
[ -f $R/ranks-8b.json ] && python3 -c "import json; d=json.load(open('$R/ranks-8b.json')); print('llama-3.1-8b random backbone on 2 GPUs: rank fingerprints', d['fingerprints'], 'identical' if d['identical'] else 'DIFFER')" >> $R/checks.txt
OK=""; for r in $RUNS; do [ -f $r/train_config.json ] && OK="$OK $r"; done
python3 -m bench.scaling --runs $OK --same-curve $R/single-b2 $R/ddp-b1 --checks $R/checks.txt \
  --commit "$GOLINEAR_GIT_COMMIT" --out $OUT/lb
cat $OUT/lb/scaling.md
tar czf $OUT/runs-ddp.tgz -C $R --exclude='*.safetensors' --exclude=state.pt --exclude=loss.png .
tar czf $OUT/logs-ddp.tgz -C $SCALING_TMP --exclude=ddp --exclude=fsdp --exclude=bases .
echo "total $(( $(date +%s) - T0 )) s"
