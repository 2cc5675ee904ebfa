#!/usr/bin/env bash
# A stash-only call (issue #16): carries one evaluation chunk (.device/scaling/chunk/NN) to the warm machine.
# Run it between the training calls and device_eval.sh, at once after the previous call returns.
SCALING_STASH=/tmp/golinear-scaling; mkdir -p $SCALING_STASH
for f in .device/scaling/chunk/*/part.*; do [ -f "$f" ] && cp -n "$f" $SCALING_STASH/; done
echo "stashed evaluation chunks: $(ls $SCALING_STASH | tr '\n' ' ')"; df -h /tmp | tail -1
