#!/usr/bin/env bash
# The study's checkpoints (checkpoints/smollm2-135m/*): `golinear train` for each named recipe of
# scripts/study/recipes.txt on the paper's 10M tokens, into OUT/<name>. A run stopped early resumes from its
# saved state when started again with the same OUT.
#   bash run.sh OUT bash scripts/study/train.sh {out} gdn-w56-s8-sc gdn-w120-s8-sc   (bundle with --train-data)
# TRAIN_ARGS: options added to every run, e.g. "--stop-at-s 3300" under a one-hour job limit (then start it again).
set -euo pipefail
OUT_DIR=${1:?usage: train.sh OUT_DIR RECIPE...}; shift
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for name in "$@"; do
  args=$(awk -v n="$name" '$1 == n {$1=""; print}' "$HERE/recipes.txt")
  if [ -z "$args" ]; then echo "unknown recipe $name (see scripts/study/recipes.txt)" >&2; exit 2; fi
  # shellcheck disable=SC2086  # the recipe's options are words
  golinear train --base smollm2-135m --tokens "$OUT_DIR/books-smollm2-10m.npz" --out "$OUT_DIR/$name" --save-every 100 \
    --note "study run (scripts/study/recipes.txt)" $args ${TRAIN_ARGS:-}
done
