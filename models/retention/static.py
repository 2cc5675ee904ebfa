"""Retention with scores fixed at arrival (`proj_residual`, `given`): decide every slot first, then run two
ordinary ops (the rule is in models/retention/ops.py).

When the score does not depend on the state, the slots after any step hold the r best (score, position) of
the tokens that have left the window (the lowest score folds, ties: the earliest position). So token j >= sinks,
which leaves at step j + window, folds at

    fold(j) = window + max(j, p_r(j)),   p_r(j) = the r-th smallest position of the tokens that beat it

(never, if fewer than r beat it; at once, with r = 0); sinks never fold. Query t sees key j iff
j <= t < fold(j). With the fold steps known, no step needs a Python loop:
  - the linear path is ONE gated delta rule (`models.attention.ops.gdn_chunk`, FLA on CUDA) over the fold sequence:
    step t takes the k, v, log_a, beta of the token folding at t (all zero, a no-op update, where none does)
    and the query q_t, so its output lin_scale * q_t^T S_t is the op's linear output;
  - the softmax path is ONE masked attention (SDPA) with that visibility, over query blocks that gather only
    the keys they can see (sinks, the window span, the slots held before the block).
Same outputs, final state and slots as the walk and the definition (tests/test_retention.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from golinear.models.attention import ops
from golinear.models.attention.ops.window import runs_unfold

PAIR_BLOCK = 1 << 26  # elements of one [.., rows, T] comparison block in fold_steps_pairwise (memory bound)
QUERY_BLOCK = 64  # queries per block of the softmax path
KEY_ALIGN = 16  # the softmax path pads each block's keys to a multiple of this (SDPA kernels' mask alignment)


def fold_steps(scores: torch.Tensor, sinks: int, window: int, retain: int) -> torch.Tensor:
    """scores [B, T, Hkv] -> [B, Hkv, T] long: the step each token folds at (>= T: not within the prompt).
    O(T log T) a row (_rth_beater); fold_steps_pairwise is the same rule by direct comparison, O(T^2)."""
    return _fold_steps(scores, sinks, window, retain, _rth_beater)


def fold_steps_pairwise(scores: torch.Tensor, sinks: int, window: int, retain: int) -> torch.Tensor:
    """fold_steps by comparing every pair of tokens (blocks of PAIR_BLOCK elements): the reference it is tested
    against."""
    return _fold_steps(scores, sinks, window, retain, _rth_beater_pairwise)


def _fold_steps(scores, sinks, window, retain, rth_beater):
    B, T, Hkv = scores.shape
    sc = scores.detach().transpose(1, 2)  # [B, Hkv, T]
    pos = torch.arange(T, device=sc.device)
    never = T + window  # a fold step no query reaches
    if retain == 0 or T == 0:
        fold = (pos + window).expand(B, Hkv, T)
    else:  # rank: a strict order, ties to the position (stable sort); sinks never beat anyone
        rank = torch.where(pos >= sinks, sc.sort(dim=-1, stable=True).indices.argsort(-1), -1)
        fold = window + torch.maximum(pos, rth_beater(rank, min(retain, T)))
    return torch.where(pos < sinks, never, fold)


def _rth_beater(rank: torch.Tensor, r: int) -> torch.Tensor:
    """rank [..., T] (distinct, except -1 for tokens that beat no one) -> [..., T]: p_r(j), the r-th smallest
    position among the tokens i with rank[i] > rank[j]; T if fewer than r (r >= 1).

    A wavelet matrix over the positions listed in rank order: the beaters of j are the suffix after j's place in
    that list, and the r-th smallest value in a range is found one bit of the position at a time, from the top:
    at each level the list is stably split by the bit (zeros first) and the range follows its zeros or its ones.
    All T queries walk the levels together: ~log2(T) rounds of a cumsum and a few gathers, no T x T block."""
    lead, T = rank.shape[:-1], rank.shape[-1]
    dev = rank.device
    seq = rank.reshape(-1, T).argsort(dim=-1, stable=True)  # positions by rank; the -1s (sinks) first
    lo = seq.argsort(-1) + 1  # j's beaters: seq[lo:T]
    hi = torch.full_like(lo, T)
    valid = hi - lo >= r
    k = torch.full_like(lo, r - 1)  # 0-based rank of the wanted value within the range
    out = torch.zeros_like(lo)
    idx = torch.arange(T, device=dev)
    for shift in reversed(range(max(1, (T - 1).bit_length()))):
        bit = (seq >> shift) & 1
        zeros = F.pad((1 - bit).cumsum(-1), (1, 0))  # [N, T + 1]: zeros among seq[:i]
        nz = zeros[:, -1:]
        z_lo, z_hi = zeros.gather(1, lo), zeros.gather(1, hi)
        z_in = z_hi - z_lo
        left = k < z_in  # the wanted value has this bit 0
        out |= (~left).long() << shift
        k = torch.where(left, k, k - z_in)
        lo = torch.where(left, z_lo, nz + lo - z_lo)
        hi = torch.where(left, z_hi, nz + hi - z_hi)
        dest = torch.where(bit == 0, zeros[:, :-1], nz + idx - zeros[:, :-1])  # the stable split
        seq = torch.empty_like(seq).scatter_(1, dest, seq)
    return torch.where(valid, out, T).view(*lead, T)


def _rth_beater_pairwise(rank: torch.Tensor, r: int) -> torch.Tensor:
    """_rth_beater by counting, for each j, the beaters at positions <= i for every i (O(T^2))."""
    T = rank.shape[-1]
    parts, rows = [], max(1, PAIR_BLOCK // max(1, rank.numel()))
    small = torch.int16 if T < 1 << 15 else torch.int32  # the counts' type (int16: 2x faster cumsum on CPU)
    for j0 in range(0, T, rows):
        beats = rank.unsqueeze(-2) > rank[..., j0:j0 + rows, None]  # [..., rows(j), T(i)]
        count = beats.view(torch.uint8).cumsum(-1, dtype=small)  # beaters at positions <= i
        want = torch.full(count.shape[:-1] + (1,), r, dtype=small, device=rank.device)
        parts.append(torch.searchsorted(count, want).squeeze(-1))  # the r-th beater's position; T: fewer beat it
    return torch.cat(parts, -1)


def fold_order(fold: torch.Tensor) -> torch.Tensor:
    """fold [B, Hkv, T] -> [B, Hkv, T]: the token folding at each step, -1 where none does (at most one does)."""
    B, Hkv, T = fold.shape
    pos = torch.arange(T, device=fold.device).expand(B, Hkv, T)
    out = fold.new_full((B, Hkv, 2 * T), -1)
    return out.scatter(2, torch.where(fold < T, fold, T + pos), pos)[..., :T]  # index T + j: a distinct bin


def fold_steps_of(order: torch.Tensor, window: int) -> torch.Tensor:
    """fold_order's inverse: order [B, Hkv, T] (-1 = none) -> fold [B, Hkv, T] (T + window: never)."""
    B, Hkv, T = order.shape
    step = torch.arange(T, device=order.device).expand(B, Hkv, T)
    out = order.new_full((B, Hkv, 2 * T), T + window)
    return out.scatter(2, torch.where(order >= 0, order, T + step), step)[..., :T]  # index T + t: a distinct bin


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, *] -> row idx[b, t, h] of x at each (b, t, h), zeros where idx < 0 (idx [B, T, H] long)."""
    B, T, H = idx.shape
    tail = (1,) * (x.dim() - 3)
    i = idx.clamp(min=0).view(B, T, H, *tail).expand(B, T, H, *x.shape[3:])
    return torch.where((idx >= 0).view(B, T, H, *tail), x.gather(1, i), torch.zeros((), dtype=x.dtype, device=x.device))


class _AtFold(torch.autograd.Function):
    """The folding token's row at each step, and its gradient by the inverse map: each token folds at most once
    and each step takes at most one token, so both directions are gathers. (Autograd's backward of a gather is a
    scatter-add whose atomics pile onto the one index every step without a fold repeats.)"""

    @staticmethod
    def forward(ctx, x, idx, inv):
        ctx.save_for_backward(inv)
        return _take(x, idx)

    @staticmethod
    def backward(ctx, grad):
        (inv,) = ctx.saved_tensors
        return _take(grad, inv), None, None


def linear_path(lin: dict, order: torch.Tensor, lin_scale: float, want_state: bool):
    """GDN over the fold sequence: (y_lin [B, T, H, V], final state or None)."""
    B, T, H = lin["log_a"].shape
    idx = order.repeat_interleave(H // order.shape[1], 1).transpose(1, 2)  # [B, T, H]: the token folding at step t
    step = torch.arange(T, device=idx.device).view(1, T, 1).expand(B, T, H)
    inv = idx.new_full((B, 2 * T, H), -1).scatter(1, torch.where(idx >= 0, idx, T + step), step)[:, :T]  # token -> step
    k, v, log_a, beta = (_AtFold.apply(lin[key], idx, inv) for key in ("k", "v", "log_a", "beta"))
    return ops.gdn_chunk(lin["q"], k, v, log_a, beta, lin_scale, output_final_state=want_state)


def softmax_path(q, k, v, fold: torch.Tensor, scale: float, sinks: int, window: int, retain: int) -> torch.Tensor:
    """Softmax of query t over the keys j <= t < fold(j), one SDPA over query blocks of QUERY_BLOCK. A block
    starting at t0 can only see the sinks, the span t0 - window .. t0 + QUERY_BLOCK - 1 and the (<= r) tokens
    held in the slots before it, so it gathers just those keys; GQA as G query rows per KV head."""
    B, T, H, D = q.shape
    Hkv, V, dev = k.shape[2], v.shape[-1], q.device
    G, Q = H // Hkv, min(QUERY_BLOCK, T)
    if T == 0:
        return q.new_zeros(B, 0, H, V)
    nb = -(-T // Q)
    pos, t0 = torch.arange(T, device=dev), torch.arange(nb, device=dev) * Q
    span = t0[:, None] - window + torch.arange(window + Q, device=dev)  # [nb, w + Q]
    held = (pos >= sinks) & (pos < (t0 - window)[:, None]) & (fold.unsqueeze(2) >= t0[:, None])  # [B,Hkv,nb,T]
    n = min(retain, T)
    slots = torch.where(held, pos, T).topk(n, -1, largest=False).values  # [B, Hkv, nb, n]; T = empty
    L = sinks + window + Q + n
    pad = -L % KEY_ALIGN
    idx = torch.cat([torch.arange(sinks, device=dev).expand(B, Hkv, nb, sinks),
                     torch.where(span >= sinks, span, -1).expand(B, Hkv, nb, window + Q), slots,
                     torch.full((B, Hkv, nb, pad), -1, device=dev)], -1)  # [B, Hkv, nb, L + pad]
    idx = torch.where(idx < T, idx, -1)
    at = idx.clamp(min=0).flatten(2)  # [B, Hkv, nb * L']
    kf = fold.gather(2, at).view(idx.shape)
    tq = (t0[:, None] + torch.arange(Q, device=dev)).unsqueeze(-1)  # [nb, Q, 1]
    see = (idx.unsqueeze(3) >= 0) & (idx.unsqueeze(3) <= tq) & (tq < kf.unsqueeze(3))  # [B, Hkv, nb, Q, L']
    empty = ~see.any(-1, keepdim=True)  # padding queries, or sinks = window = 0: key 0, output zeroed below
    see = see | (empty & (torch.arange(idx.shape[-1], device=dev) == 0))

    def keys(x):  # x [B, T, Hkv, *] -> the blocks' keys [B, Hkv * nb, L', *]
        xh = x.transpose(1, 2)
        if T < sinks:  # (the sink columns would read past the prompt: gather every column)
            return xh.gather(2, at.unsqueeze(-1).expand(*at.shape, xh.shape[-1])).view(B, Hkv * nb, -1, xh.shape[-1])
        # sinks + the window span by pad + unfold (its backward sums overlapping runs without atomic adds, which a
        # gather's scatter-add backward needs for every key each block repeats); only the slots are gathered
        runs = runs_unfold(x, sinks, 0, 0, nb, Q, window + Q).view(B, Hkv, nb, sinks + window + Q, -1)
        col = torch.arange(n, device=dev)  # an empty slot reads key c (masked): distinct keys, so its zero
        sl = torch.where(slots < T, slots, col).flatten(2)  # gradient adds do not all land on one address
        held_keys = xh.gather(2, sl.unsqueeze(-1).expand(*sl.shape, xh.shape[-1])).view(B, Hkv, nb, n, xh.shape[-1])
        out = F.pad(torch.cat([runs, held_keys], 3), (0, 0, 0, pad))  # the alignment columns: zeros, masked
        return out.view(B, Hkv * nb, idx.shape[-1], xh.shape[-1])
    qh = F.pad(q, (0, 0, 0, 0, 0, nb * Q - T)).view(B, nb, Q, Hkv, G, D).permute(0, 3, 1, 4, 2, 5)
    mask = see.unsqueeze(3).expand(B, Hkv, nb, G, Q, -1).reshape(B, Hkv * nb, G * Q, -1)
    o = F.scaled_dot_product_attention(qh.reshape(B, Hkv * nb, G * Q, D), keys(k), keys(v), attn_mask=mask,
                                       scale=scale)
    o = o.view(B, Hkv, nb, G, Q, V).masked_fill(empty.unsqueeze(3), 0)
    return o.permute(0, 2, 4, 1, 3, 5).reshape(B, nb * Q, H, V)[:, :T]


def end_slots(fold: torch.Tensor, scores: torch.Tensor, sinks: int, window: int, retain: int, lengths=None):
    """The slots after the prompt: (positions [B, Hkv, r], -1 = empty; their scores, -inf = empty; folded count).
    lengths: each row's prompt length as a [B, 1, 1] tensor (models.retention.prefill_rows), None: all T."""
    B, Hkv, T = fold.shape
    pos = torch.arange(T, device=fold.device)
    length = T if lengths is None else lengths
    kept = (pos >= sinks) & (pos + window < length) & (fold >= length)  # left the window, never folded
    n = min(retain, T)
    slot = torch.where(kept, pos, T).topk(n, -1, largest=False, sorted=True).values if n else fold[..., :0]
    slot = torch.cat([slot, slot.new_full((B, Hkv, retain - n), T)], -1)
    slot = torch.where(slot < T, slot, -1)
    sc = F.pad(scores.detach().transpose(1, 2), (0, 1)).gather(2, slot.clamp(min=0))  # (a T = 0 prompt reads the pad)
    sc = torch.where(slot >= 0, sc, torch.full_like(sc, -float("inf")))
    return slot, sc, (fold < length).sum(-1)
