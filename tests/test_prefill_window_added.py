"""The chunked prefill adds the window + sinks straight into the linear output (models.decoding.prefill.window_attention_added):
the same numbers, bit for bit, as window_attention_blocked followed by the disjoint sum y_lin + y_swa."""
from __future__ import annotations

import pytest
import torch
import transformers

from golinear.models.attention import ops
from golinear.models.decoding import prefill
from golinear.models.decoding.fast_decode import FastDecoder
from golinear.models.attention.linearize import LinearizeConfig, linearize
from golinear.models.attention.ops import window
from golinear.models.attention.ops.window import window_attention_blocked
from _tiny import perturb_new_params


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p0,s,w,G", [(0, 8, 56, 4), (0, 0, 20, 1), (512, 4, 10, 2), (128, 8, 56, 4)])
def test_window_attention_added_is_the_sum(dtype, p0, s, w, G):
    B, Tq, Hkv, D = 2, 256, 2, 16
    g = torch.Generator().manual_seed(p0 + w)
    q = torch.randn(B, Tq, Hkv * G, D, generator=g).to(dtype)
    n_prev = min(p0, w)
    lo = s if p0 else 0
    L = lo + n_prev + Tq
    k, v = (torch.randn(B, L, Hkv, D, generator=g).to(dtype) for _ in range(2))
    y_lin = torch.randn(B, Tq, Hkv * G, D, generator=g).to(dtype)
    args = dict(window=w, scale=D ** -0.5, sinks=s if p0 + Tq - 1 - w >= 0 else 0, base=lo + n_prev, lo=lo, q_pos0=p0)
    with torch.no_grad():
        want = y_lin + window_attention_blocked(q, k, v, **args)
        got = prefill.window_attention_added(y_lin.clone(), q, k, v, **args)
    assert torch.equal(got, want)


def tiny_model(seed=0):
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=97, max_position_embeddings=1024)
    torch.manual_seed(seed)
    model = linearize(transformers.LlamaForCausalLM(cfg).eval(),
                      LinearizeConfig(mechanism="gdn", window=12, sinks=3, short_conv=True))
    perturb_new_params(model, 0.1)
    return model


@pytest.mark.parametrize("lens", [None, [300, 170, 64]])
def test_prefill_with_whole_blocks_is_unchanged(monkeypatch, lens):
    """Chunks of 64 (whole query blocks, so the window is added into the linear output): the same logits and
    decode state, bit for bit, as with the add turned off (window output, then attn.combine). The reference GDN
    op returns a strided output; FLA's is contiguous, which the add needs: the op's output is made contiguous."""
    gdn_chunk = ops.gdn_chunk
    monkeypatch.setattr(ops, "gdn_chunk", lambda *a, **kw: (lambda o, st: (o.contiguous(), st))(*gdn_chunk(*a, **kw)))
    model = tiny_model()
    ids = torch.randint(0, 97, (3, 300), generator=torch.Generator().manual_seed(1))
    calls = []
    real = prefill.window_attention_added

    def run():
        fd = FastDecoder(model, prefill_chunk=64, use_graph=False)
        fd.prefill(ids, lens)
        return fd.last_logits.clone(), [t.clone() for st in fd.states for t in st.tensors()]

    monkeypatch.setattr(prefill, "window_attention_added", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    added = run()
    assert calls  # the path under test ran (every chunk after the first: 4 per layer)
    monkeypatch.setattr(prefill, "_adds_into", lambda *a: False)
    plain = run()
    assert torch.equal(added[0], plain[0])
    assert all(torch.equal(a, b) for a, b in zip(added[1], plain[1]))


@pytest.mark.parametrize("block", [32, 128])
def test_prefill_block_changes_no_token(monkeypatch, block):
    """Another query block for the prefill's window (window.PREFILL_BLOCK, what profile_prefill.py --window-blocks
    times): the same logits to float32 rounding and the same greedy tokens, the window still added into the linear
    output where the chunk holds whole blocks (the reference GDN op's output made contiguous, as FLA's is)."""
    gdn_chunk = ops.gdn_chunk
    monkeypatch.setattr(ops, "gdn_chunk", lambda *a, **kw: (lambda o, st: (o.contiguous(), st))(*gdn_chunk(*a, **kw)))
    model = tiny_model()
    ids = torch.randint(0, 97, (3, 300), generator=torch.Generator().manual_seed(2))

    def run():
        fd = FastDecoder(model, prefill_chunk=128, use_graph=False)
        fd.prefill(ids, [300, 170, 64])
        return fd.last_logits.clone()

    want = run()
    monkeypatch.setattr(window, "PREFILL_BLOCK", block)
    calls = []
    real = prefill.window_attention_added
    monkeypatch.setattr(prefill, "window_attention_added", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    got = run()
    assert calls and (got - want).abs().max() < 1e-5 and torch.equal(got.argmax(-1), want.argmax(-1))
