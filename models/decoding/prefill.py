"""Chunked prefill of a right-padded, variable-length batch into a DecodeState (LinearizedAttention.prefill
with a `chunk`, driven by models.decoding.fast_decode.FastDecoder).

The prompt runs in chunks of positions [p0, p1), carrying per layer (`carry`, a dict) the window tail, the
sinks seen so far, the linear inputs of the last w tokens and the conv state across chunks; the recurrent
state is carried in the DecodeState being filled. Every op is causal, so a row's real tokens never see its
padding; what remains per row is the end of its prompt: the tokens that enter the recurrent state stop at its
own length - window (later ones are masked: their STOP_KEYS inputs, e.g. GDN's beta and log decay, are zeroed,
which leaves the state unchanged), and its window ring, conv state and last hidden state are gathered at its
own last token, in the chunk where the row ends (`ChunkEnds`). After the last chunk the state is complete:
sinks padded to s slots, the recurrent state fp32 (zeros where no token entered it).
Bandwidth (at 8B, batch 8 every [B, Tc, H, D] tensor of an 8K chunk is 0.54 GB; tests/test_prefill_traffic.py
counts the bytes): the keys get the sinks and the window tail in front in one copy, and the window + sinks are
added straight into the linear output (window_attention_added), which for GDN covers every row of the first
chunk too (zero tokens in front, see _pads_front).
"""
from __future__ import annotations

import torch

from golinear.models.cache.decode_state import LIN_KEYS, DecodeState, gather_ring, ring_index
from golinear.models.attention import ops
from golinear.models.attention.ops import fla_backend  # window_attention_blocked, sink_part (also on the CPU)
from golinear.models.attention.ops import window as window_ops
from golinear.models.attention.ops.window import window_attention_blocked
from golinear.models.attention.projection import fused_qkv, project_qkv
from golinear.models.spec import CONV_ON


def check_lengths(lengths, B: int, T: int) -> list[int]:
    """Real prompt lengths of a right-padded [B, T] batch (None: all T); ValueError naming a bad one."""
    lens = [T] * B if lengths is None else [int(n) for n in lengths]
    if len(lens) != B or any(not 1 <= n <= T for n in lens):
        raise ValueError(f"lengths {lens} must give one length per row ({B} rows), each 1..{T} (the padded width)")
    return lens


class ChunkEnds:
    """The prefill chunk [p0, p1) of a right-padded batch of prompts `lens` (padded width T), and the rows
    whose prompt ends inside it; shared by every layer of the chunk."""

    def __init__(self, lens: list[int], p0: int, p1: int, T: int, device):
        self.p0, self.p1, self.B = p0, p1, len(lens)
        self.last = p1 == T  # the state is completed after this chunk
        self.rows = [b for b, n in enumerate(lens) if p0 < n <= p1]
        self.rows_lengths = [lens[b] for b in self.rows]
        self.index = torch.tensor(self.rows, device=device, dtype=torch.long)
        self.last_token = torch.tensor([n - 1 for n in self.rows_lengths], device=device, dtype=torch.long)
        self.short = any(n < p1 for n in lens)  # some row has padding in this chunk
        self.lengths = torch.tensor(lens, device=device) if self.short else None
        self.all = len(self.rows) == len(lens)
        self._rings = {}

    def ring(self, w: int, origin: int):
        """(index [R, w] into a tensor starting at position `origin`, positions [R, w] (-1: empty slot),
        whether any slot is empty) of these rows' rings; shared by every tensor and layer."""
        if (w, origin) not in self._rings:
            idx, pos = zip(*(ring_index(n, w, origin) for n in self.rows_lengths))
            dev = self.index.device
            self._rings[w, origin] = (torch.tensor(idx, device=dev), torch.tensor(pos, device=dev),
                                      any(p < 0 for row in pos for p in row))
        return self._rings[w, origin]

    def scatter(self, buf, val):
        """These rows' values val [R, ...] into buf [B, ...] (made, zeros, on first use); val itself if the
        chunk ends every row."""
        if self.all:
            return val
        if buf is None:
            buf = val.new_zeros(self.B, *val.shape[1:])
        buf[self.index] = val
        return buf

    def ring_of(self, buf, ext: torch.Tensor, origin: int, w: int):
        """(buf with these rows' rings [B, w, ...] gathered from ext [B, L, ...] (entry 0 is position `origin`;
        slot j: the one of the row's last w positions p with p % w == j; zeros where none), positions [R, w])."""
        idx, pos, empty = self.ring(w, origin)
        return self.scatter(buf, gather_ring(ext, self.index, idx, pos, empty)), pos


