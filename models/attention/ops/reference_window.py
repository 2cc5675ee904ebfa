"""Pure-PyTorch reference of the softmax side of a linearized layer: sliding-window attention plus sink tokens
(prefill, with the log-sum-exp the combine with the linear path needs) and its decode step. GQA aware; the
definition the fused SDPA/FLA versions (models/attention/ops/window.py, models/attention/ops/fla_backend.py) are tested against."""
from __future__ import annotations

import math

import torch

from golinear.models.attention.ops.ref_common import compute_dtype

ATTN_QUERY_BLOCK = 32  # queries per block in window_sink_attention
ATTN_MAX_SCORES = 1 << 24  # scores held at once by window_sink_attention (64 MiB in fp32)


def grouped(q, k):
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"attention needs q [B, Tq, Hq, D] and k/v [B, Tk, Hkv, D]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}")
    Hq, Hkv = q.shape[2], k.shape[2]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    return Hq // Hkv


def masked_softmax(scores, allowed):
    """Softmax over the last dim restricted to `allowed`; returns (probs, lse). Rows with no allowed
    entry give probs 0 and lse -inf, without NaN gradients."""
    s = scores.masked_fill(~allowed, -math.inf)
    m = s.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    empty = denom == 0
    denom = torch.where(empty, torch.ones_like(denom), denom)
    lse = torch.where(empty, torch.full_like(denom, -math.inf), m + torch.log(denom)).squeeze(-1)
    return p / denom, lse


