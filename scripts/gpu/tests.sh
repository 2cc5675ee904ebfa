#!/usr/bin/env bash
# The GPU tests (FLA kernels against the reference ops, the fused and CUDA-graph paths); the log goes to OUT.
#   bash run.sh OUT bash scripts/gpu/tests.sh {out}           (inside a `golinear bundle --extra gpu`)
set -euo pipefail
OUT_DIR=${1:?usage: tests.sh OUT_DIR [pytest options]}; shift
python -m pytest -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_gpu_overhead.py tests/test_gpu_train_graph.py \
  "$@" 2>&1 | tee "$OUT_DIR/gpu-tests.log"
exit "${PIPESTATUS[0]}"
