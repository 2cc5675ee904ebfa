"""The StreamingLLM / window + sinks cross-check (bench/boards/press_crosscheck.py): counts that follow the per-sample
answers on the real backbone and tasks, and the docs summary that follows the shipped CSV."""
from __future__ import annotations

from pathlib import Path

import pytest

from golinear.bench.boards import press_crosscheck as X

ROOT = Path(__file__).resolve().parent.parent


def test_the_two_models_keep_the_same_budget():
    press, window = X.models(64)
    assert (press.press, press.kv_budget) == ("streaming_llm", 64)
    assert (window.mechanism, window.sinks, window.window) == ("none", 8, 56)


def test_agreement_refuses_different_documents():
    row = {"doc_id": 0, "answer": "a", "score": 100.0, "right": True}
    with pytest.raises(ValueError, match="different documents"):
        X.agreement("t", [row], [{**row, "doc_id": 1}])


@pytest.mark.slow
def test_counts_follow_the_per_sample_answers_on_the_real_backbone():
    pytest.importorskip("kvpress")
    rows, logged, prov = X.crosscheck(["golinear_sniah_1"], budget=64, context_length=1024, samples=2)
    (row,) = rows
    press, window = logged["press"]["golinear_sniah_1"], logged["window"]["golinear_sniah_1"]
    assert len(press) == len(window) == row["samples"] == 2
    assert row["same_answer"] == sum(p["answer"] == w["answer"] for p, w in zip(press, window))
    assert row["both_right"] + row["only_press_right"] + row["only_window_right"] + row["both_wrong"] == 2
    assert row["both_right"] == sum(p["right"] and w["right"] for p, w in zip(press, window))
    assert row["press_score"] == round(sum(p["score"] for p in press) / 2, 2)
    assert row["window_score"] == round(sum(w["score"] for w in window) / 2, 2)
    assert all(r["answer"] for r in press + window)  # both generated something
    assert (prov["budget"], prov["context_length"], prov["samples"]) == (64, 1024, 2)
    assert X.read_csv(X.to_csv(rows)) == rows


def test_the_docs_summary_is_the_shipped_csv():
    rows = X.read_csv((ROOT / "leaderboards/kv-crosscheck.csv").read_text())
    page = (ROOT / "docs/kv_compression.md").read_text()
    assert X.summary(rows) in page
    assert X.with_summary(page, rows) == page
