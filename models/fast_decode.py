"""Fast generation for linearized models: chunked prefill, then decoding on a static-shape cache.

Every decode buffer has a fixed shape whatever the prompt length: per linearized layer the recurrent
state, the sink KV, a ring buffer of the last `window` tokens (their KV, their position and the
linear-path inputs they fold into the state when they leave), and the short-conv state; per
full-attention layer of a hybrid a KV buffer of `max_len` slots. The decode step reads the position from
a device tensor and selects ring slots / validity with device-side indexing, so it has no host sync and
no data-dependent shapes: on CUDA it is captured once in a CUDA graph and replayed per token, and its
cost does not depend on how long the prompt was. Once the position reaches sinks + window (any prompt of
that length), a leaner step is used: the sinks are complete and every window slot holds a real token, so
it skips the sink writes, the masks and the validity checks (a graph is re-captured when the variant changes).

The math is LinearizedAttention's (models/layers.py), reusing its modules and methods (`project`,
`linear_inputs`, `_run`, `_query`, `_combine`); tests/test_latency.py checks the logits against the
model's own parallel forward. The prefill runs the prompt in chunks of `prefill_chunk` positions,
carrying state, window tail, sinks and conv state across chunks, which bounds activation memory.

Variable-length batches: `prefill(ids, lengths)` takes prompts padded on the RIGHT. Every prefill op is
causal, so a row's real tokens never see its padding; what remains per row is the end of its prompt: the
tokens that enter the recurrent state stop at its own length - window (later ones are masked: zero key,
value, beta, feature map and log decay, which leave the state unchanged), and its window ring, conv state
and last logits are gathered at its own last token. Decoding then runs with one position per row (RoPE,
ring slots, sink writes, masks and the full-attention KV slot are per row), so rows of different lengths
share one static cache and one captured graph. A row's padding is never in any state.
"""
from __future__ import annotations

import torch

from models import ops
from models.layers import LIN_KEYS, LinearizedAttention
from models.ops.fla_backend import sink_part, window_attention_blocked

DEFAULT_PREFILL_CHUNK = 8192


def decoder_layers(model):
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ValueError(f"unsupported model class {type(model).__name__}: expected a *ForCausalLM with .model.layers")
    return inner.layers


