"""The timed runs behind `golinear latency`'s rows: each takes a batch of prompt ids and returns (prefill seconds,
decode seconds), the device synchronised at both ends of each phase.

`run_full`: HF's own model on its DynamicCache; `run_fast`: models.decoding.fast_decode's decoder (full-static and every
linearized configuration). The KV-cache compression rows are bench/speed/latency_press.py's PressRun.
"""
from __future__ import annotations

import time

import torch

from golinear.models.backbones.cache_arg import cache_kwarg, returned_cache


def sync(device):
    """Wait for the device's queued work (a no-op on the CPU), so the wall clock times what ran."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def run_full(model, ids, new_tokens):
    """HF's own model: prefill with logits of the last position, then greedy steps on its DynamicCache."""
    device = ids.device
    sync(device)
    t0 = time.perf_counter()
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1:].argmax(-1)
    past = returned_cache(out)
    sync(device)
    t1 = time.perf_counter()
    for _ in range(new_tokens):
        out = model(input_ids=nxt, use_cache=True, **cache_kwarg(model, past))
        nxt = out.logits[:, -1:].argmax(-1)
    sync(device)
    t2 = time.perf_counter()
    del out, past
    return t1 - t0, t2 - t1


@torch.no_grad()
def run_fast(decoder, ids, new_tokens):
    device = ids.device
    sync(device)
    t0 = time.perf_counter()
    decoder.prefill(ids)
    sync(device)
    t1 = time.perf_counter()
    decoder.capture()  # only when the buffers were re-allocated (full-static: per length); not timed
    sync(device)
    t2 = time.perf_counter()
    decoder.decode(new_tokens)
    sync(device)
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2
