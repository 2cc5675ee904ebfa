"""CPU tests for the fast decoder (models/decoding/fast_decode.py) and `golinear latency` (bench/speed/latency.py)."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
import transformers

from golinear.bench.speed import latency
from golinear.bench.cli import main as cli
from golinear.models.decoding.fast_decode import FastDecoder
from golinear.models.attention.linearize import LinearizeConfig, linearize
from _tiny import inductor_works, perturb_new_params
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tiny_model(mech, seed=1, **cfg):
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=97,
                                      max_position_embeddings=512)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    if mech is not None:
        linearize(model, LinearizeConfig(mechanism=mech, **cfg))
        perturb_new_params(model, 0.1)  # move the new parameters off their (identity / neutral) initialisation
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
    """Batch 1 and 2 in one invocation; every row carries the decode bound, and full attention's byte count
    equals a hand count of SmolLM2's first two layers (fp32, tied embeddings)."""
    argv = ["latency", "--lengths", "16,32", "--batch", "1,2", "--new-tokens", "2",
            "--configs", "full;gdn-default", "--out-dir", str(tmp_path), "--prefill-chunk", "16",
            "--layers", "2"]
    assert cli(argv) == 0
    df = pd.read_csv(tmp_path / "latency.csv")
    assert len(df) == 8 and set(df.config) == {"full", "gdn-default"} and set(df.length) == {16, 32}
    assert sorted(df.batch.unique()) == [1, 2] and (df.status == "ok").all()
    assert (df.prefill_s > 0).all() and (df.decode_ms_per_token > 0).all()
    assert (df.model == "smollm2-135m[2 layers]").all() and (df.device == "cpu").all()
    assert df.copy_gb_per_s.nunique() == 1 and (df.copy_gb_per_s > 0).all()  # measured once per run
    bound = 1000 * df.decode_bytes_per_step / (df.copy_gb_per_s * 1e9)  # (the CSV keeps 6 digits)
    assert list(df.decode_bound_ms) == pytest.approx(list(bound), rel=1e-4)
    assert list(df.decode_vs_bound) == pytest.approx(list(df.decode_ms_per_token / df.decode_bound_ms), rel=1e-4)
    h, f, kv = 576, 1536, 3 * 64
    layer = 4 * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h)  # q, o; k, v; MLP; two norms
    weights = 2 * layer + 4 * (49152 * h + h)  # tied: the LM head reads the whole table; final norm
    full = df[df.config == "full"].set_index(["batch", "length"]).decode_bytes_per_step
    for (b, L), got in full.items():
        want = weights + 4 * b * h + 2 * 2 * 4 * b * (L + 1.5) * kv  # rows; 2 layers x K,V up to the mean length
        assert got == pytest.approx(want, rel=1e-5), (b, L)
    gdn = df[df.config == "gdn-default"].set_index(["batch", "length"]).decode_bytes_per_step
    assert gdn[2, 16] == gdn[2, 32] > gdn[1, 32] == gdn[1, 16]  # fixed-size state: grows with batch, not length
    assert cli(argv[:2] + ["32"] + argv[3:]) == 0  # same keys again: replaced, not appended
    assert len(pd.read_csv(tmp_path / "latency.csv")) == 8
    md = (tmp_path / "latency.md").read_text()
    assert "gdn-default" in md and "bound ms/tok" in md and "batch 2" in md
    assert "Targets" not in md  # CPU timings are not judged against the GPU targets
    assert "nan" not in md and "gdn-default peak GiB" in md
    peak = pd.read_csv(tmp_path / "latency.csv").peak_gib
    assert (peak > 0.05).all()  # on the CPU, the process's peak resident set (weights and libraries included)
    assert (tmp_path / "latency.png").read_bytes()[:4] == b"\x89PNG"


