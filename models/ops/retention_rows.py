"""Decoding a batch of retention states whose rows have seen different numbers of tokens (issue #17).

`retention_step` (models/ops/retention.py) decides per row with torch.where/gather, but its Python branches
depend on the step number t, shared by every row: whether t writes a sink (t < sinks), whether a token leaves
the window (t >= sinks + window), and the window ring's slot ((t - sinks) % window, with the shared `win_pos`).
Once t >= sinks + window none of that varies any more (every sink and window slot holds a real token, and a
token leaves the window at every step); what still depends on t is the ring slot, the leaving token's
position t - window and proj_residual's running mean ksum / (t + 1). So rows of different lengths can share a
step when every row is past that point: `RetentionRows` stacks B per-row states (each from its own prompt's
prefill) with a per-row `win_pos` and step counter, and `retention_rows_step` runs

  - rows all at the same t (any t, including a single row): `retention_step` itself;
  - otherwise, every row with t >= sinks + window in one batched step with t per row (the same ops, a per-row
    ring slot and position), and each earlier row alone through `retention_step` (rare: a prompt shorter than
    sinks + window; exact by construction).

tests/test_retention_generate.py checks both against each row stepped alone.
"""
from __future__ import annotations

import dataclasses

import torch

from models.diagnostics import normalize_keys
from models.ops.reference import _masked_softmax
from models.ops.retention import (EPS, LIN, Q_KEYS, RetentionState, _check, _fold_and_place, delta_error,
                                  entry_scores, residual, retention_step, take)


@dataclasses.dataclass
class RetentionRows:
    """B retention states stacked along the batch (every tensor of `state` has B rows), each row with its own
    ring positions win_pos [B, w] and tokens seen (host ints). state.win_pos / state.seen are not used."""
    state: RetentionState
    win_pos: torch.Tensor
    seen: list

    @classmethod
    def stack(cls, states: list) -> "RetentionRows":
        """The rows of several RetentionStates (each of any batch size, same sinks/window/slots) in order."""
        if not states:
            raise ValueError("RetentionRows.stack needs at least one state")
        first = states[0]

        def cat(get):
            return torch.cat([get(s) for s in states], 0)
        stacked = dataclasses.replace(
            first, S=cat(lambda s: s.S), sink_k=cat(lambda s: s.sink_k), sink_v=cat(lambda s: s.sink_v),
            win={key: cat(lambda s: s.win[key]) for key in first.win}, ret_pos=cat(lambda s: s.ret_pos),
            ret={key: cat(lambda s: s.ret[key]) for key in first.ret}, ksum=cat(lambda s: s.ksum),
            folded=cat(lambda s: s.folded))
        win_pos = cat(lambda s: s.win_pos.expand(s.S.shape[0], -1))
        return cls(stacked, win_pos, [s.seen for s in states for _ in range(s.S.shape[0])])

    def row(self, b: int) -> RetentionState:
        """Row b as a one-row RetentionState (views)."""
        def one(x):
            return x[b:b + 1]
        st = self.state
        return dataclasses.replace(st, S=one(st.S), sink_k=one(st.sink_k), sink_v=one(st.sink_v),
                                   win={key: one(x) for key, x in st.win.items()}, win_pos=self.win_pos[b],
                                   ret={key: one(x) for key, x in st.ret.items()}, ret_pos=one(st.ret_pos),
                                   ksum=one(st.ksum), folded=one(st.folded), seen=self.seen[b])

    def put_row(self, b: int, one: RetentionState) -> "RetentionRows":
        """A copy with row b replaced by the one-row state `one`."""
        at = torch.tensor([b], device=self.state.S.device)

        def put(x, y):
            return x.index_copy(0, at, y)
        st = self.state
        new = dataclasses.replace(st, S=put(st.S, one.S), sink_k=put(st.sink_k, one.sink_k),
                                  sink_v=put(st.sink_v, one.sink_v), ret_pos=put(st.ret_pos, one.ret_pos),
                                  win={key: put(x, one.win[key]) for key, x in st.win.items()},
                                  ret={key: put(x, one.ret[key]) for key, x in st.ret.items()},
                                  ksum=put(st.ksum, one.ksum), folded=put(st.folded, one.folded))
        seen = list(self.seen)
        seen[b] = one.seen
        return RetentionRows(new, put(self.win_pos, one.win_pos.unsqueeze(0)), seen)

    def tensors(self) -> list:
        return self.state.tensors() + [self.win_pos]

    def select(self, index: torch.Tensor) -> "RetentionRows":
        """The rows `index` (reordered, repeated)."""
        rows = index.tolist()
        return RetentionRows(self.state.select(index), self.win_pos.index_select(0, index.to(self.win_pos.device)),
                             [self.seen[b] for b in rows])


