"""KVzip (kvpress's KVzipPress) on golinear's prompt ids: query-agnostic scores from reconstructing the context.

After the context's prefill, the model reads "Repeat the previous context exactly." and the context again, chunk
by chunk, over the prefilled cache; an entry's score is the largest attention any reconstruction query gives it.
Those passes are part of the press: they run inside its prefill, so a latency row pays them in prefill time and
memory. kvpress drives them from its own context manager, which reads the prompt's chat template and the cache
under transformers 4's names; here the same steps run on the prompt ids every golinear row reads (no chat template:
kvpress's form for a model without one, a newline after the instruction), its scoring hook behind
kvpress_adapter's names, and each layer keeps `keep` x KV heads entries over uneven heads (layerwise=True: the same
total per layer as the uniform budget; the static decoder holds the heads as for AdaKV).
"""
from __future__ import annotations

import functools

import torch

from golinear.models.backbones.cache_arg import cache_kwarg
from golinear.models.kv_compression.kvpress_adapter import kvpress_version, legacy_kwargs


CHUNK = 2048  # context tokens a reconstruction pass repeats (KVzipPress.chunk_size's default)
N_SINK = 4  # first entries never evicted (KVzipPress.n_sink's default)
PREV_POSTFIX = 8  # a later chunk's prompt ends with the previous chunk's last tokens (KVzipPress.prepare)


@functools.cache
def tokenizer_for(name_or_path: str):
    """The backbone's tokenizer (KVzip's instruction is text); golinear's default backbone's for a configuration
    without one (random weights: any valid ids serve)."""
    from golinear.models.backbones.backbone import load_tokenizer
    try:
        return load_tokenizer(name_or_path)
    except (OSError, ValueError):
        return load_tokenizer()


def repeat_prompts(tok) -> tuple[list[int], list[int], list[int]]:
    """KVzipPress.prepare's token ids: the first chunk's instruction, a later chunk's (the previous chunk's last
    PREV_POSTFIX tokens follow it), and the suffix before the repeated chunk (a newline: no chat template)."""
    def enc(text):
        return tok.encode(text, add_special_tokens=False)
    return (enc("\n\nRepeat the previous context exactly."),
            enc("\n\nRepeat the part of the previous context exactly, starting with"), enc("\n"))


def layerwise_ratio(length: int, keep: int, heads: int) -> float:
    """The ratio at which KVzipPress(layerwise=True) evicts exactly heads x (length - keep) entries per layer (it
    evicts int(heads x length x ratio))."""
    if keep >= length:
        return 0.0
    return (heads * (length - keep) + 0.5) / (heads * length)


@torch.no_grad()
def kvzip_prefill_row(model, x: torch.Tensor, keep: int):
    """One prompt `x` [1, n], prefilled and scored by kvpress's KVzipPress (the definition)."""
    import kvpress
    from transformers import DynamicCache
    kvpress_version()
    heads = model.config.num_key_value_heads
    press = kvpress.KVzipPress(compression_ratio=layerwise_ratio(x.shape[1], keep, heads), layerwise=True,
                               chunk_size=CHUNK, n_sink=N_SINK)
    backbone = model.model
    cache = DynamicCache()
    backbone(input_ids=x, use_cache=True, **cache_kwarg(backbone, cache))
    if press.compression_ratio == 0:
        return cache
    tok = tokenizer_for(model.config.name_or_path)
    press._context_ids, press._cache, press.prefix_length = x, cache, 0
    press._suffix_ids = tok.encode("\n", return_tensors="pt", add_special_tokens=False)
    press.context_length = x.shape[1]
    pairs = press.prepare(model, tok)
    hooks = []
    for layer in backbone.layers:
        layer.self_attn.rotary_emb = backbone.rotary_emb  # kvpress's presses read the layer's RoPE there
        hooks.append(layer.self_attn.register_forward_hook(
            lambda m, a, k, o: press.forward_hook(m, a, legacy_kwargs(k), o), with_kwargs=True))
    try:
        press.start_idx = 0
        for context_ids, repeat_ids in pairs:  # each pass scores one chunk; the hook cuts the cache back after it
            press.end_idx = press.start_idx + context_ids.shape[1]
            backbone(input_ids=repeat_ids.to(x.device), use_cache=True, **cache_kwarg(backbone, cache))
            press.start_idx = press.end_idx
    finally:
        for h in hooks:
            h.remove()
    press.compress_post(model)
    return cache