def step_attention(q, keys, vals, allowed, scale):
    """One decode query per sequence against a few keys, in one fused SDPA call: q [B,1,Hq,D], keys/vals
    [B,L,Hkv,D], allowed [B, L] bool (per row) or None (all) -> out [B,1,Hq,D]. The G query heads of a KV
    head are G query rows of that head, so keys are not expanded (as in _step_full)."""
    B, _, Hq, D = q.shape
    Hkv = keys.shape[2]
    qg = q.reshape(B, Hkv, Hq // Hkv, D)
    mask = None if allowed is None else allowed.view(B, 1, 1, -1)
    o = torch.nn.functional.scaled_dot_product_attention(qg, keys.transpose(1, 2), vals.transpose(1, 2),
                                                          attn_mask=mask, scale=scale)
    return o.reshape(B, 1, Hq, vals.shape[-1])


def _put(buf, rows, idx, value):
    """buf[rows[b], idx[b]] = value[b] for every row b, with device indices (no host sync)."""
    buf.index_put_((rows, idx), value.to(buf.dtype))


def check_lengths(lengths, B: int, T: int) -> list[int]:
    """Real prompt lengths of a right-padded [B, T] batch (None: all T); ValueError naming a bad one."""
    lens = [T] * B if lengths is None else [int(n) for n in lengths]
    if len(lens) != B or any(not 1 <= n <= T for n in lens):
        raise ValueError(f"lengths {lens} must give one length per row ({B} rows), each 1..{T} (the padded width)")
    return lens


def ring_index(length: int, w: int, origin: int) -> tuple[list[int], list[int]]:
    """Which position sits in each of the w ring slots after a prompt of `length` tokens (slot = position % w):
    (index of that position in a tensor whose entry 0 is position `origin` (clamped to 0 where none),
    position or -1 where the slot is still empty)."""
    pos = [length - w + (j - length) % w for j in range(w)]
    return [max(p - origin, 0) for p in pos], [p if p >= 0 else -1 for p in pos]


def _assign(holder: dict, name: str, value: torch.Tensor):
    """Copy into the existing static buffer when shapes match (keeps captured graphs valid), else replace."""
    old = holder.get(name)
    if old is not None and old.shape == value.shape and old.dtype == value.dtype:
        old.copy_(value)
        return False
    holder[name] = value.clone()
    return True


class _LinearLayerState:
    """Static decode buffers of one LinearizedAttention layer (filled by the prefill)."""

    def __init__(self):
        self.buf: dict[str, torch.Tensor] = {}  # sink_k/v [B,s,Hkv,D], ring_k/v [B,w,Hkv,D], ring_pos [B,w],
        self.lin: dict[str, torch.Tensor] = {}  # ring of linear inputs [B,w,...]
        self.conv: dict[str, torch.Tensor] = {}
        self.state = None  # tensor or (S, Z)


class _ChunkEnds:
    """The rows of a right-padded batch whose prompt ends inside the prefill chunk [p0, p1)."""

    def __init__(self, lens: list[int], p0: int, p1: int, device):
        self.p0 = p0
        self.rows = [b for b, n in enumerate(lens) if p0 < n <= p1]
        self.rows_lengths = [lens[b] for b in self.rows]
        self.index = torch.tensor(self.rows, device=device, dtype=torch.long)
        self.last = torch.tensor([n - 1 for n in self.rows_lengths], device=device, dtype=torch.long)
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


def _scatter_rows(buf, index, val, B):
    """buf[index] = val, buf [B, ...] made (zeros) on first use."""
    if buf is None:
        buf = val.new_zeros(B, *val.shape[1:])
    buf[index] = val
    return buf


def _ring_ends(holder: dict, name: str, ext: torch.Tensor, origin: int, w: int, ends: _ChunkEnds, B: int):
    """holder[name][b] = the ring of row b for the rows ending in this chunk (slot j: the one of its last w
    positions p with p % w == j; zeros where the row has no such token); ext [B, L, ...] starts at position
    `origin`. Returns those positions [R, w] (-1: empty slot)."""
    idx, pos, empty = ends.ring(w, origin)
    vals = ext[ends.index.unsqueeze(1), idx]  # [R, w, ...]
    if empty:
        filled = (pos >= 0).view(*pos.shape, *([1] * (vals.dim() - 2)))
        vals = torch.where(filled, vals, torch.zeros((), dtype=vals.dtype, device=vals.device))
    holder[name] = vals if ends.all else _scatter_rows(holder.get(name), ends.index, vals, B)
    return pos

class FastDecoder:
    """Greedy generation for a (linearized or hybrid) *ForCausalLM with a static cache and CUDA graphs.

    `prefill(input_ids)` returns the first generated token [B, 1]; `decode(n)` returns the next n tokens
    [B, n]. `use_graph=None` means: on CUDA. `max_len` bounds prompt + generated tokens (it sizes the KV
    buffers of full-attention layers only)."""

    def __init__(self, model, prefill_chunk: int = DEFAULT_PREFILL_CHUNK, use_graph: bool | None = None,
                 max_len: int | None = None):
        if prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0 (0 = the whole prompt at once), got {prefill_chunk}")
        self.model = model
        self.layers = list(decoder_layers(model))
        self.prefill_chunk = prefill_chunk
        self.device = next(model.parameters()).device
        self.use_graph = (self.device.type == "cuda") if use_graph is None else use_graph
        self.max_len = max_len
        self.linear = [isinstance(layer.self_attn, LinearizedAttention) for layer in self.layers]
        self.states: list = [None] * len(self.layers)
        # from this position on, every sink and ring slot holds a real token and the token leaving the window
        # is not a sink: the decode step then skips the sink writes, the masks and the validity checks
        self.steady_from = max((layer.self_attn.sinks + layer.self_attn.window for layer, lin
                                in zip(self.layers, self.linear) if lin), default=0)
        self.graph = None
        self.graph_steady = None  # the step variant the captured graph replays
        self.io: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ public API
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, lengths=None) -> torch.Tensor:
        """Run the prompts, fill the static cache; returns each row's first generated token [B, 1].

        input_ids [B, T] padded on the right; lengths: each row's real length (None: all T)."""
        B, T = input_ids.shape
        if T == 0:
            raise ValueError("prefill needs at least one prompt token")
        lens = check_lengths(lengths, B, T)
        max_len = max(self.max_len or 0, T + 1)
        changed = False
        fresh = [_LinearLayerState() if lin else {} for lin in self.linear]
        chunk = self.prefill_chunk or T
        tails = [dict() for _ in self.layers]
        finals = [dict() for _ in self.layers]  # per-row ends of the prompts (ring, conv state), see _gather_ends
        last_h = None
        for p0 in range(0, T, chunk):
            p1 = min(T, p0 + chunk)
            ids = input_ids[:, p0:p1]
            h = self.model.model.embed_tokens(ids)
            pos = torch.arange(p0, p1, device=ids.device).unsqueeze(0).expand(B, -1)
            pe = self.model.model.rotary_emb(h, pos)
            ends = _ChunkEnds(lens, p0, p1, self.device)
            for i, layer in enumerate(self.layers):
                x = layer.input_layernorm(h)
                if self.linear[i]:
                    a = self._prefill_linear(layer.self_attn, x, pe, p0, fresh[i], tails[i], ends, finals[i])
                else:
                    a = self._prefill_full(layer.self_attn, x, pe, p0, tails[i])
                h = h + a
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            if ends.rows:  # each row's last real token: the position its first new token is predicted from
                last = h[ends.index, ends.last - p0].unsqueeze(1)
                last_h = last if ends.all else _scatter_rows(last_h, ends.index, last, B)
        logits = self.model.lm_head(self.model.model.norm(last_h))
        # move everything into the static buffers (reused across prompts so a captured graph stays valid)
        for i, layer in enumerate(self.layers):
            if self.linear[i]:
                changed |= self._finish_linear(i, layer.self_attn, fresh[i], tails[i], finals[i], B)
            else:
                changed |= self._finish_full(i, layer.self_attn, tails[i], T, B, max_len)
        nxt = logits.argmax(-1)
        changed |= _assign(self.io, "ids", nxt)
        pos = torch.tensor(lens, device=self.device)
        changed |= _assign(self.io, "pos", pos)
        changed |= _assign(self.io, "pos_ids", pos.view(B, 1))
        changed |= _assign(self.io, "rows", torch.arange(B, device=self.device))
        changed |= _assign(self.io, "logits", logits.float())
        if changed:
            self.graph = None
        self.positions = lens  # host-side copy of io["pos"], for the steady switch and the capacity check
        return nxt

    @torch.no_grad()
    def decode(self, n: int) -> torch.Tensor:
        """n greedy steps from the prefilled cache; returns [B, n]."""
        if "ids" not in self.io:
            raise ValueError("decode() needs a prefill() first")
        capacity = min((st["k"].shape[2] for st in self.states if isinstance(st, dict)), default=None)
        if capacity is not None and max(self.positions) + n > capacity:
            raise ValueError(f"decode({n}) after {max(self.positions)} tokens exceeds the full-attention KV buffer of "
                             f"{capacity} slots; construct FastDecoder with a larger max_len")
        first = min(self.positions)  # the step variant is chosen by the row furthest behind
        self.positions = [p + n for p in self.positions]
        out = []
        if self.use_graph:
            steady = first >= self.steady_from  # a steady graph only ever sees later positions: valid throughout
            if self.graph is not None and self.graph_steady != steady:
                self.graph = None
            if self.graph is None:
                self._capture(steady)
        for i in range(n):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._step(steady=first + i >= self.steady_from)
            out.append(self.io["ids"].clone())
        return torch.cat(out, 1) if out else self.io["ids"].new_zeros(self.io["ids"].shape[0], 0)

    def capture(self):
        """Capture the decode step now (else the first decode() does it); no-op without graphs."""
        if "ids" not in self.io:
            raise ValueError("capture() needs a prefill() first")
        if self.use_graph and self.graph is None:
            self._capture(min(self.positions) >= self.steady_from)

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, lengths=None) -> torch.Tensor:
        """max_new_tokens greedy tokens per row [B, n] (input_ids right-padded to `lengths`, as in prefill)."""
        first = self.prefill(input_ids, lengths)
        return torch.cat([first, self.decode(max_new_tokens - 1)], 1) if max_new_tokens > 0 else first[:, :0]

    @property
    def last_logits(self) -> torch.Tensor:
        """Logits [B, 1, vocab] behind the most recent token (prefill or decode step)."""
        return self.io["logits"]

    # ------------------------------------------------------------------ prefill, linearized layers
    def _prefill_linear(self, attn: LinearizedAttention, x, pe, p0: int, st: _LinearLayerState, tail: dict,
                        ends: "_ChunkEnds", final: dict):
        B, Tc = x.shape[:2]
        p1 = p0 + Tc
        s, w = attn.sinks, attn.window
        prev_conv = tail.get("conv")
        qk, q, k, v, new_conv = attn._project(x, pe, prev_conv)
        # tails are cloned: a view would keep the whole chunk's tensors alive (memory grows per layer)
        tail["conv"] = {key: val.clone() for key, val in new_conv.items()} if new_conv else None
        if new_conv and ends.rows:
            self._conv_ends(attn, x, prev_conv, tail["conv"]["qkv"], ends, final)
        swa = None
        if attn.has_softmax_path:
            if p0 < s:  # the first s keys overall are the sinks
                prev = tail.get("sink_k")
                take = min(s, p1) - p0
                tail["sink_k"] = k[:, :take].clone() if prev is None else torch.cat([prev, k[:, :take]], 1)
                tail["sink_v"] = v[:, :take].clone() if prev is None else torch.cat([tail["sink_v"], v[:, :take]], 1)
            if w > 0:  # window + sinks in one fused attention call over [sinks | previous w keys | these]
                tk, tv = tail.get("win_k"), tail.get("win_v")
                n_tail = 0 if tk is None else tk.shape[1]
                k_ext = k if tk is None else torch.cat([tk, k], 1)
                v_ext = v if tv is None else torch.cat([tv, v], 1)
                n_sink = tail["sink_k"].shape[1] if s > 0 and p1 - 1 - w >= 0 else 0  # a sink outside a window
                keys = torch.cat([tail["sink_k"], k_ext], 1) if n_sink else k_ext
                vals = torch.cat([tail["sink_v"], v_ext], 1) if n_sink else v_ext
                swa = window_attention_blocked(q, keys, vals, w, attn.scaling, sinks=n_sink, base=n_sink + n_tail,
                                               lo=n_sink, q_pos0=p0).to(q.dtype)
                if ends.rows:
                    for name, val in (("ring_k", k_ext), ("ring_v", v_ext)):
                        pos = _ring_ends(final, name, val, p0 - n_tail, w, ends, B)
                    final["ring_pos"] = pos if ends.all else _scatter_rows(final.get("ring_pos"), ends.index, pos, B)
                tail["win_k"], tail["win_v"] = k_ext[:, -w:].clone(), v_ext[:, -w:].clone()  # last w keys
            else:  # sinks only
                q_pos = torch.arange(p0, p1, device=x.device)
                o_s, lse_s = sink_part(q, tail["sink_k"], tail["sink_v"], 0, attn.scaling, q_pos)
                swa = o_s.to(q.dtype)
        lin_out = None
        first = 0  # lin_out covers the rows >= first (earlier rows read a zero state)
        if attn.lin is not None:
            lin = attn.linear_inputs(x, q, k, v, qk=qk)
            qx = attn._query(lin)
            lin = {key: lin[key] for key in LIN_KEYS if key in lin}
            prev = tail.get("lin")
            ext = lin if prev is None else {key: torch.cat([prev[key], lin[key]], 1) for key in lin}
            e0 = p0 - (0 if prev is None else next(iter(prev.values())).shape[1])  # position of ext[:, 0]
            n = p1 - w - e0  # tokens entering the state in this chunk: positions e0 .. p1-w-1
            # sinks never enter the state, and they come before any other token, so the state is still
            # zero when they would: skip them instead of zeroing their key and beta
            n_sink = min(max(0, s - e0), max(n, 0))
            if n - n_sink > 0:
                entering = {key: val[:, n_sink:n] for key, val in ext.items()}
                if ends.short:  # a row's tokens from its length - window on never enter its state
                    stop = (ends.lengths - w).view(B, 1)  # first position that must not enter
                    keep = torch.arange(e0 + n_sink, e0 + n, device=x.device).view(1, -1) < stop
                    entering = {key: torch.where(keep.view(*keep.shape, *([1] * (val.dim() - 2))), val,
                                                 torch.zeros((), dtype=val.dtype, device=val.device))
                                for key, val in entering.items()}
                first = Tc - n + n_sink  # first query row reading a state (row of position e0 + n_sink + w)
                lin_out, st.state = attn._run(entering, qx[:, first:], st.state, chunked=True)
            else:
                lin_out = attn._zero_output(qx, lin)
            if w > 0 and ends.rows:
                for key, val in ext.items():
                    _ring_ends(final.setdefault("lin", {}), key, val, e0, w, ends, B)
            tail["lin"] = {key: val[:, -w:].clone() for key, val in ext.items()} if w > 0 else None
        y = attn._combine(lin_out, swa, x.dtype, first)
        return attn.o_proj(y.reshape(B, Tc, -1).to(x.dtype))

    def _conv_ends(self, attn, x, prev, new, ends: "_ChunkEnds", final: dict):
        """The conv state of each row ending in this chunk: [q|k|v] before the conv of its last W-1 tokens.
        A row ending at the chunk's end has it in `new` (the chunk's conv state); another row's is gathered
        from the previous chunk's state `prev` (zeros before position 0) and recomputed from x."""
        B, Tc = x.shape[:2]
        p0, W1 = ends.p0, new.shape[-1]
        if all(n == p0 + Tc for n in ends.rows_lengths):
            final["conv"] = new if ends.all else _scatter_rows(final.get("conv"), ends.index, new[ends.index], B)
            return
        # entry i of [prev | x] is position p0 - W1 + i; a row of length n needs positions n - W1 .. n - 1
        idx = torch.tensor([list(range(n - p0, n - p0 + W1)) for n in ends.rows_lengths], device=x.device)
        rows = ends.index.unsqueeze(1)
        from_x = attn._qkv(x[rows, (idx - W1).clamp(min=0)])  # [R, W1, D]
        before = (idx < W1).unsqueeze(-1)
        if prev is None:
            from_prev = torch.zeros((), dtype=from_x.dtype, device=x.device)  # positions < 0 (first chunk)
        else:
            from_prev = prev["qkv"].transpose(1, 2)[rows, idx.clamp(max=W1 - 1)].to(from_x.dtype)
        vals = torch.where(before, from_prev, from_x).transpose(1, 2)  # [R, D, W1]
        final["conv"] = _scatter_rows(final.get("conv"), ends.index, vals.to(new.dtype), B)

    def _finish_linear(self, i, attn, fresh: _LinearLayerState, tail: dict, final: dict, B: int) -> bool:
        st = self.states[i] if isinstance(self.states[i], _LinearLayerState) else _LinearLayerState()
        self.states[i] = st
        s, w = attn.sinks, attn.window
        H, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
        dt = attn.o_proj.weight.dtype
        dev = self.device
        changed = False
        if s > 0:  # a row shorter than s holds padding keys in its last sink slots: masked, then overwritten
            sk = torch.zeros(B, s, Hkv, D, dtype=dt, device=dev)
            sv = torch.zeros_like(sk)
            n = tail["sink_k"].shape[1]
            sk[:, :n], sv[:, :n] = tail["sink_k"], tail["sink_v"]
            changed |= _assign(st.buf, "sink_k", sk) | _assign(st.buf, "sink_v", sv)
        if w > 0:
            changed |= _assign(st.buf, "ring_pos", final["ring_pos"])
            if attn.has_softmax_path:
                for name in ("ring_k", "ring_v"):
                    changed |= _assign(st.buf, name, final[name].to(dt))
            if attn.lin is not None:
                for key, val in final["lin"].items():
                    changed |= _assign(st.lin, key, val)
        if attn.lin is not None:
            state = fresh.state if fresh.state is not None else self._zero_state(attn, B)
            if isinstance(state, tuple):
                old = st.state if isinstance(st.state, tuple) else (None, None)
                holder = {"S": old[0], "Z": old[1]}
                changed |= _assign(holder, "S", state[0].float()) | _assign(holder, "Z", state[1].float())
                st.state = (holder["S"], holder["Z"])
            else:
                holder = {"S": st.state}
                changed |= _assign(holder, "S", state.float())
                st.state = holder["S"]
        if attn.conv is not None:
            changed |= _assign(st.conv, "qkv", final["conv"])
        return changed

    def _zero_state(self, attn, B):
        H, D = attn.num_heads, attn.head_dim
        if attn.mechanism == "hedgehog":
            F2 = attn.lin.phi_q.weight.shape[-1] * 2
            return (torch.zeros(B, H, F2, D, device=self.device), torch.zeros(B, H, F2, device=self.device))
        return torch.zeros(B, H, D, D, device=self.device)

    # ------------------------------------------------------------------ prefill, full-attention layers
    @staticmethod
    def _project_full(attn, x, pe):
        B, T = x.shape[:2]
        D = attn.head_dim
        q = attn.q_proj(x).view(B, T, -1, D)
        k = attn.k_proj(x).view(B, T, -1, D)
        v = attn.v_proj(x).view(B, T, -1, D)
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        q, k = apply_rotary_pos_emb(q, k, *pe, unsqueeze_dim=2)
        return q, k, v

    def _prefill_full(self, attn, x, pe, p0: int, tail: dict):
        B, Tc = x.shape[:2]
        q, k, v = self._project_full(attn, x, pe)
        keys = k if p0 == 0 else torch.cat([tail["k"], k], 1)
        vals = v if p0 == 0 else torch.cat([tail["v"], v], 1)
        tail["k"], tail["v"] = keys, vals
        G = q.shape[2] // k.shape[2]
        qt, kt, vt = q.transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2)
        if p0 == 0:
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=attn.scaling,
                                                                  enable_gqa=G > 1)
        else:
            allowed = torch.arange(keys.shape[1], device=x.device)[None] <= torch.arange(p0, p0 + Tc,
                                                                                        device=x.device)[:, None]
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=allowed, scale=attn.scaling,
                                                                  enable_gqa=G > 1)
        return attn.o_proj(o.transpose(1, 2).reshape(B, Tc, -1))

    def _finish_full(self, i, attn, tail: dict, T: int, B: int, max_len: int) -> bool:
        """KV buffers [B, Hkv, max_len, D] (head-major, so a decode step reads each head's keys contiguously)."""
        st = self.states[i] if isinstance(self.states[i], dict) else {}
        self.states[i] = st
        k, v = tail["k"], tail["v"]
        L = max_len  # a different size re-allocates the buffers (and invalidates a captured graph)
        kb = torch.zeros(B, k.shape[2], L, k.shape[3], dtype=k.dtype, device=self.device)
        vb = torch.zeros_like(kb)
        kb[:, :, :T], vb[:, :, :T] = k.transpose(1, 2), v.transpose(1, 2)
        return _assign(st, "k", kb) | _assign(st, "v", vb)

    # ------------------------------------------------------------------ decode step (static shapes)
    def _step(self, steady: bool = False):
        io = self.io
        pos, pos_ids = io["pos"], io["pos_ids"]
        h = self.model.model.embed_tokens(io["ids"])
        pe = self.model.model.rotary_emb(h, pos_ids)
        for i, layer in enumerate(self.layers):
            x = layer.input_layernorm(h)
            if self.linear[i]:
                a = self._step_linear(layer.self_attn, self.states[i], x, pe, pos, steady)
            else:
                a = self._step_full(layer.self_attn, self.states[i], x, pe, pos)
            h = h + a
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = self.model.lm_head(self.model.model.norm(h))
        io["logits"].copy_(logits.float())
        io["ids"].copy_(logits.argmax(-1))
        pos.add_(1)
        pos_ids.add_(1)

    def _step_linear(self, attn: LinearizedAttention, st: _LinearLayerState, x, pe, pos, steady: bool = False):
        """One token per row at the row's own position pos [B] (ring slot pos % w, sink slot, masks per row).
        steady (every row's pos >= sinks + window, known when the step is built): the sinks are written, every
        slot is a real token and the leaving one is not a sink, so no sink write, mask or validity check."""
        B = x.shape[0]
        s, w = attn.sinks, attn.window
        rows = self.io["rows"]
        qk, q, k, v, new_conv = attn._project(x, pe, st.conv or None)
        if new_conv:
            for key, val in new_conv.items():
                st.conv[key].copy_(val)
        slot = pos % w if w > 0 else None
        lin_out = None
        if attn.lin is not None:
            lin = attn.linear_inputs(x, q, k, v, qk=qk)
            qx = attn._query(lin)
            cur = {key: lin[key] for key in LIN_KEYS if key in lin}
            if w > 0:  # the token leaving the window (position pos - w) folds into the state
                leaving = {key: st.lin[key][rows, slot].unsqueeze(1) for key in cur}
                for key, val in cur.items():
                    _put(st.lin[key], rows, slot, val[:, 0])
            else:
                leaving = cur
            if not steady:  # a sink or an empty slot (zeros) leaves nothing in the state: zero its inputs
                valid = st.buf["ring_pos"][rows, slot] >= s if w > 0 else pos >= s
                leaving = {key: val * valid.view(B, 1, *([1] * (val.dim() - 2))) for key, val in leaving.items()}
            out, state = attn._run(leaving, qx, st.state, chunked=False)
            if isinstance(state, tuple):
                st.state[0].copy_(state[0])
                st.state[1].copy_(state[1])
            else:
                st.state.copy_(state)
            lin_out = out
        if w > 0 and not steady:  # (read only by non-steady steps; a prefill rewrites it)
            _put(st.buf["ring_pos"], rows, slot, pos)
        swa = None
        if attn.has_softmax_path:
            keys, vals, allowed = [], [], []
            if s > 0 and not steady:  # a row still inside its first s tokens writes its sink slot
                idx = pos.clamp(max=s - 1)
                is_sink = (pos < s).view(B, 1, 1)
                for name, new in (("sink_k", k), ("sink_v", v)):
                    buf = st.buf[name]
                    _put(buf, rows, idx, torch.where(is_sink, new[:, 0], buf[rows, idx]))
                allowed.append(torch.arange(s, device=x.device).view(1, s) <= pos.view(B, 1))
            if s > 0:
                keys.append(st.buf["sink_k"])
                vals.append(st.buf["sink_v"])
            if w > 0:
                _put(st.buf["ring_k"], rows, slot, k[:, 0])
                _put(st.buf["ring_v"], rows, slot, v[:, 0])
                keys.append(st.buf["ring_k"])
                vals.append(st.buf["ring_v"])
                if not steady:
                    allowed.append(st.buf["ring_pos"] >= s)
            cat = lambda xs: xs[0] if len(xs) == 1 else torch.cat(xs, 1)  # noqa: E731
            swa = step_attention(q, cat(keys), cat(vals), None if steady else cat(allowed), attn.scaling)
        y = attn._combine(lin_out, swa, x.dtype)
        return attn.o_proj(y.reshape(B, 1, -1).to(x.dtype))

    def _step_full(self, attn, st: dict, x, pe, pos):
        """One query per row against the static KV buffer, written at the row's position (slots > pos masked):
        SDPA with the query heads of a KV head as G query rows, so no GQA expansion of the cache is needed."""
        B = x.shape[0]
        q, k, v = self._project_full(attn, x, pe)
        rows = self.io["rows"]
        st["k"][rows, :, pos] = k[:, 0].to(st["k"].dtype)  # [B, Hkv, D] at (row, :, pos[row])
        st["v"][rows, :, pos] = v[:, 0].to(st["v"].dtype)
        Hkv, L = st["k"].shape[1], st["k"].shape[2]
        qg = q.reshape(B, Hkv, -1, q.shape[-1])  # [B, Hkv, G, D]: query head h*G+g -> row g of KV head h
        allowed = (torch.arange(L, device=x.device).view(1, L) <= pos.view(B, 1)).view(B, 1, 1, L)
        o = torch.nn.functional.scaled_dot_product_attention(qg, st["k"], st["v"], attn_mask=allowed,
                                                              scale=attn.scaling)
        return attn.o_proj(o.reshape(B, 1, -1).to(x.dtype))

    # ------------------------------------------------------------------ CUDA graph
    def _buffers(self):
        out = list(self.io.values())
        for st in self.states:
            if isinstance(st, _LinearLayerState):
                out += list(st.buf.values()) + list(st.lin.values()) + list(st.conv.values())
                out += list(st.state) if isinstance(st.state, tuple) else ([st.state] if st.state is not None else [])
            elif isinstance(st, dict):
                out += list(st.values())
        return out

    def _capture(self, steady: bool):
        """Warm up (Triton autotuning, cuBLAS handles) on a saved copy of the cache, then capture one step."""
        bufs = self._buffers()
        saved = [b.clone() for b in bufs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(steady)
        torch.cuda.current_stream().wait_stream(side)
        for b, c in zip(bufs, saved):
            b.copy_(c)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step(steady)
        for b, c in zip(bufs, saved):  # capture does not run kernels, but be exact about the state
            b.copy_(c)
        del saved
        self.graph, self.graph_steady = graph, steady