def prefill_chunk(attn, x, pe, state: DecodeState, ends: ChunkEnds, carry: dict):
    """One chunk of LinearizedAttention.prefill: the attention output [B, Tc, hidden] of positions
    [ends.p0, ends.p1); fills `state` for the rows ending in the chunk and completes it after the last one.
    On CUDA without autograd it runs the inference-only kernels (models.attention.ops.fast_inference). One projection feeds
    both paths: conv_on "linear" (the softmax path without the conv) is refused."""
    if attn.conv_linear_only:
        raise ValueError(f"the chunked prefill (golinear.models.decoding.prefill) implements conv_on={CONV_ON[0]!r} only, got "
                         f"conv_on={attn.conv_on!r}; prefill the whole prompt (HF generate, golinear.models.decoding.batch_generate.decoder_for)")
    with ops.prefill_scope():
        return _prefill_chunk(attn, x, pe, state, ends, carry)


def _prefill_chunk(attn, x, pe, state: DecodeState, ends: ChunkEnds, carry: dict):
    B, Tc = x.shape[:2]
    p0, p1 = ends.p0, ends.p0 + Tc
    s, w = attn.sinks, attn.window
    pe = tuple(t[:1] for t in pe)  # every row of the chunk is at positions p0..p1-1: one table, broadcast
    prev_conv = carry.get("conv")
    qk, q, k, v, new_conv = project_qkv(attn, x, pe, attn.conv_weight(), prev_conv)
    # carries are cloned: a view would keep the whole chunk's tensors alive (memory grows per layer)
    carry["conv"] = new_conv.clone() if new_conv is not None else None
    if new_conv is not None and ends.rows:
        _conv_ends(attn, x, prev_conv, carry["conv"], ends, state)
    swa = swa_args = None
    if attn.has_softmax_path:
        if p0 < s:  # the first s keys overall are the sinks
            prev = carry.get("sink_k")
            take = min(s, p1) - p0
            carry["sink_k"] = k[:, :take].clone() if prev is None else torch.cat([prev, k[:, :take]], 1)
            carry["sink_v"] = v[:, :take].clone() if prev is None else torch.cat([carry["sink_v"], v[:, :take]], 1)
        if w > 0:  # window + sinks in one fused attention call over [sinks | previous w keys | these]
            tk, tv = carry.get("win_k"), carry.get("win_v")
            n_tail = 0 if tk is None else tk.shape[1]
            n_sink = carry["sink_k"].shape[1] if s > 0 and p1 - 1 - w >= 0 else 0  # a sink outside a window
            lo = n_sink if n_tail else 0  # first chunk: the sinks are its own keys 0..s-1, read in place
            # [sinks | previous w keys | these] in one copy; the ring and the next tail read views of it
            keys = _keys_after(([carry["sink_k"]] if lo else []) + ([tk] if n_tail else []), k)
            vals = _keys_after(([carry["sink_v"]] if lo else []) + ([tv] if n_tail else []), v)
            k_ext, v_ext = keys[:, lo:], vals[:, lo:]  # [previous w keys | these]: views
            # run after the linear path, to be added straight into its output (window_attention_added)
            swa_args = dict(q=q, k=keys, v=vals, window=w, scale=attn.scaling, sinks=n_sink, base=lo + n_tail,
                            lo=lo, q_pos0=p0)
            if ends.rows:
                state.ring_k, pos = ends.ring_of(state.ring_k, k_ext, p0 - n_tail, w)
                state.ring_v, _ = ends.ring_of(state.ring_v, v_ext, p0 - n_tail, w)
                state.ring_pos = ends.scatter(state.ring_pos, pos)
            carry["win_k"], carry["win_v"] = k_ext[:, -w:].clone(), v_ext[:, -w:].clone()  # last w keys
        else:  # sinks only
            q_pos = torch.arange(p0, p1, device=x.device)
            o_s, _ = fla_backend.sink_part(q, carry["sink_k"], carry["sink_v"], 0, attn.scaling, q_pos)
            swa = o_s.to(q.dtype)
    lin_out = None
    first = 0  # lin_out covers the rows >= first (earlier rows read a zero state)
    if attn.lin is not None:
        # the KV_KEYS stay on the KV heads here: expanded to the query heads only for the rows that run
        lin = attn.lin.inputs(x, q, k, v, qk=qk, expand_kv=False)
        qx = attn.query(lin)
        lin = {key: lin[key] for key in LIN_KEYS if key in lin}
        groups = {key: attn.lin.groups if key in attn.lin.KV_KEYS else 1 for key in lin}
        prev = carry.get("lin") or {}  # the last w tokens of the previous chunks
        e0 = p0 - (next(iter(prev.values())).shape[1] if prev else 0)  # position of row 0 of [prev | lin]
        n = p1 - w - e0  # tokens entering the state in this chunk: positions e0 .. p1-w-1
        # sinks never enter the state, and they come before any other token, so the state is still
        # zero when they would: skip them instead of zeroing their key and beta
        n_sink = min(max(0, s - e0), max(n, 0))
        if n - n_sink > 0:
            first = Tc - n + n_sink  # first query row reading a state (row of position e0 + n_sink + w)
            # rows before `first` read a zero state (only sinks, which never enter it, came before): with
            # `first` zero tokens in front (k, v, gates 0: the state stays zero), the op's output covers every
            # row and the window is added straight into it (window_attention_added)
            pad = first if _pads_front(attn, swa_args) else 0
            entering = {key: _rows(prev.get(key), val, n_sink, n, groups[key], pad) for key, val in lin.items()}
            first -= pad
            if ends.short:  # a row's tokens from its length - window on leave its state unchanged
                stop = (ends.lengths - w).view(B, 1)  # first position that must not enter
                keep = torch.arange(e0 + n_sink - pad, e0 + n, device=x.device).view(1, -1) < stop
                for key in attn.lin.STOP_KEYS:
                    val = entering[key]
                    entering[key] = torch.where(keep.view(*keep.shape, *([1] * (val.dim() - 2))), val,
                                                torch.zeros((), dtype=val.dtype, device=val.device))
            lin_out, state.state = attn.run(entering, qx[:, first:], state.state, chunked=True)
        else:
            lin_out = attn.zero_output(qx, lin)
        if w > 0 and ends.rows:
            for key, val in lin.items():
                state.ring_lin[key] = _ring(ends, state.ring_lin.get(key), prev.get(key), val, e0, w, groups[key])
        carry["lin"] = {key: _last(prev.get(key), val, w) for key, val in lin.items()} if w > 0 else None
    if swa_args is not None and _adds_into(attn, lin_out, first, swa_args):
        y = window_attention_added(lin_out, **swa_args)
    else:
        if swa_args is not None:
            swa = fla_backend.window_attention_blocked(**swa_args).to(q.dtype)
        y = attn.combine(lin_out, swa, x.dtype, first)
    if ends.last:
        _complete(attn, state, carry, B, x.device)
    return attn.o_proj(y.reshape(B, Tc, -1).to(x.dtype))


