#!/bin/bash
# Issue #14, the fused steady decode step (models/ops/fused_decode.py): one H200 call (carry [".whl"]) that
# (a) runs its GPU tests, (b) times gdn-default's decode at Llama-3.1-8B dims, batch 8, 32K, fused (default on
# CUDA) and not (GOLINEAR_FUSED_DECODE=0), plain gdn beside it. Rows land in $OUT/on/ and $OUT/off/, logs in $OUT.
# Usage: bash scripts/gpu/fused_decode_check.sh     Env: TEST_TIMEOUT (default 150), BENCH_TIMEOUT (default 200 each)
set -u
OUT=${OUT:-/tmp/golinear-out}; mkdir -p "$OUT/on" "$OUT/off"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/golinear-fd/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/golinear-fd/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/golinear-fd/triton-cache
mkdir -p $TRITON_CACHE_DIR
BENCH="python3 -m bench.latency --model llama-3.1-8b --lengths 32768 --batch 8 --device cuda --dtype bfloat16"

echo "== tests at ${SECONDS}s"
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -v -s -p no:cacheprovider tests/test_gpu.py \
  -k "gdn_step_inplace or fused_decode or (fast_decoder_matches_forward_on_cuda and gdn)" > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "PASSED|FAILED|ERROR|rel err|fused decode|gdn_step_inplace|^=+ " $OUT/tests.log | tail -20

echo "== fused (default) at ${SECONDS}s"
timeout ${BENCH_TIMEOUT:-200} $BENCH --configs "gdn-default;gdn" --out-dir $OUT/on > $OUT/on.log 2>&1
echo "rc=$?"; grep -E "T= *32768|Error|error" $OUT/on.log | tail -5

echo "== GOLINEAR_FUSED_DECODE=0 at ${SECONDS}s"
GOLINEAR_FUSED_DECODE=0 timeout ${BENCH_TIMEOUT:-200} $BENCH --configs "gdn-default" --out-dir $OUT/off > $OUT/off.log 2>&1
echo "rc=$?"; grep -E "T= *32768|Error|error" $OUT/off.log | tail -5
echo "done at ${SECONDS}s"
