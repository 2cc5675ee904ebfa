"""Many prompts' contexts compressed under a press with one forward pass: the press row's prefill in batches.

A press scores one prompt's whole row (SnapKV its last queries, Expected Attention the statistics of all of them),
so a padded batch cannot be scored as one tensor. The costly part, the forward pass, is shared all the same: the
contexts run right-padded in one batch (causal attention: no real token sees the padding after it, so each row's
hidden states, keys and values are the ones it has alone), and after each attention layer the press's `compress`
runs on each row's own slice (its tokens, keys, values and position embeddings) at its own budget. That is all
kvpress's BasePress.forward_hook does for the presses golinear runs (none overrides it: a test checks), so a row
keeps the entries it keeps alone. Rows of the same length and budget are one slice of the batch (the contexts are
sorted by length first) and are compressed by one call, as kvpress scores a batch of equal rows: a press's scores
are per row, its kept entries a top-k per row and head (a test holds each row to itself alone). kvpress's Compactor
and CriticalAdaKV couple a batch's rows (a sketch drawn with the batch's shape, z-scores and head budgets over the
batch): golinear builds them from models.kv_compression.batch_faithful, which gives each row what it gets alone.
Each layer's uncompressed cache is dropped once its rows are compressed.
KVzip (OWN_PREFILL) shares the contexts' forward pass and its reconstruction passes (models.kv_compression.kvzip_rows:
one pass per chunk for every row, masked to each row's own tokens). A chunked prefill stays one prompt at a time
(models.kv_compression.generate).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from golinear.models.backbones.cache_arg import cache_kwarg
from golinear.models.kv_compression.kvpress_adapter import kvpress_version, legacy_kwargs
from golinear.models.kv_compression.kvzip_rows import kvzip_evictions
from golinear.models.kv_compression.presses import OWN_PREFILL, build_press, check_press
from golinear.models.decoding.batch_generate import pad_rows

PREFILL_TOKENS = 1 << 18  # padded tokens a forward pass holds at most (64 contexts of 4K); more rows run in groups


def batches(press: str, prefill_chunk: int) -> bool:
    """Whether compress_contexts serves this press row (else one prompt at a time: a chunked prefill)."""
    check_press(press)
    return not prefill_chunk


@torch.no_grad()
def compress_contexts(model, contexts: list[list[int]], press: str, keeps: list[int],
                      max_tokens: int = PREFILL_TOKENS) -> list[tuple[object, list | None]]:
    """Per context (token ids at positions 0..n-1): (its compressed cache, `.layers[i].keys/.values` [1, Hkv, n', D],
    and the entries a head-adaptive press evicted per layer as take_head_masks gives them, or None), each context
    compressed to its `keeps` entries per layer and KV head exactly as compressed_prefill would alone."""
    kvpress_version()
    if len(contexts) != len(keeps) or any(not c for c in contexts):
        raise ValueError("compress_contexts needs one keep per context and at least one token in each")
    press = check_press(press)
    order = sorted(range(len(contexts)), key=lambda i: (len(contexts[i]), keeps[i]))  # equal rows side by side
    contexts, keeps = [contexts[i] for i in order], [keeps[i] for i in order]
    out = []
    width = max(len(c) for c in contexts)
    group = max(1, max_tokens // width)
    run = _kvzip_group if press in OWN_PREFILL else _compress_group
    for g0 in range(0, len(contexts), group):
        out.extend(run(model, contexts[g0:g0 + group], press, keeps[g0:g0 + group]))
    back = [None] * len(out)
    for j, i in enumerate(order):
        back[i] = out[j]
    return back


def _kvzip_group(model, contexts, press, keeps):
    """KVzip: the contexts' prefill in one batch, then its reconstruction passes for every row at once
    (models.kv_compression.kvzip_rows: the evictions each row gets alone); each row's cache is its slice."""
    from transformers import DynamicCache
    ids = pad_rows(contexts, 0, "right")[0].to(model.device)
    batch = DynamicCache()
    model.model(input_ids=ids, use_cache=True, **cache_kwarg(model.model, batch))
    masks = kvzip_evictions(model, batch, contexts, keeps)
    out = []
    for b, ctx in enumerate(contexts):
        row, n = DynamicCache(), len(ctx)
        for i, layer in enumerate(batch.layers):
            row.update(layer.keys[b:b + 1, :, :n].clone(), layer.values[b:b + 1, :, :n].clone(), i)
        out.append((row, masks[b]))
    return out


def _compress_group(model, contexts, press, keeps):
    from transformers import DynamicCache
    backbone = model.model.language_model if hasattr(model.model, "language_model") else model.model
    lens = [len(c) for c in contexts]
    ids, _ = pad_rows(contexts, 0, "right")
    ids = ids.to(model.device)
    layers = len(backbone.layers)
    kept = [[None] * layers for _ in contexts]
    evicted = [[None] * layers for _ in contexts]
    scorer = build_press(press, keeps[0])
    scorer.post_init_from_model(model)
    positions = {n: torch.arange(n, device=ids.device) for n in lens}  # each length's cache_position, made once
    runs = _runs(lens, keeps)

    def hook(module, args, kwargs, output):
        kw = legacy_kwargs(kwargs)
        layer = kw["past_key_values"].layers[module.layer_idx]
        h, (cos, sin) = kw["hidden_states"], kw["position_embeddings"]
        for b0, b1 in runs:
            n = lens[b0]
            row = {**kw, "hidden_states": h[b0:b1, :n], "position_embeddings": (cos[:, :n], sin[:, :n]),
                   "cache_position": positions[n]}
            scorer.keep = keeps[b0]
            keys, values = scorer.compress(module, row["hidden_states"], layer.keys[b0:b1, :, :n],
                                           layer.values[b0:b1, :, :n], row)
            masked = getattr(module, "masked_key_indices", None)
            rows = None if masked is None else _rows_of(masked, b1 - b0)
            keys, values = keys.clone(), values.clone()  # one copy a run: a view could hold the batch's cache
            for j in range(b1 - b0):  # each row a view of its run's copy (all the run's rows are kept alike)
                kept[b0 + j][module.layer_idx] = (keys[j:j + 1], values[j:j + 1])
                evicted[b0 + j][module.layer_idx] = None if rows is None else rows[j]
            module.masked_key_indices = None
        layer.keys = layer.values = layer.keys[:, :, :0]  # this layer's rows are done: free its cache
        return output

    hooks = []
    try:
        for layer in backbone.layers:
            layer.self_attn.rotary_emb = backbone.rotary_emb  # kvpress's presses read the layer's RoPE there
            hooks.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
        cache = DynamicCache()
        backbone(input_ids=ids, use_cache=True, **cache_kwarg(backbone, cache),
                 position_ids=torch.arange(ids.shape[1], device=ids.device)[None])
    finally:
        for h in hooks:
            h.remove()
    return [(SimpleNamespace(layers=[SimpleNamespace(keys=k, values=v) for k, v in rows]),
             masks if any(m is not None for m in masks) else None) for rows, masks in zip(kept, evicted)]


def _runs(lens: list[int], keeps: list[int]) -> list[tuple[int, int]]:
    """[b0, b1) of each run of consecutive rows with the same length and budget."""
    out = []
    for b, key in enumerate(zip(lens, keeps)):
        if out and (lens[out[-1][0]], keeps[out[-1][0]]) == key:
            out[-1] = (out[-1][0], b + 1)
        else:
            out.append((b, b + 1))
    return out


def _rows_of(masked: tuple, rows: int) -> list[tuple]:
    """A head-adaptive press's evictions (batch, head, position indices) of the `rows` rows of its call, each as row
    0 alone, in the call's order within a row: one host sync for the call (the counts), none for a call of one row
    (a boolean selection per row and index tensor synchronised the GPU three times a row and layer)."""
    batch, head, pos = masked
    if rows == 1:
        return [(torch.zeros_like(batch), head, pos)]
    order = torch.argsort(batch, stable=True)
    counts = torch.bincount(batch, minlength=rows).tolist()
    return [(torch.zeros_like(h), h, p) for h, p in zip(head[order].split(counts), pos[order].split(counts))]
