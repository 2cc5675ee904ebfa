#!/usr/bin/env bash
# Here, once: the data folders scripts/study/device_eval.sh reads, split so each fits a call beside the tree
# (.device/eval-data/std: CR, LAMBADA, MMLU ~9 MB; .device/eval-data/long: S-NIAH/RULER haystacks and QA ~6 MB;
# .device/eval-data/essays: S-NIAH's haystack alone, 0.66 MB, small enough to ride with the last GGUF parts).
# SHA256SUMS travels with both: a run checks every file it reads against it. Env: DATA (../shared/data).
set -euo pipefail
DATA=${DATA:-../shared/data}; E=.device/eval-data
rm -rf $E && mkdir -p $E/std $E/long $E/essays
for d in arc hellaswag piqa winogrande lambada_openai mmlu; do cp -r $DATA/$d $E/std/; done
for d in paul_graham_essays squad_v2 hotpotqa_sample100; do cp -r $DATA/$d $E/long/; done
cp -r $DATA/paul_graham_essays $E/essays/
for d in std long essays; do cp $DATA/SHA256SUMS $E/$d/; done
TREE=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "tree $((TREE / 1000000)) MB, .whl $(du -sm .whl | cut -f1) MB, .device/whl-eval $(du -sm .device/whl-eval | cut -f1) MB, GGUF part 20 MB"
du -sm $E/std $E/long $E/essays; echo "a call carries at most 67.1 MB (64 MiB) with the tree"
