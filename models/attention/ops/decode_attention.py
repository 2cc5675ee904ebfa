"""One decode query per row against a static KV buffer, each row reading only its filled prefix.

`decode_attention(q, k_buf, v_buf, lengths, scale)`: q [B, Hq, D] (one new token per row, after RoPE), the
head-major static buffers k_buf/v_buf [B, Hkv, L, D] (models/decoding/fast_decode.py), lengths [B] (a device tensor: row
b attends to its slots 0..lengths[b]-1; the rest of the buffer is padding or stale) -> out [B, Hq, D] in q's dtype.
`holes` [B, Hkv, 2] (optional, int32): slots [start, end) of a row's KV head that it skips (a head-adaptive press's
cache: each head fills its first slots, models/kv_compression/static_decode.py).
GQA without expanding the cache: the G = Hq / Hkv query heads of a KV head are G query rows of that head.

Two forms of one computation, as FLA pairs a naive reference with each kernel:
  - `decode_attention_reference`: SDPA over the whole buffer with a per-row mask (slots >= lengths[b] masked).
    The definition, and the path on the CPU. `prefix` limits the keys to the first `prefix` slots (a host-side
    bound on every row's length, known to an eager decode loop: no work on the unfilled tail).
  - models/attention/ops/decode_attention_split_k.py: a Triton kernel that splits the key axis over programs (FlashAttention's
    and FlashInfer's split-K decoding: a decode query is too little work for one program per (row, head) to fill
    the GPU at long contexts), each reading only the part of its row's prefix in its split, then merges the partial
    softmaxes. Static shapes and no mask tensor, so one CUDA graph serves every length; used on CUDA.
"""
from __future__ import annotations

import torch


def allowed_slots(L: int, last: torch.Tensor, holes=None) -> torch.Tensor:
    """[B, Hkv or 1, Q, L] bool: the slots query (b, i) attends to: slot <= last[b, i] ([B, Q]), outside its row's
    KV head's hole ([start, end) in holes [B, Hkv, 2])."""
    slots = torch.arange(L, device=last.device)
    allowed = (slots.view(1, 1, L) <= last.unsqueeze(-1)).unsqueeze(1)
    if holes is not None:
        inside = (slots.view(1, 1, L) >= holes[..., :1]) & (slots.view(1, 1, L) < holes[..., 1:])  # [B, Hkv, L]
        allowed = allowed & ~inside.unsqueeze(2)
    return allowed


def decode_attention_reference(q, k_buf, v_buf, lengths, scale: float, prefix: int | None = None, holes=None):
    """SDPA over the buffer (or its first `prefix` slots) with slots >= lengths[b] (and inside a hole) masked."""
    B, Hq, D = q.shape
    Hkv = k_buf.shape[1]
    if prefix is not None:
        k_buf, v_buf = k_buf[:, :, :prefix], v_buf[:, :, :prefix]
    allowed = allowed_slots(k_buf.shape[2], (lengths - 1).view(B, 1), holes)
    qg = q.reshape(B, Hkv, Hq // Hkv, D).to(k_buf.dtype)  # query head h*G+g -> row g of KV head h
    o = torch.nn.functional.scaled_dot_product_attention(qg, k_buf, v_buf, attn_mask=allowed, scale=scale)
    return o.reshape(B, Hq, v_buf.shape[-1]).to(q.dtype)


def split_k_usable(q: torch.Tensor) -> bool:
    """Whether the split-K kernel serves this call: CUDA tensors, Triton importable (it comes with CUDA torch)."""
    if not q.is_cuda:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def decode_attention(q, k_buf, v_buf, lengths, scale: float, prefix: int | None = None, holes=None):
    """The split-K kernel where usable (CUDA), else the reference (over `prefix` slots when given)."""
    if split_k_usable(q):
        from golinear.models.attention.ops.decode_attention_split_k import decode_attention_split_k
        return decode_attention_split_k(q, k_buf, v_buf, lengths, scale, holes=holes)
    return decode_attention_reference(q, k_buf, v_buf, lengths, scale, prefix, holes)