def window_sink_attention(q, k, v, sinks, window, scale, q_offset=0):
    """Softmax attention over I = {j < sinks} U {t - window < j <= t} (and j <= t), GQA aware.

    q [B, Tq, Hq, D] at absolute positions q_offset + i; k, v [B, Tk, Hkv, D] at positions 0..Tk-1.
    Returns (out [B, Tq, Hq, D] in q's dtype, lse [B, Tq, Hq] in the compute dtype, fp32).
    Queries go in blocks of ATTN_QUERY_BLOCK; each block gathers only the sink keys and the keys its
    window can reach (sinks + window + block - 1), so work and memory are O(Tq x (sinks + window)).
    When that span covers all keys, every block uses all keys (blocks grouped to bound memory)."""
    G = grouped(q, k)
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v {tuple(v.shape)} must match k {tuple(k.shape)} in [B, Tk, Hkv]")
    if sinks < 0 or window < 0 or q_offset < 0:
        raise ValueError(f"sinks, window and q_offset must be >= 0; got {sinks}, {window}, {q_offset}")
    B, Tq, Hq, D = q.shape
    Tk, Hkv, Dv = k.shape[1], k.shape[2], v.shape[-1]
    dt = compute_dtype(q)
    dev = q.device
    if Tq == 0 or Tk == 0:
        return (q.new_zeros(B, Tq, Hq, Dv), torch.full((B, Tq, Hq), -math.inf, dtype=dt, device=dev))
    Bq = ATTN_QUERY_BLOCK
    nb = -(-Tq // Bq)
    qp = q.to(dt)
    if nb * Bq != Tq:
        qp = torch.cat([qp, qp.new_zeros(B, nb * Bq - Tq, Hq, D)], dim=1)
    qp = qp.view(B, nb, Bq, Hkv, G, D)
    kd, vd = k.to(dt), v.to(dt)
    tpos = q_offset + torch.arange(nb * Bq, device=dev).view(nb, Bq, 1)  # [nb, Bq, 1]
    s_eff = min(sinks, Tk)
    win_len = min(window + Bq - 1, Tk)
    sparse = s_eff + win_len < Tk
    if sparse:  # per block: the sinks, then a contiguous run of win_len keys ending at the block's end
        t0 = q_offset + torch.arange(nb, device=dev) * Bq
        start = (t0 - window + 1).clamp(min=0, max=Tk - win_len)
        kpos = torch.cat([torch.arange(s_eff, device=dev).expand(nb, s_eff),
                          start[:, None] + torch.arange(win_len, device=dev)], dim=1)  # [nb, L]
        in_sinks = torch.arange(kpos.shape[1], device=dev) < s_eff
        kp = kpos.unsqueeze(1)  # [nb, 1, L]
        allowed = (kp <= tpos) & (in_sinks | ((kp >= s_eff) & (kp > tpos - window)))
    else:
        kp = torch.arange(Tk, device=dev).view(1, 1, Tk)
        allowed = (kp <= tpos) & ((kp < sinks) | (kp > tpos - window))  # [nb, Bq, Tk]
    L = allowed.shape[-1]
    per_block = B * Hq * Bq * L
    group = max(1, ATTN_MAX_SCORES // per_block)
    outs, lses = [], []
    for m0 in range(0, nb, group):
        m1 = min(nb, m0 + group)
        qg = qp[:, m0:m1]
        if sparse:
            idx = kpos[m0:m1]
            s = torch.einsum("bmqhgd,bmlhd->bmhgql", qg, kd[:, idx]) * scale
            p, lse = masked_softmax(s, allowed[m0:m1, None, None])
            o = torch.einsum("bmhgql,bmlhd->bmqhgd", p, vd[:, idx])
        else:  # causal: keys after the group's last query are never visible
            hi = max(1, min(Tk, q_offset + m1 * Bq))
            s = torch.einsum("bmqhgd,blhd->bmhgql", qg, kd[:, :hi]) * scale
            p, lse = masked_softmax(s, allowed[m0:m1, None, None, :, :hi])
            o = torch.einsum("bmhgql,blhd->bmqhgd", p, vd[:, :hi])
        outs.append(o)
        lses.append(lse)
    out = torch.cat(outs, 1).reshape(B, nb * Bq, Hq, Dv)[:, :Tq]
    lse = torch.cat(lses, 1).permute(0, 1, 4, 2, 3).reshape(B, nb * Bq, Hq)[:, :Tq]
    return out.to(q.dtype), lse


def window_sink_softmax(q, k, v, sinks, window, scale):
    """window_sink_attention's output alone (the layer's parallel pass needs no lse); the CUDA backend
    computes it in one fused attention call."""
    return window_sink_attention(q, k, v, sinks, window, scale)[0]


def window_sink_decode(q, k_cache, v_cache, scale):
    """Decoding step: every query row attends to all cached keys (the caller passes exactly the sink +
    window keys it may see, the current token included). q [B, Tq, Hq, D], caches [B, L, Hkv, D].
    Returns (out [B, Tq, Hq, D], lse [B, Tq, Hq]); with L == 0 the output is 0 and lse -inf."""
    G = grouped(q, k_cache)
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"v_cache {tuple(v_cache.shape)} must match k_cache {tuple(k_cache.shape)}")
    B, Tq, Hq, D = q.shape
    Hkv, L = k_cache.shape[2], k_cache.shape[1]
    dt = compute_dtype(q)
    if L == 0:
        return (q.new_zeros(B, Tq, Hq, v_cache.shape[-1]),
                torch.full((B, Tq, Hq), -math.inf, dtype=dt, device=q.device))
    s = torch.einsum("bqhgd,bkhd->bhgqk", q.to(dt).reshape(B, Tq, Hkv, G, D), k_cache.to(dt)) * scale
    p, lse = masked_softmax(s, torch.ones(L, dtype=torch.bool, device=q.device))
    out = torch.einsum("bhgqk,bkhd->bqhgd", p, v_cache.to(dt))
    return out.reshape(B, Tq, Hq, v_cache.shape[-1]).to(q.dtype), lse.permute(0, 3, 1, 2).reshape(B, Tq, Hq)


_grouped, _masked_softmax = grouped, masked_softmax  # (the names models.attention.ops.reference has exported)
