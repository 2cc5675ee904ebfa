"""generate_until tokenizes its contexts up front in batches: the padded batches it builds from them equal
lm-eval's own tok_batch_encode (left and right padding, prompts of different lengths, a BOS-led batch), and
the cache is gone after the call."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

import golinear.bench.backends.lm_backend as B  # noqa: E402


@pytest.fixture(scope="module")
def lm():
    return B.make_lm("golinear-hf", batch_size=2)


CONTEXTS = ["The capital of France is", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "  spaces  around  ", "Once"]


@pytest.mark.parametrize("side", ["left", "right"])
def test_cached_batches_equal_lm_evals(lm, side):
    bos = lm.tokenizer.decode(lm.prefix_token_id)
    for strings in (CONTEXTS, [bos + "Hello there", "Hi"], ["Hi", bos + "Hello there"]):
        lm._encoded = lm._encode_strings(strings)
        try:
            got = lm.tok_batch_encode(strings, padding_side=side)
        finally:
            lm._encoded = {}
        want = HFLM.tok_batch_encode(lm, strings, padding_side=side)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), (strings, side)


def test_generate_until_uses_and_drops_the_cache(lm, monkeypatch):
    calls = []
    real = lm.tokenizer.encode
    monkeypatch.setattr(lm.tokenizer, "encode", lambda *a, **k: calls.append(a) or real(*a, **k))
    reqs = [Instance("generate_until", {}, (c, {"until": ["\n"], "max_gen_toks": 3, "do_sample": False}), i)
            for i, c in enumerate(CONTEXTS)]
    outs = lm.generate_until(reqs, disable_tqdm=True)
    assert len(outs) == len(CONTEXTS) and lm._encoded == {}
    assert not [a for a in calls if a and a[0] in CONTEXTS]  # no context was encoded one at a time


def test_prefill_widths_are_few_and_tight():
    """Similar prompt lengths share a width (4K S-NIAH prompts of 3,9xx tokens: one), padding stays <= 12.5 %."""
    from golinear.bench.backends.lm_backend import padded_width
    assert {padded_width(n) for n in range(3841, 4097)} == {4096}
    for n in list(range(1, 5000)) + [32000, 32768, 40000, 131072]:
        w = padded_width(n)
        assert n <= w and (w - n <= 64 or (w - n) / n <= 0.125), (n, w)
        assert w % 64 == 0 and padded_width(w) == w


def test_encode_ids_equals_the_tokenizers_call(lm):
    """The Rust fast path gives tokenizer(texts)["input_ids"] exactly: with and without special tokens, special-token
    text inside a string, unicode, whitespace runs, an empty string; the tokenizer's own call when truncation is
    set on the Rust tokenizer (which the fast path would apply)."""
    tok = lm.tokenizer
    texts = CONTEXTS + ["", tok.eos_token + " after eos", "naïve café — 数字 123\n\n\t tabs", "a" * 5000]
    for special in (True, False):
        want = tok(texts, add_special_tokens=special)["input_ids"]
        assert B.encode_ids(tok, texts, add_special_tokens=special) == want
    tok.backend_tokenizer.enable_truncation(3)  # a setting the fast path does not apply: the tokenizer's call is used
    try:
        assert B.encode_ids(tok, ["a b c d e f"]) == tok(["a b c d e f"])["input_ids"]
    finally:
        tok.backend_tokenizer.no_truncation()
