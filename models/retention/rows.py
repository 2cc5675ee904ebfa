"""Decoding a batch of retention states whose rows have seen different numbers of tokens.

`retention_step` (models/retention/ops.py) decides per row with torch.where/gather, but its Python branches
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

That batched step is `steady_step_inplace`: t per row from a device tensor, the state updated in place, fixed
shapes and no host sync, which is what models.retention.generate.RetentionDecoder replays in a CUDA graph once
every row is past sinks + window (retention_rows_step runs it on a copy, keeping its input unmodified).
tests/test_retention_generate.py checks both against each row stepped alone.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from golinear.models.attention.ops.key_stats import normalize_keys
from golinear.models.retention.ops import (EPS, LIN, Q_KEYS, RetentionState, check_inputs, delta_error, lowest,
                                  entry_scores, residual, retention_step)


@dataclasses.dataclass
class RetentionRows:
    """B retention states stacked along the batch (every tensor of `state` has B rows), each row with its own
    ring positions win_pos [B, w] and tokens seen (host ints). state.win_pos / state.seen are not used."""
    state: RetentionState
    win_pos: torch.Tensor
    seen: list
    buffers: dict | None = None  # pack(): the state's sinks, window and slots as views of these (plus a spare slot)

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

    def pack(self) -> "RetentionRows":
        """The same rows laid out for the in-place step (steady_step_inplace): sinks, window and slots of the softmax
        keys (and values) as views of one buffer [B, Hkv, s + w + r + 1, D], so the step's attention reads them
        without a concatenation, and every slot field with one spare slot after the r, so a token that takes no
        slot (the lowest score was its own) is written there: one scatter a field, no read of the rest. Copying
        into the state's tensors (a later prefill of the same shapes) fills the buffers."""
        st = self.state
        s, w, r = st.sink_k.shape[2], st.win["k"].shape[2], st.ret_pos.shape[-1]
        if r == 0 or w == 0:  # (no in-place step without them)
            return self

        def joined(parts):
            x = torch.cat([*parts, parts[-1][:, :, :1]], 2)
            return x, [x[:, :, a:a + p.shape[2]] for a, p in zip((0, s, s + w), parts)]
        kb, (sink_k, win_k, ret_k) = joined([st.sink_k, st.win["k"], st.ret["k"]])
        vb, (sink_v, win_v, ret_v) = joined([st.sink_v, st.win["v"], st.ret["v"]])
        spare = {key: torch.cat([x, x[:, :, :1]], 2) for key, x in st.ret.items() if key not in ("k", "v")}
        pos = torch.cat([st.ret_pos, st.ret_pos[:, :, :1]], 2)
        ret = {key: (ret_k if key == "k" else ret_v if key == "v" else spare[key][:, :, :r]) for key in st.ret}
        state = dataclasses.replace(st, sink_k=sink_k, sink_v=sink_v, win={**st.win, "k": win_k, "v": win_v},
                                    ret=ret, ret_pos=pos[:, :, :r])
        return RetentionRows(state, self.win_pos, list(self.seen), {"k": kb, "v": vb, "ret": spare, "ret_pos": pos})

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
    """retention_step's computation for rows with t >= sinks + window, t per row, on a copy of the state (rows
    below that point get a meaningless result: the caller replaces them)."""
    st = rows.state
    copy = RetentionRows(dataclasses.replace(
        st, S=st.S.clone(), sink_k=st.sink_k.clone(), sink_v=st.sink_v.clone(),
        win={key: x.clone() for key, x in st.win.items()}, ret={key: x.clone() for key, x in st.ret.items()},
        ret_pos=st.ret_pos.clone(), ksum=st.ksum.clone(), folded=st.folded.clone()),
        rows.win_pos.clone(), list(rows.seen))
    pos = torch.tensor(rows.seen, device=q.device)
    y = steady_step_inplace(copy, q, k, v, lin, pos, scale, lin_scale, score, scores)
    copy.seen = [n + 1 for n in rows.seen]
    return y, copy