def test_latency_writes_under_runs_latency_by_default(tmp_path, monkeypatch, capsys):
    """Without --out-dir the rows go to ./runs/latency, never into the tracked leaderboards/."""
    monkeypatch.chdir(tmp_path)
    published = ROOT / "leaderboards" / "latency.csv"
    before = published.read_bytes()
    assert cli(["latency", "--lengths", "16", "--batch", "1", "--new-tokens", "2", "--configs", "full",
                "--prefill-chunk", "16", "--layers", "2"]) == 0
    assert (tmp_path / "runs" / "latency" / "latency.csv").exists()
    assert (tmp_path / "runs" / "latency" / "latency.md").exists()
    assert published.read_bytes() == before
    out = capsys.readouterr().out
    assert " GiB (process)" in out and "nan" not in out and "Targets" not in out


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
    (["--batch", "0", "--lengths", "16"], "--batch"),
    (["--batch", "1,two", "--lengths", "16"], "--batch"),
])
def test_latency_bad_input(argv, needle, tmp_path, capsys):
    if "--device" in argv and torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert cli(["latency", "--out-dir", str(tmp_path), *argv]) == 2
    assert needle in capsys.readouterr().err


# ------------------------------------------------------------------ the decode bandwidth bound
B, H, HKV, D, CTX = 2, 4, 2, 16, 13  # tiny_model's heads; batch and prompt of the hand counts below
PLAIN_WEIGHTS = 4 * (3 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64 + 97 * 64)  # layers, norm, head


@pytest.mark.parametrize("tied", [False, True])
def test_decode_bytes_full_attention_hand_count(tied):
    """Weights once (the embedding table only as the LM head when tied), B embedding rows, K and V of every
    layer up to the context: counted by hand for the tiny fp32 model."""
    from golinear.bench.speed.decode_bound import decode_bytes
    model = tiny_model(None)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    got = decode_bytes(model, None, batch=B, context=CTX + 0.5)
    assert got["weights"] == PLAIN_WEIGHTS  # untied: the head, not the input table; tied: the table once
    assert got["embedding_rows"] == 4 * B * 64
    assert got["kv_cache"] == 3 * 2 * 4 * B * (CTX + 0.5) * HKV * D
    assert got["recurrent_state"] == got["window_sinks"] == got["window_inputs"] == got["conv_state"] == 0


BOUND_CASES = [  # mechanism, window, sinks, short conv, state bytes per layer, window inputs per slot
    ("gdn", 4, 2, True, 4 * B * H * D * D, 4 * B * H * (2 * D + 2)),  # state [B,H,D,D]; k, v, log_a, beta
    ("hedgehog", 4, 2, False, 4 * B * H * 128 * (D + 1), 4 * B * H * (D + 128)),  # S [B,H,2*64,D] + Z; v, phi_k
    ("none", 4, 2, False, 0, 0),  # window + sinks alone
]


@pytest.mark.parametrize("mech,window,sinks,conv,state,inputs", BOUND_CASES)
def test_decode_bytes_linearized_hand_count(mech, window, sinks, conv, state, inputs):
    """Each term of a linearized hybrid (layer 1 kept full) against a hand count from the tiny config: the
    state read and written, every sink and window K/V slot read plus one written, one window slot of linear
    inputs read and one written, the conv state [B, q+k+v dims, 3] read and written; the full layer's KV."""
    from golinear.bench.speed.decode_bound import decode_bytes
    model = tiny_model(mech, window=window, sinks=sinks, short_conv=conv, full_layers=[1])
    fd = FastDecoder(model, prefill_chunk=5, max_len=64)
    fd.prefill(torch.randint(0, 97, (B, CTX)))
    got = decode_bytes(model, fd.states, batch=B, context=CTX + 0.5)
    linear_layers = 2
    kv_slot = 4 * B * HKV * D
    assert got["recurrent_state"] == linear_layers * 2 * state
    assert got["window_sinks"] == linear_layers * 2 * kv_slot * (sinks + window + 1)
    assert got["window_inputs"] == linear_layers * 2 * inputs
    assert got["conv_state"] == (linear_layers * 2 * 4 * B * (64 + 2 * 32) * 3 if conv else 0)
    assert got["kv_cache"] == 1 * 2 * 4 * B * (CTX + 0.5) * HKV * D
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)  # the linearization's own parameters
    assert got["embedding_rows"] == 4 * B * 64 and got["weights"] == PLAIN_WEIGHTS + 4 * trained


def test_decode_bytes_needs_a_state_per_layer():
    from golinear.bench.speed.decode_bound import decode_bytes
    with pytest.raises(ValueError, match="3 decoder layers"):
        decode_bytes(tiny_model(None), [None], batch=1, context=4)


