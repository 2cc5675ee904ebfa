#!/usr/bin/env bash
# Here, after a scripts/study/device_eval.sh call: add its returned cells to the committed store and keep the
# unfinished cells' request caches for the next call. Usage: bash scripts/study/merge_eval.sh FILES_AT [STORE]
# (FILES_AT: the folder the call's $OUT files came back to; STORE: default leaderboards/store; env PARTIAL: where the
# request caches go, default .device/eval-partial).
# Then carry .device/eval-partial in the next call, and commit the store (git add leaderboards/store).
set -euo pipefail
AT=$1; STORE=${2:-leaderboards/store}; PARTIAL=${PARTIAL:-.device/eval-partial}
PY=${PY:-.venv/bin/python}; [ -x $PY ] || PY=python3
TMP=$(mktemp -d); trap 'rm -rf $TMP' EXIT
mkdir -p $TMP/store/cells && tar xzf $AT/cells.tgz -C $TMP/store
$PY -m bench.cli store merge $TMP/store --store $STORE
$PY -m bench.cli store stale --store $STORE || true  # lists the cells of a checkpoint retrained in place (drop: --drop)
PARTS=$(ls $AT/partial.tgz.part-* 2>/dev/null || ls $AT/partial.tgz 2>/dev/null || true)  # (calls before session 23: one file)
if [ -n "$PARTS" ]; then  # laid over the kept caches: a call that was not carried them returns none of them
  mkdir -p $PARTIAL && cat $PARTS | tar xzf - -C $PARTIAL
  echo "request caches of unfinished cells: $(find $PARTIAL -name '*.db' | wc -l) files, $(du -sh $PARTIAL | cut -f1) (carry $PARTIAL)"
fi
