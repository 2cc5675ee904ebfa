"""The presses golinear evaluates, by name, each held at an exact cache budget.

kvpress sizes a press by a compression ratio; a budget comparison needs a count: `ExactBudget` keeps `keep`
KV entries per layer and KV head whatever the prompt's length (the ratio is set per call from the length).
StreamingLLM keeps 8 sink tokens, as golinear's window + sinks models do.
"""
from __future__ import annotations

from dataclasses import dataclass

# name -> (kvpress class name, options): the question-agnostic scorers a budget sweep runs
PRESSES = {
    "streaming_llm": ("StreamingLLMPress", {"n_sink": 8}),
    "knorm": ("KnormPress", {}),
    "snapkv": ("SnapKVPress", {}),
    "tova": ("TOVAPress", {}),
    "expected_attention": ("ExpectedAttentionPress", {}),
}


def check_press(name) -> str:
    low = str(name).strip().lower()
    if low not in PRESSES:
        raise ValueError(f"unknown press {name!r}; allowed: {sorted(PRESSES)}")
    return low


def ratio_for(length: int, keep: int) -> float:
    """The compression ratio that makes kvpress keep exactly `keep` of `length` entries (it keeps
    int(length * (1 - ratio))); 0 when there is nothing to drop."""
    if keep >= length:
        return 0.0
    return (length - keep - 0.5) / length


@dataclass
class ExactBudget:
    """A kvpress ScorerPress that keeps `keep` entries per layer and KV head: before the press's own hook runs,
    its ratio is set from the length of the layer's cache (the keys it is about to score)."""
    press: object
    keep: int = 0

    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)

    def forward_hook(self, module, args, kwargs, output):
        layer = kwargs["past_key_values"].layers[module.layer_idx]
        self.press.compression_ratio = ratio_for(layer.keys.shape[2], self.keep)
        return self.press.forward_hook(module, args, kwargs, output)


def build_press(name: str, keep: int) -> ExactBudget:
    """A fresh press `name` that keeps `keep` entries per layer and KV head."""
    import kvpress
    cls, options = PRESSES[check_press(name)]
    return ExactBudget(getattr(kvpress, cls)(**options), keep)
