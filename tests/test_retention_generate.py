"""Batched generation for models with retention slots (models/retention/generate.py, models/retention/rows.py),
fp32 on the CPU: a batch of prompts of different lengths gives, token for token, what each prompt gives generated
alone by HF's generate (the one-at-a-time path), for both scores; the per-row step equals each row stepped alone."""
from __future__ import annotations

import pytest
import torch

from golinear.models.decoding.batch_generate import decoder_for, generate_batch
from golinear.models.retention.ops import RetentionState, retention_step
from golinear.models.retention.prefill import retention_prefill
from golinear.models.retention.rows import RetentionRows, retention_rows_step
from golinear.models.retention.generate import RetentionDecoder, state_tensors
from test_batched_generate import alone, prompts, tiny_model

SCORES = ("delta_error", "proj_residual")
RECIPE = dict(window=4, sinks=2, short_conv=True, retain=3)  # steady from sinks + window = 6 tokens
LONG = [7, 6, 19, 11]  # all past the steady point, different lengths


def retention_model(score, tmp_path):
    """tiny_model with slots chosen by `score`; "fitted" gets a random scorer file of the model's shape."""
    if score != "fitted":
        return tiny_model("gdn", **RECIPE, retain_score=score)
    from test_retention_scorer import write_scorer
    return tiny_model("gdn", **RECIPE, retain_score=score, scorer=str(write_scorer(tmp_path / "scorer.safetensors")))


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("lengths", [LONG, LONG + [3], [1, 4]], ids=["steady", "one-short-row", "all-short"])
def test_batched_equals_each_prompt_alone(score, lengths):
    model = tiny_model("gdn", **RECIPE, retain_score=score)
    ps, n = prompts(lengths), 12
    decoder = decoder_for(model, max_len=64)
    assert isinstance(decoder, RetentionDecoder)
    assert generate_batch(decoder, ps, n) == [alone(model, p, n) for p in ps]


def test_hybrid_full_layer_and_no_conv():
    """A hybrid's full-attention layer goes through the static KV buffers with per-row positions."""
    model = tiny_model("gdn", window=3, sinks=1, retain=2, full_layers=[1], retain_score="proj_residual")
    ps, n = prompts([5, 12, 9, 2]), 10
    assert generate_batch(decoder_for(model, max_len=64), ps, n) == [alone(model, p, n) for p in ps]


def test_rows_stop_early_at_eos():
    """A row stops at its first EOS; the other rows are unaffected."""
    model = tiny_model("gdn", **RECIPE)
    ps, n = prompts(LONG), 10
    ref = [alone(model, p, n) for p in ps]
    eos = ref[1][2]
    got = generate_batch(decoder_for(model), ps, n, eos={eos})
    want = [r[:r.index(eos) + 1] if eos in r else r for r in ref]
    assert got == want and len(got[1]) <= 3 and any(len(g) == n for g in got)


def _states(lengths, score, seed=0):
    """Per-row prefilled RetentionStates of random prompts, and a random next token's inputs for each."""
    g = torch.Generator().manual_seed(seed)
    H, Hkv, D, s, w, r = 4, 2, 8, 2, 4, 3

    def inputs(T):
        q, k, v = torch.randn(1, T, H, D, generator=g), torch.randn(1, T, Hkv, D, generator=g), \
            torch.randn(1, T, Hkv, D, generator=g)
        lk = torch.nn.functional.normalize(k.repeat_interleave(2, 2), dim=-1)
        lin = {"q": q, "k": lk, "v": v.repeat_interleave(2, 2), "log_a": -torch.rand(1, T, H, generator=g),
               "beta": torch.rand(1, T, H, generator=g)}
        return q, k, v, lin
    states = []
    for T in lengths:
        q, k, v, lin = inputs(T)
        states.append(retention_prefill(q, k, v, lin, 0.3, 1.0, s, w, r, score, want_state=True)[1])
    return states, [inputs(1) for _ in lengths]


