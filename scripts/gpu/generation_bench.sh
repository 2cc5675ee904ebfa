#!/usr/bin/env bash
# One H200 call for issue #12: `golinear generation` on S-NIAH-1 (4,096 tokens, 200 samples, bf16): gdn-default
# batched (the shipped default recipe), its old one-at-a-time path (GEN_SEQ samples), full-static, full attention
# (lm-eval's batched HF generate), in that order (a run cut off by its time limit keeps the rows issue #12 needs
# most), and the bf16 parity batched vs each prompt alone on GEN_PARITY samples; then, if >= 90 s are left, the
# batched-generation GPU tests. Everything lands in $OUT: generation.csv, generation_parity.csv, generation.md,
# gen.log, gpu_tests.log.
# Set-up: scripts/gpu/device_setup.sh (sourced here; the GGUF parts and wheels as in docs/gpu.md: .whl and
# .device/whl-eval carried or installed by an earlier call of this machine). S-NIAH-1's haystack is generated
# noise: it reads no data file, but the RULER code wants a data folder: GOLINEAR_DATA (default .device/data,
# created empty when absent). Env: GEN_CONTEXT (4096), GEN_SAMPLES (200), GEN_SEQ (20), GEN_BATCH (32),
# GEN_PARITY (200), GEN_DEVICE (cuda), GEN_BUDGET (seconds for the whole call, set-up included, 540: keep it under
# the call's time limit; the benchmark gets what the set-up leaves, less BENCH_MARGIN s for its kill and the summary,
# and says how much), GEN_TESTS (1: run the GPU tests after), SKIP_SETUP=1 (no device_setup.sh; PY names the
# python), GGUF_SHA, GOLINEAR_GIT_COMMIT.
# CPU smoke run (here): SKIP_SETUP=1 PY=.venv/bin/python GEN_DEVICE=cpu GEN_CONTEXT=1024 GEN_SAMPLES=2 GEN_SEQ=1 \
#   GEN_BATCH=2 GEN_PARITY=1 GEN_TESTS=0 OUT=/tmp/gen-out bash scripts/gpu/generation_bench.sh
set -u
T0=$(date +%s)
BUDGET=${GEN_BUDGET:-540}
BENCH_MARGIN=15  # between the benchmark's limit and the budget's end: timeout's kill (-k 5) and the summary
TESTS_MIN=90  # the GPU tests run only with this many seconds left
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/golinear-out}; mkdir -p "$OUT"
PY=${PY:-python3}
if [ "${SKIP_SETUP:-0}" != 1 ]; then
  source scripts/gpu/device_setup.sh || exit $?
fi
export GOLINEAR_DATA=${GOLINEAR_DATA:-.device/data}
mkdir -p "$GOLINEAR_DATA"
LOG=$OUT/gen.log
{ date -u; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null
  $PY -c "import torch, transformers, lm_eval; print('torch', torch.__version__, 'transformers', transformers.__version__, 'lm_eval', lm_eval.__version__)"
  $PY -c "import fla; print('fla', fla.__version__)" 2>/dev/null; } >> $LOG 2>&1
SETUP=$(( $(date +%s) - T0 ))
BENCH=$(( $(left) - BENCH_MARGIN ))
echo "== generation benchmark: set-up took $SETUP s of GEN_BUDGET=$BUDGET; the benchmark gets $BENCH s" | tee -a $LOG
if [ $BENCH -gt 0 ]; then  # (timeout 0 would mean no limit)
  timeout -k 5 $BENCH $PY -m bench.cli generation --device ${GEN_DEVICE:-cuda} \
    --context-length ${GEN_CONTEXT:-4096} --samples ${GEN_SAMPLES:-200} --sequential-samples ${GEN_SEQ:-20} \
    --batch-size ${GEN_BATCH:-32} --parity ${GEN_PARITY:-200} --data-dir "$GOLINEAR_DATA" --out-dir "$OUT" \
    2>&1 | grep -v "Loading weights\|pretrained\|already-initialized" | tee -a $LOG
  RC=${PIPESTATUS[0]}
  [ $RC = 124 ] || [ $RC = 137 ] && RC="$RC (cut off at its $BENCH s limit)"
  echo "benchmark rc=$RC at $(( $(date +%s) - T0 )) s" | tee -a $LOG
else
  echo "benchmark not run: no time left" | tee -a $LOG
fi
if [ "${GEN_TESTS:-1}" = 1 ]; then
  if [ $(left) -ge $TESTS_MIN ]; then
    timeout -k 5 $(( $(left) - 10 )) $PY -m pytest -v -s -p no:cacheprovider tests/test_gpu.py \
      -k "batched_generation or fast_decoder" > $OUT/gpu_tests.log 2>&1
    echo "gpu tests rc=$? at $(( $(date +%s) - T0 )) s" | tee -a $LOG
    grep -E "passed|failed|rows identical|rel err" $OUT/gpu_tests.log | tail -12
  else
    echo "gpu tests skipped: $(left) s left (they need $TESTS_MIN)" | tee -a $LOG
  fi
fi
cat $OUT/generation.md 2>/dev/null
echo "total $(( $(date +%s) - T0 )) s"