def steady_step_inplace(rows: RetentionRows, q, k, v, lin, pos, scale, lin_scale, score="delta_error", scores=None):
    """One decoding token per row at its own position pos [B] (a device tensor; every row >= sinks + window), the
    state updated in place: fixed shapes, no host sync, no branch on the data, so a CUDA graph can replay it
    (models.retention.generate). rows.seen is not advanced (the caller knows the positions). Returns y [B, 1, H, V]."""
    st = rows.state
    s, w, r = st.sink_k.shape[2], st.win_pos.shape[0], st.ret_pos.shape[-1]
    check_inputs(q, k, v, lin, s, w, r)
    if q.shape[1] != 1 or w == 0:
        raise ValueError(f"the steady step takes one token and a window > 0, got T={q.shape[1]}, window={w}")
    B, _, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    dt, dev = st.S.dtype, q.device
    q1, k1, v1 = (x[:, 0].to(dt) for x in (q, k, v))
    new = {"k": k1, "v": v1, **{key: lin[LIN[key]][:, 0].to(dt) for key in Q_KEYS}}
    kt = normalize_keys(k1, EPS)
    st.ksum.add_(kt)
    if score == "delta_error":  # scored when it leaves the window
        new["score"] = torch.zeros(B, Hkv, dtype=dt, device=dev)
    elif score == "proj_residual":
        new["score"] = residual(kt, st.ksum / (pos + 1).to(dt).view(B, 1, 1))
    else:
        new["score"] = entry_scores(k, score, scores)[:, 0].to(dt)
    # the window ring: the token in the row's slot leaves, the new one takes the slot
    rows_ix, slot = torch.arange(B, device=dev), torch.remainder(pos - s, w)
    leaving = {key: x[rows_ix, :, slot] for key, x in st.win.items()}  # [B, Hx, *]
    buf = rows.buffers
    if buf is None:
        _write_window(st.win, rows.win_pos, new, slot, pos)
    if score == "delta_error":
        Sk = torch.einsum("bhkv,bhk->bhv", st.S, leaving["lk"])
        leaving["score"] = delta_error(Sk, leaving["lv"], leaving["log_a"], G)
    # candidates 0..r-1: the slot holders, r: the leaving token; the lowest score folds (an empty slot: no-op)
    cand_pos = torch.cat([st.ret_pos, (pos - w).view(B, 1, 1).expand(B, Hkv, 1)], -1)  # [B, Hkv, r + 1]
    e = lowest(torch.cat([st.ret["score"], leaving["score"].unsqueeze(-1)], -1), cand_pos).unsqueeze(-1)
    valid = cand_pos.gather(-1, e) >= 0  # [B, Hkv, 1]

    def grouped(x, n):  # [B, H, n, *] as [B, Hkv, G, n, *]: a KV head's decision serves its G query heads
        return x.view(B, Hkv, G, n, *x.shape[3:])

    held, mine = e.clamp(max=r - 1), e == r  # a slot's index, and whether the leaving token itself folds

    def folding(key):  # candidate e's field [B, H, *]: slot e, or the leaving token where e == r
        c, one = grouped(st.ret[key], r), (1,) * (st.ret[key].dim() - 3)
        at = held.view(B, Hkv, 1, 1, *one).expand(B, Hkv, G, 1, *c.shape[4:])
        mine_g = mine.view(B, Hkv, 1, 1, *one)
        return torch.where(mine_g, grouped(leaving[key].unsqueeze(2), 1), c.gather(3, at)).view(B, H, *c.shape[4:])
    f = {key: folding(key) for key in Q_KEYS}
    la, be = (torch.where(valid, f[key].view(B, Hkv, G), 0).view(B, H) for key in ("log_a", "beta"))
    S = st.S.mul_(la.exp()[..., None, None])
    u = be.unsqueeze(-1) * (f["lv"] - torch.einsum("bhkv,bhk->bhv", S, f["lk"]))
    S.view(B * H, *S.shape[2:]).baddbmm_(f["lk"].reshape(B * H, -1, 1), u.reshape(B * H, 1, -1))
    st.folded.add_(valid.squeeze(-1))
    if buf is None:
        hot = torch.arange(r, device=dev) == e  # [B, Hkv, r]: the slot the leaving token takes (none if e == r)
        for key, x in st.ret.items():
            rest = (1,) * (x.dim() - 3)
            if key in Q_KEYS:
                xg = grouped(x, r)
                torch.where(hot.view(B, Hkv, 1, r, *rest), leaving[key].view(B, Hkv, G, 1, *x.shape[3:]), xg, out=xg)
            else:
                torch.where(hot.view(B, Hkv, r, *rest), leaving[key].unsqueeze(2), x, out=x)
        torch.where(hot, cand_pos[..., r:], st.ret_pos, out=st.ret_pos)
        keys = torch.cat([st.sink_k, st.win["k"], st.ret["k"]], 2)  # [B, Hkv, s + w + r, D]
        vals = torch.cat([st.sink_v, st.win["v"], st.ret["v"]], 2)
    else:  # packed (RetentionRows.pack): every write in one place, outside a compiled graph (_write_packed)
        _write_packed(st.win, rows.win_pos, buf, new, leaving, slot, pos, e, cand_pos[..., r:], s + w, G)
        keys, vals = buf["k"][:, :, :s + w + r], buf["v"][:, :, :s + w + r]
    # the output: the linear state's read-out + the softmax over sinks, window and the filled slots (one SDPA)
    y = lin_scale * torch.einsum("bhk,bhkv->bhv", lin["q"][:, 0].to(dt), S)
    ok = F.pad(st.ret_pos >= 0, (s + w, 0), value=True).unsqueeze(2)  # [B, Hkv, 1, s + w + r]
    o = F.scaled_dot_product_attention(q1.view(B, Hkv, G, D), keys, vals, attn_mask=ok, scale=scale)
    return (y + o.reshape(B, H, -1)).unsqueeze(1).to(q.dtype)


