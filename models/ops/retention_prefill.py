"""Prefill for GDN + sinks + window + retention slots (models/ops/retention.py has the rule).

`retention_prefill` (what the layer calls): scores fixed at arrival (`proj_residual`, `given`) take the
fast path of models/ops/retention_static.py (slot decisions on the scalar scores first, then one GDN op over
the fold sequence and one masked attention); `delta_error` takes the chunk walk below, which is also the
reference the fast path is tested against (`retention_prefill_walk`).

The walk: per chunk of C steps, the tokens that can fold are known in advance: the r tokens in the slots at the
chunk's start and the (up to) C tokens that leave the window during it. Which of them folds at which
step is a sequential, data-dependent decision (delta_error depends on the state), so the chunk walks
its steps, but never touches the K x V state inside the walk: it tracks the "probes" Y = S^T p for those
candidates' keys and the chunk's queries (one matmul at the chunk's start), updated per fold by
    Y <- a Y + (k_f . p) u,   u = beta_f (v_f - a Y_f)
(the Gram matrix of candidates x probes is one matmul too). The chunk's end state is one matmul,
S_end = exp(sum g) S_0 + sum_i exp(sum_{m>i} g_m) k_{f_i} u_i^T, and its softmax path (sinks, window span,
the slots as they were at each step) one masked attention. Same outputs and final state as
retention_recurrent; the returned RetentionState continues with retention_step.
"""
from __future__ import annotations

import math

import torch

from models.diagnostics import normalize_keys
from models.ops.reference import _check_chunk_size, _compute_dtype, _exclusive_suffix_sum, _masked_softmax
from models.ops.retention import (EPS, KV_KEYS, LIN, Q_KEYS, RetentionState, _check, delta_error, entry_scores, evict,
                                  take)
from models.ops.retention_static import end_slots, fold_order, fold_steps, linear_path, softmax_path


def retention_prefill(q, k, v, lin, scale, lin_scale, sinks, window, retain, score="delta_error", scores=None,
                      chunk_size=64, want_state=True):
    """A whole prompt from an empty cache. Inputs as retention_recurrent; chunk_size is the walk's (delta_error).
    Returns (y [B, T, H, V] in q's dtype, RetentionState after the prompt; None unless want_state: training
    needs no decode state)."""
    if score == "delta_error":
        return retention_prefill_walk(q, k, v, lin, scale, lin_scale, sinks, window, retain, score, scores,
                                      chunk_size, want_state)
    _check(q, k, v, lin, sinks, window, retain)
    T, dt = q.shape[1], _compute_dtype(q)
    with torch.no_grad():
        static = entry_scores(k.to(dt), score, scores)
        fold = fold_steps(static, sinks, window, retain)
    y_lin, S = linear_path(lin, fold_order(fold), lin_scale, want_state)
    y = (y_lin.to(dt) + softmax_path(q, k, v, fold, scale, sinks, window, retain).to(dt)).to(q.dtype)
    if not want_state:
        return y, None
    slot_pos, slot_score, folded = end_slots(fold, static, sinks, window, retain)
    Lh = {key: lin[LIN[key]].to(dt).transpose(1, 2) for key in Q_KEYS}
    if S is None or T == 0:
        S = q.new_zeros(q.shape[0], q.shape[2], Lh["lk"].shape[-1], Lh["lv"].shape[-1], dtype=dt)
    return y, _state_after(k.to(dt), v.to(dt), Lh, static, S.to(dt), slot_pos, slot_score.to(dt), folded, sinks,
                           window)


def retention_prefill_walk(q, k, v, lin, scale, lin_scale, sinks, window, retain, score="delta_error", scores=None,
                           chunk_size=64, want_state=True):
    """The chunk walk, for every score (the path of delta_error, the reference of the fast path)."""
    _check(q, k, v, lin, sinks, window, retain)
    _check_chunk_size(chunk_size)
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    dt = _compute_dtype(q)
    out_dtype = q.dtype
    q, k, v = (x.to(dt) for x in (q, k, v))
    lq = lin["q"].to(dt)
    Lh = {key: lin[LIN[key]].to(dt).transpose(1, 2) for key in Q_KEYS}  # [B, H, T, *]
    static = entry_scores(k, score, scores)
    S = q.new_zeros(B, H, Lh["lk"].shape[-1], Lh["lv"].shape[-1])
    slot_pos = torch.full((B, Hkv, retain), -1, dtype=torch.long, device=q.device)
    slot_score = q.new_full((B, Hkv, retain), -math.inf)
    folded = torch.zeros(B, Hkv, dtype=torch.long, device=q.device)
    ys = []
    for c0 in range(0, T, chunk_size):
        c1 = min(T, c0 + chunk_size)
        y_lin, S, slot_pos, slot_score, folded, members = _walk(Lh, lq, static, S, slot_pos, slot_score, folded,
                                                               c0, c1, sinks, window, G, lin_scale)
        ys.append(y_lin + _chunk_softmax(q, k, v, c0, c1, members, sinks, window, scale))
    y = torch.cat(ys, 1) if ys else q.new_zeros(B, 0, H, Lh["lv"].shape[-1])
    if not want_state:
        return y.to(out_dtype), None
    return y.to(out_dtype), _state_after(k, v, Lh, static, S, slot_pos, slot_score, folded, sinks, window)


