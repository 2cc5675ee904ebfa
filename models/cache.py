"""The decode cache: constant size per linearized layer, whatever the prompt length.

Per linearized layer it holds the recurrent state, the sink KV (first `sinks` tokens), a rolling
window of the last `window` tokens (their softmax KV and the linear-path inputs they will fold into
the state when they leave the window) and the short-convolution state. Full-attention layers of a
hybrid keep an ordinary growing KV cache (transformers' DynamicLayer).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer


class LinearLayerCache(CacheLayerMixin):
    """State of one linearized layer. Tensors are None until the first forward fills them."""

    is_compileable = False
    is_sliding = False

    def __init__(self, **kwargs):
        super().__init__()
        self.seen = 0                    # tokens processed so far (positions 0..seen-1)
        self.state = None                # recurrent state (tensor, or (S, Z) for Hedgehog)
        self.sink_k = self.sink_v = None  # [B, Hkv, <=s, D] post-RoPE
        self.win_k = self.win_v = None    # [B, Hkv, <=w, D] post-RoPE, oldest first
        self.win_lin = None              # dict of linear-path inputs of the window tokens, [B, <=w, ...]
        self.conv = None                 # dict name -> [B, D, W-1]

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
        out = []
        for t in (self.sink_k, self.sink_v, self.win_k, self.win_v):
            if t is not None:
                out.append(t)
        for group in (self.win_lin or {}, self.conv or {}):
            out.extend(v for v in group.values() if v is not None)
        if isinstance(self.state, tuple):
            out.extend(self.state)
        elif self.state is not None:
            out.append(self.state)
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        def pick(t):
            return None if t is None else t.index_select(0, beam_idx.to(t.device))
        self.sink_k, self.sink_v = pick(self.sink_k), pick(self.sink_v)
        self.win_k, self.win_v = pick(self.win_k), pick(self.win_v)
        if self.win_lin:
            self.win_lin = {k: pick(v) for k, v in self.win_lin.items()}
        if self.conv:
            self.conv = {k: pick(v) for k, v in self.conv.items()}
        if isinstance(self.state, tuple):
            self.state = tuple(pick(s) for s in self.state)
        else:
            self.state = pick(self.state)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.reorder_cache(torch.arange(self._batch()).repeat_interleave(repeats))

    def _batch(self) -> int:
        return self.tensors()[0].shape[0]


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
