"""The result store: atomic cells, resume lookups, stable listing, merging stores from several machines."""
import json
import os

import pytest

from golinear.bench.results.store import CellKey, Store, hash_data_paths


def cell(model="base=smollm2-135m", task="golinear_piqa", limit=4, value=0.5):
    return {"key": {"model": model, "task": task, "config": {"limit": limit, "seed": 1234}},
            "model": {"label": "full"}, "task": task, "metric": "acc", "value": value, "stderr": 0.1, "n": limit,
            "metrics": {"acc,none": {"value": value, "stderr": 0.1}}}


def test_put_get_has_roundtrip(tmp_path):
    store = Store(tmp_path / "s")
    key = CellKey("base=smollm2-135m", "golinear_piqa", {"limit": 4, "seed": 1234})
    assert not store.has(key) and store.get(key) is None
    path = store.put(cell())
    assert store.has(key)
    got = store.get(key)
    assert got["value"] == 0.5 and got["digest"] == key.digest
    assert path.name.endswith(f"--{key.digest}.json") and path.parent.name.startswith("full-")
    # a different configuration is a different cell
    assert not store.has(CellKey("base=smollm2-135m", "golinear_piqa", {"limit": 8, "seed": 1234}))
    # key order inside config does not matter
    assert store.has(CellKey("base=smollm2-135m", "golinear_piqa", {"seed": 1234, "limit": 4}))


def test_rewrite_replaces_not_duplicates(tmp_path):
    store = Store(tmp_path)
    store.put(cell(value=0.5))
    store.put(cell(value=0.75))
    cells = store.cells()
    assert len(cells) == 1 and cells[0]["value"] == 0.75
    assert not [p for p in (tmp_path / "cells").rglob(".tmp-*")]


def test_failed_write_leaves_no_cell(tmp_path):
    store = Store(tmp_path)
    bad = cell()

    class Boom:
        def __str__(self):
            raise RuntimeError("disk full")
    bad["boom"] = Boom()
    with pytest.raises(RuntimeError):
        store.put(bad)
    assert store.cells() == []
    assert not [p for p in (tmp_path / "cells").rglob("*") if p.is_file()]


def test_listing_is_stable_and_ignores_temp_files(tmp_path):
    store = Store(tmp_path)
    for t in ("golinear_piqa", "golinear_arc_easy", "golinear_hellaswag"):
        store.put(cell(task=t))
    d = next((tmp_path / "cells").iterdir())
    (d / ".tmp-half.json").write_text('{"key": ')  # what a kill mid-write would leave
    first = [c["digest"] for c in store.cells()]
    assert first == sorted(first) and len(first) == 3
    assert [c["digest"] for c in Store(tmp_path).cells()] == first


def test_merge_from_other_store(tmp_path):
    a, b = Store(tmp_path / "a"), Store(tmp_path / "b")
    a.put(cell(task="golinear_piqa"))
    b.put(cell(task="golinear_piqa", value=0.9))  # same key: a keeps its own
    b.put(cell(task="golinear_arc_easy"))
    assert a.merge_from(b) == 1
    values = {c["task"]: c["value"] for c in a.cells()}
    assert values == {"golinear_piqa": 0.5, "golinear_arc_easy": 0.5}


def test_merge_adds_per_sample_scores_only_to_the_same_score_measured_again(tmp_path):
    """A kept cell without per-sample scores (stored before cells kept them) takes them from the same cell measured
    again with the same value, n and per-sample mean; a different value leaves it as it was."""
    a, b = Store(tmp_path / "a"), Store(tmp_path / "b")
    a.put(cell(task="golinear_piqa"))
    a.put(cell(task="golinear_arc_easy"))
    samples = {f"golinear_piqa/{i}/h": v for i, v in enumerate((1.0, 0.0, 1.0, 0.0))}
    b.put({**cell(task="golinear_piqa"), "per_sample": samples, "provenance": {"git": {"commit": "abc"}}})
    b.put({**cell(task="golinear_arc_easy", value=0.75), "per_sample": {"x/0/h": 0.75}})  # another score: not taken
    assert a.merge_from(b) == 0
    got = {c["task"]: c for c in a.cells()}
    assert got["golinear_piqa"]["per_sample"] == samples and got["golinear_piqa"]["value"] == 0.5
    assert got["golinear_piqa"]["per_sample_added"]["git"] == {"commit": "abc"}
    assert "per_sample" not in got["golinear_arc_easy"] and got["golinear_arc_easy"]["value"] == 0.5


def test_unwritable_store_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not writable"):
        Store(blocker / "store").ensure_writable()


def test_corrupt_cell_is_reported(tmp_path):
    store = Store(tmp_path)
    path = store.put(cell())
    path.write_text("{broken")
    with pytest.raises(ValueError, match="corrupt cell"):
        store.cells()


def test_hash_data_paths(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text("1\n")
    (tmp_path / "b.txt").write_text("2\n")
    h = hash_data_paths([tmp_path / "d", tmp_path / "b.txt", tmp_path / "missing"])
    assert set(h) == {str(tmp_path / "d" / "a.jsonl"), str(tmp_path / "b.txt")}
    assert h[str(tmp_path / "b.txt")] == "53c234e5e8472b6ac51c1ae1cab3fe06fad053beb8ebfd8977b010655bfdd3c3"
    assert hash_data_paths([tmp_path / "d"], skip_roots=[tmp_path / "d"]) == {}
    assert json.dumps(h)  # plain strings
    assert os.path.exists(tmp_path / "b.txt")
