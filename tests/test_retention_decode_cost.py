"""The retention decode step's cost does not depend on the context length, checked on the CPU.

RetentionDecoder's steady step (models.retention.rows.steady_step_inplace) is what a CUDA graph replays per
token, so it must dispatch the same work whatever the prompt length, keep fixed-size state, and read no host
value (`.item()`, `.tolist()`, a tensor built from Python numbers: each is a stream sync on CUDA and breaks a
capture). Kernels per layer are counted as tests/test_overhead.py counts the default recipe's step.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from golinear.models.retention.rows import RetentionRows, steady_step_inplace
from golinear.models.retention.generate import RetentionDecoder
from test_batched_generate import tiny_model
from test_retention_generate import RECIPE, SCORES, _states

HOST_VALUES = {"lift_fresh", "lift_fresh_copy", "_local_scalar_dense"}  # a host number into, or out of, a tensor
# Kernels per middle layer of one steady decode step (bf16, SmolLM2's heads, sinks 8 + window 28 + retain 28,
# short conv, CPU count). Before the retention decode work: 191 (proj_residual), 187 of them in a step that also
# made 3 host->device copies (a sync each on CUDA); the default recipe's eager step is 77 (test_overhead.py).
KERNEL_BOUND = 153
# GOLINEAR_FUSED_DECODE=1 (layer step compiled, glue fused), inductor kernels one each: 22 with the state's writes
# inside the graph, where inductor copied every window and slot buffer whole (see the test below); 41 since they run
# outside it, one scatter a field (16 small kernels a layer instead of copies of every buffer)
COMPILED_KERNEL_BOUND = 41


class Dispatched(TorchDispatchMode):
    """Every aten op dispatched inside: (name, output shapes)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = tuple(tuple(t.shape) for t in (out if isinstance(out, (tuple, list)) else [out]) if torch.is_tensor(t))
        self.ops.append((func.__name__, shapes))
        return out


def steady_decoder(score: str, length: int) -> RetentionDecoder:
    """A decoder after a prompt of `length` tokens (past sinks + window) and one decode step."""
    model = tiny_model("gdn", **RECIPE, retain_score=score)
    ids = torch.randint(1, 50, (3, length), generator=torch.Generator().manual_seed(length))
    dec = RetentionDecoder(model, use_graph=False)
    dec.prefill(ids)
    dec.decode(1)
    return dec


@pytest.mark.parametrize("score", SCORES)
def test_decode_step_work_does_not_depend_on_the_prompt_length(score):
    """The same aten ops with the same shapes, and the same state shapes, after prompts of 12 and 300 tokens."""
    seen = []
    for length in (12, 300):
        dec = steady_decoder(score, length)
        with Dispatched() as d, torch.no_grad():
            dec.decode(1)
        shapes = [[tuple(t.shape) for t in st.tensors()] for st, lin in zip(dec.states, dec.linear) if lin]
        seen.append((d.ops, shapes))
        assert dec.states[0].retention.seen == [length + 2] * 3
    assert len(seen[0][0]) > 100 and seen[0] == seen[1]


@pytest.mark.parametrize("score", SCORES)
def test_steady_steps_update_the_buffers_in_place(score):
    """What a CUDA graph captures is pointers: steady steps keep every buffer (state, conv, io) where it was, and
    change the state's values."""
    dec = steady_decoder(score, 12)
    pointers = [t.data_ptr() for t in dec._buffers()]
    state = dec.states[0].retention.state
    S, ret_pos = state.S.clone(), state.ret_pos.clone()
    with torch.no_grad():
        dec.decode(3)
    assert [t.data_ptr() for t in dec._buffers()] == pointers
    assert dec.states[0].retention.state is state and not torch.equal(state.S, S)
    assert not torch.equal(state.ret_pos, ret_pos)  # slots were taken


@pytest.mark.parametrize("score", SCORES)
def test_steady_step_reads_no_host_value(score):
    """steady_step_inplace on meta tensors (no data: .item(), .tolist() or a branch on a value raise) builds no tensor
    from Python numbers: nothing in it syncs with the host, so a CUDA graph can capture it."""
    states, toks = _states([9, 7, 12], score)
    rows = RetentionRows.stack(states)
    q, k, v = (torch.cat([tk[i] for tk in toks]) for i in range(3))
    lin = {key: torch.cat([tk[3][key] for tk in toks]) for key in toks[0][3]}
    meta = lambda x: x.to("meta")  # noqa: E731
    st = rows.state
    rows = RetentionRows(type(st)(S=meta(st.S), sink_k=meta(st.sink_k), sink_v=meta(st.sink_v),
                                  win={key: meta(x) for key, x in st.win.items()}, win_pos=meta(st.win_pos),
                                  ret={key: meta(x) for key, x in st.ret.items()}, ret_pos=meta(st.ret_pos),
                                  ksum=meta(st.ksum), folded=meta(st.folded), seen=st.seen), meta(rows.win_pos),
                         rows.seen)
    pos = torch.tensor(rows.seen, device="meta")
    with Dispatched() as d:
        y = steady_step_inplace(rows, meta(q), meta(k), meta(v), {key: meta(x) for key, x in lin.items()}, pos,
                                0.3, 1.0, score)
    assert y.shape == (3, 1, 4, 8)
    assert not {name.split(".")[0] for name, _ in d.ops} & HOST_VALUES, d.ops


