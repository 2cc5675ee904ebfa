"""Statistics of a layer's keys that the retention ops and the diagnostics both read: the unit keys and their
running mean (proj_residual's R_j = |P_j k~_j - kbar_j|)."""
from __future__ import annotations

import torch


def normalize_keys(k: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return k / (k.norm(dim=-1, keepdim=True) + eps)


def running_mean(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Mean of x over positions <= t along `dim` (inclusive prefix mean)."""
    T = x.shape[dim]
    counts = torch.arange(1, T + 1, device=x.device, dtype=x.dtype)
    shape = [1] * x.dim()
    shape[dim] = T
    return x.cumsum(dim) / counts.view(shape)
