"""Split-K decode attention in Triton: the fast form of models.attention.ops.decode_attention (its SDPA reference is the
definition; tests/test_decode_attention.py compares them under Triton's interpreter on the CPU).

Stage 1, one program per (row, KV head, split of the key axis): the G query heads of that KV head as G rows of a
tile, an online softmax over the keys of its split that lie in the row's filled prefix (a split past the prefix
reads nothing), written as a partial (max, sum, weighted values). Stage 2 merges the splits' partials (log-sum-exp
weights). The number of splits depends only on the shapes, so a CUDA graph captured once serves every position.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # keys per inner step


@triton.jit
def _split_k_partials(Q, K, V, LENGTHS, HOLES, MID_O, MID_M, MID_L, scale,
                      stride_qb, stride_qh, stride_kb, stride_kh, stride_kl, stride_vb, stride_vh, stride_vl,
                      HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr, CHUNK: tl.constexpr,
                      BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr, HAS_HOLES: tl.constexpr,
                      PRECISION: tl.constexpr):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    h = bh % HKV
    length = tl.load(LENGTHS + b).to(tl.int32)
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, length)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK)
    q = tl.load(Q + b * stride_qb + (h * G + g)[:, None] * stride_qh + d[None, :],
                mask=(g[:, None] < G) & (d[None, :] < D), other=0.0).to(tl.float32)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    if HAS_HOLES:  # slots [hole_start, hole_end) of this row's head are skipped
        hole_start = tl.load(HOLES + bh * 2)
        hole_end = tl.load(HOLES + bh * 2 + 1)
    for n0 in range(start, end, BLOCK):
        keys = n0 + n
        inside = keys < end
        if HAS_HOLES:
            inside = inside & ((keys < hole_start) | (keys >= hole_end))
        k = tl.load(K + b * stride_kb + h * stride_kh + keys[:, None] * stride_kl + d[None, :],
                    mask=inside[:, None] & (d[None, :] < D), other=0.0)
        # (float32 whatever type scale arrives as: torch.compile passes a Python float to a Triton kernel as fp64)
        scores = (tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION) * scale).to(tl.float32)
        scores = tl.where(inside[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block wholly in a hole adds nothing (not NaN)
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        v = tl.load(V + b * stride_vb + h * stride_vh + keys[:, None] * stride_vl + d[None, :],
                    mask=inside[:, None] & (d[None, :] < D), other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision=PRECISION)
        s = s * alpha + tl.sum(p, 1)
        m = m_new
    row = (bh * SPLITS + split) * BLOCK_G + g
    tl.store(MID_M + row, m)
    tl.store(MID_L + row, s)
    tl.store(MID_O + row[:, None] * BLOCK_D + d[None, :], acc)


def num_splits(rows_heads: int, L: int, device: torch.device) -> int:
    """Enough programs to fill the GPU twice over (FlashAttention's split heuristic, simplified), each with at
    least one key block of the buffer."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(triton.cdiv(L, BLOCK_N), triton.cdiv(2 * sms, rows_heads)))


def decode_attention_split_k(q, k_buf, v_buf, lengths, scale: float, splits: int | None = None, holes=None,
                             exact: bool = False):
    """models.attention.ops.decode_attention's computation: q [B, Hq, D], k_buf/v_buf [B, Hkv, L, D] (last dim contiguous),
    lengths [B] (>= 1), holes [B, Hkv, 2] or None -> [B, Hq, D] in q's dtype. `exact`: float32 dot products in IEEE
    float32 instead of the matrix units' TF32 (Triton's default on a GPU; the interpreter is exact either way), for
    tests of the computation itself."""
    B, Hq, D = q.shape
    _, Hkv, L, _ = k_buf.shape
    G = Hq // Hkv
    splits = splits or num_splits(B * Hkv, L, q.device)
    chunk = triton.cdiv(triton.cdiv(L, splits), BLOCK_N) * BLOCK_N
    block_g = max(16, triton.next_power_of_2(G))
    block_d = max(16, triton.next_power_of_2(D))
    dtype = q.dtype
    q = q.to(k_buf.dtype).contiguous()
    mid_o = torch.empty(B * Hkv, splits, block_g, block_d, dtype=torch.float32, device=q.device)
    mid_m = torch.empty(B * Hkv, splits, block_g, dtype=torch.float32, device=q.device)
    mid_l = torch.empty_like(mid_m)
    if holes is not None:
        holes = holes.to(torch.int32).contiguous()
    _split_k_partials[(B * Hkv, splits)](
        q, k_buf, v_buf, lengths, lengths if holes is None else holes, mid_o, mid_m, mid_l, scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), k_buf.stride(2),
        v_buf.stride(0), v_buf.stride(1), v_buf.stride(2),
        HKV=Hkv, G=G, D=D, SPLITS=splits, CHUNK=chunk, BLOCK_G=block_g, BLOCK_D=block_d, BLOCK=BLOCK_N,
        HAS_HOLES=holes is not None, PRECISION="ieee" if exact else "tf32")
    # merge: weights exp(m_split - max); a split that read nothing has m = -inf, weight 0
    top = mid_m.amax(1, keepdim=True)
    w = torch.exp(mid_m - top)
    out = (mid_o * w.unsqueeze(-1)).sum(1) / (mid_l * w).sum(1).unsqueeze(-1)
    return out[:, :G, :D].reshape(B, Hq, D).to(dtype)
