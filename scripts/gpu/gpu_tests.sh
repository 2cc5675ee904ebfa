#!/usr/bin/env bash
# GPU tests in parallel pytest groups (so Triton compilations overlap), each under one timeout; every log
# lands in $OUT/gpu_tests.log and the summary lines (pass/fail counts, printed speeds) on stdout.
# Run after scripts/gpu/device_setup.sh (it sets PYTHONPATH to the carried wheels).
# Env: GPU_TEST_TIMEOUT (s, default 400), GPU_TEST_GROUPS (';'-separated "name|pytest args"), default: the
# checks of the layer's overhead cuts (fused window+sink SDPA, fused short conv, whole-layer CUDA vs CPU,
# GOLINEAR_COMPILE, fast decoder, dispatch, #640 guard) and the CUDA-graph trainer (with its printed speed).
set -u
OUT=${OUT:-/tmp/golinear-out}; rm -rf /tmp/gpu-tests; mkdir -p "$OUT" /tmp/gpu-tests
O=tests/test_gpu_overhead.py; G=tests/test_gpu.py
DEFAULT="softmax|$O -k window_sink_softmax or blocked_chunk or short_conv_autograd;layer|$O -k train_step_cuda or compile_matches"
DEFAULT+=";graph|-s tests/test_gpu_train_graph.py;window|$G -k window_sink_attention or short_conv or mixed;decode|$G -k fast_decoder or dispatch or guard"
IFS=';' read -ra GROUPS_ <<< "${GPU_TEST_GROUPS:-$DEFAULT}"
for g in "${GROUPS_[@]}"; do
  name=${g%%|*}; args=${g#*|}
  file=$(echo "$args" | grep -o 'tests/[a-z_]*\.py'); pre=${args%%tests/*}; k=${args#*-k }
  [ "$k" = "$args" ] && k=""
  ( timeout ${GPU_TEST_TIMEOUT:-400} python3 -m pytest -v -p no:cacheprovider $pre $file ${k:+-k "$k"} \
      > /tmp/gpu-tests/$name.log 2>&1; echo "$name rc=$?" >> /tmp/gpu-tests/rc.txt ) &
done
wait
for f in /tmp/gpu-tests/*.log; do echo "##### $f"; cat "$f"; done > $OUT/gpu_tests.log
cat /tmp/gpu-tests/rc.txt
grep -hE "^=+ .*(passed|failed|error|skipped)" /tmp/gpu-tests/*.log; grep -h "tokens/s" /tmp/gpu-tests/*.log
