"""Retention prefill of a right-padded batch of prompts of different lengths, in one pass.

`retention_prefill` (models/retention/prefill.py) takes rows of one length, so batched generation used to
prefill each prompt alone: ~1,000 small ops a layer per prompt (0.33-0.38 s a 4K prompt on an H200, against
0.047 s in one pass: docs/retention.md). With scores fixed at arrival (`proj_residual`, `given`) a row's
padding can be made inert instead, so one pass serves every row:
  - a fold at a step at or past the row's length is dropped (the token stays in its slot, as at the end of
    the row's own prompt), so the GDN op over the fold sequence runs no-op updates (k, v, gate, beta all
    zero) on the padded steps and its final state is the row's state after its own prompt;
  - the real tokens' fold steps within the prompt need nothing else (models.retention.static.fold_steps:
    token j folds at window + max(j, p_r(j)), p_r the r-th smallest position of the tokens that beat it):
    padding comes after every real token, so it can be that r-th beater only when j would fold at or past
    the row's end anyway, a fold the rule above drops;
  - the softmax path needs nothing: a real query never sees a later key, so never a padding one;
  - the decode state (slots, window ring, sinks, running key sum, fold count) is gathered at each row's own
    length, as models.retention.prefill._state_after gathers it for one length, into the per-row layout
    of models.retention.rows.RetentionRows that batched decoding continues.
`delta_error` scores depend on the state, so its decisions come from the walk (models.retention.prefill
.fold_decisions) over the padded rows at once: the walk is sequential in the steps, not in the rows, and a row's
decisions before its end read only its own tokens, so the rule above then applies unchanged. The walk launches
the same ~25 small ops a step for one row or many, so where launches bound it (a GPU) one pass of B rows should
cost about what one row alone did (on the CPU, where the ops' work bounds it: 1.6x for 8 rows, docs/retention.md).
tests/test_retention_prefill_rows.py checks every row's output and state against the row prefilled alone.
"""
from __future__ import annotations

import torch

from golinear.models.attention.ops.key_stats import normalize_keys
from golinear.models.attention.ops.reference import compute_dtype
from golinear.models.retention.ops import EPS, LIN, Q_KEYS, RetentionState, check_inputs
from golinear.models.retention.prefill import fold_decisions, gather_slots, ring_positions
from golinear.models.retention.rows import RetentionRows
from golinear.models.retention.static import end_slots, fold_order, linear_path, softmax_path


def retention_prefill_rows(q, k, v, lin, scale, lin_scale, sinks, window, retain, score, lengths, scores=None,
                           chunk_size=64):
    """Whole prompts of a right-padded batch (row b: its first lengths[b] tokens), inputs as retention_prefill.
    Returns (y [B, T, H, V] in q's dtype, meaningful at each row's real positions; RetentionRows after each
    row's prompt). No autograd needed (decoding)."""
    check_inputs(q, k, v, lin, sinks, window, retain)
    B, T = q.shape[:2]
    lens = [int(n) for n in lengths]
    if len(lens) != B or any(not 1 <= n <= T for n in lens):
        raise ValueError(f"lengths {lens} must give one length per row ({B} rows), each 1..{T} (the padded width)")
    dt, dev = compute_dtype(q), q.device
    n = torch.tensor(lens, device=dev).view(B, 1, 1)
    fold, static, exits = fold_decisions(q, k, v, lin, scale, lin_scale, sinks, window, retain, score, scores,
                                         chunk_size)  # fold [B, Hkv, T]; scores [B, T, Hkv]
    fold = torch.where(fold < n, fold, T + window)  # past the row's prompt: not within it
    y_lin, S = linear_path(lin, fold_order(fold), lin_scale, want_state=True)
    y = (y_lin.to(dt) + softmax_path(q, k, v, fold, scale, sinks, window, retain).to(dt)).to(q.dtype)
    slot_pos, slot_score, folded = end_slots(fold, exits, sinks, window, retain, lengths=n)
    Lh = {key: lin[LIN[key]].to(dt).transpose(1, 2) for key in Q_KEYS}
    if S is None:
        S = q.new_zeros(B, q.shape[2], Lh["lk"].shape[-1], Lh["lv"].shape[-1], dtype=dt)
    return y, _rows_after(k.to(dt), v.to(dt), Lh, static, S.to(dt), slot_pos, slot_score.to(dt), folded, sinks,
                          window, lens)


def _rows_after(k, v, Lh, static, S, slot_pos, slot_score, folded, s, w, lens):
    """models.retention.prefill._state_after with a length per row: the RetentionRows after each prompt."""
    B, T, Hkv, D = k.shape
    H = Lh["lk"].shape[1]
    G, r, dev = H // Hkv, slot_pos.shape[-1], k.device
    st = RetentionState.empty(B, H, Hkv, D, Lh["lk"].shape[-1], Lh["lv"].shape[-1], s, w, r, k.dtype, dev)
    n = torch.tensor(lens, device=dev)
    ns = min(s, T)
    sink = (torch.arange(ns, device=dev).view(1, ns) < n.view(B, 1)).view(B, 1, ns, 1)  # a short row's padding
    st.sink_k[:, :, :ns] = torch.where(sink, k[:, :ns].transpose(1, 2), 0)
    st.sink_v[:, :, :ns] = torch.where(sink, v[:, :ns].transpose(1, 2), 0)
    src = {"k": k.transpose(1, 2), "v": v.transpose(1, 2), **Lh,
           "score": (static if static is not None else k.new_zeros(B, T, Hkv)).transpose(1, 2)}
    win_pos = ring_positions(n, s, w)  # [B, w]
    st.win = gather_slots(src, win_pos.view(B, 1, w).expand(B, Hkv, w), G)
    st.ret = gather_slots(src, slot_pos, G)
    st.ret["score"] = slot_score.clone()
    st.ret_pos, st.S, st.folded = slot_pos, S, folded
    real = (torch.arange(T, device=dev).view(1, T) < n.view(B, 1)).view(B, T, 1, 1)
    st.ksum = torch.where(real, normalize_keys(k, EPS), 0).sum(1)
    return RetentionRows(st, win_pos, list(lens))
