#!/usr/bin/env bash
# Here, once per development machine: the wheel folders the device scripts carry (docs/gpu.md), listed in
# scripts/gpu/wheels.txt, for the lent machine's Python (PYV, default 3.12). A package with a wheel for that Python
# is downloaded as is; a pure-Python sdist (rouge_score, sqlitedict, word2number) is built into a py3 wheel here.
# Usage: bash scripts/gpu/prepare_wheels.sh   Env: PIP (default .venv/bin/pip), PYV.
set -euo pipefail
PIP=${PIP:-.venv/bin/pip}; PYV=${PYV:-3.12}
grep -v '^#' scripts/gpu/wheels.txt | while read -r dir pkg; do
  [ -z "$dir" ] && continue
  if [[ "$pkg" != *==* ]]; then
    ver=$($PIP show "$pkg" 2>/dev/null | awk '/^Version:/ {print $2}')
    [ -n "$ver" ] || { echo "prepare_wheels: $pkg is not installed in $PIP's environment (run make install)"; exit 2; }
    pkg="$pkg==$ver"
  fi
  mkdir -p "$dir"
  $PIP download -q --no-deps --only-binary=:all: --python-version "$PYV" -d "$dir" "$pkg" 2>/dev/null \
    || $PIP wheel -q --no-deps -w "$dir" "$pkg" 2>/dev/null \
    || { echo "prepare_wheels: no wheel for $pkg (Python $PYV)"; exit 2; }
done
for d in $(grep -v '^#' scripts/gpu/wheels.txt | awk 'NF {print $1}' | sort -u); do
  echo "$d: $(ls $d/*.whl | wc -l) wheels, $(du -sh $d | cut -f1)"
done
