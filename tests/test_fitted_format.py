"""bench.boards.fitted_format: what a scorer was fitted to (from its metadata, old files included), the label rule, its use
in the retention rows' labels, and bench.boards.needle_types' table built on it."""
from __future__ import annotations

from pathlib import Path

import torch

from golinear.bench.boards import fitted_format as ff
from golinear.bench.boards import needle_types
from golinear.models.retention.scorer import load_scorer, save_scorer

from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def probe_script():
    return load_script("retention_scorer_probe.py", register=True)


def test_the_label_rule():
    assert ff.fitted_label("numbers scorer", "numbers", {"numbers", "uuids"}) == \
        "numbers scorer [fitted to the test's value type: numbers]"
    assert ff.fitted_label("numbers scorer", "numbers", {"words"}) == "numbers scorer"
    assert ff.fitted_label("default", None, {"numbers"}) == "default"
    assert ff.fitted_label("word scorer", "words", ()) == "word scorer"  # CR, LAMBADA: no needles


def test_the_committed_scorers_fit_from_their_metadata():
    numbers = ff.file_fit(str(ff.SCORERS / "numbers.safetensors"))
    words = ff.file_fit(str(ff.SCORERS / "value.safetensors"))  # written before --values existed: words
    assert numbers == {"value_type": "numbers", "value_format": "7-digit numbers, randrange(10**6, 10**7)", "seed": 0}
    assert words["value_type"] == "words" and words["seed"] == 0
    assert ff.scorer_fit({"fit": {"target": "far"}})["value_type"] is None
    assert ff.scorer_fit({"fit": "random weights: for cost measurements only"})["value_type"] is None


def test_rows_find_their_scorer_in_checkpoints_and_options():
    assert ff.fitted_value_type("gdn-w248-s8-sc,window=124,retain=124,retain_score=fitted,"
                                "scorer=numbers.safetensors") == "numbers"
    assert ff.fitted_value_type("gdn-w252-s8-r252-fit-sc") == "words"  # the trained row's own copy
    assert ff.fitted_value_type("gdn-w504-s8-sc") is None
    assert ff.fitted_value_type("gdn-w124-s8-r124-pr-sc") is None  # slots, but proj_residual: no scorer
    assert ff.fitted_value_type("gdn-w248-s8-sc,window=124,retain=124,retain_score=proj_residual") is None


def test_a_new_fit_records_its_seed_and_value_format(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # rank imports retention_slots, as the script run does
    probe = probe_script()
    meta = probe.fit_record("value", "numbers", 3)
    assert meta == {"value_type": "numbers", "value_format": probe.VALUE_FORMATS["numbers"], "seed": 3}
    assert probe.fit_record("far", "words", 3)["value_type"] is None
    path = save_scorer(tmp_path / "s.safetensors", torch.zeros(2, 3, 4), torch.zeros(2, 3), {"fit": {}, **meta})
    assert ff.scorer_fit(load_scorer(path)[2]) == meta
    for script, argv in ((probe.fit, ["--out", str(tmp_path / "x.safetensors"), "--seed", "42"]),
                         (probe.rank, ["--scorer", str(path), "--seed", "42"])):
        try:
            script(argv)
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"{script.__name__} accepted the evaluation seed")


def test_retention_rows_say_when_their_scorer_was_fitted_to_the_tests_values():
    from golinear.bench.claims.roles import RETENTION_VALUE_TYPES, retention_roles
    from golinear.bench.boards.fitted_format import needle_value_types
    assert needle_value_types(RETENTION_VALUE_TYPES) == {"numbers", "uuids"}  # S-NIAH-1/2, MK/MQ/MV: numbers; S-NIAH-3: UUIDs
    roles = retention_roles([256])
    flagged = [r for r in roles if "fitted to the test's value type" in r]
    assert flagged == ["training-free, half as slots, numbers scorer [fitted to the test's value type: numbers]@256"]
    assert "trained, half as slots, fitted scorer@256" in roles  # fitted to words: none of these tests' values