def retention_rows_step(rows: RetentionRows, q, k, v, lin, scale, lin_scale, score="delta_error", scores=None):
    """One decoding token per row (T == 1), each row at its own step; shapes as retention_step.
    Returns (y [B, 1, H, V], new RetentionRows); the input is not modified."""
    st = rows.state
    s, w = st.sink_k.shape[2], st.win_pos.shape[0]
    if len(set(rows.seen)) == 1:  # aligned rows: the step itself
        y, new = retention_step(dataclasses.replace(st, win_pos=rows.win_pos[0], seen=rows.seen[0]), q, k, v, lin,
                                scale, lin_scale, score, scores)
        return y, RetentionRows(new, new.win_pos.expand(len(rows.seen), -1), [new.seen] * len(rows.seen))
    y, out = _steady_step(rows, q, k, v, lin, scale, lin_scale, score, scores)
    for b, t in enumerate(rows.seen):  # rows before the steady point (a short prompt): alone, overwriting row b
        if t < s + w:
            one = {key: x[b:b + 1] for key, x in lin.items()}
            yb, new = retention_step(rows.row(b), q[b:b + 1], k[b:b + 1], v[b:b + 1], one, scale, lin_scale,
                                     score, None if scores is None else scores[b:b + 1])
            y = y.index_copy(0, torch.tensor([b], device=y.device), yb)
            out = out.put_row(b, new)
    return y, out


def _steady_step(rows: RetentionRows, q, k, v, lin, scale, lin_scale, score, scores):
    """retention_step's computation for rows with t >= sinks + window, t per row (rows below that point get
    a meaningless result: the caller replaces them)."""
    state = rows.state
    s, w, r = state.sink_k.shape[2], state.win_pos.shape[0], state.ret_pos.shape[-1]
    _check(q, k, v, lin, s, w, r)
    if q.shape[1] != 1:
        raise ValueError(f"retention_rows_step takes one token, got T={q.shape[1]}")
    B, _, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    dt, dev = state.S.dtype, q.device
    t = torch.tensor(rows.seen, device=dev)  # [B]
    q1, k1, v1 = (x[:, 0].to(dt) for x in (q, k, v))
    new = {"k": k1, "v": v1, **{key: lin[LIN[key]][:, 0].to(dt) for key in Q_KEYS}}
    kt = normalize_keys(k1, EPS)
    ksum = state.ksum + kt
    if score == "delta_error":
        new["score"] = torch.zeros(B, Hkv, dtype=dt, device=dev)
    elif score == "proj_residual":
        new["score"] = residual(kt, ksum / (t + 1).to(dt).view(B, 1, 1))
    else:
        new["score"] = entry_scores(k, score, scores)[:, 0].to(dt)
    if w == 0:
        leaving, win, win_pos = new, dict(state.win), rows.win_pos
    else:
        slot = torch.remainder(t - s, w)  # [B]
        leaving = {key: take(x, slot.view(B, 1).expand(B, x.shape[1])) for key, x in state.win.items()}
        hot = torch.arange(w, device=dev) == slot.view(B, 1)  # [B, w]
        win = {key: torch.where(hot.view(B, 1, w, *([1] * (x.dim() - 3))), new[key].unsqueeze(2), x)
               for key, x in state.win.items()}
        win_pos = torch.where(hot, t.view(B, 1), rows.win_pos)
    if score == "delta_error":
        Sk = torch.einsum("bhkv,bhk->bhv", state.S, leaving["lk"])
        leaving["score"] = delta_error(Sk, leaving["lv"], leaving["log_a"], G)
    ret, ret_pos, S, now = _fold_and_place(state.ret, state.ret_pos, state.S, leaving, (t - w).view(B, 1),
                                           leaving["score"], G)
    y = lin_scale * torch.einsum("bhk,bhkv->bhv", lin["q"][:, 0].to(dt), S)
    keys = torch.cat([state.sink_k, win["k"], ret["k"]], 2)  # [B, Hkv, s + w + r, D]
    vals = torch.cat([state.sink_v, win["v"], ret["v"]], 2)
    ok = torch.cat([torch.ones(B, Hkv, s + w, dtype=torch.bool, device=dev), ret_pos >= 0], -1)
    sc = torch.einsum("bhgd,bhld->bhgl", q1.view(B, Hkv, G, D), keys) * scale
    p, _ = _masked_softmax(sc, ok.unsqueeze(2))
    y = y + torch.einsum("bhgl,bhld->bhgd", p, vals).reshape(B, H, -1)
    out = dataclasses.replace(state, S=S, win=win, ret=ret, ret_pos=ret_pos, ksum=ksum,
                              folded=state.folded + now.long())
    return y.unsqueeze(1).to(q.dtype), RetentionRows(out, win_pos, [n + 1 for n in rows.seen])
