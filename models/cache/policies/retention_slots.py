"""Retention slots (retain > 0; GDN with a window; docs/retention.md): beside sinks + window, `slots` softmax slots
per KV head keep the tokens that score highest when they leave the window; the lowest-scoring candidate folds into
the GDN state instead (models/retention/ops.py has the rule and the definition).

`RetentionSlots` is the family's base: the paths (the prompt through models.retention.prefill, a right-padded
batch through models.retention.prefill_rows, a decode token through models.retention.ops.retention_step on the
fixed-size RetentionState in DecodeState.retention). A policy of the family supplies the scores, one method:
  - `score(keys)`: scores fixed when a token arrives, from its key alone ([..., Hkv, D] -> [..., Hkv], higher =
    more worth a slot), computed from the same keys by the prompt's pass and each decode step; or
  - `op_score(keys)` for a score the op computes from its own state (delta_error: the GDN state; proj_residual:
    the running key mean): the op's score name and no tensor.
Training: plain autograd through the values on the chosen paths; which token takes a slot gets no gradient.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from golinear.models.cache.decode_state import DecodeState
from golinear.models.retention.ops import retention_step
from golinear.models.retention.prefill import retention_prefill
from golinear.models.retention.prefill_rows import retention_prefill_rows
from golinear.models.cache.policies.base import CachePolicy
from golinear.models.attention.projection import fused_qkv, matmul_dtype, project_qkv


@dataclasses.dataclass(eq=False, repr=False)
class RetentionSlots(CachePolicy):
    decoder: ClassVar[str] = "retention"

    def score(self, keys: torch.Tensor) -> torch.Tensor:
        """Arrival scores [..., Hkv] of keys [..., Hkv, D] (a policy scored at arrival overrides this)."""
        raise NotImplementedError(f"cache policy {self.name!r} scores inside the op (op_score)")

    def op_score(self, keys: torch.Tensor) -> tuple[str, torch.Tensor | None]:
        """The retention op's (score, scores): by default this policy's arrival scores, handed over as "given"."""
        return "given", self.score(keys)

    def parallel(self, layer, x, pe, qk, q, k, v, conv, state: DecodeState | None):
        lin = layer.linear_inputs(x, q, k, v, qk=qk)
        y, kept = retention_prefill(q, k, v, lin, layer.scaling, layer.lin.scale, layer.sinks, layer.window,
                                    self.slots, *self.op_score(k), want_state=state is not None)
        if state is not None:
            state.conv = None if conv is None else conv.clone(memory_format=torch.contiguous_format)
            state.retention = kept
        return y

    def prefill_chunk(self, layer, x, pe, state, chunk, carry):
        raise ValueError("a chunked, right-padded prefill (golinear.models.decoding.prefill) has no retention slots "
                         f"(retain={self.slots}); prefill the whole prompt (HF generate)")

    def prefill_rows(self, layer, x, pe, lengths: list[int]):
        """Row b: its first lengths[b] tokens (models.retention.prefill_rows). Returns (attention output
        [B, T, hidden], meaningful at each row's real positions; a DecodeState of the rows stacked: the short conv's
        inputs before each row's last token and the RetentionRows batched decoding continues). pe: [1, T, D]."""
        B, T = x.shape[:2]
        x, weight = x.to(matmul_dtype(x)), layer.conv_weight()
        qk, q, k, v, _ = project_qkv(layer, x, pe, weight, want_conv_state=False)
        lin = layer.linear_inputs(x, q, k, v, qk=qk)
        score, scores = self.op_score(k)
        y, rows = retention_prefill_rows(q, k, v, lin, layer.scaling, layer.lin.scale, layer.sinks, layer.window,
                                         self.slots, score, lengths, scores)
        conv = None
        if weight is not None:  # the conv's inputs [q|k|v] of each row's last W - 1 tokens
            W1 = weight.shape[-1] - 1
            at = torch.tensor(lengths, device=x.device).view(B, 1) - W1 + torch.arange(W1, device=x.device)
            rows_x = x[torch.arange(B, device=x.device).view(B, 1), at.clamp(min=0)]  # [B, W1, hidden]
            conv = torch.where((at >= 0).unsqueeze(-1), fused_qkv(layer, rows_x), 0).transpose(1, 2).contiguous()
        return layer.o_proj(y.reshape(B, T, -1).to(x.dtype)), DecodeState(conv=conv, retention=rows)

    def step(self, layer, x, pe, state: DecodeState, pos=None, rows=None, steady: bool = False):
        """Every row at the same position (retention_step; HF generate)."""
        return self.decode(layer, x, pe, state, retention_step)

    def decode(self, layer, x, pe, state: DecodeState, op):
        """One decode token through the retention step `op` (retention_step, or models.retention.generate's per-row
        steps: models.retention.rows), which returns (y, the new retention state)."""
        qk, q, k, v, _ = layer.project_step(x, pe, state)
        lin = layer.linear_inputs(x, q, k, v, qk=qk)
        y, state.retention = op(state.retention, q, k, v, lin, layer.scaling, layer.lin.scale, *self.op_score(k))
        return layer.o_proj(y.reshape(x.shape[0], 1, -1).to(matmul_dtype(x)))
