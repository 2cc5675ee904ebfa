"""CPU tests for the fast decoder (models/fast_decode.py) and `golinear latency` (bench/latency.py)."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
import transformers

from bench import latency
from bench.cli import main as cli
from models.fast_decode import FastDecoder
from models.linearize import LinearizeConfig, linearize


def tiny_model(mech, seed=1, **cfg):
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=97,
                                      max_position_embeddings=512)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    if mech is not None:
        linearize(model, LinearizeConfig(mechanism=mech, **cfg))
        with torch.no_grad():  # move the new parameters off their (identity / neutral) initialisation
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 0.1)
    return model


CASES = [  # mechanism, window, sinks, short conv, full layers, prefill chunk
    ("gdn", 4, 2, True, None, 5),
    ("gla", 3, 1, True, None, 4),
    ("kgla", 5, 0, False, None, 7),
    ("hedgehog", 4, 2, True, None, 6),
    ("gdn", 0, 0, True, None, 5),
    ("gdn", 0, 3, False, [1], 4),
    ("none", 4, 2, False, None, 3),
    ("gdn", 6, 2, True, None, 0),
    ("gla", 20, 2, True, None, 4),  # window longer than the prompt
    # sinks + window between the prompt (13) and its end after decoding (19): the decode step switches from
    # the general form (masks, sink writes, validity) to the steady one mid-way
    ("gdn", 12, 3, True, None, 5),
    ("hedgehog", 14, 2, True, None, 4),
]


@pytest.mark.parametrize("mech,window,sinks,conv,full,chunk", CASES)
def test_fast_decoder_matches_parallel_forward(mech, window, sinks, conv, full, chunk):
    """Chunked prefill + static-cache decoding reproduce the logits of one parallel forward pass."""
    model = tiny_model(mech, window=window, sinks=sinks, short_conv=conv, full_layers=full)
    B, T, n = 2, 13, 6
    ids = torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(0))
    fd = FastDecoder(model, prefill_chunk=chunk, max_len=64)
    toks, logits = [fd.prefill(ids)], [fd.last_logits.clone()]
    for _ in range(n):
        toks.append(fd.decode(1))
        logits.append(fd.last_logits.clone())
    with torch.no_grad():
        want = model(torch.cat([ids] + toks[:-1], 1)).logits.float()[:, T - 1:]
    torch.testing.assert_close(torch.cat(logits, 1), want, rtol=1e-4, atol=1e-4)
    assert torch.equal(torch.cat(toks, 1), want.argmax(-1))


def test_decode_buffers_do_not_depend_on_prompt_length():
    """The decode step works on the same static buffers whatever the prompt: same shapes, same storage."""
    model = tiny_model("gdn", window=4, sinks=2, short_conv=True)
    fd = FastDecoder(model, prefill_chunk=8)
    fd.prefill(torch.randint(0, 97, (2, 10)))
    before = [(b.data_ptr(), tuple(b.shape)) for b in fd._buffers()]
    fd.decode(2)
    fd.prefill(torch.randint(0, 97, (2, 57)))
    after = [(b.data_ptr(), tuple(b.shape)) for b in fd._buffers()]
    assert before == after


def test_fast_decoder_generate_matches_hf_generate_full_attention():
    """A plain (not linearized) model through the static full-attention path equals HF greedy generate."""
    model = tiny_model(None)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    fd = FastDecoder(model, prefill_chunk=4, max_len=32)
    got = fd.generate(ids, 6)
    want = model.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)[:, 9:]
    assert torch.equal(got, want)


def test_latency_cli_cpu_sweep_merges_rows(tmp_path):
    argv = ["latency", "--lengths", "16,32", "--batch", "1", "--new-tokens", "2",
            "--configs", "full;gdn-default", "--out-dir", str(tmp_path), "--prefill-chunk", "16",
            "--layers", "2"]
    assert cli(argv) == 0
    df = pd.read_csv(tmp_path / "latency.csv")
    assert len(df) == 4 and set(df.config) == {"full", "gdn-default"} and set(df.length) == {16, 32}
    assert (df.status == "ok").all() and (df.prefill_s > 0).all() and (df.decode_ms_per_token > 0).all()
    assert (df.model == "smollm2-135m[2 layers]").all() and (df.device == "cpu").all()
    assert cli(argv[:2] + ["32"] + argv[3:]) == 0  # same key again: replaced, not appended
    assert len(pd.read_csv(tmp_path / "latency.csv")) == 4
    md = (tmp_path / "latency.md").read_text()
    assert "gdn-default" in md and "decode speed-up" in md
    assert (tmp_path / "latency.png").read_bytes()[:4] == b"\x89PNG"


def test_latency_full_static_config(tmp_path):
    """Full attention through the static-cache decoder: a KV buffer per length, rows like the others."""
    assert cli(["latency", "--lengths", "8,24", "--batch", "1", "--new-tokens", "2", "--configs", "full-static",
                "--out-dir", str(tmp_path), "--layers", "1"]) == 0
    df = pd.read_csv(tmp_path / "latency.csv")
    assert list(df.config) == ["full-static"] * 2 and (df.status == "ok").all()


def test_fast_decoder_full_attention_capacity_is_checked():
    model = tiny_model(None)
    fd = FastDecoder(model, max_len=12)
    fd.prefill(torch.randint(0, 97, (1, 9)))
    fd.decode(3)
    with pytest.raises(ValueError, match="KV buffer"):
        fd.decode(1)


def test_latency_records_oom_and_goes_on(tmp_path, monkeypatch):
    calls = []

    def fake_full(model, ids, new_tokens):
        calls.append(ids.shape[1])
        if ids.shape[1] == 32:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return 0.5, 0.1

    monkeypatch.setattr(latency, "run_full", fake_full)
    assert cli(["latency", "--lengths", "16,32,48", "--batch", "1", "--new-tokens", "2", "--configs", "full",
                "--out-dir", str(tmp_path), "--layers", "1"]) == 0
    df = pd.read_csv(tmp_path / "latency.csv").set_index("length")
    assert df.status.to_dict() == {16: "ok", 32: "OOM", 48: "ok"}
    assert "OOM" in (tmp_path / "latency.md").read_text()


@pytest.mark.parametrize("argv,needle", [
    (["--model", "gpt-2", "--lengths", "16"], "named configuration"),
    (["--layers", "99", "--lengths", "16"], "--layers"),
    (["--lengths", "16,x"], "--lengths"),
    (["--configs", "nonsense", "--lengths", "16"], "unknown model"),
    (["--device", "cuda", "--lengths", "16"], "CUDA"),
])
def test_latency_bad_input(argv, needle, tmp_path, capsys):
    if "--device" in argv and torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert cli(["latency", "--out-dir", str(tmp_path), *argv]) == 2
    assert needle in capsys.readouterr().err


# ------------------------------------------------------------------ the CUDA backend's plain-PyTorch parts
@pytest.mark.parametrize("T,window,sinks,groups", [(1, 4, 2, 1), (15, 8, 4, 3), (65, 56, 8, 2), (130, 0, 4, 2),
                                                    (100, 7, 0, 2)])
def test_blocked_window_and_sink_merge_match_reference(T, window, sinks, groups):
    """The autograd window path (blocked) + sink merge, and the no-grad add_sinks, equal the reference."""
    import math
    from models.ops import reference, window as win
    g = torch.Generator().manual_seed(T)
    B, Hkv, D = 2, 2, 16
    q = torch.randn(B, T, Hkv * groups, D, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, T, Hkv, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    want, want_lse = reference.window_sink_attention(q, k, v, sinks, window, 0.3)
    pos = torch.arange(T)
    if window:
        o_w, lse_w = win.window_part_blocked(q, k, v, window, 0.3)
    else:
        o_w = torch.zeros(B, T, Hkv * groups, D, dtype=torch.float64)
        lse_w = torch.full((B, T, Hkv * groups), -math.inf, dtype=torch.float64)
    got, lse = o_w, lse_w
    if sinks:
        got, lse = win.merge_attention(o_w, lse_w, *win.sink_part(q, k[:, :sinks], v[:, :sinks], window, 0.3, pos))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)
    cot = torch.randn(want.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((got * cot).sum(), (q, k, v))
    for a, b in zip(grads, torch.autograd.grad((want * cot).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if window and sinks:
        with torch.no_grad():
            fast, fast_lse = win.add_sinks(q, o_w, lse_w, k[:, :sinks], v[:, :sinks], window, 0.3, pos)
        torch.testing.assert_close(fast.double(), want.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast_lse.double(), want_lse.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T,with_state", [(1, True), (17, False), (17, True)])
def test_fast_short_conv_matches_reference(T, with_state):
    from models.ops import fla_backend as fb, reference
    g = torch.Generator().manual_seed(T)
    x, w = torch.randn(2, T, 12, generator=g), torch.randn(12, 4, generator=g)
    state = torch.randn(2, 12, 3, generator=g) if with_state else None
    with torch.no_grad():
        want, want_state = reference.short_conv(x, w, state, output_final_state=True)
        got, got_state = fb.short_conv(x, w, state, output_final_state=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_state, want_state)
