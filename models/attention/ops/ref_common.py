"""Shared checks and chunking helpers of the pure-PyTorch reference ops (models/attention/ops/reference.py and
models/attention/ops/reference_window.py): input validation with one-line errors, fp32 compute dtype, chunk layout."""
from __future__ import annotations

import torch

def compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def check_qkv(q, k, v, name_q="q", name_k="k"):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{name_q}/{name_k}/v must be [B, T, H, D]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape != k.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"shape mismatch: {name_q} {tuple(q.shape)}, {name_k} {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} (need {name_q} == {name_k} and equal [B, T, H])")


def check_state(state, shape, name="initial_state"):
    if state is not None and tuple(state.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(state.shape)}, expected {tuple(shape)}")


def check_chunk_size(chunk_size):
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[B, T, H, ...] -> [B, H, N, C, ...], zero-padding T up to a multiple of C."""
    B, T, H = x.shape[:3]
    n = -(-T // chunk_size)
    pad = n * chunk_size - T
    if pad:
        x = torch.cat([x, x.new_zeros((B, pad) + tuple(x.shape[2:]))], dim=1)
    x = x.reshape((B, n, chunk_size, H) + tuple(x.shape[3:]))
    return x.transpose(2, 3).transpose(1, 2).contiguous()


def from_chunks(x: torch.Tensor, T: int) -> torch.Tensor:
    """[B, H, N, C, ...] -> [B, T, H, ...] (drops the padding)."""
    B, H, N, C = x.shape[:4]
    x = x.transpose(1, 2).transpose(2, 3).reshape((B, N * C, H) + tuple(x.shape[4:]))
    return x[:, :T]


def causal_mask(C: int, device, strict: bool = False) -> torch.Tensor:
    return torch.ones(C, C, dtype=torch.bool, device=device).tril(-1 if strict else 0)


# the names models.attention.ops.reference and its tests have used
_compute_dtype = compute_dtype
_check_qkv = check_qkv
_check_state = check_state
_check_chunk_size = check_chunk_size
_to_chunks = to_chunks
_from_chunks = from_chunks
_causal_mask = causal_mask