def test_copy_bandwidth_cpu():
    from golinear.bench.speed.decode_bound import copy_bandwidth
    bps = copy_bandwidth(torch.device("cpu"), nbytes=16 * 2**20, reps=2)
    assert 1e8 < bps < 1e13  # any machine copies 16 MiB faster than 100 MB/s and slower than 10 TB/s


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_copy_bandwidth_cuda():
    """On the H200 (HBM3e, 4.8 TB/s) a device-to-device copy moves well over 1 TB/s (anchor: ~4.3 TB/s)."""
    from golinear.bench.speed.decode_bound import copy_bandwidth
    bps = copy_bandwidth(torch.device("cuda"))
    print(f"copy bandwidth {bps / 1e9:.0f} GB/s")
    assert 1e12 < bps < 1e13


@pytest.mark.parametrize("text,want", [("1", [1]), ("1,8", [1, 8]), (" 2 , 4 ,", [2, 4])])
def test_parse_positive_ints(text, want):
    assert latency.parse_positive_ints("--batch", text) == want


@pytest.mark.parametrize("text", ["", "0", "1,-2", "1,x", "1.5", "2,2"])
def test_parse_positive_ints_rejects(text):
    with pytest.raises(ValueError, match="--batch .*comma-separated distinct positive integers"):
        latency.parse_positive_ints("--batch", text)


def _rows(with_bound: bool):
    """Rows of one made-up run (batch 8; numbers chosen so each target's outcome is known)."""
    base = dict(model="m", weights="random", dtype="bfloat16", device="gpu", batch=8, status="ok")
    table = {  # config: (prefill s, decode ms/token, peak GiB) at 1024 and 32768
        "full": ((1.0, 40.0, 10.0), (20.0, 60.0, 80.0)),
        "full-static": ((1.0, 9.0, 10.0), (20.0, 30.0, 90.0)),
        "gdn-default": ((1.2, 10.0, 10.0), (10.0, 10.5, 24.0)),  # 2x prefill, 2.86x decode, 5% spread, 0.3x peak
    }
    rows = []
    for config, points in table.items():
        for length, (prefill, decode, peak) in zip((1024, 32768), points):
            row = dict(base, config=config, length=length, prefill_s=prefill, decode_ms_per_token=decode,
                       peak_gib=peak)
            if with_bound:
                row.update(decode_bytes_per_step=20e9, copy_gb_per_s=4000.0, decode_bound_ms=5.0,
                           decode_vs_bound=decode / 5.0)
            rows.append(row)
    return pd.DataFrame(rows)


def test_target_checks_from_rows():
    from golinear.bench.speed.latency_targets import target_checks
    checks = target_checks(_rows(with_bound=True)).set_index("target")
    assert list(checks.config.unique()) == ["gdn-default"]  # the baselines are not checked against themselves
    assert checks.loc["prefill speed-up vs the fastest full attention", ["value", "met"]].tolist() == \
        ["2.00x at 32768", "met"]
    assert checks.loc["decode speed-up vs the fastest full attention", ["value", "met"]].tolist() == \
        ["2.86x at 32768", "not met"]
    assert checks.loc["decode spread over lengths (max/min - 1)", "value"] == "5.0% over 1024..32768"
    assert checks.loc["peak memory vs the smallest full attention", ["value", "met"]].tolist() == \
        ["0.30x at 32768", "met"]
    assert checks.loc["decode vs bandwidth bound, worst length (stretch)", ["value", "met"]].tolist() == \
        ["2.10x at 32768", "not met"]
    old = target_checks(_rows(with_bound=False))  # rows from before the bound: that check is left out
    assert "decode vs bandwidth bound, worst length (stretch)" not in set(old.target) and len(old) == 4
    one_batch = _rows(with_bound=True).assign(batch=1)  # the bound target is for batch 8
    assert "decode vs bandwidth bound, worst length (stretch)" not in set(target_checks(one_batch).target)


