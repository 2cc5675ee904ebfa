"""Sliding-window + sink softmax attention in plain PyTorch (SDPA and einsum; no FLA), for the CUDA backend
(models.attention.ops.fla_backend) and the fast decoder's prefill; it runs on the CPU too.

Query t sees the window keys t - window < j <= t and the sink keys j < sinks outside it (j <= t - window).
  - window_attention_blocked: window + sinks in ONE SDPA call: query blocks of 64, each against the sinks plus
    the run of keys its window reaches, under a cached additive mask; GQA as G rows per block (keys are never
    expanded); with or without autograd; also takes a previous chunk's keys (the prefill).
  - window_part_blocked / sink_part / add_sinks / merge_attention: the window and the sinks as two partial
    softmaxes (out, lse) merged through the log-sum-exp (the differentiable part of
    fla_backend.window_sink_attention, whose no-grad window part is FLA's kernel).
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

WINDOW_BLOCK = 64  # query block of the differentiable window path
# Query block of the gather (no-grad) path, the prefill's. Each block copies the sinks plus the window - 1 + block
# keys it reaches, so a larger block copies the keys fewer times (17 times at a window of 1016 with 64) and attends
# to more masked ones; scripts/gpu/profile_prefill.py --window-blocks times the choices side by side.
PREFILL_BLOCK = WINDOW_BLOCK


def merge_attention(o_a, lse_a, o_b, lse_b):
    """Softmax over the union of two disjoint key sets from the two partial results (lse may be -inf)."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    wa = torch.where(torch.isfinite(lse_a), torch.exp(lse_a - safe), torch.zeros_like(lse_a))
    wb = torch.where(torch.isfinite(lse_b), torch.exp(lse_b - safe), torch.zeros_like(lse_b))
    return o_a.float() * wa.unsqueeze(-1) + o_b.float() * wb.unsqueeze(-1), lse


def sink_part(q, sink_k, sink_v, window, scale, q_pos):
    """Softmax over the sink keys j (positions 0..s-1) that are outside the window: j <= t - window.

    q [B,T,Hq,D], sink_k/v [B,s,Hkv,D], q_pos [T] absolute positions. -> (out fp32, lse fp32)."""
    B, T, Hq, D = q.shape
    s, Hkv = sink_k.shape[1], sink_k.shape[2]
    G = Hq // Hkv
    scores = torch.einsum("bthgd,bshd->bthgs", q.float().reshape(B, T, Hkv, G, D), sink_k.float()) * scale
    j = torch.arange(s, device=q.device)
    allowed = j.unsqueeze(0) <= (q_pos.unsqueeze(1) - window)  # [T, s]
    scores = scores.masked_fill(~allowed[None, :, None, None, :], -math.inf)
    lse = torch.logsumexp(scores, -1)
    p = torch.exp(scores - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)).unsqueeze(-1))
    out = torch.einsum("bthgs,bshd->bthgd", p, sink_v.float())
    return out.reshape(B, T, Hq, -1), lse.reshape(B, T, Hq)


def add_sinks(q, o_w, lse_w, sink_k, sink_v, window, scale, q_pos):
    """Merge the sink keys outside the window (j < s, j <= t - window) into a window result, no autograd.

    Memory-light form of sink_part + merge_attention for the prefill: the only full-size tensors it
    writes are one [B,T,Hq,V] output in the input dtype (fp32 is used only for the [.., s] scores).
    q [B,T,Hq,D], o_w [B,T,Hq,V], lse_w [B,T,Hq] (finite: window >= 1), sink_k/v [B,s,Hkv,D].
    -> (out [B,T,Hq,V] in v's dtype, lse [B,T,Hq] fp32)."""
    B, T, Hq, D = q.shape
    s, Hkv, V = sink_k.shape[1], sink_k.shape[2], sink_v.shape[-1]
    G = Hq // Hkv
    scores = torch.einsum("bthgd,bshd->bthgs", q.reshape(B, T, Hkv, G, D), sink_k.to(q.dtype)).float() * scale
    allowed = torch.arange(s, device=q.device).unsqueeze(0) <= (q_pos.unsqueeze(1) - window)  # [T, s]
    scores = scores.masked_fill(~allowed[None, :, None, None, :], -math.inf)
    lse_w = lse_w.reshape(B, T, Hkv, G).float()
    lse = torch.logaddexp(lse_w, torch.logsumexp(scores, -1))  # finite because lse_w is
    p = torch.exp(scores - lse.unsqueeze(-1))  # sink weights, already normalised over the union
    out = torch.einsum("bthgs,bshd->bthgd", p.to(sink_v.dtype), sink_v)
    out.addcmul_(o_w.reshape(B, T, Hkv, G, V).to(out.dtype), torch.exp(lse_w - lse).unsqueeze(-1).to(out.dtype))
    return out.reshape(B, T, Hq, V), lse.reshape(B, T, Hq)