def _keys_after(front: list, cur):
    """[front... | cur] along dim 1 in one copy (cur itself when nothing is in front)."""
    return torch.cat([*front, cur], 1) if front else cur


def _adds_into(attn, lin_out, first: int, swa_args: dict) -> bool:
    """Whether the window + sinks can be added straight into the linear output (window_attention_added): a plain
    disjoint sum (not Hedgehog's shared normaliser) over every row, one dtype, no autograd, whole query blocks."""
    q = swa_args["q"]
    return (attn.mechanism != "hedgehog" and isinstance(lin_out, torch.Tensor) and first == 0
            and not torch.is_grad_enabled() and lin_out.dtype == q.dtype == swa_args["v"].dtype
            and lin_out.is_contiguous() and lin_out.shape[:3] == q.shape[:3]
            and q.shape[1] % window_ops.PREFILL_BLOCK == 0)


def window_attention_added(y, q, k, v, window, scale, sinks=0, base=0, lo=0, q_pos0=0):
    """y += window_attention_blocked(q, k, v, ...) in place, added straight from SDPA's output, whose layout
    ([B, Hkv, n, block, G, V] order) needs one copy to become [B, Tq, Hq, V]: that copy and the fresh tensor
    of y_lin + y_swa are 2 of the 5 passes over [B, Tq, Hq, V] of copy-then-add; the sums are the same, bit
    for bit (tests/test_prefill_window_added.py). No autograd; y [B, Tq, Hq, V] contiguous, Tq a multiple of the
    block."""
    return window_attention_blocked(q, k, v, window, scale, sinks=sinks, base=base, lo=lo, q_pos0=q_pos0, add_to=y)


def _pads_front(attn, swa_args) -> bool:
    """Whether the linear op's inputs get zero tokens in front so that its output covers every row of the chunk:
    when the window is then added into it, and the padding costs no copy of size: GDN (per-head gates, small)
    with shared KV heads (k and v are written into a fresh expanded tensor anyway)."""
    return swa_args is not None and attn.mechanism == "gdn" and attn.lin.groups > 1 and not torch.is_grad_enabled()


