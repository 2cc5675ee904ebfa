#!/usr/bin/env bash
# leaderboards/eval-speed.md and leaderboards/parity.{md,csv}: how fast `golinear run` evaluates S-NIAH at 4K on a GPU,
# per kind of row, and whether each fast path scores as its one-at-a-time definition does.
#   bash run.sh OUT_DIR bash scripts/gpu/eval_speed.sh {out} [STAGE...]     (inside a `golinear bundle`, docs/offline.md)
# Stages (default: speed parity; each resumable: finished cells are skipped):
#   speed   ROWS on S-NIAH-1/2/3, SAMPLES a task, batch BATCH (first compile included in each row's first cell)
#   parity  ROWS on the same PARITY_SAMPLES samples of S-NIAH-1, once fast (the default) and once with
#           --generation reference (HF generate for full attention, one prompt at a time for linearized rows,
#           kvpress's DynamicCache for presses)
# Then: OUT_DIR/eval-speed.md (scripts/gpu/eval_speed.py) and OUT_DIR/parity.{md,csv} (scripts/gpu/parity.py); copy
# them to leaderboards/ when they are the run to publish.
set -euo pipefail
OUT_DIR=${1:?usage: eval_speed.sh OUT_DIR [speed|parity ...]}; shift
STAGES=${*:-speed parity}
ROWS=${ROWS:-full;gdn-w56-s8-sc;gdn-w1016-s8-sc;press=snapkv,kv_budget=1024;press=kvzip,kv_budget=1024;gdn-w508-s8-r508-fit-sc}
SAMPLES=${SAMPLES:-500}
PARITY_SAMPLES=${PARITY_SAMPLES:-200}
BATCH=${BATCH:-64}
DTYPE=${DTYPE:-bfloat16}
PY=${PYTHON:-python3}
# shellcheck source=scripts/gpu/with_dtype.sh
source "$(dirname "${BASH_SOURCE[0]}")/with_dtype.sh"
MODELS=$(with_dtype "$ROWS")
COMMON=(--suites sniah --context-length 4096 --device cuda --batch-size "$BATCH" --models "$MODELS")
nvidia-smi --query-gpu=name,memory.total --format=csv || true
for stage in $STAGES; do
    case $stage in
    speed)
        golinear run "${COMMON[@]}" --num-samples "$SAMPLES" --store "$OUT_DIR/speed"
        $PY scripts/gpu/eval_speed.py "$OUT_DIR/speed" --out "$OUT_DIR/eval-speed.md" ;;
    parity)
        golinear run "${COMMON[@]}" --tasks golinear_sniah_1 --num-samples "$PARITY_SAMPLES" --store "$OUT_DIR/fast"
        golinear run "${COMMON[@]}" --tasks golinear_sniah_1 --num-samples "$PARITY_SAMPLES" --generation reference \
            --store "$OUT_DIR/reference"
        $PY scripts/gpu/parity.py "$OUT_DIR/fast" "$OUT_DIR/reference" --out "$OUT_DIR/parity" ;;
    *) echo "unknown stage '$stage'; allowed: speed parity" >&2; exit 2 ;;
    esac
done