def test_linear_rows_against_the_fastest_full_attention_row():
    """Per length the fastest full-attention row is the baseline (here full-static, then a faster full-static-sdpa
    at 32K): the decode target uses it, and each linearized row is stated against it beside both decode/bounds."""
    from golinear.bench.speed.latency_targets import against_fastest_full, target_checks
    df = _rows(with_bound=True)
    sdpa = df[df.config == "full-static"].assign(config="full-static-sdpa", decode_ms_per_token=[12.0, 21.0],
                                                  prefill_s=[0.5, 30.0])
    df = pd.concat([df, sdpa.assign(decode_vs_bound=sdpa.decode_ms_per_token / 5.0)], ignore_index=True)
    t = against_fastest_full(df).set_index("length")
    assert t.decode_vs.tolist() == ["full-static", "full-static-sdpa"]
    assert t.prefill_vs.tolist() == ["full-static-sdpa", "full"]
    assert t.decode_speed_up.round(3).tolist() == [0.9, 2.0] and t.full_decode_vs_bound.tolist() == [1.8, 4.2]
    assert t.decode_vs_bound.tolist() == [2.0, 2.1]
    checks = target_checks(df).set_index("target")
    assert checks.loc["decode speed-up vs the fastest full attention", "value"] == "2.00x at 32768"


@pytest.mark.parametrize("with_bound", [False, True])
def test_render_with_and_without_bound_columns(tmp_path, with_bound):
    """Old CSV rows (no bound columns) still render; new ones add the bound table and the copy bandwidth.
    A row of the new kind beside old ones shows '-' where the old rows have no value."""
    from golinear.bench.speed.latency_render import render
    oom = dict(model="m", weights="random", dtype="bfloat16", device="gpu", batch=64, status="OOM", config="full",
               length=32768, **({"copy_gb_per_s": 4000.0} if with_bound else {}))  # nothing measured but that
    df = pd.concat([_rows(with_bound), pd.DataFrame([oom])], ignore_index=True)
    if with_bound:
        df.loc[(df.config == "full") & (df.length == 1024), ["decode_bound_ms", "decode_vs_bound"]] = float("nan")
    render(df, tmp_path)
    md = (tmp_path / "latency.md").read_text()
    assert "| gdn-default | prefill speed-up vs the fastest full attention" in md and "not met" in md
    assert ("bound ms/tok" in md) == with_bound and ("4000 GB/s" in md) == with_bound
    assert ("not measured" in md) != with_bound
    assert "batch 64" in md and "|32768|OOM|OOM|OOM|" in md.replace(" ", "")
    assert "| 32768 | gdn-default | 2.00x | full | 2.86x | full-static |" in md  # (a prefill tie: the first)
    if with_bound:
        cells = [x.replace(" ", "") for x in md.splitlines()]
        bound_row = next(x for x in cells if x.startswith("|1024|") and "|2|" in x)  # gdn-default: 10 / 5 ms
        assert "|-|" in bound_row  # full at 1024 lacks its bound
    assert (tmp_path / "latency.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------ the CUDA backend's plain-PyTorch parts
@pytest.mark.parametrize("T,window,sinks,groups", [(1, 4, 2, 1), (15, 8, 4, 3), (65, 56, 8, 2), (130, 0, 4, 2),
                                                    (100, 7, 0, 2)])
def test_blocked_window_and_sink_merge_match_reference(T, window, sinks, groups):
    """The autograd window path (blocked) + sink merge, and the no-grad add_sinks, equal the reference."""
    import math
    from golinear.models.attention.ops import reference, window as win
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
    from golinear.models.attention.ops import fla_backend as fb, reference
    g = torch.Generator().manual_seed(T)
    x, w = torch.randn(2, T, 12, generator=g), torch.randn(12, 4, generator=g)
    state = torch.randn(2, 12, 3, generator=g) if with_state else None
    with torch.no_grad():
        want, want_state = reference.short_conv(x, w, state, output_final_state=True)
        got, got_state = fb.short_conv(x, w, state, output_final_state=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_state, want_state)


# ------------------------------------------------------------------ the fused steady decode step (models.attention.ops.fused_decode)
def _decode_run(model, monkeypatch, fused: str, n=5):
    """Logits of n steady steps and the final decode state, rows at different positions (lengths 13 and 9)."""
    monkeypatch.setenv("GOLINEAR_FUSED_DECODE", fused)
    ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(0))
    fd = FastDecoder(model, prefill_chunk=5, max_len=64, use_graph=False)
    fd.prefill(ids, lengths=[13, 9])
    logits = []
    for _ in range(n):
        fd.decode(1)
        logits.append(fd.last_logits.clone())
    states = [st.tensors() if hasattr(st, "tensors") else list(st.values()) for st in fd.states]  # (dict: full)
    return torch.cat(logits, 1), [t.clone() for ts in states for t in ts]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("sinks,conv,out_norm", [(2, True, False), (0, False, True), (3, True, True)])
