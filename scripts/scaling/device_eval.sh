#!/usr/bin/env bash
# Last call of issue #16 (nvidia-h200-x2): data-parallel evaluation of SmolLM2 (full attention and the default
# recipe's checkpoint) on the full CR and LAMBADA sets and one long-context suite, `accelerate launch
# --num_processes 2 -m bench.cli run`, each into a fresh store; the cells are compared with the committed
# one-GPU cells (leaderboards/store: same key, n and value), and CR with full attention is also run on one GPU
# in this call for the wall-time ratio (the committed cells' wall times were taken beside other work).
# Needs every evaluation chunk stashed by the earlier calls of this warm machine (device_common.sh); exits 7
# at once, naming the missing ones, otherwise. In priority order, each step time-boxed: DP CR full, 1-GPU CR full,
# DP CR default recipe, DP LAMBADA both, long context (S-NIAH at 4,096, NS samples) on 2 GPUs and on 1.
# Carry: .whl .device/scaling/inputs .device/scaling/chunk/04. Env: EVAL_BATCH (32), NS (25), DEADLINE (560 s);
# a CPU dry run (docs/scaling.md): SCALING_DRY=1 DEVICE=cpu DATA EVAL_LIMIT LC_LEN PORT SCALING_TMP OUT.
set -u
T0=$(date +%s); DEADLINE=${DEADLINE:-560}
if [ -z "${SCALING_DRY:-}" ]; then
  source .device/scaling/inputs/manifest.env
  SCALING_STASH=/tmp/golinear-scaling; mkdir -p $SCALING_STASH
  for f in .device/scaling/chunk/*/part.*; do [ -f "$f" ] && cp -n "$f" $SCALING_STASH/; done
  HAVE=$(ls $SCALING_STASH/part.* 2>/dev/null | wc -l)
  if [ "$HAVE" != "$PAYLOAD_CHUNKS" ]; then
    echo "evaluation chunks: have $(ls $SCALING_STASH | tr '\n' ' '), need part.00..part.0$((PAYLOAD_CHUNKS-1));"
    echo "the machine was given back between calls: send device_stash.sh calls carrying the missing chunks, then this"; exit 7
  fi
  if [ ! -d /tmp/payload ]; then
    cat $SCALING_STASH/part.* > /tmp/payload.tar
    echo "$PAYLOAD_SHA  /tmp/payload.tar" | sha256sum -c - || exit 8
    mkdir -p /tmp/payload && tar xf /tmp/payload.tar -C /tmp/payload && rm /tmp/payload.tar
  fi
  mkdir -p .device/whl-eval /tmp/golinear-stash && cp -n /tmp/payload/whl-eval/*.whl .device/whl-eval/
  cp -n /tmp/payload/smollm2.gguf /tmp/golinear-stash/smollm2.gguf.partA
  export GGUF_SHA GGUF_SIZE=$(stat -c %s /tmp/payload/smollm2.gguf)
  SCALING_TMP=${SCALING_TMP:-/tmp/scaling}
  source scripts/scaling/device_common.sh || exit $?
else  # a CPU dry run (EVAL_LIMIT docs per task, DATA, DEVICE=cpu): the same steps, nothing joined or installed
  SCALING_TMP=${SCALING_TMP:-/tmp/scaling}; source scripts/scaling/device_common.sh || exit $?
fi
python3 -c "import lm_eval; print('lm_eval', lm_eval.__version__)" || exit 6
DATA=${DATA:-/tmp/payload/data}; CK=checkpoints/smollm2-135m/gdn-w56-s8-sc; EB=${EVAL_BATCH:-32}
RUN="-m bench.cli run --device ${DEVICE:-cuda} --batch-size $EB --data-dir $DATA ${EVAL_LIMIT:+--limit $EVAL_LIMIT}"
DP="accelerate launch --config_file scripts/scaling/accelerate/ddp.yaml --num_processes 2 --main_process_port $((${PORT:-29510}+21))"
E=$SCALING_TMP/eval; mkdir -p $E; : > $E/timing.jsonl
timed() {  # timed NAME GPUS SUITE MODELS CMD...: the whole command's wall time into timing.jsonl
  local name=$1 gpus=$2 suite=$3 models=$4; shift 4
  local t=$(date +%s.%N); step $name "$@"; local rc=$?
  [ $rc = 99 ] && return
  python3 -c "import json,sys; print(json.dumps({'name': '$name', 'suite': '$suite', 'gpus': $gpus, 'models': '$models', 'batch_size': $EB, 'wall_s': round($(date +%s.%N) - $t, 1), 'returncode': $rc}))" >> $E/timing.jsonl
}
timed dp-cr-full 2 cr full $DP $RUN --models full --suites cr --store $E/store-dp
timed one-cr-full 1 cr full env CUDA_VISIBLE_DEVICES=0 python3 $RUN --models full --suites cr --store $E/store-1
timed dp-cr-default 2 cr-default default $DP $RUN --models $CK --suites cr --store $E/store-dp
timed dp-lambada 2 lambada "full;default" $DP $RUN --models "full;$CK" --suites lambada --store $E/store-dp
LC="--suites sniah --context-length ${LC_LEN:-4096} --num-samples ${NS:-25}"
timed dp-sniah 2 sniah default $DP $RUN --models $CK $LC --store $E/store-dp-lc
timed one-sniah 1 sniah default env CUDA_VISIBLE_DEVICES=0 python3 $RUN --models $CK $LC --store $E/store-1-lc
python3 -c "import json; runs=[json.loads(l) for l in open('$E/timing.jsonl')]; json.dump({'commit': '$GOLINEAR_GIT_COMMIT', 'runs': runs}, open('$E/timing.json', 'w'), indent=1)"
cat $E/timing.json
python3 -m bench.scaling --eval-timing $E/timing.json --compare $E/store-dp leaderboards/store \
  --compare $E/store-dp $E/store-1 --compare $E/store-dp-lc $E/store-1-lc --compare $E/store-1 leaderboards/store --commit "$GOLINEAR_GIT_COMMIT" --out $OUT/lb
cat $OUT/lb/scaling.md
tar czf $OUT/eval-stores.tgz -C $E . ; tar czf $OUT/logs-eval.tgz -C $SCALING_TMP --exclude=ddp --exclude=fsdp --exclude=bases --exclude=eval .
echo "total $(( $(date +%s) - T0 )) s"
