"""kvpress 0.5.5 on transformers 5: the one change its hooks need, in one place.

kvpress pins transformers<5.3. From transformers 5 on, an attention layer's forward receives its cache as
`cache` (not `past_key_values`) and no `cache_position`; every press's hook reads both from the kwargs
(`BasePress.forward_hook`: `kwargs["past_key_values"]`, `is_prefilling(kwargs["cache_position"], q_len)`), so
each press fails with `KeyError: 'past_key_values'`. `apply_press` registers the press's own hook on every
attention layer, as `BasePress.__call__` does, behind a wrapper that adds the two names (the cache object
itself, and the positions of the tokens being run, which is what cache_position held). Nothing else of
kvpress is changed or copied; with an older transformers the wrapper adds nothing that was not there.
"""
from __future__ import annotations

import importlib.metadata
from contextlib import contextmanager

import torch

KVPRESS_VERSION_RANGE = ("0.5.5",)  # the kvpress versions this adapter is tested with


def kvpress_version() -> str:
    """The installed kvpress version; a one-line error when it is missing."""
    try:
        return importlib.metadata.version("kvpress")
    except importlib.metadata.PackageNotFoundError:
        raise ValueError("KV-cache compression needs the package kvpress: pip install --no-deps kvpress==0.5.5 "
                         "(see docs/kv_compression.md)") from None


def legacy_kwargs(kwargs: dict, every_forward: bool = False) -> dict:
    """The attention kwargs under the names kvpress reads (transformers 4.x's). With `every_forward`, each forward
    is presented as a prefill (positions 0..n-1), so the press compresses after every chunk of a chunked prefill
    (kvpress otherwise compresses only after a forward that starts at position 0)."""
    out = dict(kwargs)
    if "past_key_values" not in out and "cache" in out:
        out["past_key_values"] = out["cache"]
    if every_forward:
        out["cache_position"] = torch.arange(out["hidden_states"].shape[1], device=out["hidden_states"].device)
    elif "cache_position" not in out and out.get("position_ids") is not None:
        out["cache_position"] = out["position_ids"][0]
    return out


@contextmanager
def apply_press(press, model, every_forward: bool = False):
    """Compress `model`'s KV cache with `press` inside the block (kvpress's `with press(model):`); after every
    forward with `every_forward` (a chunked prefill), else after the prefill only."""
    kvpress_version()
    press.post_init_from_model(model)
    backbone = model.model.language_model if hasattr(model.model, "language_model") else model.model
    hooks = []

    def hook(module, args, kwargs, output):
        return press.forward_hook(module, args, legacy_kwargs(kwargs, every_forward), output)
    try:
        for layer in backbone.layers:
            layer.self_attn.rotary_emb = backbone.rotary_emb  # kvpress's presses read the layer's RoPE there
            hooks.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
        yield
    finally:
        for h in hooks:
            h.remove()


def take_head_masks(model, keep: bool = False) -> list | None:
    """The entries a head-adaptive press evicted, per layer: (batch, head, position) index tensors or None; taken
    off the attention modules, where kvpress leaves them for its attention patch (which hides those keys from every
    later query until the next prefill), or with `keep` left there. None when no layer holds any."""
    backbone = model.model.language_model if hasattr(model.model, "language_model") else model.model
    masks = []
    for layer in backbone.layers:
        masks.append(getattr(layer.self_attn, "masked_key_indices", None))
        if not keep:
            layer.self_attn.masked_key_indices = None
    return masks if any(m is not None for m in masks) else None


def put_head_masks(model, masks: list) -> None:
    """Set per-layer evicted entries (take_head_masks' form) on the attention modules for kvpress's patch."""
    backbone = model.model.language_model if hasattr(model.model, "language_model") else model.model
    for layer, m in zip(backbone.layers, masks):
        layer.self_attn.masked_key_indices = m
