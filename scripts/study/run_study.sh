#!/usr/bin/env bash
# The study, regenerated from nothing with the suite's own commands. Every stage resumes:
# `golinear train` continues an unfinished run folder and reports a finished one; `golinear run` skips cells
# already in the store. Run on a CUDA machine (the stages' GPU times are in docs/study.md).
# Usage: bash scripts/study/run_study.sh STAGE...   stages: train standard mmlu sniah ruler hybrid diagnose render
# Env: DEVICE (cuda), BATCH (auto), STORE (leaderboards/store), CKPT (checkpoints/smollm2-135m),
#      TOKENS (runs/train/books-smollm2-10m.npz, prepared once by `golinear train --prepare-only`), DATA (data dir)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEVICE=${DEVICE:-cuda}; BATCH=${BATCH:-auto}; STORE=${STORE:-leaderboards/store}; CKPT=${CKPT:-checkpoints/smollm2-135m}
TOKENS=${TOKENS:-runs/train/books-smollm2-10m.npz}
G="golinear"; command -v golinear >/dev/null || G="python -m golinear.bench.cli"
DATA_ARGS=(); [ -n "${DATA:-}" ] && DATA_ARGS=(--data-dir "$DATA")
RECIPES=scripts/study/recipes.txt
names() { grep -v '^#' $RECIPES | awk 'NF {print $1}' | grep -E "${1:-.}" || true; }
specs() {  # full attention and each named checkpoint that is trained (the others named on stderr)
  local s="full"
  for n in "$@"; do
    if [ -f "$CKPT/$n/config.json" ]; then s="$s;$CKPT/$n"; else echo "not trained yet, left out: $n" >&2; fi
  done
  echo "$s"
}
run() { $G run --store "$STORE" --device "$DEVICE" --batch-size "$BATCH" "${DATA_ARGS[@]}" "$@"; }

for stage in "$@"; do
  echo "== stage $stage"
  case $stage in
    train)  # every recipe line: 2,500 steps x 4,096 tokens (10M), the `golinear train` defaults
      for n in $(names); do
        $G train --tokens "$TOKENS" --out "$CKPT/$n" "${DATA_ARGS[@]}" $(awk -v n="$n" '$1 == n {$1=""; print}' $RECIPES)
      done ;;
    standard)  # Tables 1-3: zero-shot CR (full test sets) and LAMBADA for full attention, every checkpoint, the controls
      run --models "$(specs $(names '^(gla|kgla|gdn|hedgehog|control)'))" --suites cr,lambada ;;
    mmlu)  # 5-shot MMLU: full attention, the final recipes (short conv, LoRA, default at budget 128), the control
      run --models "$(specs gdn-w56-s8-sc gdn-w56-s8-lora gdn-w120-s8-sc control-lora-r5)" --suites mmlu ;;
    sniah)  # Table 8: the default recipe trained at each budget, the untrained window + sinks at the same budgets
      M="full"; for b in 128 256 512 1024; do M="$M;$CKPT/gdn-w$((b - 8))-s8-sc;mechanism=none,window=$((b - 8)),sinks=8"; done
      run --models "$M" --suites sniah --context-length 4096 --num-samples 500 ;;
    ruler)  # Table 9: the extended RULER at 4K, budgets 128 and 1024 (HQA has 100 questions)
      run --models "full;$CKPT/gdn-w120-s8-sc;$CKPT/gdn-w1016-s8-sc;mechanism=none,window=120,sinks=8;mechanism=none,window=1016,sinks=8" \
          --suites ruler --context-length 4096 --num-samples 500 ;;
    hybrid)  # Figure 5: strict GDN with 10-50 % full-attention layers, uniform vs hardness-selected
      run --models "$(specs $(names '^gdn(-seed[12])?$|^gdn-full'))" --suites cr,lambada ;;
    diagnose)  # Figures 2-3: the four strict mechanisms before and after training
      $G diagnose "${DATA_ARGS[@]}" --device "$DEVICE" --out "$CKPT/diagnostics" \
        --checkpoint "$CKPT/gla" --checkpoint "$CKPT/kgla" --checkpoint "$CKPT/gdn" --checkpoint "$CKPT/hedgehog" ;;
    render)
      $G leaderboard --store "$STORE" --out leaderboards ;;
    *) echo "unknown stage $stage (train standard mmlu sniah ruler hybrid diagnose render)"; exit 2 ;;
  esac
done
