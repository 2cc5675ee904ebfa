#!/usr/bin/env bash
# leaderboards/kv-compression.{md,csv,png} and kv-compression-paired.csv: linearize or compress the KV cache, S-NIAH
# at 4K with 500 samples a task, every press beside the linearized rows, each cell with its per-sample scores.
#   bash run.sh OUT_DIR bash scripts/gpu/kv_compression.sh {out} [STAGE...]     (inside a `golinear bundle`, docs/offline.md)
# Stages (default: sniah ruler latency; each resumable: finished cells are skipped):
#   sniah     every press, the window and the linearized rows at budgets 256 and 1024
#   sniah512  the three best of each family at 512: TOP_PRESSES and TOP_LINEAR_512 (read them off the 256/1024 table)
#   ruler     RULER's eight tasks at 1024, RULER_SAMPLES (100) a task: TOP_PRESSES and TOP_LINEAR_1024
#   latency   Llama-3.1-8B dimensions: TOP_PRESSES at 1024 with and without a chunked prefill, and the best press
#             at 256 and at 512 (BEST_PRESS_256, BEST_PRESS_512: the trade-off table states each budget's best press
#             as it ran), beside full-static and gdn-default, 4K and 32K, batch 1 and LATENCY_BATCH (8 where full
#             attention at 32K fits, else 4)
# DRY_RUN=1: each evaluation stage's `golinear run --dry-run` instead (the cells OUT_DIR/store still lacks and their
# time at the speeds it measured; nothing is evaluated), the latency stage skipped.
# Then: golinear store merge OUT_DIR/store --store leaderboards/store (a kept cell without per-sample scores takes them
# from the same cell measured again) and golinear leaderboard --store leaderboards/store --out leaderboards.
# Rows fitted to the test's needle format (the numbers retention scorer) are not in the comparison.
set -euo pipefail
OUT_DIR=${1:?usage: kv_compression.sh OUT_DIR [sniah|sniah512|ruler|latency ...]}; shift
STAGES=${*:-sniah ruler latency}
TOP_PRESSES=${TOP_PRESSES:-kvzip,compactor,lagkv}  # the best three at 1024 in leaderboards/kv-compression.md
BEST_PRESS_256=${BEST_PRESS_256:-compactor}  # the best press at 256 and at 512 in leaderboards/kv-compression.md
BEST_PRESS_512=${BEST_PRESS_512:-compactor}
TOP_LINEAR_512=${TOP_LINEAR_512:-gdn-w504-s8-sc;gdn-w504-s8-sc,window=252,retain=252,retain_score=proj_residual}
TOP_LINEAR_1024=${TOP_LINEAR_1024:-gdn-w1016-s8-sc;gdn-w508-s8-r508-fit-sc}
LATENCY_BATCH=${LATENCY_BATCH:-8}
ALL_PRESSES="streaming_llm knorm snapkv tova expected_attention keydiff lagkv compactor adakv_snapkv
adakv_expected_attention criticalkv_snapkv criticalkv_expected_attention kvzip"
# a larger batch amortises a decode step's kernel launches over more samples (leaderboards/eval-profile.md); scores do
# not depend on it
EVAL_BATCH=${EVAL_BATCH:-64}
# every row in one dtype (bf16: in float32 a batched prefill's attention has no fused kernel for grouped KV heads and
# falls back to one that holds the whole attention matrix)
DTYPE=${DTYPE:-bfloat16}
# shellcheck source=scripts/gpu/with_dtype.sh
source "$(dirname "${BASH_SOURCE[0]}")/with_dtype.sh"
# RULER's eight tasks at 100 samples a task: 800 paired samples a row (S-NIAH: 3 x 500)
RULER_SAMPLES=${RULER_SAMPLES:-100}
COMMON=(--context-length 4096 --store "$OUT_DIR/store" --device cuda --batch-size "$EVAL_BATCH")
run() {  # run SUITE SPECS [SAMPLES]
    golinear run --suites "$1" "${COMMON[@]}" --num-samples "${3:-500}" --models "$(with_dtype "$2")" \
        ${DRY_RUN:+--dry-run}
}
nvidia-smi --query-gpu=name,memory.total --format=csv || true

presses() {  # presses() BUDGET NAME... -> ';'-separated press specs
    local b=$1; shift
    local out=""
    for p in "$@"; do out+="press=$p,kv_budget=$b;"; done
    echo "${out%;}"
}

for stage in $STAGES; do
    case $stage in
    sniah)
        run sniah "full;$(presses 256 $ALL_PRESSES);mechanism=none,window=248,sinks=8;gdn-w248-s8-sc;\
gdn-w124-s8-r124-fit-sc;gdn-w248-s8-sc,window=124,retain=124,retain_score=proj_residual"
        run sniah "$(presses 1024 $ALL_PRESSES);mechanism=none,window=1016,sinks=8;gdn-w1016-s8-sc;\
gdn-w508-s8-r508-fit-sc;gdn-w1016-s8-sc,window=508,retain=508,retain_score=proj_residual" ;;
    sniah512)
        run sniah "$(presses 512 ${TOP_PRESSES//,/ });mechanism=none,window=504,sinks=8;$TOP_LINEAR_512" ;;
    ruler)
        run ruler "full;$(presses 1024 ${TOP_PRESSES//,/ });$TOP_LINEAR_1024" "$RULER_SAMPLES" ;;
    latency)
        [ -z "${DRY_RUN:-}" ] || continue
        configs="full-static;gdn-default;press=$BEST_PRESS_256,kv_budget=256;press=$BEST_PRESS_512,kv_budget=512"
        for p in ${TOP_PRESSES//,/ }; do
            configs+=";press=$p,kv_budget=1024"
            case $p in adakv_*|criticalkv_*|kvzip|compactor) ;; *)  # these refuse prefill_chunk (models/spec/values.py)
                configs+=";press=$p,kv_budget=1024,prefill_chunk=4096" ;; esac
        done
        golinear latency --device cuda --configs "$configs" --lengths 4096,32768 --batch "1,$LATENCY_BATCH" \
            --out-dir "$OUT_DIR/latency" ;;
    *) echo "kv_compression.sh: unknown stage '$stage'; allowed: sniah sniah512 ruler latency" >&2; exit 2 ;;
    esac
done
