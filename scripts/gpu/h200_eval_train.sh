#!/usr/bin/env bash
# One H200 call (after device_setup.sh ran in earlier calls): the full-test-set evaluation of issue #5
# (full attention and the shipped default-recipe checkpoint on CR, 5-shot MMLU and LAMBADA, one process per
# model x suite, all writing to one store) while scripts/train/device_train.sh trains the reference recipes
# of issue #4 on the same GPU, and optionally the GLA GPU tests of issue #3. Evaluation scores do not depend
# on sharing the GPU; the training speed figures of this call are shared-GPU figures (noted in each run).
# Env: GGUF_SHA, EVAL_MODELS (';'-separated specs), EVAL_SUITES, EVAL_DEADLINE (s after start), TRAIN=0/1,
# EVAL_DATA (data folder, default .device/data), GPU_TESTS (pytest -k expression, empty = none), plus
# device_train.sh's knobs.
set -u
T0=$(date +%s)
source scripts/gpu/device_setup.sh || exit $?
python3 -c "import torch, lm_eval, fla, transformers; print('torch', torch.__version__, 'lm_eval', lm_eval.__version__, 'fla', fla.__version__, 'transformers', transformers.__version__)" || exit 6
mkdir -p /tmp/store /tmp/evallogs
# start from the committed store: finished cells (same key) are skipped, not redone
[ -d leaderboards/store/cells ] && cp -rn leaderboards/store/. /tmp/store/
EVAL_PIDS=()
IFS=';' read -ra MODELS <<< "${EVAL_MODELS:-full;checkpoints/smollm2-135m/gdn-w56-s8-sc}"
for m in "${MODELS[@]}"; do
  for s in ${EVAL_SUITES:-cr mmlu lambada}; do
    tag=$(basename "$m")-$s
    python3 -m bench.cli run --models "$m" --suites $s --device cuda --batch-size ${EVAL_BATCH:-32} \
      --data-dir ${EVAL_DATA:-.device/data} --store /tmp/store > /tmp/evallogs/$tag.log 2>&1 &
    EVAL_PIDS+=($!); echo "t=$(( $(date +%s) - T0 ))s eval $tag"
  done
done
if [ -n "${GPU_TESTS:-}" ]; then
  timeout $(( ${EVAL_DEADLINE:-540} - 20 )) python3 -m pytest -v -p no:cacheprovider tests/test_gpu.py -k "$GPU_TESTS" \
    > /tmp/evallogs/gpu_tests.log 2>&1 &
fi
[ "${TRAIN:-1}" = 1 ] && bash scripts/train/device_train.sh
while [ $(( $(date +%s) - T0 )) -lt ${EVAL_DEADLINE:-540} ]; do
  alive=0; for p in "${EVAL_PIDS[@]}"; do kill -0 $p 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break; sleep 5
done
for p in "${EVAL_PIDS[@]}"; do kill $p 2>/dev/null && echo "eval pid $p killed at the deadline (finished cells are kept)"; done
sleep 1; pkill -f "pytest -v -p no:cacheprovider tests/test_gpu.py" 2>/dev/null
for f in /tmp/evallogs/*.log; do echo "== $f"; grep -E "wrote|skip|Error|error|Traceback" $f | tail -5; done
find /tmp/store -name '*.json' | wc -l
tar czf $OUT/store.tgz -C /tmp/store . ; tar czf $OUT/evallogs.tgz -C /tmp/evallogs .
ls -l $OUT  # (the Triton cache, ~90 MB, is over the 16-MiB limit on files back)
echo "total $(( $(date +%s) - T0 )) s"
