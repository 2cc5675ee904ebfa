"""scripts/retention_scorer_probe.py: its target is the mean weight from queries beyond the gap, its ridge fit
recovers a linear rule, its retrieval texts and value labels mark the inserted values (the features and the file
it writes: tests/test_retention_scorer.py)."""
from __future__ import annotations

import pytest
import torch

from _scripts import load_script

probe = load_script("retention_scorer_probe.py", register=True)


def test_far_mass_is_the_mean_weight_from_queries_beyond_the_gap():
    g = torch.Generator().manual_seed(1)
    H, T, gap = 4, 9, 3
    w = torch.rand(H, T, T, generator=g).tril()
    w = w / w.sum(-1, keepdim=True)
    mass, ok = probe.far_mass(w, group=2, gap=gap, min_queries=2)
    for h in range(2):
        for j in range(T):
            queries = [t for t in range(T) if t > j + gap]
            assert bool(ok[j]) == (len(queries) >= 2)
            if queries:
                want = torch.stack([w[q, queries, j].mean() for q in (2 * h, 2 * h + 1)]).mean()
                torch.testing.assert_close(mass[h, j], want)


def test_ridge_recovers_a_linear_rule():
    g = torch.Generator().manual_seed(2)
    x = torch.rand(500, 6, dtype=torch.float64, generator=g) * torch.tensor([1, 10, 0.1, 3, 5, 2], dtype=torch.float64)
    w_true = torch.tensor([0.5, -0.2, 3.0, 0.0, 1.0, -1.5], dtype=torch.float64)
    y = x @ w_true + 0.7
    w, b = probe.ridge(x, y, lam=1e-9)
    torch.testing.assert_close(w, w_true, atol=1e-5, rtol=1e-5)
    assert abs(float(b) - 0.7) < 1e-5
    assert probe.r2(x, y, w, b) > 0.999999
    assert probe.r2(x, y, torch.zeros(6, dtype=torch.float64), y.mean()) < 1e-9  # a constant explains nothing


def test_question_mass_reads_the_last_queries_and_masks_the_question():
    g = torch.Generator().manual_seed(5)
    w = torch.rand(4, 10, 10, generator=g)
    mass, ok = probe.question_mass(w, group=2, queries=3, tail=4)
    torch.testing.assert_close(mass[1], w[2:4, 7:, :].mean(1).mean(0))
    assert ok.tolist() == [True] * 6 + [False] * 4


def test_retrieval_texts_ask_about_one_inserted_sentence():
    text = ". ".join(f"Sentence number {i} of a book" for i in range(20))
    for seed in range(5):
        out = probe.retrieval_texts([text], seed)[0]
        body, question = out.rsplit("\n", 1)
        inserted = [s for s in body.split(". ") if s.startswith("The secret word for the ")]
        assert len(inserted) == 2 and body.count("Sentence number") == 20
        asked = question.split("secret word for the ")[1].split("?")[0]
        assert [s for s in inserted if s.startswith(f"The secret word for the {asked} is ")]
        assert question.endswith(f"The secret word for the {asked} is")


def test_value_labels_mark_the_inserted_values_tokens_only():
    from golinear.models.backbones.backbone import load_tokenizer
    tok = load_tokenizer()
    text = probe.retrieval_texts([". ".join(f"Line {i} of the story" for i in range(12))], 3)[0]
    enc = tok(text, return_offsets_mapping=True)
    labels = probe.value_labels(text, enc["offset_mapping"])
    marked = tok.decode([t for t, y in zip(enc["input_ids"], labels) if y]).split()
    values = [s.split(" is ")[1] for s in text.rsplit("\n", 1)[0].split(". ") if s.startswith("The secret word")]
    assert marked == values and len(values) == 2  # the question's trailing "is" marks nothing


def test_random_scorer_has_the_named_configurations_shape(tmp_path):
    from golinear.models.backbones.backbone import named_config
    from golinear.models.retention.scorer import load_scorer, scorer_for_model
    probe.random_scorer(["--model", "smollm2-135m", "--layers", "2", "--out", str(tmp_path / "r.safetensors")])
    weight, bias, meta = load_scorer(tmp_path / "r.safetensors")
    assert tuple(weight.shape) == (2, 3, 32) and tuple(bias.shape) == (2, 3) and "cost" in meta["fit"]
    with pytest.raises(ValueError, match=r"this backbone needs \[layers, KV heads, head_dim/2\] = \[30, 3, 32\]"):
        scorer_for_model(tmp_path / "r.safetensors", named_config("smollm2-135m"), None)


def test_retrieval_texts_with_numbers_label_the_whole_number():
    from golinear.models.backbones.backbone import load_tokenizer
    tok = load_tokenizer()
    text = probe.retrieval_texts([". ".join(f"Line {i} of the story" for i in range(12))], 4, values="numbers")[0]
    values = [s.split(" is ")[1] for s in text.rsplit("\n", 1)[0].split(". ") if s.startswith("The secret word")]
    assert len(values) == 2 and all(v.isdigit() and len(v) == 7 for v in values)
    enc = tok(text, return_offsets_mapping=True)
    marked = tok.decode([t for t, y in zip(enc["input_ids"], probe.value_labels(text, enc["offset_mapping"])) if y])
    assert marked.replace(" ", "") == "".join(values)
    with pytest.raises(ValueError, match=r"^values must be one of \['words', 'numbers'\], got 'uuids'$"):
        probe.retrieval_texts([text], 0, values="uuids")
