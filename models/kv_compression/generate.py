"""Greedy generation with a compressed KV cache, on exactly the token ids every other golinear row reads.

Question-agnostic (the main comparison): the context is prefilled under the press and compressed to
`budget - len(question)` entries per layer and KV head, then the question is read (uncompressed), so decoding
starts from `budget` entries, as a linearized model's sinks + window hold at most `budget`. Question-aware: the
whole prompt (but its last token, run after for the first logits) is compressed to `budget - 1`. kvpress's own pipeline does the same steps, but applies a chat template
and re-tokenizes; here the ids are the ones lm-eval built, so the samples are the same as the other rows'.
New tokens are appended to the cache uncompressed (at most max_new_tokens of them).

With `prefill_chunk`, the part under the press is prefilled in chunks of that many tokens and compressed after
each, so the cache never holds more than the budget plus one chunk: the memory-matched comparison (a linearized
model's prefill memory does not grow with the prompt either; the default press prefills the whole context with
full attention first).
"""
from __future__ import annotations

import torch

from golinear.models.backbones.cache_arg import cache_kwarg
from golinear.models.kv_compression.kvpress_adapter import apply_press, take_head_masks
from golinear.models.kv_compression.presses import OWN_PREFILL, build_press


def split_budget(prompt_len: int, question_len: int, budget: int, question_aware: bool) -> tuple[int, int]:
    """(tokens prefilled under the press, entries it keeps): question-aware, the prompt but its last token (run
    after, for the first logits) at `budget - 1`; else the context at what the question leaves of `budget`."""
    if question_aware:
        question_len = 1
    keep = budget - question_len
    if keep < 1:
        raise ValueError(f"cache budget {budget} cannot hold the question's {question_len} tokens; "
                         f"use a budget above {question_len}")
    return prompt_len - question_len, keep


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """[start, end) spans of `size` tokens covering n, the first one taking the remainder (so no chunk is shorter
    than `size`: SnapKV scores with the last 64 queries of a chunk); one span without a size."""
    k = max(1, n // size) if size else 1
    starts = [0] + [n - size * (k - i) for i in range(1, k)]
    return list(zip(starts, starts[1:] + [n]))


@torch.no_grad()
def compressed_prefill(model, x: torch.Tensor, press: str, keep: int, prefill_chunk: int = 0):
    """A DynamicCache of the tokens `x` ([batch, n], positions 0..n-1) prefilled under `press` and compressed to
    `keep` entries per layer and KV head (each row its own entries); with `prefill_chunk`, in chunks of that many
    tokens, compressed after each."""
    from transformers import DynamicCache
    if press in OWN_PREFILL:
        from golinear.models.kv_compression.kvzip_rows import kvzip_prefill
        return kvzip_prefill(model, x, keep)
    cache = DynamicCache()
    with apply_press(build_press(press, keep), model, every_forward=bool(prefill_chunk)):
        for c0, c1 in chunks(x.shape[1], prefill_chunk):
            model.model(input_ids=x[:, c0:c1], use_cache=True, **cache_kwarg(model.model, cache),
                        position_ids=torch.arange(c0, c1, device=x.device)[None])
    return cache


@torch.no_grad()
def generate(model, ids: list[int], question_len: int, press: str, budget: int, max_new_tokens: int,
             question_aware: bool = False, eos: frozenset = frozenset(), stop=None, prefill_chunk: int = 0
             ) -> list[int]:
    """New token ids for one prompt (`ids`, its last `question_len` tokens the question)."""
    device = model.device
    n_press, keep = split_budget(len(ids), question_len, budget, question_aware)
    x = torch.tensor([ids], device=device)
    cache = compressed_prefill(model, x[:, :n_press], press, keep, prefill_chunk)
    pos, rest = n_press, x[:, n_press:]
    out = []
    for _ in range(max_new_tokens):
        position_ids = torch.arange(pos, pos + rest.shape[1], device=device)[None]
        logits = model(input_ids=rest, position_ids=position_ids, use_cache=True, **cache_kwarg(model, cache),
                       logits_to_keep=1).logits
        pos += rest.shape[1]
        token = int(logits[0, -1].argmax())
        out.append(token)
        if token in eos or (stop and stop(out)):
            break
        rest = torch.tensor([[token]], device=device)
    take_head_masks(model)  # a head-adaptive press's evictions end with this prompt
    return out
