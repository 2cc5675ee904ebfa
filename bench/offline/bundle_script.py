"""The script an offline bundle ships (`run.sh`): install from the bundle's wheels with no network, then run one
command with the bundle's data, checkpoints and output folder. Kept as text here so `golinear bundle` writes the
same script from a checkout or an installed copy."""

MANIFEST = "BUNDLE-SHA256SUMS"

# run.sh's check (python -I, before anything from the bundle runs): `check` refuses a file that differs from the
# manifest, one missing or added, a link, and an environment inside the bundle that run.sh did not make on this
# machine (its stamp: the device, inode and ctime of venv/bin/python, which no copy keeps); `mark` stamps it.
CHECK_PY = r"""
import hashlib, os, sys
mode, here, venv, out = sys.argv[1:5]
real = os.path.realpath
def fail(msg):
    print(f"golinear bundle: {msg}; nothing was run", file=sys.stderr)
    sys.exit(1)
try:
    with open(os.path.join(here, "%(m)s"), "rb") as f:
        manifest = f.read()
    want = dict(reversed(ln.split("  ", 1)) for ln in manifest.decode().splitlines())
except (OSError, ValueError, UnicodeDecodeError):
    fail("%(m)s is missing or unreadable (copy the bundle again)")
def stamp():
    st = os.lstat(os.path.join(venv, "bin", "python"))
    return f"{hashlib.sha256(manifest).hexdigest()} {st.st_dev}:{st.st_ino}:{st.st_ctime_ns}\n"
if mode == "mark":
    with open(os.path.join(venv, ".golinear-installed"), "w") as f:
        f.write(stamp())
    sys.exit(0)
inside = real(venv).startswith(real(here) + os.sep)
if inside and os.path.lexists(venv):
    try:
        with open(os.path.join(venv, ".golinear-installed")) as f:
            ok = f.read() == stamp()
    except OSError:
        ok = False
    if not ok:
        fail(f"{venv} was not made on this machine by run.sh (or its install broke off); remove it and call run.sh again")
skip = {real(out)} | ({real(venv)} if inside else set())
seen = set()
for root, dirs, files in os.walk(here):
    for d in list(dirs):
        p = os.path.join(root, d)
        if p == os.path.join(here, "ns") or (real(p) in skip and not os.path.islink(p)):
            dirs.remove(d)  # made by run.sh itself (ns/ is made again on every call)
        elif os.path.islink(p):
            fail(f"{os.path.relpath(p, here)} is a link, which the bundle does not hold")
    for name in files:
        p = os.path.join(root, name)
        rel = "./" + os.path.relpath(p, here)
        if rel == "./%(m)s":
            continue
        if os.path.islink(p) or rel not in want:
            fail(f"{rel[2:]} is not one of the bundle's files ({'a link' if os.path.islink(p) else 'added after it was built'})")
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != want[rel]:
            fail(f"{rel[2:]} differs from the sha256 recorded when the bundle was built (copy the bundle again)")
        seen.add(rel)
missing = sorted(set(want) - seen)
if missing:
    fail(f"{missing[0][2:]} is missing ({len(missing)} files listed in %(m)s are)")
""" % {"m": MANIFEST}

RUN_SH = r'''#!/usr/bin/env bash
# golinear offline bundle: checks every file of this folder against BUNDLE-SHA256SUMS, installs from its wheels
# (pip --no-index --require-hashes: no network needed), then
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
case "$VENV" in *[\"\$\`\\]* | *$'\n'*)
  echo "golinear bundle: the environment's path $VENV holds one of \" \$ \` \\ or a newline, which pip's launchers would hand to a shell; set GOLINEAR_VENV to a path without them" >&2
  exit 2;;
esac
PY="${PYTHON:-python3}"
CHECK_PY="$(cat <<'CHECK'
@CHECK_PY@
CHECK
)"
# every file of the bundle as it was when it was built (BUNDLE-SHA256SUMS), none added, before anything runs
"$PY" -I -c "$CHECK_PY" check "$HERE" "$VENV" "$OUT_DIR" || exit 1
if [ ! -f "$VENV/.golinear-installed" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --no-index --require-hashes --find-links "$HERE/wheels" \
    -r "$HERE/requirements-hashed.txt"
  if [ -s "$HERE/requirements-nodeps-hashed.txt" ]; then
    "$VENV/bin/python" -m pip install --quiet --no-index --require-hashes --no-deps --find-links "$HERE/wheels" \
      -r "$HERE/requirements-nodeps-hashed.txt"
  fi
  # the launcher finds its python beside itself: no path is written into it
  printf '#!/bin/sh\nexec "${0%%/*}/python" -m golinear.bench.cli "$@"\n' > "$VENV/bin/golinear"
  chmod +x "$VENV/bin/golinear"
  "$PY" -I -c "$CHECK_PY" mark "$HERE" "$VENV" "$OUT_DIR"
fi
# the repository's folders are the golinear.bench / .models / .tasks namespace: linked under ns/golinear/
rm -rf "$HERE/ns" && mkdir -p "$HERE/ns/golinear"
for d in bench models tasks; do ln -sfn "$HERE/repo/$d" "$HERE/ns/golinear/$d"; done
export PATH="$VENV/bin:$PATH" PYTHONPATH="$HERE/ns:$HERE/repo${PYTHONPATH:+:$PYTHONPATH}"
export GOLINEAR_DATA="$HERE/data" GOLINEAR_CHECKPOINTS="$HERE/checkpoints" GOLINEAR_OUT="$OUT_DIR"
export PYTHONPYCACHEPREFIX="$VENV/pycache"  # no byte code read from or written into the bundle
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1
if [ -d "$HERE/triton-cache" ]; then  # a copy: the kernels Triton adds are written beside the environment
  [ -d "$VENV/triton-cache" ] || cp -R "$HERE/triton-cache" "$VENV/triton-cache"
  export TRITON_CACHE_DIR="$VENV/triton-cache"
fi
shopt -u patsub_replacement 2>/dev/null || true  # bash 5.2: '&' in OUT_DIR stays '&'
args=()
for a in "$@"; do args+=("${a//\{out\}/$OUT_DIR}"); done
cd "$HERE/repo"
"${args[@]}" 2>&1 | tee -a "$OUT_DIR/run.log"
exit "${PIPESTATUS[0]}"
'''.replace("@CHECK_PY@", CHECK_PY.strip())

UNPACK_SH = r'''#!/usr/bin/env bash
# Join the parts of a golinear bundle and unpack it here: bash unpack.sh [DEST] (default: .)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${1:-.}"
mkdir -p "$DEST"
cat "$HERE"/golinear-bundle.tar.part-* | tar -x -C "$DEST"
echo "unpacked into $DEST/golinear-bundle (next: bash $DEST/golinear-bundle/run.sh OUT_DIR COMMAND ...)"
'''