def cell(family, task, score, budget=512, length=2048, n=50, seed=42):
    return {"task": task, "n": n, "model": {"family": family, "budget": budget},
            "key": {"config": {"limit": None, "context_length": length, "num_samples": n, "seed": seed}},
            "metrics": {"score,none": {"value": score}}}


def test_needle_types_table_labels_rows_by_their_test():
    numbers = "gdn-w504-s8-sc,window=252,retain=252,retain_score=fitted,scorer=numbers.safetensors"
    cells = [cell("gdn-w504-s8-sc", "golinear_sniah_1", 10.0), cell("gdn-w504-s8-sc", "golinear_sniah_words_1", 8.0),
             cell(numbers, "golinear_sniah_1", 90.0), cell(numbers, "golinear_sniah_words_1", 30.0),
             cell(numbers, "golinear_sniah_uuids_1", 4.0),
             cell("gdn-w248-s8-sc", "golinear_sniah_1", 5.0, length=4096, n=500)]  # no variant at 4K: left out
    shown = needle_types.table(needle_types.frame(cells))
    rows = {(r["needle values"], r["row"]): r["noise haystack (S-NIAH-1)"] for _, r in shown.iterrows()}
    assert rows == {("numbers", "`gdn-w504-s8-sc`"): "10.00",
                    ("numbers", f"`{numbers}` [fitted to the test's value type: numbers]"): "90.00",
                    ("words", "`gdn-w504-s8-sc`"): "8.00", ("words", f"`{numbers}`"): "30.00",
                    ("uuids", f"`{numbers}`"): "4.00"}
    assert set(shown["scorer fitted to"]) == {"", "`numbers.safetensors`: numbers (7-digit numbers, "
                                                  "randrange(10**6, 10**7)), seed 0"}
    text = needle_types.section(cells)
    assert "## S-NIAH by needle value type" in text and "2048 tokens, 50 samples a task, generation seed 42" in text
    assert needle_types.section(cells[-1:]) == ""


def test_needle_types_rows_of_one_scorer_named_by_different_paths_are_one_row():
    words = "gdn-w248-s8-sc,window=124,retain=124,retain_score=fitted,scorer=value.safetensors"
    by_path = words.replace("scorer=", "scorer=checkpoints/smollm2-135m/scorers/")
    cells = [cell(words, "golinear_sniah_words_1", 38.0), cell(by_path, "golinear_sniah_1", 6.0),
             cell(by_path, "golinear_sniah_2", 2.0)]
    shown = needle_types.table(needle_types.frame(cells))
    rows = {(r["needle values"], r["row"]): (r["noise haystack (S-NIAH-1)"], r["essay haystack (S-NIAH-2 / 3)"])
            for _, r in shown.iterrows()}
    assert rows == {("numbers", f"`{words}`"): ("6.00", "2.00"),
                    ("words", f"`{words}` [fitted to the test's value type: words]"): ("38.00", "")}
    assert set(shown["scorer fitted to"]) == {"`value.safetensors`: words (one of 24 English words "
                                              "(retention_scorer_probe.WORDS)), seed 0"}


def test_leaderboard_rows_say_it_per_task():
    """sniah.md's rows are (model, task): only the rows of the value type the scorer was fitted to say so."""
    import pandas as pd

    from golinear.bench.boards.leaderboard import sniah_table
    numbers = "gdn-w504-s8-sc,window=252,retain=252,retain_score=fitted,scorer=numbers.safetensors"
    df = pd.DataFrame([{"column": t, "full_attention": False, "model": numbers, "family_id": "label:" + numbers,
                        "family_name": numbers, "model_key": "k", "budget": "512", "backbone": "smollm2-135m",
                        "context_length": 4096, "n": 500, "value": v}
                       for t, v in (("S-NIAH-1", 99.0), ("S-NIAH-3", 6.0))])
    rows = dict(zip(sniah_table(df, None)["task"], sniah_table(df, None)["model"]))
    assert rows == {"S-NIAH-1": f"{numbers} [fitted to the test's value type: numbers]", "S-NIAH-3": numbers}
