"""KV-cache compression rows of `golinear latency`: a kvpress press at a cache budget (spec `press=<name>,
kv_budget=<entries>[,prefill_chunk=<tokens>]`, models/kv_compression) timed like the other rows.

Prefill: the prompt but its last token under the press with full attention, compressed to `kv_budget - 1` KV
entries per layer and KV head (with `prefill_chunk`, in chunks of that many tokens compressed after each: the
memory-matched row), then the last token read into the cache for the first logits, so decoding starts from
`kv_budget` entries, as models.kv_compression.generate starts from the budget. A random prompt has no question:
its last token plays the question's part. Decode: greedy steps over the compressed entries, each new token appended
uncompressed, on the static-cache decoder full-static uses (models.kv_compression.static_decode: the entries copied
into its static buffers at the end of the prefill, CUDA graph on CUDA, captured outside the timings), as golinear's
press generation decodes; `--press-decoder dynamic` times HF's DynamicCache instead (the cross-check).
"""
from __future__ import annotations

import time

import torch

from golinear.bench.cli_args import PRESS_DECODERS
from golinear.bench.speed.latency_runs import sync
from golinear.models.backbones.cache_arg import cache_kwarg
from golinear.models.kv_compression.generate import chunks, compressed_prefill, split_budget
from golinear.models.kv_compression.kvpress_adapter import take_head_masks
from golinear.models.kv_compression.static_decode import PressDecoder, kept_per_head

MIN_BUDGET = 2  # the prompt's last token is read after compression: at least one entry kept before it


def check_press_spec(spec, lengths: list[int]) -> None:
    """The press row's options and lengths, checked before any model is built (one-line errors)."""
    from golinear.models.kv_compression.kvpress_adapter import kvpress_version
    from golinear.models.kv_compression.presses import OWN_PREFILL, build_press
    kvpress_version()
    if spec.kv_budget < MIN_BUDGET:
        raise ValueError(f"config {spec.label!r}: press={spec.press} needs kv_budget=<KV entries kept per layer and "
                         f"KV head>, at least {MIN_BUDGET}, e.g. kv_budget=1024")
    if spec.question_aware:
        raise ValueError(f"config {spec.label!r}: question_aware=true times the same work as the question-agnostic "
                         "press (a latency prompt has no question; its last token is read after compression)")
    press = None if spec.press in OWN_PREFILL else build_press(spec.press, 1).press
    window = getattr(getattr(press, "press", press), "window_size", 0)  # SnapKV (or AdaKV's): the queries it scores with
    for length in lengths:
        n_press, keep = split_budget(length, 1, spec.kv_budget, question_aware=True)
        held = 0
        for c0, c1 in chunks(n_press, spec.prefill_chunk):
            held += c1 - c0
            if held > keep and c1 - c0 <= window:
                raise ValueError(f"config {spec.label!r} at length {length}: {spec.press} scores with the last "
                                 f"{window} queries, so each chunk it compresses needs more than {window} tokens "
                                 f"(this one has {c1 - c0}); use longer prompts or prefill_chunk above {window}")
            held = min(held, keep)


class PressRun:
    """One press row's timed run: (prefill s, decode s) for a batch of prompts. `entries` holds the KV entries per
    layer and KV head the last run's decode started from (one count: every layer and row holds the same)."""

    def __init__(self, model, spec, new_tokens: int, decoder: str = PRESS_DECODERS[0], use_graph: bool = False):
        if decoder not in PRESS_DECODERS:
            raise ValueError(f"--press-decoder {decoder!r}; allowed: {', '.join(PRESS_DECODERS)}")
        self.model, self.spec, self.new_tokens = model, spec, new_tokens
        self.decoder_name = decoder
        self.static = PressDecoder(model, use_graph=use_graph) if decoder == "static" else None
        self.entries = None
        self.compressed = False  # whether a run has compressed yet (the press's kernels loaded)

    @torch.no_grad()
    def __call__(self, ids):
        model, device, length = self.model, ids.device, ids.shape[1]
        n_press, keep = split_budget(length, 1, self.spec.kv_budget, question_aware=True)
        positions = torch.arange(length + self.new_tokens, device=device)[None]
        sync(device)
        t0 = time.perf_counter()
        cache = compressed_prefill(model, ids[:, :n_press], self.spec.press, keep, self.spec.prefill_chunk)
        logits = model(input_ids=ids[:, n_press:], position_ids=positions[:, n_press:length], use_cache=True,
                       logits_to_keep=1, **cache_kwarg(model, cache)).logits
        nxt = logits[:, -1:].argmax(-1)
        masks = take_head_masks(model, keep=self.static is None)  # a head-adaptive press's evictions (else None)
        self.entries = kept_per_head(cache, masks)
        if self.static is not None:  # the kept entries into the static buffers: the end of the prefill
            self.static.max_len = self.entries + self.new_tokens + 1
            self.static.load([cache], [length], nxt, logits[:, -1:], [masks])
            del cache
        sync(device)
        t1 = time.perf_counter()
        if self.static is not None:
            self.static.capture()  # untimed (a no-op without CUDA graphs, or when this shape is captured)
            sync(device)
            t1b = time.perf_counter()
            self.static.decode(self.new_tokens)
        else:
            t1b = t1
            for pos in range(length, length + self.new_tokens):
                logits = model(input_ids=nxt, position_ids=positions[:, pos:pos + 1], use_cache=True,
                               **cache_kwarg(model, cache)).logits
                nxt = logits[:, -1:].argmax(-1)
        sync(device)
        t2 = time.perf_counter()
        take_head_masks(model)  # the DynamicCache decode read them; they end with this run
        self.compressed |= n_press > keep
        return t1 - t0, t2 - t1b

    def row_fields(self) -> dict:
        """The row's press, budget and note (what its prefill, decode and decode bytes count)."""
        s = self.spec
        chunked, after = ("", "")
        if s.prefill_chunk:
            chunked, after = f" in chunks of {s.prefill_chunk} tokens", " after every chunk"
        fits = " (the prompt fits the budget: nothing dropped)" if self.entries < s.kv_budget else ""
        copy, where = ((", then the kept entries copied into the static KV buffers", "the static-cache decoder "
                        "full-static uses") if self.static is not None else ("", "HF's DynamicCache"))
        note = (f"kvpress {s.press}, kv_budget {s.kv_budget}: prefill = the prompt but its last token with full "
                f"attention{chunked}, compressed to kv_budget - 1 KV entries per layer and KV head{after}, then the "
                f"last token{copy}; decode = greedy steps on {where} from {self.entries} entries{fits}, one more a "
                "step; decode bytes per step = the weights + those entries' keys and values (mean over the steps)")
        return dict(press=s.press, kv_budget=s.kv_budget, note=note)

    @property
    def config_label(self) -> str:
        """The row's name: the spec's, the DynamicCache cross-check named as such (its own row, not the static's)."""
        return self.spec.label + ("" if self.static is not None else ", DynamicCache decode")
