"""The presses golinear evaluates, by name, each held at an exact cache budget.

kvpress sizes a press by a compression ratio; a budget comparison needs a count: `ExactBudget` keeps `keep`
KV entries per layer and KV head whatever the prompt's length (the ratio is set per call from the length).
A head-adaptive press (AdaKV, CriticalAdaKV around a scorer) keeps the same total per layer, `keep` x KV heads,
spread unevenly over the heads: kvpress keeps every entry and masks the evicted ones per head
(`module.masked_key_indices`); the static decoder holds each head's kept entries and masks the rest
(models/kv_compression/static_decode.py). KVzip (OWN_PREFILL) scores with passes of its own over the context
(models/kv_compression/kvzip.py) and holds its layers as the head-adaptive presses do. StreamingLLM keeps 8 sink
tokens, as golinear's window + sinks models do.
A press that draws random numbers (DRAWS_RANDOM: Compactor's leverage sketch) draws the same ones for every prompt:
seed 0 in a forked generator, so a row's answer does not depend on what ran before it. The others run without it:
forking and seeding the generators costs about 1.6 ms a layer on CUDA, a third of a 4K prompt's compressed prefill.
Compactor, CriticalAdaKV and the scorers it wraps are built from subclasses in models/kv_compression/batch_faithful.py
(BATCH_FAITHFUL): kvpress's classes couple a batch's rows (a sketch drawn with the batch's shape, z-scores, head
budgets and pad values over the batch); the subclasses give each row of a call what kvpress's class gives it alone,
so batched prefill compresses a run of equal rows in one call for every press.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

# name -> (kvpress class name, options): the question-agnostic scorers a budget sweep runs
PRESSES = {
    "streaming_llm": ("StreamingLLMPress", {"n_sink": 8}),
    "knorm": ("KnormPress", {}),
    "snapkv": ("SnapKVPress", {}),
    "tova": ("TOVAPress", {}),
    "expected_attention": ("ExpectedAttentionPress", {}),
    "keydiff": ("KeyDiffPress", {}),
    "lagkv": ("LagKVPress", {}),
    "compactor": ("CompactorPress", {}),
}
# name -> (kvpress head-adaptive wrapper, the scorer of PRESSES it wraps): the same entries per layer, uneven heads
HEAD_ADAPTIVE = {
    "adakv_snapkv": ("AdaKVPress", "snapkv"),
    "adakv_expected_attention": ("AdaKVPress", "expected_attention"),
    "criticalkv_snapkv": ("CriticalAdaKVPress", "snapkv"),
    "criticalkv_expected_attention": ("CriticalAdaKVPress", "expected_attention"),
}
# presses of kvpress 0.5.5 golinear cannot run on its backbone, and why (named when asked for, never left out)
UNAVAILABLE = {
    "kvzap": "KVzap scores with a model trained per backbone (nvidia/KVzap-<model> on the Hugging Face Hub); none "
             "exists for SmolLM2-135M",
    "fastkvzip": "FastKVzip's gates are trained per backbone (Jang-Hyun/Fast-KVzip: Qwen3, Llama-3.1, ...); none "
                 "exists for SmolLM2-135M, and they load with torch.load (pickle)",
}
# presses with a prefill of their own (models/kv_compression/kvzip.py: extra passes over the context), head-adaptive
OWN_PREFILL = {"kvzip": ("KVzipPress", "context reconstruction, layerwise")}
# presses kvpress runs over the whole prompt in one pass only (a chunk after the first fails its prefill check)
ONE_PASS = {"compactor": "kvpress's CompactorPress scores the whole prompt at once (it supports prefill only)"}
# presses whose scores draw random numbers (tests/test_kv_compression.py checks this against kvpress's sources)
DRAWS_RANDOM = {"compactor"}
# kvpress classes whose rows a batch couples -> their batch-faithful subclass (models/kv_compression/batch_faithful.py);
# SnapKV's and Expected Attention's pad values only matter under CriticalAdaKV, which weighs them
BATCH_FAITHFUL = {f"{name}Press": f"Rowwise{name}Press" for name in
                  ("Compactor", "CriticalAdaKV", "SnapKV", "ExpectedAttention")}
ALL_PRESSES = {**PRESSES, **HEAD_ADAPTIVE, **OWN_PREFILL}


def check_press(name) -> str:
    low = str(name).strip().lower()
    if low in UNAVAILABLE:
        raise ValueError(f"press {name!r} is not available: {UNAVAILABLE[low]}")
    if low not in ALL_PRESSES:
        raise ValueError(f"unknown press {name!r}; allowed: {sorted(ALL_PRESSES)}")
    return low


def head_adaptive(name: str) -> bool:
    return check_press(name) in HEAD_ADAPTIVE or name in OWN_PREFILL


def ratio_for(length: int, keep: int) -> float:
    """The compression ratio that makes kvpress keep exactly `keep` of `length` entries (it keeps
    int(length * (1 - ratio))); 0 when there is nothing to drop."""
    if keep >= length:
        return 0.0
    return (length - keep - 0.5) / length


@dataclass
class ExactBudget:
    """A kvpress press that keeps `keep` entries per layer and KV head (head-adaptive: `keep` x heads per layer):
    before the press's own hook runs, its ratio is set from the length of the layer's cache (the keys it is about
    to score)."""
    press: object
    keep: int = 0
    seeded: bool = False  # a press that draws random numbers: seed 0 in a forked generator at every layer

    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)

    def forward_hook(self, module, args, kwargs, output):
        layer = kwargs["past_key_values"].layers[module.layer_idx]
        self.press.compression_ratio = ratio_for(layer.keys.shape[2], self.keep)
        with self._seeded(layer.keys):
            return self.press.forward_hook(module, args, kwargs, output)

    def compress(self, module, hidden_states, keys, values, kwargs):
        """The press's own compress of one prompt's keys and values [1, Hkv, n, D] at this budget: what its hook does
        between reading the layer's cache and writing it back (models.kv_compression.batched_prefill)."""
        self.press.compression_ratio = ratio_for(keys.shape[2], self.keep)
        with self._seeded(keys):
            return self.press.compress(module, hidden_states, keys, values, None, kwargs)

    @contextlib.contextmanager
    def _seeded(self, like):
        """Seed 0 in a forked generator for a press that draws random numbers; nothing for the others."""
        if not self.seeded:
            yield
            return
        import torch
        with torch.random.fork_rng(devices=[like.device] if like.is_cuda else []):
            torch.manual_seed(0)
            yield


def build_press(name: str, keep: int) -> ExactBudget:
    """A fresh press `name` that keeps `keep` entries per layer and KV head (in total per layer, head-adaptive)."""
    name = check_press(name)
    if name in OWN_PREFILL:
        raise ValueError(f"press {name!r} prefills on its own (models.kv_compression.kvzip), not through a hook")
    if name in HEAD_ADAPTIVE:
        wrapper, scorer = HEAD_ADAPTIVE[name]
        cls, options = PRESSES[scorer]
        return ExactBudget(press_class(wrapper)(press=press_class(cls)(**options)), keep,
                           seeded=scorer in DRAWS_RANDOM)
    cls, options = PRESSES[name]
    return ExactBudget(press_class(cls)(**options), keep, seeded=name in DRAWS_RANDOM)


def press_class(name: str) -> type:
    """kvpress's press class `name`, or its batch-faithful subclass (BATCH_FAITHFUL) where kvpress's couples rows."""
    if name in BATCH_FAITHFUL:
        from golinear.models.kv_compression import batch_faithful
        return getattr(batch_faithful, BATCH_FAITHFUL[name])
    import kvpress
    return getattr(kvpress, name)