@pytest.mark.parametrize("score", SCORES)
def test_rows_step_equals_each_row_alone(score):
    """Several steps of retention_rows_step on stacked rows (one before the steady point) = each row stepped alone
    by retention_step: outputs and every tensor of the state."""
    lengths = [9, 6, 23, 3]
    states, _ = _states(lengths, score)
    rows = RetentionRows.stack(states)
    for step in range(6):
        _, toks = _states(lengths, score, seed=step + 1)
        cat = [torch.cat([tk[i] for tk in toks]) for i in range(3)]
        lin = {key: torch.cat([tk[3][key] for tk in toks]) for key in toks[0][3]}
        y, rows = retention_rows_step(rows, *cat, lin, 0.3, 1.0, score)
        for b, (q, k, v, one) in enumerate(toks):
            yb, states[b] = retention_step(states[b], q, k, v, one, 0.3, 1.0, score)
            torch.testing.assert_close(y[b:b + 1], yb, rtol=1e-6, atol=1e-6)
    assert rows.seen == [n + 6 for n in lengths]
    for b, one in enumerate(states):
        for got, want in zip(rows.row(b).tensors(), one.tensors()):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("score", SCORES)
def test_packed_rows_step_in_place_as_the_unpacked_ones(score):
    """RetentionRows.pack (sinks, window and slots in one K/V buffer, a spare slot per field) changes the layout, not
    the step: steady_step_inplace on packed rows gives the unpacked rows' outputs and states, step after step."""
    from golinear.models.retention.rows import steady_step_inplace
    lengths = [9, 14, 23, 11]  # all past sinks + window (6)
    states, _ = _states(lengths, score)
    plain, packed = RetentionRows.stack(states), RetentionRows.stack(states).pack()
    assert packed.buffers is not None and packed.state.ret["k"].data_ptr() != plain.state.ret["k"].data_ptr()
    pos = torch.tensor(lengths)
    for step in range(8):  # enough steps for tokens to take slots and to fold
        _, toks = _states(lengths, score, seed=step + 1)
        cat = [torch.cat([tk[i] for tk in toks]) for i in range(3)]
        lin = {key: torch.cat([tk[3][key] for tk in toks]) for key in toks[0][3]}
        want = steady_step_inplace(plain, *cat, lin, pos + step, 0.3, 1.0, score)
        got = steady_step_inplace(packed, *cat, lin, pos + step, 0.3, 1.0, score)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        for a, b in zip(packed.tensors(), plain.tensors()):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert packed.state.sink_k.data_ptr() == packed.buffers["k"].data_ptr()  # still views of the buffers


def test_stack_and_select_keep_each_row():
    states, _ = _states([8, 3], "proj_residual")
    rows = RetentionRows.stack(states).select(torch.tensor([1, 0, 1]))
    assert rows.seen == [3, 8, 3]
    for got, want in zip(rows.row(1).tensors(), states[0].tensors()):
        assert torch.equal(got, want)
    assert isinstance(rows.row(2), RetentionState) and rows.row(2).seen == 3


def test_decoder_refuses_a_model_without_slots():
    with pytest.raises(ValueError, match=r"^RetentionDecoder is for models with retention slots"):
        RetentionDecoder(tiny_model("gdn", window=4, sinks=2))


