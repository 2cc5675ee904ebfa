"""The fused steady decode step (models.attention.ops.fused_decode, GOLINEAR_FUSED_DECODE=1) on the CPU: the eager
step's tokens and logits, and no copy of the window in the code inductor generates for it (the GPU tests hold it to
the eager step on CUDA, tests/test_gpu.py)."""
from __future__ import annotations

import re

import pytest
import torch

from golinear.models.decoding.fast_decode import FastDecoder
from _tiny import inductor_works
from test_batched_generate import tiny_model

SINKS, WINDOW = 8, 24


def _decode(model, monkeypatch, mode: str, steps: int = 4):
    monkeypatch.setenv("GOLINEAR_FUSED_DECODE", mode)
    dec = FastDecoder(model, use_graph=False, max_len=200)
    with torch.no_grad():
        toks = [dec.prefill(torch.randint(1, 50, (2, 64), generator=torch.Generator().manual_seed(0)))]
        logits = []
        for _ in range(steps):
            toks.append(dec.decode(1))
            logits.append(dec.last_logits.clone())
    return dec, torch.cat(toks, 1), torch.cat(logits, 1)


def test_the_fused_step_is_the_eager_step_and_copies_no_window(monkeypatch):
    """Same tokens and logits as the eager step; the allocations of the generated code hold no [B, sinks + window,
    Hkv, D] (sinks and ring concatenated: a copy of the whole window each step) and no ring-shaped buffer."""
    if not inductor_works():
        pytest.skip("torch.compile (inductor) cannot run on this machine")
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    model = tiny_model("gdn", window=WINDOW, sinks=SINKS, short_conv=True)
    _, want_toks, want_logits = _decode(model, monkeypatch, "0")
    dec, toks, logits = _decode(model, monkeypatch, "1")
    assert torch.equal(toks, want_toks)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        _, code = run_and_get_code(lambda: dec.decode(1))
    torch._dynamo.reset()
    st = dec.states[0]
    B, _, Hkv, D = st.ring_k.shape
    banned = {(B, SINKS + WINDOW, Hkv, D), tuple(st.ring_k.shape), *(tuple(x.shape) for x in st.ring_lin.values())}
    made = {tuple(int(n) for n in m.split(",") if n.strip())
            for m in re.findall(r"empty_strided_\w+\(\(([\d, ]+)\)", "\n".join(code))}
    assert made, "no generated code seen: the fused step did not run"
    assert not made & banned, made & banned
