#!/bin/bash
# Issue #14, the fused decode step (models/ops/fused_decode.py, models/ops/decode_glue.py): one H200 call (carry
# [".whl"]) that (a) times the decode at Llama-3.1-8B dims, batch 8, 32K: gdn-default and gdn fused
# (GOLINEAR_FUSED_DECODE=auto), then gdn-default with GOLINEAR_FUSED_DECODE=0 (the eager step, as before), (b) runs the GPU tests of the
# fused path with the time left. Rows land in $OUT/on/latency.csv and $OUT/off/latency.csv, logs in $OUT.
# Usage: bash scripts/gpu/fused_decode_check.sh   Env: BUDGET_S (default 570), SKIP_TESTS=1, SKIP_OFF=1
set -u
OUT=${OUT:-/tmp/golinear-out}; mkdir -p "$OUT/on" "$OUT/off"
BUDGET_S=${BUDGET_S:-570}; left() { echo $((BUDGET_S - SECONDS)); }
source scripts/gpu/device_setup.sh > /dev/null || exit 1  # the carried wheels in /tmp/site, one Triton cache per machine
BENCH="python3 -m bench.latency --model llama-3.1-8b --lengths 32768 --batch 8 --device cuda --dtype bfloat16"
show() { grep -E "T= *32768|Error|error|Traceback" "$1" | tail -6; }

echo "== fused (GOLINEAR_FUSED_DECODE=auto) at ${SECONDS}s"
GOLINEAR_FUSED_DECODE=auto timeout $(( $(left) - 200 )) $BENCH --configs "gdn-default;gdn" --out-dir $OUT/on > $OUT/on.log 2>&1
echo "rc=$?"; show $OUT/on.log

if [ "${SKIP_OFF:-0}" != 1 ]; then
  echo "== GOLINEAR_FUSED_DECODE=0 at ${SECONDS}s"
  GOLINEAR_FUSED_DECODE=0 timeout $(( $(left) - 90 )) $BENCH --configs "gdn-default" --out-dir $OUT/off > $OUT/off.log 2>&1
  echo "rc=$?"; show $OUT/off.log
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== tests at ${SECONDS}s ($(left) s left)"
  timeout $(( $(left) - 5 )) python3 -m pytest -v -s -p no:cacheprovider tests/test_gpu.py \
    -k "gdn_step_inplace or fused_decode or (fast_decoder_matches_forward_on_cuda and gdn)" > $OUT/tests.log 2>&1
  echo "tests rc=$?"; grep -E "PASSED|FAILED|ERROR|rel err|fused decode|gdn_step_inplace|^=+ " $OUT/tests.log | tail -20
fi
echo "done at ${SECONDS}s"
