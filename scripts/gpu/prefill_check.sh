#!/bin/bash
# Issue #14, the gdn-default prefill at 32K: (a) models/prefill.py: one copy of [sinks | window tail | chunk keys],
# the window added straight into GDN's output; (b) models/fast_decode.py: the decode step's fused glue (residual add
# + RMSNorm, SiLU * up) in the prefill, under GOLINEAR_FUSED_DECODE (auto = on for CUDA). One H200 call (carry
# [".whl"]) at Llama-3.1-8B dims, random bf16 weights, batch 8, 32K. Expected times on a fresh machine (sweep of
# 2026-12-01: set-up ~70 s, 1-2.5 min of Triton compiling per FLA kernel configuration, prefills of 11 / 7.7 / 8.2 s):
#   1. bench.latency gdn-default;gdn;full, chunk 8192 (the leaderboard's setting), (a) + (b)  ~300 s -> $OUT/c8192/
#      (rows are merged one by one: the key row first, in case the timeout cuts the part)
#   2. gdn-default with GOLINEAR_FUSED_DECODE=0: (a) alone, against the leaderboard's 8.19 s   ~50 s -> $OUT/noglue/
#   3. the GPU tests of the chunked prefill (gdn, CUDA graph decode)                            ~40 s -> $OUT/tests.log
#   4. gdn-default with --prefill-chunk 16384, then 32768 (peak memory in the CSV)          ~60 s each -> $OUT/c16384/, c32768/
#   5. torch.profiler of one warm gdn-default and one gdn prefill (chunk 8192): top CUDA ops ~60 s each -> $OUT/profile.log
# Parts run while time is left (BUDGET_S); scripts/gpu/profile_prefill.py profiles SmolLM2-135M only, so 5 is inline.
# Usage: bash scripts/gpu/prefill_check.sh
# Env: BUDGET_S (default 560), SKIP_NOGLUE=1, SKIP_TESTS=1, SKIP_CHUNKS=1, SKIP_PROFILE=1
set -u
OUT=${OUT:-/tmp/golinear-out}; mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-560}; left() { echo $((BUDGET_S - SECONDS)); }
source scripts/gpu/device_setup.sh > /dev/null || exit 1  # the carried wheels in /tmp/site, one Triton cache per machine
BENCH="python3 -m bench.latency --model llama-3.1-8b --lengths 32768 --batch 8 --device cuda --dtype bfloat16 --new-tokens 4"
show() { grep -E "T= *32768|Error|error|Traceback" "$1" | tail -6; }
rows() { python3 -c "import pandas as pd, sys; d = pd.read_csv(sys.argv[1]); print(d[['config', 'prefill_chunk', 'prefill_s', 'peak_gib', 'status']].to_string(index=False))" "$1/latency.csv" 2>&1 | tail -5; }

echo "== 1. gdn-default;gdn;full, chunk 8192 at ${SECONDS}s"
timeout $(( $(left) - 170 )) $BENCH --configs "gdn-default;gdn;full" --out-dir $OUT/c8192 > $OUT/c8192.log 2>&1
echo "rc=$?"; show $OUT/c8192.log; rows $OUT/c8192

if [ "${SKIP_NOGLUE:-0}" != 1 ] && [ $(left) -gt 150 ]; then
  echo "== 2. gdn-default, GOLINEAR_FUSED_DECODE=0 at ${SECONDS}s"
  GOLINEAR_FUSED_DECODE=0 timeout $(( $(left) - 110 )) $BENCH --configs "gdn-default" --out-dir $OUT/noglue > $OUT/noglue.log 2>&1
  echo "rc=$?"; show $OUT/noglue.log; rows $OUT/noglue
fi

if [ "${SKIP_TESTS:-0}" != 1 ] && [ $(left) -gt 60 ]; then
  echo "== 3. tests at ${SECONDS}s ($(left) s left)"
  timeout $(( $(left) - 20 )) python3 -m pytest -v -s -p no:cacheprovider tests/test_gpu.py \
    -k "(fast_decoder_matches_forward_on_cuda or batched_generation_on_cuda) and gdn" > $OUT/tests.log 2>&1
  echo "tests rc=$?"; grep -E "PASSED|FAILED|ERROR|rel err|^=+ " $OUT/tests.log | tail -12
fi

if [ "${SKIP_CHUNKS:-0}" != 1 ]; then
  for c in 16384 32768; do
    [ $(left) -lt 150 ] && { echo "== skip chunk $c: $(left) s left"; continue; }
    echo "== 4. gdn-default, chunk $c at ${SECONDS}s"
    timeout $(( $(left) - 90 )) $BENCH --configs "gdn-default" --prefill-chunk $c --out-dir $OUT/c$c > $OUT/c$c.log 2>&1
    echo "rc=$?"; show $OUT/c$c.log; rows $OUT/c$c
  done
fi

if [ "${SKIP_PROFILE:-0}" != 1 ] && [ $(left) -gt 120 ]; then
  echo "== 5. profile at ${SECONDS}s"
  timeout $(( $(left) - 40 )) python3 - > $OUT/profile.log 2>&1 <<'EOF'
import torch
from torch.profiler import ProfilerActivity, profile
from models.backbone import random_backbone
from models.fast_decode import FastDecoder
from models.linearize import LinearizeConfig, linearize
RECIPES = {"gdn-default": dict(mechanism="gdn", window=56, sinks=8, short_conv=True), "gdn": dict(mechanism="gdn")}
ids = torch.randint(1, 32000, (8, 32768), device="cuda")
for name, recipe in RECIPES.items():
    model = random_backbone("llama-3.1-8b", dtype=torch.bfloat16, device="cuda")
    linearize(model, LinearizeConfig(**recipe))
    model.to(dtype=torch.bfloat16)
    dec = FastDecoder(model, prefill_chunk=8192)
    dec.prefill(ids)  # warm: every chunk shape compiled and autotuned
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        dec.prefill(ids)
        torch.cuda.synchronize()
    print(f"===== {name}: one prefill [8, 32768], chunk 8192")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70))
    del dec, model
    torch.cuda.empty_cache()
EOF
  echo "rc=$?"; grep -E "=====|Self CUDA time total" $OUT/profile.log
fi

echo "done at ${SECONDS}s"