def test_fused_decode_step_equals_the_step(monkeypatch, compiled, sinks, conv, out_norm):
    """GOLINEAR_FUSED_DECODE=1 (fp32, CPU): the same logits and decode state as LinearizedAttention.step, over
    several steady steps (its pure function eagerly, and through torch.compile as on CUDA)."""
    from golinear.models.attention.ops import fused_decode
    if compiled and not inductor_works():
        pytest.skip("torch.compile (inductor) cannot run on this machine")
    if not compiled:
        monkeypatch.setattr(fused_decode, "prepare", fused_decode._prepare)
    model = tiny_model("gdn", window=4, sinks=sinks, short_conv=conv, out_norm=out_norm)
    calls = []
    real = fused_decode.fused_step
    monkeypatch.setattr(fused_decode, "fused_step", lambda *a: calls.append(1) or real(*a))
    want, want_state = _decode_run(model, monkeypatch, "0")
    assert not calls
    got, got_state = _decode_run(model, monkeypatch, "1")
    assert len(calls) == 5 * 3  # every step of every layer took the fused path
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_state, want_state, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_fused_decode_mode_is_validated(monkeypatch):
    from golinear.models.attention.ops import fused_decode
    monkeypatch.setenv("GOLINEAR_FUSED_DECODE", "yes")
    with pytest.raises(ValueError, match="GOLINEAR_FUSED_DECODE='yes'; allowed"):
        fused_decode.mode()


def test_fused_decode_is_off_on_cpu_by_default(monkeypatch):
    from golinear.models.attention.ops import fused_decode
    monkeypatch.delenv("GOLINEAR_FUSED_DECODE", raising=False)
    layer = tiny_model("gdn", window=4, sinks=2, short_conv=True).model.layers[0].self_attn
    x = torch.zeros(1, 1, 64)
    assert not fused_decode.applies(layer, x, steady=True)
    monkeypatch.setenv("GOLINEAR_FUSED_DECODE", "1")
    with torch.no_grad():
        assert not fused_decode.applies(layer, x, steady=True)  # outside FastDecoder's step (HF generate, lm-eval)
        with fused_decode.decode_scope():
            assert fused_decode.applies(layer, x, steady=True) and not fused_decode.applies(layer, x, steady=False)


@pytest.mark.parametrize("mech,full", [("gdn", None), (None, None), ("gdn", [1])])
def test_fused_decoder_glue_equals_the_modules(monkeypatch, mech, full):
    """GOLINEAR_FUSED_DECODE=1, the compiled residual add + RMSNorm and SiLU * up (models.attention.ops.decode_glue): the
    logits and decode state of the modules' own forward (fp32), full attention and hybrids included."""
    if not inductor_works():
        pytest.skip("torch.compile (inductor) cannot run on this machine")
    from golinear.models.attention.ops import decode_glue
    cfg = dict(window=4, sinks=2, short_conv=True, full_layers=full) if mech else {}
    model = tiny_model(mech, **cfg)
    calls = []
    real = decode_glue.add_rms_norm
    monkeypatch.setattr(decode_glue, "add_rms_norm", lambda *a: calls.append(1) or real(*a))
    want, want_state = _decode_run(model, monkeypatch, "0")
    assert not calls
    got, got_state = _decode_run(model, monkeypatch, "1")
    assert len(calls) == 5 * 2 * 3  # two per layer and step
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_state, want_state, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_fused_glue_only_for_known_formulas(monkeypatch):
    """decode_glue serves Llama/Qwen RMSNorm + SiLU MLPs only, with the mode on; anything else runs the modules."""
    from golinear.models.attention.ops import decode_glue
    model = tiny_model("gdn", window=4, sinks=2, short_conv=True)
    layers, norm, x = model.model.layers, model.model.norm, torch.zeros(1, 1, 64)
    from golinear.models.attention.ops.fused_decode import decode_scope
    monkeypatch.setenv("GOLINEAR_FUSED_DECODE", "1")
    with torch.no_grad(), decode_scope():
        assert decode_glue.usable(layers, norm, x)
        monkeypatch.setattr(layers[1], "post_attention_layernorm", torch.nn.LayerNorm(64))
        assert not decode_glue.usable(layers, norm, x)
    monkeypatch.setenv("GOLINEAR_FUSED_DECODE", "auto")  # CPU tensors: off by default
    with torch.no_grad(), decode_scope():
        assert not decode_glue.usable(model.model.layers[:1], norm, x)


