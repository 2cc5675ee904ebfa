"""scripts/retention_slots.py: the needle's value tokens found in the prompt, and the census of where they sit
after a prefill with retention slots (every token is in exactly one of sinks, window, slots or state)."""
from __future__ import annotations


import pytest
import torch

from golinear.models.backbones.backbone import load_tokenizer
from golinear.models.retention.generate import RetentionDecoder
from test_batched_generate import tiny_model

from _scripts import load_script

retention_slots = load_script("retention_slots.py")


def test_value_tokens_cover_the_value_and_nothing_else():
    tok = load_tokenizer()
    needle = "One of the special magic numbers for calm-dog is: 4205917."
    prompt = f"The grass is green. The sky is blue. {needle} The grass is green. What is the number?"
    ids, where = retention_slots.value_tokens(tok, prompt, needle, "4205917")
    assert ids == tok(prompt)["input_ids"]
    assert where == list(range(where[0], where[-1] + 1))
    assert tok.decode([ids[i] for i in where]).strip() == "4205917"
    with pytest.raises(ValueError, match="not found"):
        retention_slots.value_tokens(tok, prompt, "One of the special magic numbers for x is: 1.", "1")


def census(T, where, retain):
    model = tiny_model("gdn", window=3, sinks=1, retain=retain, retain_score="proj_residual")
    decoder = RetentionDecoder(model, use_graph=False)
    decoder.prefill(torch.randint(1, 90, (1, T), generator=torch.Generator().manual_seed(0)))
    return retention_slots.slot_census(decoder, where)


def test_census_places_each_token_once():
    # 1 sink + 3 window + 4 slots, 8 tokens: positions 1-4 left the window, all four still fit the slots
    out = census(8, [1, 2, 3, 4], retain=4)
    assert len(out) == 3 * 2  # three linear layers x two KV heads
    assert all(c == (4, 0) for c in out)
    assert all(c == (0, 3) for c in census(8, [5, 6, 7], retain=4))  # the window
    assert all(c == (0, 0) for c in census(8, [0], retain=4))  # the sink
    # 20 tokens, 2 slots: 16 tokens left the window, at most 2 of them held per (layer, head)
    out = census(20, list(range(1, 17)), retain=2)
    assert all(held == 2 and win == 0 for held, win in out)


def test_span_probe_pools_each_arrival_score_over_its_neighbours(monkeypatch):
    import golinear.models.retention.prefill as prefill
    monkeypatch.setattr(prefill, "entry_scores", prefill.entry_scores)  # restored after the test
    k = torch.randn(1, 12, 2, 8, generator=torch.Generator().manual_seed(0))
    plain = prefill.entry_scores(k, "proj_residual")
    retention_slots.pool_scores(2)
    pooled = prefill.entry_scores(k, "proj_residual")
    want = torch.stack([plain[:, max(0, j - 2):j + 3].amax(1) for j in range(12)], 1)
    torch.testing.assert_close(pooled, want)
    assert not torch.equal(pooled, plain)
    with pytest.raises(ValueError, match="not delta_error"):
        prefill.entry_scores(k, "delta_error")
