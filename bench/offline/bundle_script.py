"""The script an offline bundle ships (`run.sh`): install from the bundle's wheels with no network, then run one
command with the bundle's data, checkpoints and output folder. Kept as text here so `golinear bundle` writes the
same script from a checkout or an installed copy."""

RUN_SH = r'''#!/usr/bin/env bash
# golinear offline bundle: installs from the wheels in this folder (pip --no-index: no network needed; each wheel
# checked against the sha256 recorded when the bundle was built, pip --require-hashes), then
# runs one command from the bundled repository with the bundled data and checkpoints.
#
#   bash run.sh OUT_DIR COMMAND [ARGS...]
#
# OUT_DIR is created; the text {out} in ARGS is replaced by its absolute path, e.g.
#   bash run.sh /scratch/$USER/golinear-out golinear latency --out-dir {out}/latency
# The first call creates the virtual environment (./venv, or $GOLINEAR_VENV) with $PYTHON (default python3).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ $# -lt 2 ]; then
  echo "usage: bash run.sh OUT_DIR COMMAND [ARGS...]  (e.g. bash run.sh out golinear run --store {out}/store)" >&2
  exit 2
fi
mkdir -p "$1"
OUT_DIR="$(cd "$1" && pwd)"
shift
VENV="${GOLINEAR_VENV:-$HERE/venv}"
if [ ! -f "$VENV/.golinear-installed" ]; then
  # every wheel as it was when the bundle was built (its sha256), before pip opens any of them
  bad="$(cd "$HERE/wheels" && sha256sum -c SHA256SUMS 2>/dev/null | grep -v ': OK$' | head -n 1 || true)"
  if [ -n "$bad" ] || [ ! -s "$HERE/wheels/SHA256SUMS" ]; then
    echo "golinear bundle: wheels/${bad%%:*} differs from the sha256 recorded when the bundle was built; nothing was installed (copy the bundle again)" >&2
    exit 1
  fi
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --no-index --require-hashes --find-links "$HERE/wheels" \
    -r "$HERE/requirements-hashed.txt"
  if [ -s "$HERE/requirements-nodeps-hashed.txt" ]; then
    "$VENV/bin/python" -m pip install --quiet --no-index --require-hashes --no-deps --find-links "$HERE/wheels" \
      -r "$HERE/requirements-nodeps-hashed.txt"
  fi
  printf '#!/bin/sh\nexec "%s/bin/python" -m golinear.bench.cli "$@"\n' "$VENV" > "$VENV/bin/golinear"
  chmod +x "$VENV/bin/golinear"
  touch "$VENV/.golinear-installed"
fi
# the repository's folders are the golinear.bench / .models / .tasks namespace: linked under ns/golinear/
mkdir -p "$HERE/ns/golinear"
for d in bench models tasks; do ln -sfn "$HERE/repo/$d" "$HERE/ns/golinear/$d"; done
export PATH="$VENV/bin:$PATH" PYTHONPATH="$HERE/ns:$HERE/repo${PYTHONPATH:+:$PYTHONPATH}"
export GOLINEAR_DATA="$HERE/data" GOLINEAR_CHECKPOINTS="$HERE/checkpoints" GOLINEAR_OUT="$OUT_DIR"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1
if [ -d "$HERE/triton-cache" ]; then export TRITON_CACHE_DIR="$HERE/triton-cache"; fi
shopt -u patsub_replacement 2>/dev/null || true  # bash 5.2: '&' in OUT_DIR stays '&'
args=()
for a in "$@"; do args+=("${a//\{out\}/$OUT_DIR}"); done
cd "$HERE/repo"
"${args[@]}" 2>&1 | tee -a "$OUT_DIR/run.log"
exit "${PIPESTATUS[0]}"
'''

UNPACK_SH = r'''#!/usr/bin/env bash
# Join the parts of a golinear bundle and unpack it here: bash unpack.sh [DEST] (default: .)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${1:-.}"
mkdir -p "$DEST"
cat "$HERE"/golinear-bundle.tar.part-* | tar -x -C "$DEST"
echo "unpacked into $DEST/golinear-bundle (next: bash $DEST/golinear-bundle/run.sh OUT_DIR COMMAND ...)"
'''