def _rows(prev, cur, a: int, b: int, groups: int, pad: int = 0):
    """Rows a..b-1 of [prev | cur] (dim 1; prev may be None) after `pad` rows of zeros, heads (dim 2) repeated
    `groups` times as models.attention.mechanisms.expand does. With groups > 1 one fresh contiguous tensor written in one
    pass per part; else a view of cur, or one cat."""
    starts = [(cur, 0)] if prev is None else [(prev, 0), (cur, prev.shape[1])]
    pieces = [t[:, max(a - start, 0):b - start] for t, start in starts if b > start and a < start + t.shape[1]]
    if pad:
        pieces.insert(0, cur.new_zeros(cur.shape[0], pad, *cur.shape[2:]))
    if groups == 1:
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, 1)
    H = cur.shape[2]
    out = cur.new_empty(cur.shape[0], pad + b - a, H * groups, *cur.shape[3:])
    i = 0
    for piece in pieces:
        out[:, i:i + piece.shape[1]].unflatten(2, (H, groups)).copy_(piece.unsqueeze(3))
        i += piece.shape[1]
    return out


def _ring(ends: ChunkEnds, buf, prev, cur, origin: int, w: int, groups: int):
    """buf with the rings of the rows ending in this chunk gathered from [prev | cur] (entry 0 at position
    `origin`; see ChunkEnds.ring_of), heads repeated `groups` times by the gather itself."""
    # the rows' last w positions lie in [shortest - w, longest): only that span of [prev | cur] is taken (a
    # view of cur when every row ends in its last w tokens), not a copy of the whole chunk
    a = max(min(ends.rows_lengths) - w - origin, 0)
    ext = _rows(prev, cur, a, max(ends.rows_lengths) - origin, 1)
    idx, pos, empty = ends.ring(w, origin + a)
    if groups > 1:  # a broadcast view: the gather writes the repeated heads
        ext = ext.unsqueeze(3).expand(*ext.shape[:3], groups, *ext.shape[3:])
    vals = gather_ring(ext, ends.index, idx, pos, empty)
    return ends.scatter(buf, vals.flatten(2, 3) if groups > 1 else vals)


def _last(prev, cur, w: int):
    """The last w rows of [prev | cur] (all of them if fewer), as a fresh tensor: the carry to the next chunk."""
    if prev is None or cur.shape[1] >= w:
        return cur[:, -w:].clone()
    return torch.cat([prev, cur], 1)[:, -w:].clone()


def _conv_ends(attn, x, prev, new, ends: ChunkEnds, state: DecodeState):
    """The conv state of each row ending in this chunk: [q|k|v] before the conv of its last W-1 tokens.
    A row ending at the chunk's end has it in `new` (the chunk's conv state); another row's is gathered
    from the previous chunk's state `prev` (zeros before position 0) and recomputed from x."""
    Tc = x.shape[1]
    p0, W1 = ends.p0, new.shape[-1]
    if all(n == p0 + Tc for n in ends.rows_lengths):
        state.conv = ends.scatter(state.conv, new if ends.all else new[ends.index])
        return
    # entry i of [prev | x] is position p0 - W1 + i; a row of length n needs positions n - W1 .. n - 1
    idx = torch.tensor([list(range(n - p0, n - p0 + W1)) for n in ends.rows_lengths], device=x.device)
    rows = ends.index.unsqueeze(1)
    from_x = fused_qkv(attn, x[rows, (idx - W1).clamp(min=0)])  # [R, W1, D]
    before = (idx < W1).unsqueeze(-1)
    if prev is None:
        from_prev = torch.zeros((), dtype=from_x.dtype, device=x.device)  # positions < 0 (first chunk)
    else:
        from_prev = prev.transpose(1, 2)[rows, idx.clamp(max=W1 - 1)].to(from_x.dtype)
    vals = torch.where(before, from_prev, from_x).transpose(1, 2)  # [R, D, W1]
    state.conv = ends.scatter(state.conv, vals.to(new.dtype))


def _complete(attn, state: DecodeState, carry: dict, B: int, device):
    """After the last chunk: sinks in s slots (a row shorter than s holds padding keys in its last sink slots:
    masked, then overwritten by the step), keys in the layer's dtype, the recurrent state fp32."""
    s = attn.sinks
    dt = attn.o_proj.weight.dtype
    if s > 0:
        sk = torch.zeros(B, s, attn.num_kv_heads, attn.head_dim, dtype=dt, device=device)
        sv = torch.zeros_like(sk)
        n = carry["sink_k"].shape[1]
        sk[:, :n], sv[:, :n] = carry["sink_k"], carry["sink_v"]
        state.sink_k, state.sink_v = sk, sv
    if state.ring_k is not None:
        state.ring_k, state.ring_v = state.ring_k.to(dt), state.ring_v.to(dt)
    if attn.lin is not None:
        st = state.state if state.state is not None else attn.zero_state(B, device)
        state.state = tuple(t.float() for t in st) if isinstance(st, tuple) else st.float()
