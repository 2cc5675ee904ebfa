#!/usr/bin/env bash
# Here, after a scripts/study/device_eval.sh call: add its returned cells to the committed store and keep the
# unfinished cells' request caches for the next call. Usage: bash scripts/study/merge_eval.sh FILES_AT [STORE]
# (FILES_AT: the folder the call's $OUT files came back to; STORE: default leaderboards/store).
# Then carry .device/eval-partial in the next call, and commit the store (git add leaderboards/store).
set -euo pipefail
AT=$1; STORE=${2:-leaderboards/store}
PY=${PY:-.venv/bin/python}; [ -x $PY ] || PY=python3
TMP=$(mktemp -d); trap 'rm -rf $TMP' EXIT
mkdir -p $TMP/store/cells && tar xzf $AT/cells.tgz -C $TMP/store
$PY -m bench.cli store merge $TMP/store --store $STORE
if [ -f $AT/partial.tgz ]; then  # laid over the kept caches: a call that was not carried them returns none of them
  mkdir -p .device/eval-partial && tar xzf $AT/partial.tgz -C .device/eval-partial
  echo "request caches of unfinished cells: $(find .device/eval-partial -name '*.db' | wc -l) files, $(du -sh .device/eval-partial | cut -f1) (carry .device/eval-partial)"
fi
