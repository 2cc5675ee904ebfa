#!/bin/bash
# One H200 call: install the FLA wheels, the latency sweep (issue #3 targets), the GPU tests (12 groups
# in parallel, so Triton compiles overlap) and the window-kernel benchmark. Everything lands in $OUT.
# Usage (device `run`, carry [".whl"]): bash scripts/gpu/run_all.sh
# Env: SWEEP_ARGS (extra `bench.latency` args), SKIP_SWEEP=1, SKIP_TESTS=1, SKIP_BENCH=1, BUDGET_S (default 560),
# TEST_ONLY='gla32 gla16' (run only these test groups; the GLA backward compiles take > 5 min on a fresh machine).
set -u
OUT=${OUT:-/tmp/golinear-out}; mkdir -p "$OUT"
LOG=$OUT/run.log
BUDGET_S=${BUDGET_S:-560}
left() { echo $((BUDGET_S - SECONDS)); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/golinear-lat/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/golinear-lat/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/golinear-lat/triton-cache
mkdir -p $TRITON_CACHE_DIR
[ -f .whl/triton-cache.tgz ] && tar xzf .whl/triton-cache.tgz -C $TRITON_CACHE_DIR
{ date -u; nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, triton, transformers, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'fla', fla.__version__)"; } >> $LOG 2>&1

if [ "${SKIP_SWEEP:-0}" != 1 ]; then
  echo "== sweep ($(left) s left)" >> $LOG
  timeout ${SWEEP_TIMEOUT:-330} python3 -m bench.latency --out-dir "$OUT" ${SWEEP_ARGS:-} >> $LOG 2>&1
  echo "sweep rc=$? at ${SECONDS}s" >> $LOG
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  T=$(( $(left) - ${BENCH_RESERVE:-70} )); [ $T -lt 60 ] && T=60
  echo "== tests (timeout ${T}s)" >> $LOG
  mkdir -p /tmp/golinear-lat/tlogs
  group() { name=$1; shift
    timeout $T python3 -m pytest -v -s -p no:cacheprovider tests/test_gpu.py -k "$*" > /tmp/golinear-lat/tlogs/$name.log 2>&1
    echo "$name rc=$?" >> /tmp/golinear-lat/tlogs/summary.log; }
  C=test_chunk_forward_backward
  TEST_GROUPS=("gla32|$C and gla and fp32" "gla16|$C and gla and bf16" "gdn32|$C and gdn and fp32"
          "gdn16|$C and gdn and bf16" "hh32|$C and hedgehog and fp32" "hh16|$C and hedgehog and bf16"
          "rec|test_recurrent_forward" "train64|test_gdn_training_shapes_backward and d64"
          "train128|test_gdn_training_shapes_backward and d128" "win32|test_window_sink_attention and fp32"
          "win16|test_window_sink_attention and bf16" "misc|guard or dispatch or fast_decoder or short_conv")
  for g in "${TEST_GROUPS[@]}"; do
    name=${g%%|*}
    if [ -z "${TEST_ONLY:-}" ] || [[ " $TEST_ONLY " == *" $name "* ]]; then group "$name" "${g#*|}" & fi
  done
  wait
  for f in /tmp/golinear-lat/tlogs/*.log; do echo "##### $f"; cat $f; done > $OUT/tests.log
  echo "tests done at ${SECONDS}s" >> $LOG
fi

if [ "${SKIP_BENCH:-0}" != 1 ] && [ $(left) -gt 40 ]; then
  [ $(left) -lt 100 ] && export BENCH_FLEX=0
  timeout $(( $(left) - 15 )) python3 scripts/gpu/bench_window.py > $OUT/window_bench.txt 2>&1
fi
tar czf $OUT/triton-cache.tgz -C $TRITON_CACHE_DIR . 2>/dev/null
echo "done at ${SECONDS}s" >> $LOG