def test_chunk_shapes_names_every_chunk_a_timed_prefill_runs():
    """The warm-up before a timed prefill must have run each chunk shape (FLA compiles and autotunes per shape)."""
    from golinear.bench.speed.latency import chunk_shapes
    assert chunk_shapes(1024, 8192) == {(True, 1024)}
    assert chunk_shapes(32768, 8192) == chunk_shapes(16384, 8192) == {(True, 8192), (False, 8192)}
    assert chunk_shapes(12000, 8192) == {(True, 8192), (False, 3808)}
    assert chunk_shapes(20000, 8192) == {(True, 8192), (False, 8192), (False, 3616)}
    assert chunk_shapes(100, 0) == {(True, 100)}


# ------------------------------------------------------------------ retention slots
def _retention_hand_count(batch, heads, kv_heads, head_dim, sinks, window, retain, elt=4):
    """Per linearized layer, the retention terms of bench/speed/decode_bound.py from the shapes (fp32 state): K or V
    of one slot for every KV head, and one slot's fold inputs (lk, lv [H, D], log_a, beta [H])."""
    kv_slot = elt * batch * kv_heads * head_dim
    fold_slot = elt * batch * heads * (2 * head_dim + 2)
    return dict(recurrent_state=2 * elt * batch * heads * head_dim * head_dim,
                window_sinks=2 * kv_slot * (sinks + window + 1), window_inputs=2 * fold_slot,
                retained_slots=2 * kv_slot * retain + 2 * kv_slot + 2 * fold_slot)


def test_decode_bytes_retention_hand_count():
    """A GDN hybrid with retention slots (layer 1 full), decoded by RetentionDecoder (RetentionRows) and by HF's
    forward on a LinearCache (RetentionState): every term against the hand count, the same after more steps."""
    from golinear.bench.speed.decode_bound import decode_bytes
    from golinear.models.cache.hf_cache import LinearCache
    from golinear.models.retention.generate import RetentionDecoder
    s, w, r = 2, 4, 3
    model = tiny_model("gdn", window=w, sinks=s, short_conv=True, full_layers=[1], retain=r,
                       retain_score="proj_residual")
    ids = torch.randint(0, 97, (B, CTX), generator=torch.Generator().manual_seed(0))
    rd = RetentionDecoder(model, max_len=64)
    rd.prefill(ids)
    got = decode_bytes(model, rd.states, batch=B, context=CTX + 0.5)
    want = _retention_hand_count(B, H, HKV, D, s, w, r)
    for term, per_layer in want.items():
        assert got[term] == 2 * per_layer, term
    assert got["conv_state"] == 2 * 2 * 4 * B * (64 + 2 * 32) * 3
    assert got["kv_cache"] == 1 * 2 * 4 * B * (CTX + 0.5) * HKV * D
    rd.decode(3)
    assert decode_bytes(model, rd.states, batch=B, context=CTX + 0.5) == got  # fixed shapes
    cache = LinearCache.for_model(model)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    states = [getattr(layer, "state", None) for layer in cache.layers]
    assert decode_bytes(model, states, batch=B, context=CTX + 0.5) == got


