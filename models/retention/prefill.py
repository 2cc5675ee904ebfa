"""Prefill for GDN + sinks + window + retention slots (models/retention/ops.py has the rule).

`retention_prefill` (what the layer calls) decides first, without autograd, which token folds at which step:
from the scalar scores alone for scores fixed at arrival (`proj_residual`, `given`:
models.retention.static.fold_steps), with the walk below for `delta_error` (its score depends on the
state). The values then come from two ordinary ops whatever the score: one GDN op over the fold sequence and
one masked attention (models/retention/static.py), so the backward pass is theirs.

`retention_prefill_walk` (the walk with autograd through it, every score) is the reference the tests hold the
layer's path to. Per chunk of C steps, the tokens that can fold are known in advance: the r slot holders at
the chunk's start and the (up to) C tokens that leave the window during it. Which of them folds at which
step is a sequential decision, so the chunk walks its steps, but never touches the K x V state inside the
walk: it tracks the "probes" Y = S^T k for those candidates' keys (one matmul at the chunk's start),
updated per fold by
    Y <- a Y + (k_f . k) u,   u = beta_f (v_f - a Y_f)
(the candidates' Gram matrix is one matmul too). The chunk's outputs and end state come after the walk from
the folds (as in gdn_chunk): S_end = exp(sum g) S_0 + sum_i exp(sum_{m>i} g_m) k_{f_i} u_i^T; its softmax
path (sinks, window span, the slots as they were at each step) is one masked attention. Same outputs and
final state as retention_recurrent; the returned RetentionState continues with retention_step.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from golinear.models.attention.ops.key_stats import normalize_keys
from golinear.models.attention.ops.reference import (check_chunk_size, compute_dtype, exclusive_suffix_sum, masked_softmax,
                                  pairwise_segment_sum)
from golinear.models.retention.ops import EPS, KV_KEYS, LIN, Q_KEYS, RetentionState, check_inputs, entry_scores, take
from golinear.models.retention.static import end_slots, fold_order, fold_steps, fold_steps_of, linear_path, softmax_path


def retention_prefill(q, k, v, lin, scale, lin_scale, sinks, window, retain, score="delta_error", scores=None,
                      chunk_size=64, want_state=True):
    """A whole prompt from an empty cache. Inputs as retention_recurrent; chunk_size is the delta_error walk's.
    Returns (y [B, T, H, V] in q's dtype, RetentionState after the prompt; None unless want_state: training
    needs no decode state). The slot decisions come first, without autograd (fold_steps from arrival-time
    scores; the walk for delta_error); the values then come from one GDN op over the fold sequence and one
    masked attention (models/retention/static.py), whatever the score."""
    check_inputs(q, k, v, lin, sinks, window, retain)
    T, dt = q.shape[1], compute_dtype(q)
    fold, static, exits = fold_decisions(q, k, v, lin, scale, lin_scale, sinks, window, retain, score, scores,
                                         chunk_size)
    y_lin, S = linear_path(lin, fold_order(fold), lin_scale, want_state)
    y = (y_lin.to(dt) + softmax_path(q, k, v, fold, scale, sinks, window, retain).to(dt)).to(q.dtype)
    if not want_state:
        return y, None
    slot_pos, slot_score, folded = end_slots(fold, exits, sinks, window, retain)
    Lh = {key: lin[LIN[key]].to(dt).transpose(1, 2) for key in Q_KEYS}
    if S is None or T == 0:
        S = q.new_zeros(q.shape[0], q.shape[2], Lh["lk"].shape[-1], Lh["lv"].shape[-1], dtype=dt)
    return y, _state_after(k.to(dt), v.to(dt), Lh, static, S.to(dt), slot_pos, slot_score.to(dt), folded, sinks,
                           window)


@torch.no_grad()
def fold_decisions(q, k, v, lin, scale, lin_scale, sinks, window, retain, score, scores=None, chunk_size=64):
    """Which token folds at which step, decided without autograd. Returns (fold [B, Hkv, T]: each token's fold
    step, T + window never; static [B, T, Hkv]: the arrival-time scores, None for delta_error; exits [B, T, Hkv]:
    each token's score as the slots compare it, 0 for a token that never left the window). Scores fixed at
    arrival decide from the scalars (fold_steps); delta_error walks the state (_walk_prompt). A row's decisions
    up to step t read only its tokens up to t, so right-padded rows decide as each row alone would."""
    dt = compute_dtype(q)
    if score != "delta_error":
        static = entry_scores(k.to(dt), score, scores)
        return fold_steps(static, sinks, window, retain), static, static
    check_chunk_size(chunk_size)
    order, *_, exits, _ = _walk_prompt(q.detach(), k.detach(), v.detach(), {key: x.detach() for key, x in lin.items()},
                                       scale, lin_scale, sinks, window, retain, score, None, chunk_size, softmax=False)
    return fold_steps_of(order, window), None, exits


def retention_prefill_walk(q, k, v, lin, scale, lin_scale, sinks, window, retain, score="delta_error", scores=None,
                           chunk_size=64, want_state=True):
    """The chunk walk, decisions and values, for every score, with autograd through it: the reference the
    layer's path (retention_prefill) is tested against."""
    check_inputs(q, k, v, lin, sinks, window, retain)
    check_chunk_size(chunk_size)
    dt = compute_dtype(q)
    _, slot_pos, slot_score, folded, _, (y, S, Lh, static) = _walk_prompt(q, k, v, lin, scale, lin_scale, sinks,
                                                                          window, retain, score, scores, chunk_size)
    if not want_state:
        return y.to(q.dtype), None
    return y.to(q.dtype), _state_after(k.to(dt), v.to(dt), Lh, static, S, slot_pos, slot_score, folded, sinks,
                                       window)


def _walk_prompt(q, k, v, lin, scale, lin_scale, sinks, window, retain, score, scores, chunk_size, softmax=True):
    """Every chunk's walk. Returns (order [B, Hkv, T]: the token folding at each step, -1 none; slot_pos,
    slot_score, folded after the prompt; exits [B, T, Hkv]: each token's score when it left the window, 0 if it
    never did; (y, S, Lh, static): y None unless softmax)."""
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    dt = compute_dtype(q)
    q, k, v = (x.to(dt) for x in (q, k, v))
    lq = lin["q"].to(dt)
    Lh = {key: lin[LIN[key]].to(dt).transpose(1, 2) for key in Q_KEYS}  # [B, H, T, *]
    static = entry_scores(k, score, scores)
    S = q.new_zeros(B, H, Lh["lk"].shape[-1], Lh["lv"].shape[-1])
    slot_pos = torch.full((B, Hkv, retain), -1, dtype=torch.long, device=q.device)
    slot_score = q.new_full((B, Hkv, retain), -math.inf)
    folded = torch.zeros(B, Hkv, dtype=torch.long, device=q.device)
    ys, orders, leaving = [], [slot_pos.new_zeros(B, Hkv, 0)], [q.new_zeros(B, Hkv, 0)]
    for c0 in range(0, T, chunk_size):
        c1 = min(T, c0 + chunk_size)
        y_lin, S, slot_pos, slot_score, folded, members, order, sc = _walk(Lh, lq, static, S, slot_pos, slot_score,
                                                                          folded, c0, c1, sinks, window, G, lin_scale)
        orders.append(order)
        leaving.append(sc)
        if softmax:
            ys.append(y_lin + _chunk_softmax(q, k, v, c0, c1, members, sinks, window, scale))
    y = (torch.cat(ys, 1) if ys else q.new_zeros(B, 0, H, Lh["lv"].shape[-1])) if softmax else None
    exits = F.pad(torch.cat(leaving, -1)[..., window:], (0, min(window, T))).transpose(1, 2)  # step j + w -> token j
    return torch.cat(orders, -1), slot_pos, slot_score, folded, exits, (y, S, Lh, static)


def _walk(Lh, lq, static, S, slot_pos, slot_score, folded, c0, c1, s, w, G, lin_scale):
    """The chunk's fold decisions and linear outputs. Returns (y_lin [B, n, H, V], S, slot_pos, slot_score,
    folded, members [B, Hkv, n, r]: the slots' positions after each step, order [B, Hkv, n]: the position
    folding at each step, -1 none; scores [B, Hkv, n]: the leaving token's score at each step, 0 none).

    Few ops a step: candidates are r slot holders, n leaving tokens and one all-zero "nothing" candidate
    (an empty slot points at it: folding it is a no-op update); what a fold reads that does not change in the
    chunk (v, a = exp(log_a), beta, the Gram row) sits in one packed row per candidate; the score is only
    compared (no autograd); the queries' outputs come after the walk, from the folds, as in gdn_chunk."""
    B, H = lq.shape[0], lq.shape[2]
    Hkv, r = slot_pos.shape[1], slot_pos.shape[2]
    n, dev, V = c1 - c0, lq.device, Lh["lv"].shape[-1]
    none = r + n  # the nothing candidate's index
    leave = torch.arange(c0, c1, device=dev) - w  # the token leaving at each step (valid when >= s)
    cand_pos = torch.cat([slot_pos, leave.clamp(min=0).expand(B, Hkv, n)], -1)  # [B, Hkv, r + n]
    cand = {key: F.pad(take(x, cand_pos.clamp(min=0).repeat_interleave(G, 1)), (0, 0) * (x.dim() - 3) + (0, 1))
            for key, x in Lh.items()}  # [B, H, r + n + 1, *], the last row zeros
    Y = cand["lk"] @ S  # S^T k for every candidate
    packed = torch.cat([cand["lv"], torch.exp(cand["log_a"]).unsqueeze(-1), cand["beta"].unsqueeze(-1),
                        cand["lk"] @ cand["lk"].transpose(-1, -2)], -1)  # [B, H, r + n + 1, V + 2 + r + n + 1]
    parts = [V, 1, 1, none + 1]
    slot_cand = torch.where(slot_pos >= 0, torch.arange(r, device=dev), none)  # each slot's candidate
    ar, far = torch.arange(r, device=dev), torch.full((), 1 << 62, device=dev)
    zero_u, no_fold, no_score = lq.new_zeros(B, H, 1, V), torch.full((B, Hkv), none, device=dev), lq.new_zeros(B, Hkv)
    us, fcs, members, scs = [], [], [], []
    for i in range(n):
        j = c0 + i - w
        u, fc, sc = zero_u, no_fold, no_score
        if j >= s:
            ci = r + i
            if static is None:
                with torch.no_grad():  # models.retention.ops.delta_error
                    err = (packed[:, :, ci, :V] - packed[:, :, ci, V:V + 1] * Y[:, :, ci]).norm(dim=-1)
                    sc = err.view(B, Hkv, G).mean(-1)
            else:
                sc = static[:, j]
            if r:
                low = slot_score.amin(-1)
                loses = sc < low  # the leaving token folds itself (ties: a slot holder is earlier, it folds)
                e = torch.where(slot_score == low.unsqueeze(-1), slot_pos, far).argmin(-1, keepdim=True)
                fc = torch.where(loses, ci, slot_cand.gather(-1, e).squeeze(-1))
            else:
                fc = torch.full_like(no_fold, ci)
            fq = fc.repeat_interleave(G, 1).view(B, H, 1, 1)
            lv, a, beta, gram = packed.gather(2, fq.expand(B, H, 1, packed.shape[-1])).split(parts, -1)
            u = beta * (lv - a * Y.gather(2, fq.expand(B, H, 1, V)))  # [B, H, 1, V]
            Y = torch.addcmul(Y * a, gram.transpose(-1, -2), u)
            if r:
                hot = ar == torch.where(loses.unsqueeze(-1), r, e)  # the slot the leaving token takes, if any
                slot_pos = torch.where(hot, j, slot_pos)
                slot_score = torch.where(hot, sc.unsqueeze(-1), slot_score)
                slot_cand = torch.where(hot, ci, slot_cand)
        us.append(u)
        fcs.append(fc)
        members.append(slot_pos)
        scs.append(sc)
    fc = torch.stack(fcs, -1)  # [B, Hkv, n]
    fq = fc.repeat_interleave(G, 1)
    g, u = cand["log_a"].gather(2, fq), torch.cat(us, 2)  # [B, H, n], [B, H, n, V] (0 where nothing folds)
    kf = take(cand["lk"], fq)  # [B, H, n, K]
    q = lq[:, c0:c1].transpose(1, 2)  # [B, H, n, K]
    decay = torch.exp(pairwise_segment_sum(g.unsqueeze(-1)).squeeze(-1)).tril()  # [i, m]: folds m+1..i
    y = torch.exp(g.cumsum(-1)).unsqueeze(-1) * (q @ S) + ((q @ kf.transpose(-1, -2)) * decay) @ u
    to_end = exclusive_suffix_sum(g, -1)
    S = torch.exp(g.sum(-1))[..., None, None] * S + (kf * torch.exp(to_end).unsqueeze(-1)).transpose(-1, -2) @ u
    folded = folded + (fc != none).sum(-1)
    order = F.pad(cand_pos, (0, 1), value=-1).gather(2, fc)  # the position folding at each step, -1 none
    return (lin_scale * y.transpose(1, 2), S, slot_pos, slot_score, folded, torch.stack(members, 2), order,
            torch.stack(scs, -1) if scs else no_score[..., :0])


def _chunk_softmax(q, k, v, c0, c1, members, s, w, scale):
    """Softmax of the chunk's queries over sinks, the window span and the slots as they were at each step."""
    B, _, H, D = q.shape
    Hkv, n, dev = k.shape[2], c1 - c0, q.device
    G = H // Hkv
    tpos = torch.arange(c0, c1, device=dev).unsqueeze(-1)
    sink_pos = torch.arange(min(s, c1), device=dev)
    span_pos = torch.arange(min(max(s, c0 - w + 1), c1), c1, device=dev) if w > 0 else sink_pos[:0]
    allowed = torch.cat([sink_pos <= tpos, (span_pos <= tpos) & (span_pos > tpos - w)], -1)  # [n, Ls]
    pos = torch.cat([sink_pos, span_pos])
    ks, vs = k[:, pos].transpose(1, 2), v[:, pos].transpose(1, 2)  # [B, Hkv, Ls, D]
    kr, vr = take(k.transpose(1, 2), members.clamp(min=0)), take(v.transpose(1, 2), members.clamp(min=0))
    qc = q[:, c0:c1].reshape(B, n, Hkv, G, D).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, n, D]
    sc = torch.cat([torch.einsum("bhgid,bhld->bhgil", qc, ks),
                    torch.einsum("bhgid,bhird->bhgir", qc, kr)], -1) * scale
    ok = torch.cat([allowed.expand(B, Hkv, 1, n, pos.numel()), (members >= 0).unsqueeze(2)], -1)
    p, _ = masked_softmax(sc, ok)
    Ls = pos.numel()
    o = (torch.einsum("bhgil,bhld->bhgid", p[..., :Ls], vs)
         + torch.einsum("bhgir,bhird->bhgid", p[..., Ls:], vr))
    return o.permute(0, 3, 1, 2, 4).reshape(B, n, H, v.shape[-1])


