"""The decode bandwidth bound of `golinear latency`: bytes one decode step must move / the measured copy bandwidth.

A decode step at batch B is memory-bound: it reads every weight once and each row's cache once, and does
little arithmetic per byte. The bound in ms/token is (bytes read and written per step) / (bandwidth of a
device-to-device copy measured on the same machine in the same run), so each latency row can say how far it
is from what the memory allows. One function per term; each counts what the step has to touch, not what a
given kernel happens to touch (a masked static KV buffer's empty slots, logits, activations and the few bytes
of positions are not counted: they are small or avoidable).

The linearized layers' terms are read off the DecodeState a decoder actually holds (models/cache/decode_state.py:
exact shapes and dtypes, whatever the mechanism); full-attention layers' KV cache is counted from the model
config, up to the current length. A layer with retention slots (retain > 0, docs/retention.md) holds a
RetentionState instead (fp32 whatever the model dtype, as the op keeps it): the same terms from its tensors,
plus `retained_slots`; its scores, positions, key sum and fold counters are not counted (a few bytes per head).
"""
from __future__ import annotations

import time

import torch

from golinear.models.cache.decode_state import DecodeState
from golinear.models.retention.ops import Q_KEYS
from golinear.models.retention.rows import RetentionRows
from golinear.models.attention.projection import decoder_layers

TERMS = ("weights", "embedding_rows", "kv_cache", "recurrent_state", "window_sinks", "window_inputs", "conv_state",
         "retained_slots")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def weight_bytes(model) -> int:
    """Every parameter, read once per step in its own dtype, except the input embedding table: the lookup
    reads only B of its rows (embedding_row_bytes). With tied embeddings the LM head reads the whole table,
    so it is counted once, as the head."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding
    return sum(_nbytes(p) for p in model.parameters() if tied or p is not embedding)


def embedding_row_bytes(model, batch: int) -> int:
    """The input embedding rows of the B new tokens (one row each, at most B distinct)."""
    return _nbytes(model.get_input_embeddings().weight[0]) * batch


def kv_cache_bytes(config, dtype: torch.dtype, batch: int, context: float) -> float:
    """One full-attention layer: keys and values of `context` positions per row, [B, context, Hkv, D] each,
    read by the step's attention (the one new position written is not counted)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * batch * context * config.num_key_value_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def retention_state(state: DecodeState):
    """The models.retention.ops.RetentionState of a layer with retention slots (RetentionDecoder stacks its rows
    in a RetentionRows), else None."""
    ret = state.retention
    return ret.state if isinstance(ret, RetentionRows) else ret


def recurrent_state_bytes(state: DecodeState) -> int:
    """The recurrent state (fp32, [B, H, K, V]; Hedgehog: numerator and normaliser), read and written back."""
    ret = retention_state(state)
    tensors = (ret.S,) if ret is not None else state.state if isinstance(state.state, tuple) else (state.state,)
    return 2 * sum(_nbytes(t) for t in tensors if t is not None)


def window_sink_bytes(state: DecodeState) -> int:
    """The softmax path: every sink and window slot's key and value, read by the step's attention, plus the
    new token's key and value written into its ring slot."""
    ret = retention_state(state)
    if ret is not None:  # [B, Hkv, slots, D]
        return (sum(_nbytes(t) for t in (ret.sink_k, ret.sink_v, ret.win["k"], ret.win["v"]))
                + sum(_nbytes(ret.win[key][:, :, 0]) for key in ("k", "v")))
    read = sum(_nbytes(t) for t in (state.sink_k, state.sink_v, state.ring_k, state.ring_v) if t is not None)
    written = sum(_nbytes(t[:, 0]) for t in (state.ring_k, state.ring_v) if t is not None)
    return read + written


def window_input_bytes(state: DecodeState) -> int:
    """The linear-path inputs the window keeps per token (k, v, gates): one slot read (the token leaving the
    window folds into the state, or takes a retention slot) and one slot written (the new token), per input."""
    ret = retention_state(state)
    if ret is not None:  # [B, H, w, *]
        return 2 * sum(_nbytes(ret.win[key][:, :, 0]) for key in Q_KEYS)
    return 2 * sum(_nbytes(t[:, 0]) for t in state.ring_lin.values())


def retained_slot_bytes(state: DecodeState) -> int:
    """Retention slots, counted as the window's: every slot's key and value read by the step's attention; at
    most one slot changes per step (the token leaving the window takes the place of the holder that folds),
    so one slot's key, value and linear inputs written, and one slot's linear inputs read (the fold's)."""
    ret = retention_state(state)
    if ret is None:
        return 0
    read = sum(_nbytes(ret.ret[key]) for key in ("k", "v"))  # [B, Hkv, r, D]
    slot = {key: _nbytes(ret.ret[key][:, :, 0]) for key in ("k", "v", *Q_KEYS)}  # Q_KEYS: [B, H, r, *]
    return read + sum(slot.values()) + sum(slot[key] for key in Q_KEYS)


def conv_state_bytes(state: DecodeState) -> int:
    """The short conv's previous inputs [B, C, W-1], read and written back."""
    return 0 if state.conv is None else 2 * _nbytes(state.conv)


def mean_context(length: int, new_tokens: int) -> float:
    """Keys a full-attention step reads, averaged over the timed steps: after a prompt of `length`, step i
    (0-based) attends over length + 1 + i positions."""
    return length + (new_tokens + 1) / 2


def decode_bytes(model, states, batch: int, context: float) -> dict[str, float]:
    """Bytes per decode step, per term (TERMS), summed over the layers. `states`: per decoder layer the
    DecodeState of a linearized layer, anything else for a full-attention layer; None: every layer is full
    attention (HF's own model)."""
    layers = decoder_layers(model)
    states = [None] * len(layers) if states is None else list(states)
    if len(states) != len(layers):
        raise ValueError(f"states: {len(states)} entries for a model of {len(layers)} decoder layers")
    dtype = model.get_input_embeddings().weight.dtype
    out = dict.fromkeys(TERMS, 0)
    out["weights"] = weight_bytes(model)
    out["embedding_rows"] = embedding_row_bytes(model, batch)
    for st in states:
        if isinstance(st, DecodeState):
            out["recurrent_state"] += recurrent_state_bytes(st)
            out["window_sinks"] += window_sink_bytes(st)
            out["window_inputs"] += window_input_bytes(st)
            out["conv_state"] += conv_state_bytes(st)
            out["retained_slots"] += retained_slot_bytes(st)
        else:
            out["kv_cache"] += kv_cache_bytes(model.config, dtype, batch, context)
    return out


def copy_bandwidth(device: torch.device, nbytes: int | None = None, reps: int = 5) -> float:
    """Bytes per second of a copy of a large tensor on `device` (read + written bytes, the fastest of `reps`
    copies after one untimed copy): CUDA events on a GPU, the wall clock on the CPU. Default size 2 GiB on a
    GPU (far above its caches), 256 MiB on the CPU."""
    device = torch.device(device)
    if nbytes is None:
        nbytes = 2 * 2**30 if device.type == "cuda" else 256 * 2**20
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - t0
        best = min(best, seconds)
    return 2 * _nbytes(src) / best