def test_decode_step_kernel_count():
    """Kernels per middle layer of one steady step, counted as tests/test_overhead.py counts them: bounded, no sync."""
    import test_overhead as overhead
    recipe = dict(mechanism="gdn", window=28, sinks=8, retain=28, retain_score="proj_residual", short_conv=True)

    def step(model):
        dec = RetentionDecoder(model, use_graph=False)
        dec.prefill(torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(0)))
        return lambda: dec.decode(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(overhead.RECIPES, "retention", recipe)
        c = overhead.per_layer("retention", step, torch.bfloat16)
    print(f"\nretention decode step per layer: {c['kernels']} kernels, {c['syncs']} host syncs")
    assert c["syncs"] == 0 and 0 < c["kernels"] <= KERNEL_BOUND, c


def test_compiled_step_is_the_eager_step(monkeypatch):
    """GOLINEAR_FUSED_DECODE=1 (on CUDA by default): the layer's steady step through torch.compile gives the eager
    step's tokens and logits; counted with inductor's kernels as one each, it issues fewer kernels per layer."""
    from _tiny import inductor_works
    if not inductor_works():
        pytest.skip("torch.compile (inductor) cannot run on this machine")
    import torch._inductor.config as inductor_config
    import test_overhead as overhead
    model = tiny_model("gdn", **RECIPE, retain_score="proj_residual")
    ids = torch.randint(1, 50, (3, 9), generator=torch.Generator().manual_seed(0))
    got = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("GOLINEAR_FUSED_DECODE", mode)
        dec = RetentionDecoder(model, use_graph=False)
        toks = [dec.prefill(ids)]
        logits = []
        for _ in range(6):
            toks.append(dec.decode(1))
            logits.append(dec.last_logits.clone())
        got[mode] = torch.cat(toks, 1), torch.cat(logits, 1)
    assert torch.equal(got["0"][0], got["1"][0])
    torch.testing.assert_close(got["1"][1], got["0"][1], rtol=1e-5, atol=1e-5)
    recipe = dict(mechanism="gdn", window=28, sinks=8, retain=28, retain_score="proj_residual", short_conv=True)

    def step(model):
        dec = RetentionDecoder(model, use_graph=False)
        dec.prefill(torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(0)))
        return lambda: dec.decode(1)
    with pytest.MonkeyPatch.context() as mp, inductor_config.patch({"cpp.enable_kernel_profile": True}):
        mp.setitem(overhead.RECIPES, "retention", recipe)
        c = overhead.per_layer("retention", step, torch.bfloat16)
    print(f"\nretention decode step per layer, compiled: {c['kernels']} kernels "
          f"({c['ops'].get('inductor', 0)} inductor)")
    assert c["syncs"] == 0 and c["ops"].get("inductor", 0) > 0 and c["kernels"] <= COMPILED_KERNEL_BOUND, c



def test_the_compiled_step_copies_no_window_or_slot_buffer(monkeypatch):
    """GOLINEAR_FUSED_DECODE=1: written inside the compiled graph, the state's window and slot buffers (graph inputs,
    or views of one) came out of inductor as new buffers of their whole shape each step, a copy and a copy back; at
    batch 64 those copies were most of the compiled step's time. The packed step's writes run outside the graph
    (rows._write_packed), so the code inductor generates allocates nothing of a state buffer's shape."""
    import re
    from _tiny import inductor_works
    if not inductor_works():
        pytest.skip("torch.compile (inductor) cannot run on this machine")
    from torch._inductor.utils import run_and_get_code
    monkeypatch.setenv("GOLINEAR_FUSED_DECODE", "1")
    torch._dynamo.reset()
    model = tiny_model("gdn", window=28, sinks=8, retain=28, retain_score="proj_residual", short_conv=True)
    with torch.no_grad():
        dec = RetentionDecoder(model, use_graph=False)
        dec.prefill(torch.randint(1, 50, (2, 64), generator=torch.Generator().manual_seed(0)))
        _, code = run_and_get_code(lambda: dec.decode(2))
    torch._dynamo.reset()
    rows = dec.states[0].retention
    buffers = rows.tensors() + [rows.buffers["k"], *rows.buffers["ret"].values()]
    shapes = {tuple(t.shape) for t in buffers if t.dim() >= 4}
    shapes.discard(tuple(rows.state.S.shape))  # the linear state: read and written whole every step anyway
    made = {tuple(int(n) for n in m.split(",") if n.strip())
            for m in re.findall(r"empty_strided_\w+\(\(([\d, ]+)\)", "\n".join(code))}
    assert made and shapes, (made, shapes)  # inductor allocated something, and the state has such buffers
    assert not made & shapes, made & shapes
