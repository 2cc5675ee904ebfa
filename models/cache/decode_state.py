"""The decode state of one linearized layer: fixed shapes, whatever the prompt length.

`DecodeState` is what `LinearizedAttention.prefill` fills and `LinearizedAttention.step` reads and updates in
place, through the layer's cache policy (models.cache.policies: the fields below are the window + sinks policy's).
Both decoders hold it: `models.cache.hf_cache.LinearLayerCache` (HF generate) and `models.decoding.fast_decode.FastDecoder` (static
buffers, replayed in a CUDA graph). Per row b:
  - sink_k/v [B, s, Hkv, D]: the first s tokens' keys/values (post-RoPE); slots a short row has not reached
    yet hold zeros or padding, masked by the step until the row's own tokens overwrite them;
  - ring_k/v [B, w, Hkv, D], ring_pos [B, w]: the last w tokens, slot = position % w, and the position each
    slot holds (-1: empty);
  - ring_lin: the linear-path inputs (LIN_KEYS) of those w tokens, [B, w, ...], folded into the recurrent
    state when the token leaves the window;
  - conv [B, C, W-1]: the short conv's previous inputs over [q|k|v];
  - state: the recurrent state, fp32 ([B, H, D, D], or (S, Z) for Hedgehog);
  - retention: with a retention-slots policy (models.cache.policies.retention_slots), a RetentionState
    (models.retention.ops) instead of the sink, ring and state fields (sinks, window ring, slots, GDN state;
    fixed shapes; conv stays here).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

LIN_KEYS = ("k", "v", "log_a", "beta", "phi_k")  # per-token inputs a window token carries into the state
TENSOR_FIELDS = ("sink_k", "sink_v", "ring_pos", "ring_k", "ring_v", "conv")


@dataclass
class DecodeState:
    sink_k: torch.Tensor | None = None
    sink_v: torch.Tensor | None = None
    ring_pos: torch.Tensor | None = None
    ring_k: torch.Tensor | None = None
    ring_v: torch.Tensor | None = None
    conv: torch.Tensor | None = None
    ring_lin: dict = field(default_factory=dict)
    state: torch.Tensor | tuple | None = None
    retention: object = None  # models.retention.ops.RetentionState (not imported: this module stays light)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor, in a fixed order (a CUDA graph's buffers, memory accounting, batch reordering)."""
        out = [getattr(self, name) for name in TENSOR_FIELDS if getattr(self, name) is not None]
        out += [self.ring_lin[key] for key in LIN_KEYS if key in self.ring_lin]
        out += list(self.state) if isinstance(self.state, tuple) else ([self.state] if self.state is not None else [])
        return out + (self.retention.tensors() if self.retention is not None else [])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def select(self, index: torch.Tensor) -> None:
        """Keep (reorder, repeat) the rows `index` of every tensor."""
        def pick(t):
            return None if t is None else t.index_select(0, index.to(t.device))
        for name in TENSOR_FIELDS:
            setattr(self, name, pick(getattr(self, name)))
        self.ring_lin = {key: pick(val) for key, val in self.ring_lin.items()}
        self.state = tuple(pick(t) for t in self.state) if isinstance(self.state, tuple) else pick(self.state)
        if self.retention is not None:
            self.retention = self.retention.select(index)

    def load(self, other: "DecodeState") -> bool:
        """Copy `other` into these buffers where shapes and dtypes match (a captured graph holding them stays
        valid), else take a copy of its tensors. Returns whether any buffer was replaced."""
        if other.retention is not None or self.retention is not None:
            raise ValueError("a retention state (retain > 0) is not loaded into static buffers; decode it with "
                             "HF generate (golinear.models.cache.hf_cache.LinearCache)")
        changed = False
        for name in TENSOR_FIELDS:
            new, old = getattr(other, name), getattr(self, name)
            value, c = assign(old, new)
            setattr(self, name, value)
            changed |= c
        for key, new in other.ring_lin.items():
            self.ring_lin[key], c = assign(self.ring_lin.get(key), new)
            changed |= c
        if isinstance(other.state, tuple):
            old = self.state if isinstance(self.state, tuple) else (None,) * len(other.state)
            pairs = [assign(o, n) for o, n in zip(old, other.state)]
            self.state = tuple(p[0] for p in pairs)
            changed |= any(p[1] for p in pairs)
        elif other.state is not None:
            self.state, c = assign(self.state if torch.is_tensor(self.state) else None, other.state)
            changed |= c
        return changed


def assign(old, new):
    """(buffer, replaced): old with new copied in when shapes and dtypes match, else a contiguous copy of new
    (a static buffer is dense row-major whatever view it was filled from: the step reads it every token)."""
    if new is None:
        return old, False
    if old is not None and old.shape == new.shape and old.dtype == new.dtype:
        old.copy_(new)
        return old, False
    return new.clone(memory_format=torch.contiguous_format), True


def assign_to(holder: dict, name: str, value: torch.Tensor) -> bool:
    """holder[name] = value, copied into the existing static buffer when shapes match (a captured CUDA graph stays
    valid); returns whether the buffer was replaced (a graph over it must then be captured again)."""
    holder[name], replaced = assign(holder.get(name), value)
    return replaced


def put(buf: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor, value: torch.Tensor) -> None:
    """buf[rows[b], idx[b]] = value[b] for every row b, with device indices (no host sync)."""
    buf.index_put_((rows, idx), value.to(buf.dtype))


def ring_index(length: int, w: int, origin: int) -> tuple[list[int], list[int]]:
    """Which position sits in each of the w ring slots after a prompt of `length` tokens (slot = position % w):
    (index of that position in a tensor whose entry 0 is position `origin` (clamped to 0 where none),
    position or -1 where the slot is still empty)."""
    pos = [length - w + (j - length) % w for j in range(w)]
    return [max(p - origin, 0) for p in pos], [p if p >= 0 else -1 for p in pos]


def gather_ring(ext: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor, pos: torch.Tensor, empty: bool):
    """ext[rows[r], idx[r, j]] for each ring slot j [R, w, ...], zeros where the slot is empty (pos < 0)."""
    vals = ext[rows.unsqueeze(1), idx]
    if empty:
        filled = (pos >= 0).view(*pos.shape, *([1] * (vals.dim() - 2)))
        vals = torch.where(filled, vals, torch.zeros((), dtype=vals.dtype, device=vals.device))
    return vals
