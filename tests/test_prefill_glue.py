"""The chunked prefill with the decode step's fused glue (models.decoding.fast_decode: GOLINEAR_FUSED_DECODE, the formulas
of models.attention.ops.decode_glue compiled with automatic dynamic shapes): the logits and decode state of the modules'
own norms and MLP (fp32), linearized, full-attention and hybrid models, chunks of two lengths."""
from __future__ import annotations

import pytest
import torch

from golinear.models.decoding import fast_decode
from golinear.models.decoding.fast_decode import FastDecoder
from _tiny import inductor_works
from tests.test_latency import tiny_model


def _prefill(model, monkeypatch, mode: str, lens):
    monkeypatch.setenv("GOLINEAR_FUSED_DECODE", mode)
    ids = torch.randint(0, 97, (3, 23), generator=torch.Generator().manual_seed(0))
    fd = FastDecoder(model, prefill_chunk=8, max_len=64, use_graph=False)
    fd.prefill(ids, lens)
    states = [t.clone() for st in fd.states for t in (st.tensors() if hasattr(st, "tensors") else st.values())]
    return fd.last_logits.clone(), states


@pytest.mark.parametrize("mech,full,lens", [("gdn", None, None), (None, None, [23, 9, 16]), ("gdn", [1], [23, 9, 16])])
def test_prefill_glue_equals_the_modules(monkeypatch, mech, full, lens):
    if not inductor_works():
        pytest.skip("torch.compile (inductor) cannot run on this machine")
    cfg = dict(window=4, sinks=2, short_conv=True, full_layers=full) if mech else {}
    model = tiny_model(mech, **cfg)
    calls = []
    real = fast_decode._prefill_glue
    monkeypatch.setattr(fast_decode, "_prefill_glue", lambda name: calls.append(name) or real(name))
    want, want_state = _prefill(model, monkeypatch, "0", lens)
    assert not calls
    got, got_state = _prefill(model, monkeypatch, "1", lens)
    layers, chunks = 3, 3  # 23 tokens in chunks of 8 (two lengths: 8 and 7)
    assert calls.count("_add_rms_norm") == chunks * (2 * layers - 1) and calls.count("_silu_mul") == chunks * layers
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_state, want_state, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
