#!/usr/bin/env bash
# The GPU test set (`-m gpu`: FLA kernels against the reference ops, the split-K decode kernel, the fused and
# CUDA-graph decode and training paths, retention on CUDA), in JOBS parallel pytest processes on one GPU (Triton's
# compiles are CPU work), each with its JUnit XML; then docs/gpu-tests.md, the summary per file (passed, failed,
# skipped, card, torch/triton/FLA versions, date), written to OUT_DIR and, with --docs, over the committed one.
#   bash scripts/gpu/tests.sh OUT_DIR [--docs] [pytest options]     (JOBS=4 processes, PYTHON=python3, TIMEOUT=)
#   bash run.sh OUT bash scripts/gpu/tests.sh {out}           (inside a `golinear bundle --extra gpu`)
set -uo pipefail
OUT_DIR=${1:?usage: tests.sh OUT_DIR [--docs] [pytest options]}; shift
DOCS=""
if [ "${1:-}" = "--docs" ]; then DOCS=docs/gpu-tests.md; shift; fi
JOBS=${JOBS:-4}
PY=${PYTHON:-python3}
LIMIT=${TIMEOUT:+timeout $TIMEOUT}  # TIMEOUT=seconds: each process stopped after that (its finished tests still counted)
mkdir -p "$OUT_DIR"
$PY -m pytest -p no:cacheprovider -q --collect-only -m gpu tests "$@" 2>/dev/null | grep '::' > "$OUT_DIR/gpu-tests.ids"
echo "$(wc -l < "$OUT_DIR/gpu-tests.ids") GPU tests in $JOBS processes"
pids=()
for j in $(seq 0 $((JOBS - 1))); do
    awk -v n="$JOBS" -v j="$j" 'NR % n == j' "$OUT_DIR/gpu-tests.ids" > "$OUT_DIR/shard$j.ids"
    # shellcheck disable=SC2046
    $LIMIT $PY -m pytest -p no:cacheprovider -q -rfEs --junitxml="$OUT_DIR/shard$j.xml" "$@" \
        $(cat "$OUT_DIR/shard$j.ids") > "$OUT_DIR/shard$j.log" 2>&1 &
    pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
cat "$OUT_DIR"/shard*.log > "$OUT_DIR/gpu-tests.log"
$PY scripts/gpu/test_summary.py "$OUT_DIR"/shard*.xml --out "$OUT_DIR/gpu-tests.md" ${DOCS:+--also "$DOCS"}
grep -hE '^(FAILED|ERROR)' "$OUT_DIR"/shard*.log || true
exit $status