def _state_after(k, v, Lh, static, S, slot_pos, slot_score, folded, s, w):
    """The decode state after the prompt, gathered from the prompt by position (empty slots zeroed)."""
    B, T, Hkv, D = k.shape
    H = Lh["lk"].shape[1]
    G, r, dev = H // Hkv, slot_pos.shape[-1], k.device
    st = RetentionState.empty(B, H, Hkv, D, Lh["lk"].shape[-1], Lh["lv"].shape[-1], s, w, r, k.dtype, dev)
    ns = min(s, T)
    st.sink_k[:, :, :ns] = k[:, :ns].transpose(1, 2)
    st.sink_v[:, :, :ns] = v[:, :ns].transpose(1, 2)
    src = {"k": k.transpose(1, 2), "v": v.transpose(1, 2), **Lh,
           "score": (static if static is not None else k.new_zeros(B, T, Hkv)).transpose(1, 2)}
    win_pos = ring_positions(torch.tensor([T], device=dev), s, w)[0]
    if T:
        st.win = gather_slots(src, win_pos.expand(B, Hkv, w), G)
        st.ret = gather_slots(src, slot_pos, G)
    st.ret["score"] = slot_score.clone()
    st.win_pos, st.ret_pos, st.S, st.folded, st.seen = win_pos, slot_pos, S, folded, T
    st.ksum = normalize_keys(k, EPS).sum(1)
    return st


def ring_positions(lengths: torch.Tensor, sinks: int, window: int) -> torch.Tensor:
    """lengths [B] -> [B, window]: the position in ring slot i after each row's prompt, -1 if none: the p in the
    row's last `window` positions with (p - sinks) % window == i, if p >= sinks."""
    i = torch.arange(window, device=lengths.device)
    last = lengths.view(-1, 1) - 1
    p = last - torch.remainder(last - sinks - i, window)
    return torch.where(p >= sinks, p, -1)


def gather_slots(src: dict, pos_kv: torch.Tensor, groups: int) -> dict:
    """The fields of the tokens at positions pos_kv [B, Hkv, n] (-1: empty, zeros) from src (each [B, heads, T,
    *]: KV_KEYS on the KV heads, the others on the query heads, `groups` of them a KV head)."""
    out = {}
    for key, x in src.items():
        pos = pos_kv if key in KV_KEYS else pos_kv.repeat_interleave(groups, 1)
        val = take(x, pos.clamp(min=0))
        out[key] = torch.where((pos >= 0).view(pos.shape + (1,) * (val.dim() - 3)), val, torch.zeros_like(val))
    return out
