"""CachePolicy: the base class of what the softmax path keeps inside its cache budget (models.cache.policies).

A policy is a small module the layer (models.attention.layers.LinearizedAttention) composes: the layer projects q/k/v and
hands them to it for the whole-prompt pass (`parallel`), a chunk of a right-padded batch (`prefill_chunk`), a
right-padded batch in one pass (`prefill_rows`) and one decode token (`step`). `decoder` names the batched decoder
that serves its decode state (models.decoding.batch_generate.decoder_for): "static" (models.decoding.fast_decode.FastDecoder's fixed
buffers: sinks, the window ring, the recurrent state) or "retention" (models.retention.generate.RetentionDecoder).
A module with no parameters and non-persistent buffers only, so checkpoints keep their keys.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch.nn as nn


@dataclasses.dataclass(eq=False, repr=False)
class CachePolicy(nn.Module):
    slots: int = 0  # retention slots per KV head beside sinks + window

    name: ClassVar[str] = ""
    decoder: ClassVar[str] = "static"
    reads_scorer: ClassVar[bool] = False  # built from a fitted scorer's tensors (models.cache.policies.make_policy)

    def __post_init__(self):
        nn.Module.__init__(self)

    def extra_repr(self) -> str:
        return f"{self.name}, slots={self.slots}"

    def parallel(self, layer, x, pe, qk, q, k, v, conv, state):
        """The whole prompt (every row T tokens): y [B, T, H, D] before o_proj; fills `state` when given."""
        raise NotImplementedError

    def prefill_chunk(self, layer, x, pe, state, chunk, carry):
        """One chunk of a right-padded batch (models.decoding.prefill): the attention output [B, Tc, hidden]."""
        raise ValueError(f"the chunked, right-padded prefill (golinear.models.decoding.prefill) does not implement cache policy "
                         f"{self.name!r}; prefill the whole prompt")

    def prefill_rows(self, layer, x, pe, lengths: list[int]):
        """A right-padded batch in one pass: (attention output [B, T, hidden], the stacked decode state)."""
        raise ValueError(f"cache policy {self.name!r} has no one-pass right-padded prefill")

    def step(self, layer, x, pe, state, pos, rows, steady: bool = False):
        """One token per row [B, 1, hidden]; updates `state` in place (or replaces its parts)."""
        raise NotImplementedError
