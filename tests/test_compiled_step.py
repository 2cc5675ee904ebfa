"""GOLINEAR_COMPILED_STEP=1: the static-shape decode step (the one a CUDA graph captures) through torch.compile gives
the eager step's tokens and logits, for full attention and the default recipe, fp32 on the CPU (Inductor's C++
backend; on a GPU the same path is compiled to Triton, tests/test_gpu.py style checks there are for a GPU run)."""
from __future__ import annotations

import pytest
import torch

from golinear.models.decoding import fast_decode
from golinear.models.decoding.fast_decode import FastDecoder
from test_batched_generate import VOCAB, tiny_model


def test_the_mode_is_checked(monkeypatch):
    monkeypatch.setenv("GOLINEAR_COMPILED_STEP", "yes")
    with pytest.raises(ValueError, match="GOLINEAR_COMPILED_STEP='yes'; allowed"):
        fast_decode.compiled_step_enabled()
    monkeypatch.setenv("GOLINEAR_COMPILED_STEP", "0")
    assert not fast_decode.compiled_step_enabled()


@pytest.mark.parametrize("mech", [None, "gdn"], ids=["full", "gdn-window-sinks-conv"])
@torch.no_grad()
def test_the_compiled_step_gives_the_eager_steps_tokens(mech, monkeypatch):
    cfg = {} if mech is None else dict(window=4, sinks=2, short_conv=True)
    model = tiny_model(mech, **cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (3, 12), generator=g)
    dec = FastDecoder(model, use_graph=False, max_len=24)
    dec.prefill(ids, [12, 9, 7])
    steady = min(dec.positions) >= dec.steady_from
    saved = [b.clone() for b in dec._buffers()]

    def run(n):
        toks, logits = [], []
        for _ in range(n):
            dec._graph_step(steady)
            toks.append(dec.io["ids"].clone())
            logits.append(dec.io["logits"].clone())
        return torch.cat(toks, 1), torch.cat(logits, 1)

    monkeypatch.setenv("GOLINEAR_COMPILED_STEP", "0")
    eager_ids, eager_logits = run(4)
    for b, c in zip(dec._buffers(), saved):
        b.copy_(c)
    monkeypatch.setenv("GOLINEAR_COMPILED_STEP", "1")
    torch._dynamo.reset()
    comp_ids, comp_logits = run(4)
    assert dec._compiled_step is not None  # the compiled path ran
    assert torch.equal(comp_ids, eager_ids)
    torch.testing.assert_close(comp_logits, eager_logits, rtol=1e-4, atol=1e-4)  # fp32; Inductor may reorder sums


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the CUDA graph captures the compiled step)")
@pytest.mark.parametrize("mech", [None, "gdn"], ids=["full", "gdn-window-sinks-conv"])
@torch.no_grad()
def test_gpu_the_captured_compiled_step_gives_the_eager_graphs_tokens(mech, monkeypatch):
    """On CUDA: the CUDA graph of the compiled step against the graph of the eager step, the same prompts, fp32."""
    cfg = {} if mech is None else dict(window=4, sinks=2, short_conv=True)
    model = tiny_model(mech, **cfg).cuda()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (3, 12), generator=g).cuda()

    def generate(mode):
        monkeypatch.setenv("GOLINEAR_COMPILED_STEP", mode)
        dec = FastDecoder(model, use_graph=True, max_len=32)
        first = dec.prefill(ids, [12, 9, 7])
        out = torch.cat([first, dec.decode(12)], 1)
        return out, dec.last_logits.clone(), dec

    eager, eager_logits, _ = generate("0")
    comp, comp_logits, dec = generate("1")
    assert dec._compiled_step is not None
    assert torch.equal(comp, eager)
    torch.testing.assert_close(comp_logits, eager_logits, rtol=1e-3, atol=1e-3)  # TF32 in FLA's kernels either way
