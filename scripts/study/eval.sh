#!/usr/bin/env bash
# The study's evaluated rows (leaderboards/store): full attention and the named checkpoints on the given suites
# at the study's settings (full test sets; S-NIAH and RULER at 4K, 500 samples, seed 42), into OUT/store.
#   bash run.sh OUT bash scripts/study/eval.sh {out} cr,mmlu,lambada gdn-w56-s8-sc gdn-w120-s8-sc
# (bundle with --suites and --checkpoints). Then, here: golinear store merge OUT/store --store leaderboards/store
set -euo pipefail
OUT_DIR=${1:?usage: eval.sh OUT_DIR SUITES CHECKPOINT...}; SUITES=${2:?suites, e.g. cr,mmlu,lambada}; shift 2
MODELS="full"
for name in "$@"; do MODELS="$MODELS;$name"; done
golinear run --models "$MODELS" --suites "$SUITES" --store "$OUT_DIR/store" --device cuda --context-length 4096 \
  --num-samples 500 --seed 42
