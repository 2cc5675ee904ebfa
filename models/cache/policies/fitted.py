"""fitted: a token is scored when it arrives by a fitted linear map from its key's RoPE-pair magnitudes
(models.retention.scorer; the scorer file is named by the option `scorer`, and a checkpoint keeps a copy). The
weights are non-persistent buffers: they follow the layer's device and never enter a checkpoint's tensors."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from golinear.models.cache.policies.retention_slots import RetentionSlots
from golinear.models.retention.scorer import arrival_scores


@dataclasses.dataclass(eq=False, repr=False)
class Fitted(RetentionSlots):
    scorer: dataclasses.InitVar[tuple | None] = None  # (weight [Hkv, D/2], bias [Hkv]) of this layer

    name: ClassVar[str] = "fitted"
    reads_scorer: ClassVar[bool] = True

    def __post_init__(self, scorer):
        super().__post_init__()
        if scorer is None:
            raise ValueError("retain_score=fitted needs a scorer (weight [Hkv, D/2], bias [Hkv])")
        self.register_buffer("weight", scorer[0].to(torch.float32), persistent=False)
        self.register_buffer("bias", scorer[1].to(torch.float32), persistent=False)

    def score(self, keys):
        return arrival_scores(keys, self.weight, self.bias)
