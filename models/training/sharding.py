"""A rank's shard of a tensor every rank holds whole, laid out as a (possibly FSDP2/DTensor) parameter: used by
the FSDP resume (models.training.train), the sharded set-up (models.training.train_fsdp) and random-weight backbones
(models.backbones.random_base)."""
from __future__ import annotations

import torch


def shard_like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's shard of `full`, laid out as `param` (no communication: every rank holds `full`)."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    if not isinstance(param, DTensor):
        return full.to(param.device)
    return distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
