#!/bin/bash
# Issue #17, retention slots on the GPU (docs/retention.md): one H200 call (carry [".whl"]; for (p) the GGUF too,
# joined by earlier calls, and the checkpoint CK in the tree), in this order:
#   (p) the phases of batched generation with slots on a trained checkpoint at 4K (scripts/bench_retention_generate.py);
#   (c1) the latency rows at Llama-3.1-8B dims, bf16, batch 8, T 1024..32768, GOLINEAR_FUSED_DECODE=auto, of the
#       retention config at the default recipe's budget 64 (sinks 8 + window 28 + retain 28, proj_residual;
#       RetentionDecoder: the prompts prefilled in one pass, then the in-place step in a CUDA graph, compiled where
#       GOLINEAR_FUSED_DECODE says so). 2026-12-02: ~120 s to 16K on a fresh machine (compilation included), the
#       32K row ~70 s more (timed prefills 0.7 + 2.0 + 13.3 + 48.2 s);
#   (a) the GPU tests of the op and of batched decoding (tests/test_retention.py and
#       tests/test_retention_generate.py, -k "$TESTS_K", default gpu; 170 s on 2026-12-01, most of it FLA's first
#       compile; cut at 205 s on 2026-12-03; 9 passed in 294 s on 2026-12-04 beside six evaluation workers,
#       delta_error's backward walk alone 93 s: give them ~450 s);
#   (c2) gdn-default's rows beside them (~50 s on a warm Triton cache);
#   (b) scripts/bench_retention.py: the op's forward/backward against the default recipe at T 4096, budget 128,
#       bf16 (~110 s: delta_error's walk is ~80K launches a pass).
# The 32K retention row is what the issue asks for, so it runs first. Each part is under `timeout` with what is
# left of BUDGET_S; rows land in $OUT/latency/latency.csv (+ .md, .png), logs in $OUT/*.log.
# Usage: bash scripts/gpu/retention_check.sh   Env: BUDGET_S (default 560), PARTS (default "p c1 a c2 b": which parts
# run, e.g. PARTS="c1 c2" for the issue's latency rows alone), TESTS_K (part a's pytest -k, e.g. "gpu and fitted")
set -u
OUT=${OUT:-/tmp/golinear-out}; mkdir -p "$OUT/latency"
BUDGET_S=${BUDGET_S:-560}; left() { echo $((BUDGET_S - SECONDS)); }
PARTS=${PARTS:-p c1 a c2 b}; part() { [[ " $PARTS " == *" $1 "* ]]; }
cap() { local n=$(( $(left) - $1 )); echo $(( n > 1 ? n : 1 )); }  # seconds left minus a reserve, >= 1 (timeout 0: none)
source scripts/gpu/device_setup.sh > /dev/null || exit 1  # the carried wheels in /tmp/site, one Triton cache per machine
RETAIN="gdn-default,window=28,retain=28,retain_score=proj_residual"  # budget 64 = gdn-default's sinks 8 + window 56

LATENCY="python3 -m bench.latency --model llama-3.1-8b --batch 8 --lengths 1024,4096,16384,32768 --device cuda \
  --dtype bfloat16 --out-dir $OUT/latency"  # rows of both runs merge into one latency.csv
# (p) why S-NIAH with slots made no progress on the H200 (2026-12-01: four processes beside five others, no batch
# of 32 4K prompts in 500 s; docs/retention.md): one trained checkpoint's phases alone, compiled step and eager
CK=${CK:-checkpoints/smollm2-135m/gdn-w248-s8-sc}
if part p && [ -f $CK/config.json ]; then  # the one-pass prefill, then (auto only) each prompt alone; stacks every 45 s
  for fused in auto 0; do
    echo "== (p) retention generate phases, GOLINEAR_FUSED_DECODE=$fused, at ${SECONDS}s"
    GOLINEAR_FUSED_DECODE=$fused timeout $(cap 420) python3 scripts/bench_retention_generate.py --device cuda \
      --dtype bfloat16 --checkpoint $CK --window 124 --retain 124 --batch 16 --length 4096 --new 16 --no-alone \
      --dump-every 45 $([ $fused = auto ] && echo --each) > $OUT/phases_$fused.log 2>&1
    echo "rc=$?"; grep -E "batch [12]:|Error|error" $OUT/phases_$fused.log | tail -6
  done
fi
if part c1; then
echo "== (c1) latency, retention at ${SECONDS}s"
GOLINEAR_FUSED_DECODE=auto timeout $(cap $(part c2 && echo 120 || echo 5)) $LATENCY --configs "$RETAIN"  # c2 keeps 120 s > $OUT/latency_retain.log 2>&1
echo "latency rc=$?"; grep -E "T=|Error|error|Traceback" $OUT/latency_retain.log | tail -8
fi

if part a; then
echo "== (a) GPU tests at ${SECONDS}s"
timeout $(cap $( (part c2 || part b) && echo 120 || echo 5)) python3 -m pytest -q -s -p no:cacheprovider tests/test_retention.py \
  tests/test_retention_generate.py -k "${TESTS_K:-gpu}" > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "retention_prefill T=|default recipe|passed|failed|error" $OUT/tests.log | tail -8
fi

if part c2; then
echo "== (c2) latency, gdn-default at ${SECONDS}s"
GOLINEAR_FUSED_DECODE=auto timeout $(cap 60) $LATENCY --configs gdn-default > $OUT/latency_default.log 2>&1
echo "latency rc=$?"; grep -E "T=|Error|error|Traceback" $OUT/latency_default.log | tail -8
fi

if part b; then
echo "== (b) bench_retention.py at ${SECONDS}s"
timeout $(cap 5) python3 scripts/bench_retention.py --device cuda --dtype bfloat16 --T 4096 --window 60 \
  --retain 60 --repeats 2 > $OUT/bench_retention.log 2>&1
echo "bench rc=$?"; tail -5 $OUT/bench_retention.log
fi

echo "== summary at ${SECONDS}s"
python3 - "$OUT/latency/latency.csv" <<'EOF'
import csv, sys
try:
    rows = list(csv.DictReader(open(sys.argv[1])))
except FileNotFoundError:
    sys.exit("no latency.csv")
for r in rows:
    print(f"{r['config']:>40} T={r['length']:>6} B={r['batch']} {r['status']}: decode {r['decode_ms_per_token']} ms/token"
          f" (bound {r['decode_bound_ms']}, graph {r['cuda_graph']}), prefill {r['prefill_s']} s, peak {r['peak_gib']} GiB")
EOF
echo "done at ${SECONDS}s"
