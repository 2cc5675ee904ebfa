#!/usr/bin/env bash
# Here: the files a device call needs of some checkpoints (config.json, new_params.safetensors, train_config.json and
# scorer.safetensors where there is one),
# copied into a gitignored folder to carry as device_eval.sh's CKPT (docs/study.md): a store cell names a
# checkpoint by folder name and the hash of its first two files, not by path. A folder the working tree lacks (the
# sparse checkout of a device session leaves checkpoints out) is read from the commit (HEAD), so packing never waits
# for a wider checkout while a warm machine idles.
# Usage: bash scripts/study/pack_checkpoints.sh DEST NAME...   (names under checkpoints/smollm2-135m)
set -euo pipefail
DEST=$1; shift; SRC=${SRC:-checkpoints/smollm2-135m}
for n in "$@"; do
  mkdir -p $DEST/$n
  for f in config.json new_params.safetensors train_config.json; do
    if [ -f $SRC/$n/$f ]; then cp $SRC/$n/$f $DEST/$n/$f.tmp
    elif git cat-file -e HEAD:$SRC/$n/$f 2>/dev/null; then git show HEAD:$SRC/$n/$f > $DEST/$n/$f.tmp
    else echo "pack_checkpoints: no checkpoint $SRC/$n ($f missing in the working tree and in HEAD)"; rm -rf $DEST/$n; exit 2
    fi
    mv $DEST/$n/$f.tmp $DEST/$n/$f
  done
  f=scorer.safetensors  # a fitted retention scorer's copy (retain_score=fitted), where the checkpoint has one
  if [ -f $SRC/$n/$f ]; then cp $SRC/$n/$f $DEST/$n/$f
  elif git cat-file -e HEAD:$SRC/$n/$f 2>/dev/null; then git show HEAD:$SRC/$n/$f > $DEST/$n/$f.tmp && mv $DEST/$n/$f.tmp $DEST/$n/$f
  fi
done
echo "$# checkpoints in $DEST ($(du -s --block-size=1M $DEST | cut -f1) MiB)"
