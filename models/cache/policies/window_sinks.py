"""The default cache policy (retain=0, the paper's recipe): the softmax path keeps the first `sinks` tokens and the
last `window`; every other token is in the linear state (models.attention.layers: the window / sinks semantics).

Decode state (models.cache.decode_state.DecodeState, fixed shapes): the sinks' K/V, a ring of the last w tokens' K/V and
linear inputs (slot pos % w), the conv state and the recurrent state. `step` decodes one token per row in place
with device-side indexing (no host sync, static shapes: models.decoding.fast_decode.FastDecoder captures it in a CUDA graph),
folding the token leaving the window into the state; the steady GDN step runs models.attention.ops.fused_decode on CUDA.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
import torch.nn.functional as F

from golinear.models.attention import ops
from golinear.models.cache.decode_state import LIN_KEYS, DecodeState, gather_ring, put, ring_index
from golinear.models.attention.ops import fused_decode
from golinear.models.cache.policies.base import CachePolicy
from golinear.models.decoding.prefill import prefill_chunk
from golinear.models.attention.projection import matmul_dtype


def step_attention(q, keys, vals, allowed, scale):
    """One decode query per sequence against a few keys, in one fused SDPA call: q [B,1,Hq,D], keys/vals
    [B,L,Hkv,D], allowed [B, L] bool (per row) or None (all) -> out [B,1,Hq,D]. The G query heads of a KV
    head are G query rows of that head, so keys are not expanded."""
    B, _, Hq, D = q.shape
    Hkv = keys.shape[2]
    qg = q.reshape(B, Hkv, Hq // Hkv, D)
    mask = None if allowed is None else allowed.view(B, 1, 1, -1)
    o = F.scaled_dot_product_attention(qg, keys.transpose(1, 2), vals.transpose(1, 2), attn_mask=mask, scale=scale)
    return o.reshape(B, 1, Hq, vals.shape[-1])


@dataclasses.dataclass(eq=False, repr=False)
class WindowSinks(CachePolicy):
    name: ClassVar[str] = "window_sinks"
    decoder: ClassVar[str] = "static"

    def parallel(self, layer, x, pe, qk, q, k, v, conv, state: DecodeState | None):
        sq, sk, sv = layer.softmax_qkv(x, pe, q, k, v)
        swa = None
        if layer.has_softmax_path:
            swa = ops.window_sink_softmax(sq, sk, sv, sinks=layer.sinks, window=layer.window, scale=layer.scaling)
        lin_out = lin = lin_state = None
        first = 0
        if layer.lin is not None:
            lin = layer.linear_inputs(x, q, k, v, qk=qk)
            lin_out, lin_state, first = layer.linear_parallel(lin, x.shape[1])
        if state is not None:
            fill(layer, state, sk, sv, lin, lin_state, conv)
        return layer.combine(lin_out, swa, x.dtype, first)

    def prefill_chunk(self, layer, x, pe, state, chunk, carry):
        return prefill_chunk(layer, x, pe, state, chunk, carry)

    def step(self, layer, x, pe, state: DecodeState, pos, rows, steady: bool = False):
        """steady (every row's pos >= sinks + window, known when the step is built): the sinks are written, every
        slot is a real token and the leaving one is not a sink, so no sink write, mask or validity check."""
        if fused_decode.applies(layer, x, steady):  # the same step in few kernels (CUDA by default)
            return fused_decode.fused_step(layer, x, pe, state, pos)
        B = x.shape[0]
        s, w = layer.sinks, layer.window
        qk, q, k, v, new_conv = layer.project_step(x, pe, state)
        sq, sk, sv = layer.softmax_qkv(x, pe, q, k, v)
        slot = pos % w if w > 0 else None
        lin_out = None
        if layer.lin is not None:
            lin = layer.linear_inputs(x, q, k, v, qk=qk)
            qx = layer.query(lin)
            cur = {key: lin[key] for key in LIN_KEYS if key in lin}
            if w > 0:  # the token leaving the window (position pos - w) folds into the state
                leaving = {key: state.ring_lin[key][rows, slot].unsqueeze(1) for key in cur}
                for key, val in cur.items():
                    put(state.ring_lin[key], rows, slot, val[:, 0])
            else:
                leaving = cur
            if not steady:  # a sink or an empty slot (zeros) leaves nothing in the state: zero its inputs
                valid = state.ring_pos[rows, slot] >= s if w > 0 else pos >= s
                leaving = {key: val * valid.view(B, 1, *([1] * (val.dim() - 2))) for key, val in leaving.items()}
            lin_out, new = layer.run(leaving, qx, state.state, chunked=False)
            if isinstance(new, tuple):
                state.state[0].copy_(new[0])
                state.state[1].copy_(new[1])
            else:
                state.state.copy_(new)
        if w > 0 and not steady:  # (read only by non-steady steps; a prefill rewrites it)
            put(state.ring_pos, rows, slot, pos)
        swa = None
        if layer.has_softmax_path:
            swa = _window_step(layer, state, sq, sk, sv, pos, rows, slot, steady)
        y = layer.combine(lin_out, swa, x.dtype)
        return layer.o_proj(y.reshape(B, 1, -1).to(matmul_dtype(x)))


def _window_step(layer, state: DecodeState, sq, sk, sv, pos, rows, slot, steady: bool):
    """The softmax over the sinks and the ring after writing this token (a row still inside its first s tokens
    writes its sink slot)."""
    B, s, w = sq.shape[0], layer.sinks, layer.window
    keys, vals, allowed = [], [], []
    if s > 0 and not steady:
        idx = pos.clamp(max=s - 1)
        is_sink = (pos < s).view(B, 1, 1)
        for buf, new in ((state.sink_k, sk), (state.sink_v, sv)):
            put(buf, rows, idx, torch.where(is_sink, new[:, 0], buf[rows, idx]))
        allowed.append(torch.arange(s, device=sq.device).view(1, s) <= pos.view(B, 1))
    if s > 0:
        keys.append(state.sink_k)
        vals.append(state.sink_v)
    if w > 0:
        put(state.ring_k, rows, slot, sk[:, 0])
        put(state.ring_v, rows, slot, sv[:, 0])
        keys.append(state.ring_k)
        vals.append(state.ring_v)
        if not steady:
            allowed.append(state.ring_pos >= s)
    cat = lambda xs: xs[0] if len(xs) == 1 else torch.cat(xs, 1)  # noqa: E731
    return step_attention(sq, cat(keys), cat(vals), None if steady else cat(allowed), layer.scaling)


def fill(layer, state: DecodeState, k, v, lin, lin_state, conv):
    """The decode state after a whole prompt (every row of length T) from the parallel pass's tensors (k, v:
    the softmax path's)."""
    B, T = k.shape[:2]
    s, w = layer.sinks, layer.window
    if s > 0:
        state.sink_k, state.sink_v = (F.pad(t[:, :s], (0, 0, 0, 0, 0, max(0, s - T))) for t in (k, v))
    if w > 0:
        idx, pos = ring_index(T, w, 0)
        rows = torch.arange(B, device=k.device)
        idx = torch.tensor(idx, device=k.device).expand(B, w)
        state.ring_pos = torch.tensor(pos, device=k.device).expand(B, w).contiguous()
        empty = any(p < 0 for p in pos)
        state.ring_k, state.ring_v = (gather_ring(t, rows, idx, state.ring_pos, empty) for t in (k, v))
        if lin is not None:
            state.ring_lin = {key: gather_ring(lin[key], rows, idx, state.ring_pos, empty)
                              for key in LIN_KEYS if key in lin}
    state.conv = None if conv is None else conv.clone(memory_format=torch.contiguous_format)
    if layer.lin is not None:
        st = lin_state if lin_state is not None else layer.zero_state(B, k.device)
        state.state = tuple(t.float() for t in st) if isinstance(st, tuple) else st.float()
