#!/usr/bin/env bash
# Sourced first by every scripts/scaling/device_*.sh call (issue #16, nvidia-h200-x2): NVLink multicast off in
# NCCL, PyTorch and NVSHMEM (a program that uses it can put the host's shared GPUs out of service), the carried
# wheels installed (scripts/gpu/device_setup.sh: PYTHONPATH, GOLINEAR_CACHE, TRITON_CACHE_DIR in /tmp, which a
# warm machine keeps for the next call), and every carried evaluation chunk (.device/scaling/chunk/NN) stashed
# in /tmp/golinear-scaling for device_eval.sh. The machine stays warm ~30 s after a call: send the next at once.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SCALING_STASH=${SCALING_STASH:-/tmp/golinear-scaling}
SCALING_TMP=${SCALING_TMP:-/tmp/scaling}
mkdir -p $SCALING_STASH $SCALING_TMP
if [ -z "${SCALING_DRY:-}" ]; then
  for f in .device/scaling/chunk/*/part.*; do [ -f "$f" ] && cp -n "$f" $SCALING_STASH/; done
  echo "stashed evaluation chunks: $(ls $SCALING_STASH 2>/dev/null | tr '\n' ' ')"
fi
[ -f .device/scaling/inputs/manifest.env ] && source .device/scaling/inputs/manifest.env
if [ -n "${SCALING_DRY:-}" ]; then  # tests/test_scaling.py: the same commands on CPU, nothing installed
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
else
  source scripts/gpu/device_setup.sh >$SCALING_TMP/setup.log 2>&1 || { tail -20 $SCALING_TMP/setup.log; return 3 2>/dev/null || exit 3; }
  nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader 2>/dev/null
fi
export GOLINEAR_GIT_COMMIT=${GOLINEAR_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'gpus', torch.cuda.device_count())"
T0=${T0:-$(date +%s)}
log_tail() { python3 scripts/scaling/log_tail.py "$1" "$2"; }  # log_tail FILE N: valid UTF-8, \r as line ends
left() { echo $(( ${DEADLINE:-540} - ($(date +%s) - T0) )); }  # seconds left of this call's budget
step() {  # step NAME CMD...: run CMD time-boxed to what is left, log to /tmp/scaling/NAME.log, say how it ended
  local name=$1; shift
  local budget=$(left)
  [ $budget -lt 30 ] && { echo "skip $name: ${budget}s left"; return 99; }
  local t=$(date +%s)
  local tag=scaling-$$-$name
  SCALING_TAG=$tag timeout -k 10 $budget "$@" > $SCALING_TMP/$name.log 2>&1; local rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then  # torchrun's workers start their own sessions: timeout's kill misses them
    local e; for e in /proc/[0-9]*/environ; do
      grep -qz "^SCALING_TAG=$tag\$" $e 2>/dev/null && kill -9 $(basename $(dirname $e)) 2>/dev/null; done
  fi
  echo "$name: rc=$rc in $(( $(date +%s) - t ))s (t=$(( $(date +%s) - T0 ))s)"; log_tail $SCALING_TMP/$name.log 4
  return $rc
}