def test_latency_retention_config_rows(tmp_path):
    """A configuration with retention slots runs through the sweep (RetentionDecoder: whole-prompt prefill, eager
    decode) next to the default recipe. Its decode bytes are flat in length; they exceed the default recipe's
    with the same sinks and window by the retained slots' bytes (K and V of every slot read, one slot a step
    written), and the default recipe's at the same total budget by that one changed slot only."""
    import math

    from golinear.models.backbones.configs import named_config
    s, w, r = 2, 6, 6
    ret = f"gdn-default,sinks={s},window={w},retain={r},retain_score=proj_residual"
    same_window, same_budget = f"gdn-default,sinks={s},window={w}", f"gdn-default,sinks={s},window={w + r}"
    assert cli(["latency", "--lengths", "20,28", "--batch", "2", "--new-tokens", "2", "--configs",
                ";".join([same_budget, same_window, ret]), "--out-dir", str(tmp_path), "--layers", "1",
                "--prefill-chunk", "8"]) == 0
    df = pd.read_csv(tmp_path / "latency.csv")
    assert len(df) == 6 and (df.status == "ok").all()
    for col in ["prefill_s", "decode_ms_per_token", *latency.BOUND_COLUMNS]:
        assert all(math.isfinite(x) and x > 0 for x in df[col]), col
    rows = df[df.config == ret]
    assert (rows.prefill_chunk == 0).all() and not rows.cuda_graph.astype(bool).any()
    assert (df[df.config != ret].prefill_chunk == 8).all()
    nbytes = df.set_index(["config", "length"]).decode_bytes_per_step
    assert nbytes[ret, 20] == nbytes[ret, 28]
    cfg = named_config("smollm2-135m")
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    Dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    per_layer = _retention_hand_count(2, H, Hkv, Dh, s, w, r)
    kv_slot = 4 * 2 * Hkv * Dh
    for length in (20, 28):
        assert nbytes[ret, length] - nbytes[same_window, length] == per_layer["retained_slots"]
        assert nbytes[ret, length] - nbytes[same_budget, length] == per_layer["retained_slots"] - 2 * r * kv_slot


def test_latency_linearizes_with_every_option_of_the_spec():
    """`golinear latency` builds the configuration it names: options beyond window/sinks/conv (conv_on, out_norm)
    reach the layers (an earlier field-by-field copy dropped them and timed the default model)."""
    from _tiny import tiny_llama
    from golinear.bench.speed.latency import _linearize
    from golinear.bench.run.specs import parse_model_spec
    model = tiny_llama(320, layers=3)
    spec = parse_model_spec("gdn-default,conv_on=linear,out_norm=true,full_layers=1")
    undo = _linearize(model, spec, torch.float32)
    attns = [layer.self_attn for layer in model.model.layers]
    linear = [a for a in attns if hasattr(a, "conv_on")]
    assert len(linear) == 2 and attns[1] not in linear
    assert all(a.conv_on == "linear" and a.lin.out_norm is not None and a.conv is not None for a in linear)
    undo()
    assert not any(hasattr(layer.self_attn, "conv_on") for layer in model.model.layers)


def test_linearized_rows_on_cuda_need_fla(monkeypatch):
    """Without FLA a CUDA sweep would time the PyTorch reference under the fast path's name: refused, naming the
    rows; full-attention baselines and press rows need no FLA, and the CPU never does."""
    import importlib.util
    from golinear.bench.speed.latency import require_kernels
    from golinear.bench.run.specs import parse_model_spec
    labels = ["full", "full-static", "gdn-default", "press=snapkv,kv_budget=64"]
    specs = [t if t == "full-static" else parse_model_spec(t) for t in labels]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fla" else real(name, *a))
    with pytest.raises(ValueError, match=r"--configs gdn-default on CUDA need flash-linear-attention"):
        require_kernels(labels, specs, torch.device("cuda"))
    require_kernels(labels[:2] + labels[3:], specs[:2] + specs[3:], torch.device("cuda"))
    require_kernels(labels, specs, torch.device("cpu"))


def test_a_static_full_decoder_runs_each_length_once_untimed(tmp_path, monkeypatch):
    """full-static's buffer (and on CUDA its graph) is sized per prompt length: the first run at each length is
    untimed, so a row never carries that length's set-up (the baseline is not made slower than it is)."""
    from golinear.bench.speed import latency
    from golinear.bench.cli import main as cli
    calls = []
    real = latency.run_fast
    monkeypatch.setattr(latency, "run_fast", lambda decoder, ids, n: calls.append(ids.shape) or real(decoder, ids, n))
    assert cli(["latency", "--configs", "full-static", "--lengths", "64,96", "--batch", "1", "--new-tokens", "2",
                "--layers", "2", "--device", "cpu", "--out-dir", str(tmp_path)]) == 0
    assert [s[1] for s in calls] == [64, 64, 96, 96]  # warm-up + timed at 64; untimed + timed at 96