# ---------------------------------------------------------------------------------------------- GPU (skipped on CPU)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("score", SCORES)
def test_gpu_batched_equals_each_prompt_alone(score):
    """On the GPU (fp32, the FLA prefill ops): the batched path's tokens = HF generate of each prompt alone."""
    model = tiny_model("gdn", **RECIPE, retain_score=score).cuda()
    ps, n = prompts(LONG + [3]), 12
    with torch.no_grad():
        want = [model.generate(torch.tensor([p], device="cuda"), max_new_tokens=n, do_sample=False,
                               pad_token_id=0)[0, len(p):].tolist() for p in ps]
    assert generate_batch(decoder_for(model, max_len=64), ps, n) == want


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("score", SCORES + ("fitted",))
def test_gpu_graph_step_equals_the_eager_step(score, tmp_path):
    """On the GPU (fp32): RetentionDecoder's steady step captured in a CUDA graph and replayed (use_graph=True) gives
    the eager step's tokens and logits (same kernels: 1e-4), including a row that starts before sinks + window (its
    first steps eager, then the capture) and a second prefill on the same decoder (a fresh capture). The fitted
    scorer too: every GPU number of its rows comes through this step."""
    model = retention_model(score, tmp_path).cuda()
    ps = prompts(LONG + [3])
    lens = [len(p) for p in ps]
    ids = torch.tensor([p + [0] * (max(lens) - len(p)) for p in ps], device="cuda")

    def run(use_graph):
        dec = RetentionDecoder(model, use_graph=use_graph)
        out = []
        for _ in range(2):  # the second prefill replaces the state the first capture held
            toks = [dec.prefill(ids, lens)]
            logits = [dec.last_logits.clone()]
            for _ in range(10):
                toks.append(dec.decode(1))
                logits.append(dec.last_logits.clone())
            out.append((torch.cat(toks, 1), torch.cat(logits, 1)))
        return out, dec
    (eager, dec_e), (graph, dec_g) = run(False), run(True)
    assert dec_e.graph is None and dec_g.graph is not None
    for (te, le), (tg, lg) in zip(eager, graph):
        assert torch.equal(te, tg)
        assert ((lg - le).norm() / le.norm()).item() <= 1e-4


@pytest.mark.parametrize("score", SCORES)
def test_a_second_batch_of_the_same_size_reuses_the_buffers_a_graph_holds(score):
    """A prefill copies its states into the last prefill's buffers when the shapes match (so the step captured in a
    CUDA graph stays valid: one capture for every batch of a run, not one per batch) and the tokens are those of a
    fresh decoder; a batch with a row before sinks + window steps eagerly, which replaces the states: no graph is
    kept over them."""
    model = tiny_model("gdn", **RECIPE, retain_score=score)
    first, second = prompts(LONG), prompts([9, 14, 6, 8], seed=1)  # same batch size, other lengths (max_len fixed)
    fresh = RetentionDecoder(model, max_len=64)
    want = generate_batch(fresh, second, 8)
    dec = RetentionDecoder(model, max_len=64)
    generate_batch(dec, first, 8)
    before = [t.data_ptr() for st in dec.states for t in state_tensors(st)]
    class Replay:  # stands in for the captured steady step: replays it on the decoder's buffers
        def replay(self):
            dec._step(steady=True)
    held = dec.graph = Replay()
    dec.graph_steady = True
    assert generate_batch(dec, second, 8) == want
    assert [t.data_ptr() for st in dec.states for t in state_tensors(st)] == before
    assert dec.graph is held
    short = prompts([3, 12, 7, 9])  # a short row: its first steps eager (not the held graph), which replace the states
    assert generate_batch(dec, short, 8) == generate_batch(RetentionDecoder(model, max_len=64), short, 8)
    assert dec.graph is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_one_capture_serves_every_batch_of_the_same_size():
    """On the GPU (fp32): two batches of the same size, every row past sinks + window, decode from one captured
    graph (the second prefill copies into the buffers it holds) with the eager step's tokens."""
    model = tiny_model("gdn", **RECIPE, retain_score="proj_residual").cuda()
    batches = [prompts(LONG), prompts([9, 14, 6, 8], seed=1)]
    eager = [generate_batch(RetentionDecoder(model, max_len=64, use_graph=False), ps, 10) for ps in batches]
    dec = RetentionDecoder(model, max_len=64, use_graph=True)
    got, graphs = [], []
    for ps in batches:
        got.append(generate_batch(dec, ps, 10))
        graphs.append(dec.graph)
    assert got == eager and graphs[0] is not None and graphs[1] is graphs[0]
