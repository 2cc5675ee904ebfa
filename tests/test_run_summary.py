"""What `golinear run` shows at its end: a compact table of the scores (accuracies in percent) and where the store
is; and the deprecation warning of transformers' `past_key_values` keyword is not printed to users."""
import json
import shutil
import warnings
from pathlib import Path

from golinear.bench.cli import main as cli
from golinear.bench.run.run_summary import score_table

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "leaderboards" / "store" / "cells"
CR = ("golinear_piqa", "golinear_arc_easy", "golinear_arc_challenge", "golinear_hellaswag", "golinear_winogrande")


def full_cells() -> list[Path]:
    folder = next(p for p in COMMITTED.glob("full-*") if any(p.glob("golinear_piqa--num_fewshot0--*.json")))
    return [next(folder.glob(f"{t}--num_fewshot0--*.json")) for t in CR]


def test_score_table_shows_each_models_scores_in_percent():
    cells = [json.loads(p.read_text()) for p in full_cells()]
    table = score_table(cells + [None])
    header, _, row = table.splitlines()
    assert header.split() == ["model", "PIQA", "ARC-e", "ARC-c", "HellaSwag", "WinoGrande"]
    assert row.split() == ["full"] + [f"{100 * c['value']:.1f}" for c in cells]
    limited = {**cells[0], "key": {**cells[0]["key"], "config": {"limit": 4, "num_fewshot": 0}}, "n": 4}
    assert "PIQA (n=4)" in score_table([limited])  # a subset says how many documents
    assert score_table([None]) == ""


def test_run_ends_with_the_table_and_the_store(tmp_path, capsys):
    store = tmp_path / "store"
    for p in full_cells():  # the committed cells: nothing to evaluate, no model loads
        dest = store / "cells" / p.parent.name / p.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, dest)
    assert cli(["run", "--models", "full", "--suites", "cr", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "5 cells planned, 5 already in" in out
    assert "PIQA" in out and "WinoGrande" in out and "full " in out
    assert f"store {store.resolve()}" in out and "golinear leaderboard --store" in out


def test_the_past_key_values_deprecation_is_not_printed():
    from transformers.utils.deprecation import deprecate_kwarg

    from golinear.bench import quiet

    @deprecate_kwarg("past_key_values", "99.0.0", new_name="cache")
    def step(cache=None):
        return cache

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        step(past_key_values=1)
        assert any("past_key_values" in str(w.message) for w in seen)  # transformers does warn
        seen.clear()
        quiet.install()
        assert step(past_key_values=2) == 2
        assert not any("past_key_values" in str(w.message) for w in seen)
        warnings.warn("another FutureWarning", FutureWarning)
        assert len(seen) == 1  # only that message is silenced


def test_long_context_scores_are_percent_already():
    """An S-NIAH score of 1.0 is 1 %, not 100 %: scores are shown as they are, one decimal, like the accuracies."""
    from golinear.bench.run.run_summary import score_text
    assert [score_text({"metric": "score", "value": v}) for v in (0.0, 1.0, 100.0)] == ["0.0", "1.0", "100.0"]
    assert score_text({"metric": "acc", "value": 0.5}) == "50.0"
    assert score_text({"metric": "perplexity", "value": 12.345}) == "12.35"