def _walk(Lh, lq, static, S, slot_pos, slot_score, folded, c0, c1, s, w, G, lin_scale):
    """The chunk's fold decisions and linear outputs. Returns (y_lin [B, n, H, V], S, slot_pos, slot_score,
    folded, members [B, Hkv, n, r]: the slots' positions after each step)."""
    B, H = lq.shape[0], lq.shape[2]
    Hkv, r = slot_pos.shape[1], slot_pos.shape[2]
    n, dev = c1 - c0, lq.device
    leave = torch.arange(c0, c1, device=dev) - w  # the token leaving at each step (valid when >= s)
    cand_pos = torch.cat([slot_pos, leave.clamp(min=0).expand(B, Hkv, n)], -1)  # [B, Hkv, r + n]
    cand = {key: take(x, cand_pos.clamp(min=0).repeat_interleave(G, 1)) for key, x in Lh.items()}  # [B,H,r+n,*]
    probes = torch.cat([cand["lk"], lq[:, c0:c1].transpose(1, 2)], 2)  # [B, H, r + 2n, K]
    Y = probes @ S  # S^T p for every probe, [B, H, r + 2n, V]
    gram = cand["lk"] @ probes.transpose(-1, -2)  # [B, H, r + n, r + 2n]
    slot_cand = torch.arange(r, device=dev).expand(B, Hkv, r)  # each slot's candidate index
    ar = torch.arange(r, device=dev)
    gs, us, fs, outs, members = [], [], [], [], []
    for i in range(n):
        j = c0 + i - w
        g, u = lq.new_zeros(B, H), lq.new_zeros(B, H, Y.shape[-1])
        fq = torch.zeros(B, H, dtype=torch.long, device=dev)
        if j >= s:
            ci = r + i
            if static is None:
                sc = delta_error(Y[:, :, ci], cand["lv"][:, :, ci], cand["log_a"][:, :, ci], G)
            else:
                sc = static[:, j]
            e = evict(slot_score, slot_pos, sc, j)
            leaving = e == r
            fc = torch.where(leaving, torch.full_like(e, ci), take(slot_cand, e))
            valid = leaving | (take(slot_pos, e) >= 0)
            fq, vq = fc.repeat_interleave(G, 1), valid.repeat_interleave(G, 1)
            g = torch.where(vq, take(cand["log_a"], fq), torch.zeros_like(g))
            beta = torch.where(vq, take(cand["beta"], fq), torch.zeros_like(g))
            a = torch.exp(g).unsqueeze(-1)
            u = beta.unsqueeze(-1) * (take(cand["lv"], fq) - a * take(Y, fq))
            Y = a.unsqueeze(-1) * Y + take(gram, fq).unsqueeze(-1) * u.unsqueeze(2)
            hot = ar == e.unsqueeze(-1)
            slot_pos = torch.where(hot, j, slot_pos)
            slot_score = torch.where(hot, sc.unsqueeze(-1), slot_score)
            slot_cand = torch.where(hot, ci, slot_cand)
            folded = folded + valid.long()
        gs.append(g)
        us.append(u)
        fs.append(fq)
        outs.append(lin_scale * Y[:, :, r + n + i])
        members.append(slot_pos)
    g, u = torch.stack(gs, -1), torch.stack(us, 2)  # [B, H, n], [B, H, n, V]
    kf = take(cand["lk"], torch.stack(fs, -1))  # [B, H, n, K] (u = 0 on steps without a fold)
    to_end = _exclusive_suffix_sum(g, -1)
    S = torch.exp(g.sum(-1))[..., None, None] * S + (kf * torch.exp(to_end).unsqueeze(-1)).transpose(-1, -2) @ u
    return torch.stack(outs, 1), S, slot_pos, slot_score, folded, torch.stack(members, 2)


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
    p, _ = _masked_softmax(sc, ok)
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
    win_pos = torch.full((w,), -1, dtype=torch.long, device=dev)
    for p in range(max(s, T - w), T):
        win_pos[(p - s) % w] = p

    def gather(pos_kv):  # pos_kv [B, Hkv, n] -> dict of the slots' fields, zeros where pos < 0
        out = {}
        for key, x in src.items():
            pos = pos_kv if key in KV_KEYS else pos_kv.repeat_interleave(G, 1)
            val = take(x, pos.clamp(min=0))
            out[key] = torch.where((pos >= 0).view(pos.shape + (1,) * (val.dim() - 3)), val, torch.zeros_like(val))
        return out
    if T:
        st.win = gather(win_pos.expand(B, Hkv, w))
        st.ret = gather(slot_pos)
    st.ret["score"] = slot_score.clone()
    st.win_pos, st.ret_pos, st.S, st.folded, st.seen = win_pos, slot_pos, S, folded, T
    st.ksum = normalize_keys(k, EPS).sum(1)
    return st