def window_part_blocked(q, k, v, window, scale, block=WINDOW_BLOCK):
    """Sliding-window softmax (keys t-window < j <= t), GQA aware, with autograd; q/k/v share positions.

    Queries go in blocks of `block`; each block sees the window-1 keys before it plus its own block
    (an unfold view), so memory is O(T x (window + block)). -> (out fp32 [B,T,Hq,V], lse fp32 [B,T,Hq])."""
    B, T, Hq, D = q.shape
    Hkv, V = k.shape[2], v.shape[-1]
    G = Hq // Hkv
    L = window - 1
    n = -(-T // block)
    Tp = n * block
    qb = F.pad(q, (0, 0, 0, 0, 0, Tp - T)).reshape(B, n, block, Hkv, G, D)
    kp = F.pad(k, (0, 0, 0, 0, L, Tp - T)).unfold(1, L + block, block)  # [B, n, Hkv, D, L+block]
    vp = F.pad(v, (0, 0, 0, 0, L, Tp - T)).unfold(1, L + block, block)  # [B, n, Hkv, V, L+block]
    scores = torch.einsum("bnqhgd,bnhdc->bnhgqc", qb, kp).float() * scale
    r = torch.arange(block, device=q.device).unsqueeze(1)
    c = torch.arange(L + block, device=q.device).unsqueeze(0)
    start = torch.arange(n, device=q.device).view(n, 1, 1) * block - L  # absolute position of column 0
    delta = r + L - c  # t - j
    allowed = (delta >= 0) & (delta <= L) & (start + c >= 0)  # [n, block, L+block]
    scores = scores.masked_fill(~allowed[None, :, None, None], -math.inf)
    lse = torch.logsumexp(scores, -1)  # every real query sees itself: finite
    p = torch.exp(scores - lse.unsqueeze(-1))
    out = torch.einsum("bnhgqc,bnhvc->bnqhgv", p.to(v.dtype), vp).float()
    out = out.reshape(B, Tp, Hq, V)[:, :T]
    lse = lse.permute(0, 1, 4, 2, 3).reshape(B, Tp, Hq)[:, :T]
    return out, lse


def _round_up(x, m):
    return -(-x // m) * m


@functools.lru_cache(maxsize=8)
def _blocked_layout(n, block, G, Tq, L, base, lo, q_pos0, window, s, Lw, dtype, device):
    """Cached (additive mask [1, n, block*G, s+Lw], key index [n*(s+Lw)], query index [n*block]) of
    window_attention_blocked. Row r*G + g of block b is query i = b*block + r (absolute position q_pos0 + i);
    column j < s is sink key j; column s + c is key idx = base + b*block - (Lw - block) + c (absolute
    position q_pos0 + idx - base), a window key when lo <= idx < L."""
    dev = torch.device(device)
    i = torch.arange(n * block, device=dev).view(n, block, 1)
    t = q_pos0 + i
    idx = (torch.arange(n, device=dev).view(n, 1, 1) * block + base - (Lw - block) + torch.arange(Lw, device=dev))
    real = (idx >= lo) & (idx < L)
    pos = q_pos0 + idx - base
    allowed = real & (pos <= t) & (pos > t - window)
    pad_row = i >= Tq  # padding queries (dropped): any real key, so that no row is empty
    allowed = allowed | (pad_row & real)
    kidx = idx.clamp(lo, L - 1).view(n, Lw)  # masked columns read some real key (finite values)
    if s:
        sink = torch.arange(s, device=dev).view(1, 1, s) <= t - window
        allowed = torch.cat([sink & ~pad_row, allowed], -1)
        kidx = torch.cat([torch.arange(s, device=dev).expand(n, s), kidx], -1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(~allowed, -math.inf)
    mask = mask.repeat_interleave(G, dim=1).unsqueeze(0)  # rows (r, g)
    return mask, kidx.reshape(-1), torch.arange(n * block, device=dev).clamp_(max=Tq - 1)


def window_attention_blocked(q, k, v, window, scale, sinks=0, base=0, lo=0, q_pos0=0, block=None, add_to=None):
    """Sliding-window softmax plus sink keys in ONE fused attention call (SDPA), GQA aware, autograd or not.

    q [B,Tq,Hq,D] at absolute positions q_pos0 + i; k/v [B,L,Hkv,D]: entries 0..sinks-1 are the sink keys
    (positions 0..sinks-1), entries lo..L-1 keys at consecutive positions with k[:, base + i] query i's own
    key. Query t sees the keys t - window < j <= t and the sinks j <= t - window (the others are inside the
    window already). Queries go in blocks of `block` (None: WINDOW_BLOCK with autograd, PREFILL_BLOCK
    without); each block attends to the sinks plus the run of Lw
    keys its window can reach, under a cached additive mask; the G query heads of a KV head are G rows of
    its block, so keys are never expanded. Without autograd the runs are gathered by one index_select per
    tensor; with autograd by pad + unfold (deterministic backward: no atomic adds). -> out [B,Tq,Hq,V].
    add_to: y [B,Tq,Hq,V] (contiguous; no autograd; Tq a multiple of `block`): out is added into y in place
    straight from SDPA's layout, without the copy to [B,Tq,Hq,V] and the fresh y + out; returns y."""
    B, Tq, Hq, D = q.shape
    L, Hkv, V = k.shape[1], k.shape[2], v.shape[-1]
    G = Hq // Hkv
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    block = block or (WINDOW_BLOCK if grad else PREFILL_BLOCK)
    n = -(-Tq // block)
    Lw = _round_up(window - 1 + block + sinks, 16) - sinks  # s + Lw a multiple of 16 (kernel alignment)
    # positions enter only relative to each other, and through the sink rule j <= t - window, which admits
    # every sink from q_pos0 = s - 1 + window on: later chunks of a prefill share one cached layout
    pos_key = min(q_pos0, max(sinks - 1 + window, 0))
    mask, kidx, qidx = _blocked_layout(n, block, G, Tq, L, base, lo, pos_key, window, sinks, Lw, v.dtype,
                                       str(q.device))
    q, k = q.to(v.dtype), k.to(v.dtype)
    if grad:
        qb = F.pad(q, (0, 0, 0, 0, 0, n * block - Tq)) if n * block != Tq else q
        qb = qb.reshape(B, n, block, Hkv, G, D).permute(0, 3, 1, 2, 4, 5).reshape(B * Hkv, n, block * G, D)
        kb, vb = (runs_unfold(x, sinks, base - lo, lo, n, block, Lw) for x in (k, v))
    else:
        qb = q.reshape(B, Tq, Hkv, G, D).transpose(1, 2).index_select(2, qidx).view(B * Hkv, n, block * G, D)
        kb, vb = (x.transpose(1, 2).index_select(2, kidx).view(B * Hkv, n, sinks + Lw, x.shape[-1]) for x in (k, v))
    o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)
    # SDPA's CUDA kernels may return a transposed layout: unflatten (always a view), then one copy
    o = o.unflatten(0, (B, Hkv)).unflatten(3, (block, G)).permute(0, 2, 3, 1, 4, 5)  # [B, n, block, Hkv, G, V]
    if add_to is not None:
        if grad or n * block != Tq:
            raise ValueError(f"add_to needs no autograd and Tq a multiple of {block} (got Tq={Tq}, grad={grad})")
        add_to.view(B, n, block, Hkv, G, V).add_(o)
        return add_to
    o = o.reshape(B, n * block, Hq, V)
    return o if n * block == Tq else o[:, :Tq]  # (a full-range slice still costs a zero-fill + copy in backward)


def runs_unfold(x, s, base, lo, n, block, Lw):
    """[B*Hkv, n, s+Lw, D]: per block the sinks x[:, :s] and the run of Lw keys of x[:, lo:] starting at
    base + b*block - (Lw - block) (zero padding outside), by pad + unfold + one cat."""
    B, _, Hkv, D = x.shape
    y = x[:, lo:] if lo else x  # (full-range slices are avoided: each costs a zero-fill + copy in backward)
    P = max(0, Lw - block - base)  # left padding so that block 0's run starts at `off`
    off = base + P - (Lw - block)
    R = max(0, (n - 1) * block + off + Lw - (y.shape[1] + P))
    y = F.pad(y, (0, 0, 0, 0, P, R)) if P or R else y
    runs = (y[:, off:] if off else y).unfold(1, Lw, block)  # [B, >= n, Hkv, D, Lw]
    runs = runs[:, :n] if runs.shape[1] > n else runs
    runs = runs.permute(0, 2, 1, 4, 3)  # [B, Hkv, n, Lw, D]
    if s:
        sink = x[:, :s].permute(0, 2, 1, 3).unsqueeze(2).expand(B, Hkv, n, s, D)
        runs = torch.cat([sink, runs], 3)
    return runs.reshape(B * Hkv, n, s + Lw, D)
