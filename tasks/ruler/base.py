"""What every RULER generator shares: seeded RNGs, the length search, the per-sample fit loop.

The random streams follow RULER's scripts call for call: its global `random` / `np.random` become
`self.rng` (random.Random(seed)) and `self.np_rng` (np.random.RandomState(seed), the legacy global
stream), and its fresh `random.Random(args.random_seed)` shuffles stay fresh here.
"""
from __future__ import annotations

import random

import numpy as np

from .constants import TEMPLATES
from .resources import TokenCounter

# RULER retries a sample that does not fit at the smallest haystack forever (its `while True`);
# we give up after this many fresh draws and say why.
MAX_RETRIES_AT_FLOOR = 100


class Generator:
    family: str = ""

    def __init__(self, tokenizer, max_seq_length: int, seed: int, data_dir):
        self.count = TokenCounter(tokenizer)
        self.max_seq_length = max_seq_length
        self.seed = seed
        self.data_dir = data_dir
        self.rng = random.Random(seed)
        self.np_rng = np.random.RandomState(seed)
        spec = TEMPLATES[self.family]
        self.tokens_to_generate = spec['tokens_to_generate']
        self.answer_prefix = spec['answer_prefix']
        # prepare.py with the 'base' model template: template + answer_prefix.
        self.template = spec['template'] + spec['answer_prefix']

    def fresh_shuffle(self, items: list) -> None:
        random.Random(self.seed).shuffle(items)

    def fits(self, text: str, extra: int = 0) -> bool:
        return self.count(text) + extra + self.tokens_to_generate <= self.max_seq_length

    def record(self, index: int, text: str, outputs: list[str], info: dict) -> dict:
        """RULER's output row: input split before the answer prefix (first 10 chars, last match)."""
        cut = text.rfind(self.answer_prefix[:10])
        prompt_tokens = self.count(text)
        return {
            "index": index,
            "input": text[:cut],
            "answer_prefix": text[cut:],
            "prompt": text,
            "outputs": list(outputs),
            "length": prompt_tokens + self.tokens_to_generate,
            "prompt_tokens": prompt_tokens,
            "max_gen_toks": self.tokens_to_generate,
            "max_seq_length": self.max_seq_length,
            **info,
        }

    def answer_token_position(self, text: str, answer: str) -> int:
        """RULER niah.py's token_position_answer: tokens before the first occurrence of the answer."""
        at = text.find(answer)
        return self.count(text[:at]) if at >= 0 else -1


def binary_search(fits, lower: int, upper: int) -> int | None:
    """RULER HEAD's search for the largest haystack size that fits (None if even `lower` does not)."""
    best = None
    while lower <= upper:
        mid = (lower + upper) // 2
        if fits(mid):
            best, lower = mid, mid + 1
        else:
            upper = mid - 1
    return best


def fit_sample(generate, start: int, step: int, fits, what: str):
    """RULER's per-sample loop: regenerate, shrinking by `step` while the sample is too long.

    `generate(size)` returns the sample; `fits(sample)` says whether it is within the budget.
    Generation errors count as "does not fit", as RULER's bare `except` does.
    """
    used, tries = start, 0
    last_error = None
    while True:
        try:
            sample = generate(used)
            if fits(sample):
                return sample
        except (ValueError, IndexError) as e:  # e.g. random.sample larger than the population
            last_error = e
        if used > step:
            used -= step
        else:
            tries += 1
            if tries >= MAX_RETRIES_AT_FLOOR:
                raise ValueError(f"{what}: no sample fits even at the smallest haystack size ({used}); "
                                 f"use a larger max_seq_length (last error: {last_error})")
