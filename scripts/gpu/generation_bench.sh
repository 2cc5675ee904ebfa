#!/usr/bin/env bash
# One H200 call for issue #12: `golinear generation` on S-NIAH-1 (4,096 tokens, 200 samples, bf16): full attention
# (lm-eval's batched HF generate), full-static, gdn-default batched (the shipped default recipe), the old
# one-at-a-time path (GEN_SEQ samples), and the bf16 parity batched vs each prompt alone on GEN_PARITY samples;
# then, with the time left, the batched-generation GPU tests. Everything lands in $OUT: generation.csv,
# generation_parity.csv, generation.md, gen.log, gpu_tests.log.
# Set-up: scripts/gpu/device_setup.sh (sourced here; the GGUF parts and wheels as in docs/gpu.md: .whl and
# .device/whl-eval carried or installed by an earlier call of this machine). S-NIAH-1's haystack is generated
# noise: it reads no data file, but the RULER code wants a data folder: GOLINEAR_DATA (default .device/data,
# created empty when absent). Env: GEN_CONTEXT (4096), GEN_SAMPLES (200), GEN_SEQ (20), GEN_BATCH (32),
# GEN_PARITY (200), GEN_DEVICE (cuda), GEN_BUDGET (seconds for the whole call, 530), GEN_TESTS (1: run the GPU
# tests after), SKIP_SETUP=1 (no device_setup.sh; PY names the python), GGUF_SHA, GOLINEAR_GIT_COMMIT.
# CPU smoke run (here): SKIP_SETUP=1 PY=.venv/bin/python GEN_DEVICE=cpu GEN_CONTEXT=1024 GEN_SAMPLES=2 GEN_SEQ=1 \
#   GEN_BATCH=2 GEN_PARITY=1 GEN_TESTS=0 OUT=/tmp/gen-out bash scripts/gpu/generation_bench.sh
set -u
T0=$(date +%s)
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
left() { echo $(( ${GEN_BUDGET:-530} - ($(date +%s) - T0) )); }
echo "== generation benchmark ($(left) s left)" | tee -a $LOG
timeout $(( $(left) - 20 )) $PY -m bench.cli generation --device ${GEN_DEVICE:-cuda} \
  --context-length ${GEN_CONTEXT:-4096} --samples ${GEN_SAMPLES:-200} --sequential-samples ${GEN_SEQ:-20} \
  --batch-size ${GEN_BATCH:-32} --parity ${GEN_PARITY:-200} --data-dir "$GOLINEAR_DATA" --out-dir "$OUT" \
  2>&1 | grep -v "Loading weights\|pretrained\|already-initialized" | tee -a $LOG
echo "benchmark rc=${PIPESTATUS[0]} at $(( $(date +%s) - T0 )) s" | tee -a $LOG
if [ "${GEN_TESTS:-1}" = 1 ] && [ $(left) -gt 60 ]; then
  timeout $(( $(left) - 10 )) $PY -m pytest -v -s -p no:cacheprovider tests/test_gpu.py \
    -k "batched_generation or fast_decoder" > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$? at $(( $(date +%s) - T0 )) s" | tee -a $LOG
  grep -E "passed|failed|rows identical|rel err" $OUT/gpu_tests.log | tail -12
fi
cat $OUT/generation.md 2>/dev/null
echo "total $(( $(date +%s) - T0 )) s"
