#!/usr/bin/env bash
# Here: the files a device call needs of some checkpoints (config.json, new_params.safetensors, train_config.json),
# copied into a gitignored folder to carry as device_eval.sh's CKPT (docs/study.md): a store cell names a
# checkpoint by folder name and the hash of its first two files, not by path.
# Usage: bash scripts/study/pack_checkpoints.sh DEST NAME...   (names under checkpoints/smollm2-135m)
set -euo pipefail
DEST=$1; shift; SRC=${SRC:-checkpoints/smollm2-135m}
for n in "$@"; do
  [ -f $SRC/$n/config.json ] || { echo "pack_checkpoints: no checkpoint $SRC/$n (config.json missing)"; exit 2; }
  mkdir -p $DEST/$n && cp $SRC/$n/{config.json,new_params.safetensors,train_config.json} $DEST/$n/
done
echo "$# checkpoints in $DEST ($(du -s --block-size=1M $DEST | cut -f1) MiB)"
