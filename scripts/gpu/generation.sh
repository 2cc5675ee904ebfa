#!/usr/bin/env bash
# leaderboards/generation.{csv,md}: generation throughput on S-NIAH-1 at 4K at equal work (stop rules off, the same
# new tokens a sample): HF generate and the static-cache decoder for full attention, the batched linearized decoder
# (the default recipe's checkpoint) and the press rows TOP_PRESSES at 1024 on the same decoder, with the parity check.
#   bash run.sh OUT bash scripts/gpu/generation.sh {out}      (inside a `golinear bundle --suites sniah`)
set -euo pipefail
OUT_DIR=${1:?usage: generation.sh OUT_DIR [golinear generation options]}; shift
TOP_PRESSES=${TOP_PRESSES:-snapkv,kvzip,adakv_expected_attention}
presses=""
for p in ${TOP_PRESSES//,/ }; do presses+="press=$p,kv_budget=1024;"; done
golinear generation --device cuda --context-length 4096 --samples 200 --sequential-samples 20 --batch-size 32 \
  --rows "full;full-static;linear;linear-sequential;press;full-static-evaluated;linear-evaluated;press-evaluated" \
  --presses "${presses%;}" --parity 200 --out-dir "$OUT_DIR/generation" "$@"
