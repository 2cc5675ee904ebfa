"""The decode cache: constant size per linearized layer, whatever the prompt length.

Per linearized layer it holds a models.cache.decode_state.DecodeState (the recurrent state, the sink KV, a ring of
the last `window` tokens with their softmax KV and the linear-path inputs they fold into the state when they
leave it, the short-convolution state) plus each row's next position; LinearizedAttention.prefill fills it and
LinearizedAttention.step updates it, the same operations the static-cache decoder (models.decoding.fast_decode) runs.
Full-attention layers of a hybrid keep an ordinary growing KV cache (transformers' DynamicLayer).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from golinear.models.cache.decode_state import DecodeState


class LinearLayerCache(CacheLayerMixin):
    """State of one linearized layer. Empty until the first forward (the prompt) fills it."""

    is_compileable = False
    is_sliding = False

    def __init__(self, **kwargs):
        super().__init__()
        self.seen = 0                  # tokens processed so far (positions 0..seen-1)
        self.state: DecodeState | None = None
        self.pos = self.rows = None     # [B] device tensors: each row's next position; arange(B)

    def filled(self, state: DecodeState, B: int, T: int, device) -> None:
        """After the prompt (T tokens per row): hold its decode state."""
        self.state, self.seen = state, T
        self.pos = torch.full((B,), T, dtype=torch.long, device=device)
        self.rows = torch.arange(B, device=device)

    def advance(self) -> None:
        """After a decode step."""
        self.seen += 1
        self.pos.add_(1)

    def lazy_initialization(self, key_states, value_states):
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        raise RuntimeError("LinearLayerCache is updated by LinearizedAttention, not through Cache.update")

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0  # as a dynamic layer: hybrid full layers share the mask

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.__init__()

    def tensors(self):
        """Every cached tensor (for memory accounting and batch reordering)."""
        return [] if self.state is None else self.state.tensors()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.state is None:
            return
        self.state.select(beam_idx)
        self.pos = self.pos.index_select(0, beam_idx.to(self.pos.device))
        self.rows = torch.arange(self.pos.shape[0], device=self.pos.device)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.reorder_cache(torch.arange(self._batch()).repeat_interleave(repeats))

    def _batch(self) -> int:
        return self.pos.shape[0]


class LinearCache(Cache):
    """A transformers Cache whose linearized layers are LinearLayerCache and full layers DynamicLayer."""

    def __init__(self, num_layers: int, full_layers=()):
        full = set(full_layers)
        super().__init__(layers=[DynamicLayer() if i in full else LinearLayerCache() for i in range(num_layers)])

    @classmethod
    def for_model(cls, model) -> "LinearCache":
        info = model.config.golinear
        return cls(model.config.num_hidden_layers, info["full_layers"])

    def nbytes(self) -> int:
        """Bytes held by the cache (the per-sequence decode memory grows only in full-attention layers)."""
        total = 0
        for layer in self.layers:
            if isinstance(layer, LinearLayerCache):
                total += layer.nbytes()
            elif layer.keys is not None:
                total += layer.keys.numel() * layer.keys.element_size() * 2
        return total
