"""KVzip's reconstruction passes for a batch of contexts at once: the same scores and evictions as kvpress's KVzipPress
on each context alone (models.kv_compression.kvzip.kvzip_prefill_row, the definition), in one forward pass per chunk.

kvpress's KVzipPress scores one prompt: after the context's prefill the model reads "Repeat the previous context
exactly." and the context again, chunk by chunk, and an entry's score is the largest attention any of those queries
gives it (over the sinks, the chunk and the repeat tokens). With contexts of different lengths n_b in one
right-padded cache of width N, each row's chunk c is its own tokens [c x chunk, min((c+1) x chunk, n_b)), so a pass
runs every row that has a chunk c:
  - the repeat tokens of row b sit at positions n_b, n_b + 1, ... (its own RoPE positions) and see the row's context
    [0, n_b) and the earlier repeat tokens, never the cache's padding [n_b, N): a 4D mask;
  - the score of row b is kvpress's softmax with the padding columns (chunk entries past n_b, repeat tokens past the
    row's own) at exactly zero weight, and the padded queries left out of the maximum;
  - after each layer the repeat tokens are cut from the cache again, as kvpress's hook does.
Evictions then follow KVzipPress.compress_post (layerwise: the same count per layer, bottom-k over heads) per row.
tests/test_batched_press_prefill.py checks every row's evictions against the row alone (float32 on the CPU, float64
on CUDA).
"""
from __future__ import annotations

import math

import torch

from golinear.models.backbones.cache_arg import cache_kwarg
from golinear.models.decoding.batch_generate import pad_rows
from golinear.models.kv_compression.kvpress_adapter import legacy_kwargs, put_head_masks
from golinear.models.kv_compression import kvzip as KZ

SCORE_ELEMENTS = 1 << 30  # attention weights a hook holds at once (rows are scored in groups below it)


@torch.no_grad()
def kvzip_prefill(model, x: torch.Tensor, keep: int):
    """A DynamicCache of the tokens `x` ([B, n]) and, on each attention module, the entries KVzip evicts
    (`masked_key_indices`, read by models.kv_compression.kvpress_adapter.take_head_masks). kvpress's KVzipPress
    scores one prompt at a time; a batch's rows run their passes together (kvzip_evictions: each row the
    evictions it gets alone) and their evictions are joined."""
    if x.shape[0] == 1:
        return KZ.kvzip_prefill_row(model, x, keep)
    from transformers import DynamicCache
    cache = DynamicCache()
    model.model(input_ids=x, use_cache=True, **cache_kwarg(model.model, cache))
    masks = kvzip_evictions(model, cache, x.tolist(), [keep] * x.shape[0])
    if masks[0] is not None:
        put_head_masks(model, [tuple(torch.cat([m[i][j] + (r if j == 0 else 0) for r, m in enumerate(masks)])
                                     for j in range(3)) for i in range(len(masks[0]))])
    return cache


