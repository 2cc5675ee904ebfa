#!/usr/bin/env bash
# Run HERE (CPU, repo root) before the device calls of issue #16; writes the gitignored .device/scaling/:
#   inputs/    (~4 MB, carried by the training calls) the llama-3.1-8b random-weight folder (config + SmolLM2
#              tokenizer + seed, no weights; qwen3-32b is made from it on the device), the books corpus
#              tokenized with that tokenizer (1M training tokens: every scaling run needs < 0.4M), manifest.env
#   chunk/NN/  the evaluation payload (SmolLM2 GGUF + .device/whl-eval wheels + the CR/LAMBADA/essay data),
#              one tar split into CHUNK_MB pieces: each call carries one piece, device_common.sh stashes it in
#              /tmp on the (warm) machine, device_eval.sh joins them.
# Env: CHUNK_MB (24), DATA (../shared/data), PY (.venv/bin/python).
set -euo pipefail
PY=${PY:-.venv/bin/python}; DATA=${DATA:-../shared/data}; CHUNK_MB=${CHUNK_MB:-24}
S=.device/scaling
rm -rf $S/inputs $S/chunk $S/payload && mkdir -p $S/inputs $S/chunk $S/payload/data
$PY -m models.random_base_write $S/inputs/llama-3.1-8b llama-3.1-8b --seed 0 --tokenizer-from smollm2-135m
$PY -m bench.cli train --prepare-only --base $S/inputs/llama-3.1-8b --tokens $S/inputs/tokens.npz \
  --data-dir $DATA --seq-len 4096 --steps 100 --prepare-train-tokens 1000000 --eval-sequences 2
# the evaluation payload
cat .gguf/?/smollm2.gguf.part? > $S/payload/smollm2.gguf  # the parts in order (A, B, ...)
GGUF_SHA=$(sha256sum $S/payload/smollm2.gguf | cut -d' ' -f1)
[ "$GGUF_SHA" = b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 ] || { echo "GGUF sha $GGUF_SHA"; exit 1; }
cp -r .device/whl-eval $S/payload/whl-eval
for d in arc hellaswag piqa winogrande lambada_openai paul_graham_essays; do cp -r $DATA/$d $S/payload/data/; done
cp $DATA/SHA256SUMS $DATA/README.md $S/payload/data/ 2>/dev/null || true
tar cf $S/payload.tar -C $S/payload . && rm -rf $S/payload
PAYLOAD_SHA=$(sha256sum $S/payload.tar | cut -d' ' -f1)
split -b ${CHUNK_MB}M -d -a 2 $S/payload.tar $S/chunk/part.
N=0; for f in $S/chunk/part.*; do n=${f##*.}; mkdir -p $S/chunk/$n && mv $f $S/chunk/$n/; N=$((N+1)); done
rm $S/payload.tar
printf 'GGUF_SHA=%s\nPAYLOAD_SHA=%s\nPAYLOAD_CHUNKS=%s\n' $GGUF_SHA $PAYLOAD_SHA $N > $S/inputs/manifest.env
TREE=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "tree $((TREE/1000000)) MB; inputs $(du -sm $S/inputs | cut -f1) MB; .whl $(du -sm .whl | cut -f1) MB; $N chunks:"
du -sm $S/chunk/*
echo "each call must stay under 64 MiB: tree + carried paths (see docs/scaling.md for the call sequence)"