def _write_window(win: dict, win_pos, new: dict, slot, pos) -> None:
    """The new token into each row's ring slot (in place; one scatter a field)."""
    for key, x in win.items():
        rest = x.shape[3:]
        x.scatter_(2, slot.view(-1, 1, 1, *(1,) * len(rest)).expand(*x.shape[:2], 1, *rest), new[key].unsqueeze(2))
    win_pos.scatter_(1, slot.view(-1, 1), pos.view(-1, 1).to(win_pos.dtype))


@torch.compiler.disable
def _write_packed(win: dict, win_pos, buf: dict, new: dict, leaving: dict, slot, pos, e, e_pos, at: int,
                  G: int) -> None:
    """The packed step's writes, in place: the new token into its ring slot, the leaving one into slot e of every
    slot field (e == r: the spare slot, a write nobody reads). Kept out of torch.compile (GOLINEAR_FUSED_DECODE):
    inductor turns an in-place write into a buffer that is a graph input, or a view of one, into a copy of the
    whole buffer and a copy back, which at batch 64 made most of the compiled step's time; eager, each is one
    small kernel (a CUDA graph captures them as it captures the rest)."""
    _write_window(win, win_pos, new, slot, pos)
    B, Hkv = e.shape[:2]
    at_kv = (at + e).unsqueeze(-1)
    for key in ("k", "v"):
        buf[key].scatter_(2, at_kv.expand(B, Hkv, 1, buf[key].shape[-1]), leaving[key].unsqueeze(2))
    for key, x in buf["ret"].items():
        rest = x.shape[3:]
        if key in Q_KEYS:
            at_e = e.view(B, Hkv, 1, 1, *(1,) * len(rest)).expand(B, Hkv, G, 1, *rest)
            x.view(B, Hkv, G, x.shape[2], *rest).scatter_(3, at_e, leaving[key].view(B, Hkv, G, 1, *rest))
        else:
            x.scatter_(2, e.view(B, Hkv, 1, *(1,) * len(rest)).expand(B, Hkv, 1, *rest), leaving[key].unsqueeze(2))
    buf["ret_pos"].scatter_(2, e, e_pos)
