#!/usr/bin/env bash
# leaderboards/latency.{csv,md,png}: the latency and memory sweep of Llama-3.1-8B's shape on one GPU.
#   bash run.sh OUT bash scripts/gpu/latency.sh {out}        (inside a `golinear bundle`, docs/offline.md)
# then copy OUT/latency/latency.csv over leaderboards/latency.csv and run `golinear latency --render-only
# --out-dir leaderboards`.
set -euo pipefail
OUT_DIR=${1:?usage: latency.sh OUT_DIR [golinear latency options]}; shift
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv || true
golinear latency --device cuda --out-dir "$OUT_DIR/latency" "$@"
