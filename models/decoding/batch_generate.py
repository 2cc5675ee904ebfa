"""Greedy generation of a batch of prompts of different lengths on the static-cache decoder, with a per-row stop.

The prompts are padded on the right and prefilled together (models.decoding.fast_decode: padding never reaches a
state); each row then decodes from its own position. A row stops at its first EOS token or at the first
token after which its continuation contains a stop string (lm-eval cuts the text there); the rows still
running keep the batch going, and a stopped row's later tokens are dropped, so they change nothing. The host
looks at the tokens every `check_every` steps (one device sync per check; every step on the CPU).
`decoder_for` picks the decoder by the layers' cache policies (models.cache.policies: their `decoder`): retention slots
get models.retention.generate.RetentionDecoder (one-pass right-padded prefill, batched per-row decode), a model
whose short conv feeds the linear path only (conv_on "linear", which the chunked prefill refuses)
WholePromptDecoder (each prompt alone through the model's forward, then FastDecoder's batched decode), every
other model FastDecoder.
"""
from __future__ import annotations

from array import array

import torch

from golinear.models.cache.decode_state import TENSOR_FIELDS, DecodeState
from golinear.models.decoding.fast_decode import FastDecoder
from golinear.models.attention.projection import decoder_layers
from golinear.models.retention.generate import RetentionDecoder


def decoder_for(model, **kwargs) -> FastDecoder:
    """The batched decoder for `model`: models.retention.generate.RetentionDecoder (kwargs: max_len, use_graph) for a
    model whose cache policy it serves (retention slots), WholePromptDecoder (the same kwargs) for one whose short
    conv feeds the linear path only (conv_on "linear"), else FastDecoder(model, **kwargs)."""
    attns = [layer.self_attn for layer in decoder_layers(model)]
    if any(a.cache_policy.decoder == RetentionDecoder.serves for a in attns if hasattr(a, "cache_policy")):
        return RetentionDecoder(model, max_len=kwargs.get("max_len"), use_graph=kwargs.get("use_graph"))
    if any(getattr(a, "conv_linear_only", False) for a in attns):
        return WholePromptDecoder(model, max_len=kwargs.get("max_len"), use_graph=kwargs.get("use_graph"))
    from golinear.models.decoding import fast_decode  # looked up per call: a profiler may swap in a stand-in
    return fast_decode.FastDecoder(model, **kwargs)


class WholePromptDecoder(FastDecoder):
    """FastDecoder's batched decode (static cache, CUDA graph, LinearizedAttention.step) after RetentionDecoder's
    prefill: each prompt alone (batch 1, unpadded) through the model's forward on a LinearCache, the rows' decode
    states then stacked. For layers the chunked prefill (models.decoding.prefill) does not implement: conv_on "linear"."""

    prefills_whole_prompts = True

    def __init__(self, model, max_len: int | None = None, use_graph: bool | None = None):
        super().__init__(model, prefill_chunk=0, use_graph=use_graph, max_len=max_len)

    one_pass = False  # RetentionDecoder's prefill, each prompt alone (its one pass is retention's)
    prefill = RetentionDecoder.prefill  # (it stacks the rows' states with the methods below)
    _prefill_each = RetentionDecoder._prefill_each
    _load = RetentionDecoder._load
    _pack = RetentionDecoder._pack  # (no retention rows here: nothing to lay out)
    _stack_full = RetentionDecoder._stack_full

    @staticmethod
    def _stack_linear(layers) -> DecodeState:
        """The rows' DecodeStates (one row each, the same shapes: fixed whatever the prompt length) as one."""
        states = [c.state for c in layers]
        out = DecodeState(**{name: _cat_rows([getattr(st, name) for st in states]) for name in TENSOR_FIELDS})
        out.ring_lin = {key: _cat_rows([st.ring_lin[key] for st in states]) for key in states[0].ring_lin}
        out.state = (tuple(_cat_rows(list(parts)) for parts in zip(*(st.state for st in states)))
                     if isinstance(states[0].state, tuple) else _cat_rows([st.state for st in states]))
        return out


def _cat_rows(tensors: list):
    """The rows' tensors as one batch (dim 0); None where the field is unused."""
    return None if tensors[0] is None else torch.cat(tensors, 0)


def eos_ids(model, tokenizer=None) -> set[int]:
    """The token ids HF's generate stops a row at: the generation config's eos_token_id (an int or a list)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    return set() if eos is None else ({int(eos)} if isinstance(eos, int) else {int(e) for e in eos})


SIDES = ("left", "right")


def pad_rows(rows: list[list[int]], value: int, side: str = "right",
             multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, W] int64 ids, [B, W] int64 mask of the real tokens): the rows padded with `value` on `side`, W the
    longest row rounded up to a multiple of `multiple`. Each row goes in through one buffer copy (torch.as_tensor
    of a 4K-token list converts it int by int, about twice as long)."""
    if side not in SIDES:
        raise ValueError(f"padding side {side!r}; allowed: {list(SIDES)}")
    width = -(-max((len(r) for r in rows), default=0) // multiple) * multiple
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        if r:
            cols = slice(width - len(r), width) if side == "left" else slice(0, len(r))
            ids[b, cols] = torch.frombuffer(array("q", r), dtype=torch.long)
            mask[b, cols] = 1
    return ids, mask


class _Row:
    """A row's new tokens and where it stopped (None while running)."""

    def __init__(self):
        self.tokens: list[int] = []
        self.stop: int | None = None  # number of tokens kept

    def check(self, new: list[int], eos: set[int], stop: list[str], decode):
        start = len(self.tokens)
        self.tokens.extend(new)
        for i in range(start, len(self.tokens)):
            if self.tokens[i] in eos:
                self.stop = i + 1
                break
        if stop and decode is not None:
            end = self.stop or len(self.tokens)
            if any(s in decode(self.tokens[:end]) for s in stop):  # then find the first token that completes one
                done = (i + 1 for i in range(start, end) if any(s in decode(self.tokens[:i + 1]) for s in stop))
                self.stop = next(done, end)


@torch.no_grad()
def generate_batch(decoder: FastDecoder, prompts: list[list[int]], max_new_tokens: int, eos: set[int] = frozenset(),
                   stop: list[str] = (), decode=None, check_every: int | None = None,
                   pad_to: int = 1) -> list[list[int]]:
    """Each prompt's greedy continuation (at most max_new_tokens, up to and including its stop token).

    prompts: token id lists (at least one token each); eos: stop token ids; stop: stop strings, checked on
    decode(tokens) (the tokenizer's decode) of the row's new tokens; pad_to: the padded width is a multiple of
    it (fewer distinct prefill shapes: kernels compile and masks are built once)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate_batch needs at least one prompt, each of at least one token")
    if max_new_tokens <= 0:
        return [[] for _ in prompts]
    lens = [len(p) for p in prompts]
    ids, _ = pad_rows(prompts, 0, "right", pad_to)
    every = check_every or (16 if decoder.use_graph else 1)
    rows = [_Row() for _ in prompts]
    new = decoder.prefill(ids.to(decoder.device), lens)
    made = 1
    stop = [s for s in stop if s]
    while True:
        for row, toks in zip(rows, new.tolist()):
            if row.stop is None:
                row.check(toks, eos, stop, decode)
        if made >= max_new_tokens or all(r.stop is not None for r in rows):
            break
        n = min(every, max_new_tokens - made)
        new = decoder.decode(n)
        made += n
    return [r.tokens[:r.stop] if r.stop is not None else r.tokens for r in rows]