@torch.no_grad()
def kvzip_evictions(model, cache, contexts: list[list[int]], keeps: list[int]) -> list[list | None]:
    """Per context (row b of `cache`, a DynamicCache of the right-padded contexts, row b's first len(contexts[b])
    entries its own): the entries KVzip evicts per layer in take_head_masks' form ((batch, head, position) index
    tensors on the CPU, batch 0), or None where the context fits its keep. The cache is left as it was."""
    backbone = model.model
    heads = model.config.num_key_value_heads
    lens = [len(c) for c in contexts]
    width = cache.layers[0].keys.shape[2]
    scored = [b for b, (n, keep) in enumerate(zip(lens, keeps)) if KZ.layerwise_ratio(n, keep, heads) > 0]
    if not scored:
        return [None] * len(contexts)
    dev = cache.layers[0].keys.device
    score = torch.zeros(len(backbone.layers), len(contexts), heads, width, dtype=model.dtype, device=dev)
    first, later, suffix = KZ.repeat_prompts(KZ.tokenizer_for(model.config.name_or_path))
    chunks = max((lens[b] - 1) // KZ.CHUNK + 1 for b in scored)
    for c in range(chunks):
        rows = [b for b in scored if lens[b] > c * KZ.CHUNK]
        prompt = [first if c == 0 else later + contexts[b][c * KZ.CHUNK - KZ.PREV_POSTFIX:c * KZ.CHUNK] for b in rows]
        repeats = [p + suffix + contexts[b][c * KZ.CHUNK:(c + 1) * KZ.CHUNK] for p, b in zip(prompt, rows)]
        _pass(model, cache, rows, [lens[b] for b in rows], repeats, c, score)
    return [_evict(score[:, b, :, :lens[b]], lens[b], keeps[b], heads) if b in scored else None
            for b in range(len(contexts))]


def _pass(model, cache, rows, lens, repeats, c, score):
    """One reconstruction pass of chunk c for `rows` (their context lengths `lens`), scores into score[:, rows]."""
    from transformers import DynamicCache
    backbone = model.model
    dev, width = score.device, cache.layers[0].keys.shape[2]
    ids, real = pad_rows(repeats, 0, "right")
    ids, B, L = ids.to(dev), *ids.shape
    n = torch.tensor(lens, device=dev).view(B, 1)
    reps = real.sum(1, keepdim=True).to(dev)
    idx = torch.tensor(rows, device=dev)
    sub = cache  # every row: the batch's own cache (each layer cut back to its width after the pass)
    if B < cache.layers[0].keys.shape[0]:
        sub = DynamicCache()
        for i, layer in enumerate(cache.layers):
            sub.update(layer.keys.index_select(0, idx), layer.values.index_select(0, idx), i)
    # row b's repeat token j: the row's context and repeat tokens 0..j (a padded token sees the same: no NaN)
    j = torch.arange(L, device=dev)
    keys_at = torch.arange(width + L, device=dev)
    allowed = (keys_at.view(1, 1, -1) < n.view(B, 1, 1)) | (
        (keys_at.view(1, 1, -1) >= width) & (keys_at.view(1, 1, -1) - width <= j.view(1, L, 1)))
    mask = torch.zeros(B, 1, L, width + L, dtype=model.dtype, device=dev)
    mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(model.dtype).min)
    start, sink = c * KZ.CHUNK, min(KZ.N_SINK, c * KZ.CHUNK)
    chunk_w = min(KZ.CHUNK, width - start)
    chunk_len = (n - start).clamp(max=KZ.CHUNK)  # [B, 1] each row's entries in this chunk
    # columns of the scored weights: sinks, the chunk, the repeat tokens; padding at zero weight
    cols = torch.arange(sink + chunk_w + L, device=dev).view(1, -1)
    valid = (cols < sink) | ((cols >= sink) & (cols < sink + chunk_len)) | (cols >= sink + chunk_w)
    causal = (cols.view(1, 1, -1) - sink - chunk_w) <= j.view(1, L, 1)  # [1, L, K]
    real_q = j.view(1, L) < reps  # [B, L]
    # a padded query attends to the first repeat token alone: its chunk weights are exactly 0 (out of the maximum)
    # without a pass over the weights after the softmax
    drop = ~torch.where(real_q.view(B, L, 1), valid.view(B, 1, -1) & causal, cols.view(1, 1, -1) == sink + chunk_w)
    group = max(1, SCORE_ELEMENTS // (model.config.num_attention_heads * L * (sink + chunk_w + L)))

    def hook(module, args, kwargs, output):
        kw = legacy_kwargs(kwargs)
        layer = kw["past_key_values"].layers[module.layer_idx]
        cos, sin = kw["position_embeddings"]
        for g0 in range(0, B, group):
            g = slice(g0, min(B, g0 + group))
            w = _weights(module, kw["hidden_states"][g], cos[g], sin[g], layer.keys[g], start, sink, chunk_w, L)
            w = w.masked_fill_(drop[g].view(w.shape[0], 1, 1, L, -1), float("-inf")).softmax(-1)
            score[module.layer_idx, idx[g], :, start:start + chunk_w] = w[..., sink:sink + chunk_w].amax(dim=(-3, -2))
        layer.keys, layer.values = layer.keys[:, :, :width], layer.values[:, :, :width]  # as kvpress's hook
        return output

    hooks = []
    try:
        for layer in backbone.layers:
            hooks.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
        backbone(input_ids=ids, position_ids=n + j.view(1, L), attention_mask=mask, use_cache=True,
                 **cache_kwarg(backbone, sub))
    finally:
        for h in hooks:
            h.remove()


def _weights(module, hidden, cos, sin, keys, start, sink, chunk_w, L):
    """kvpress's KVzipPress._compute_cross_attention before its mask and softmax, for rows of one pass: the
    reconstruction queries (RoPE at each row's positions) against [sinks, the chunk, the repeat tokens]."""
    from kvpress.utils import get_prerope_query_states
    from transformers.models.llama.modeling_llama import rotate_half
    B, hkv = hidden.shape[0], module.config.num_key_value_heads
    q = get_prerope_query_states(module, hidden)
    q = (q * cos.unsqueeze(1)) + (rotate_half(q) * sin.unsqueeze(1))
    q = q.view(B, hkv, -1, L, module.head_dim)
    k = torch.cat([keys[:, :, :sink], keys[:, :, start:start + chunk_w], keys[:, :, -L:]], dim=2)
    k = k.unsqueeze(2).transpose(-2, -1).contiguous()
    root = math.sqrt(module.head_dim)
    if root == 2 ** round(math.log2(root)):  # a power of two: scaling the queries first is exact (no pass over [.., K])
        return torch.matmul(q * (1 / root), k)
    return torch.matmul(q, k) / root


def _evict(score: torch.Tensor, n: int, keep: int, heads: int) -> list:
    """KVzipPress.compress_post (layerwise) on one row's scores [layers, heads, n]: the sinks kept, then per layer the
    int(heads x n x ratio) lowest entries across heads."""
    score = score.clone()
    score[..., :KZ.N_SINK] = score.amax() + 1.0
    pruned = int(heads * n * KZ.layerwise_ratio(n, keep, heads))
    # per layer, as kvpress does (one topk a layer: the same choice among ties), then one copy to the host
    picked = torch.stack([torch.topk(-layer.reshape(1, -1), pruned, dim=1).indices.flatten() for layer in score]).cpu()
    return [(torch.zeros(pruned, dtype=torch.long), i // n, i % n) for i in picked]
