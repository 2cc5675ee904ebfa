#!/usr/bin/env bash
# leaderboards/generation.{csv,md}: generation throughput on S-NIAH-1 at 4K, full attention against the batched
# linearized decoder, with the parity check.
#   bash run.sh OUT bash scripts/gpu/generation.sh {out}      (inside a `golinear bundle --suites sniah`)
set -euo pipefail
OUT_DIR=${1:?usage: generation.sh OUT_DIR [golinear generation options]}; shift
golinear generation --device cuda --context-length 4096 --samples 200 --sequential-samples 20 --batch-size 32 \
  --parity 200 --out-dir "$OUT_DIR/generation" "$@"
