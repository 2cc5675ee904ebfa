"""Bringing evaluated cells home: `golinear store merge` of a store written elsewhere (an offline GPU machine's
OUT/store), and `golinear run --tasks`."""
from __future__ import annotations

import json
from pathlib import Path

from golinear.bench.cli import main as cli
from golinear.bench.results.store import CellKey, Store

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "leaderboards" / "store"


def committed_cell(task: str) -> dict:
    path = next((COMMITTED / "cells").glob(f"full-*/{task}--*.json"))
    return json.loads(path.read_text())


def with_limit(cell: dict, limit: int) -> dict:
    """The same cell under another key (limit), as a run with --limit would write it."""
    key = {**cell["key"], "config": {**cell["key"]["config"], "limit": limit}}
    return {**cell, "key": key, "digest": CellKey.from_dict(key).digest}


def test_store_merge_adds_missing_cells_and_keeps_existing_ones(tmp_path, capsys):
    """A cell dest already holds (the same measurement) is kept as it is, a missing one added; two different values
    for one key are refused and named (tests/test_store_trust.py)."""
    src, dest = Store(tmp_path / "src"), Store(tmp_path / "dest")
    piqa = committed_cell("golinear_piqa")
    kept = dest.put(piqa)
    before = kept.read_bytes()
    src.put(piqa)
    src.put(with_limit(piqa, 2))
    assert cli(["store", "merge", str(src.root), "--store", str(dest.root)]) == 0
    assert "1 of 2 cells" in capsys.readouterr().out
    assert kept.read_bytes() == before
    assert dest.has(CellKey.from_dict(with_limit(piqa, 2)["key"]))
    assert cli(["store", "merge", str(src.root), "--store", str(dest.root)]) == 0  # again: nothing new
    assert "0 of 2 cells" in capsys.readouterr().out


def test_store_merge_refuses_a_damaged_source_before_writing(tmp_path):
    src, dest = Store(tmp_path / "src"), Store(tmp_path / "dest")
    src.put(committed_cell("golinear_piqa"))
    bad = src.put(with_limit(committed_cell("golinear_piqa"), 3))
    bad.write_text("{}")
    assert cli(["store", "merge", str(src.root), "--store", str(dest.root)]) == 2
    assert not dest.root.exists()
    assert cli(["store", "merge", str(tmp_path / "nowhere"), "--store", str(dest.root)]) == 2


def test_run_tasks_selects_tasks_of_the_suites_and_names_the_allowed_ones(tmp_path, capsys):
    from golinear.bench.run.plan import resolve_suites
    assert [e.task for e in resolve_suites("ruler", tasks="mq,MV,golinear_ruler_vt")] == [
        "golinear_ruler_mq", "golinear_ruler_mv", "golinear_ruler_vt"]
    assert cli(["run", "--models", "full", "--suites", "cr", "--tasks", "PIQA,MQ", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown task(s) ['MQ'] in these suites; allowed: PIQA (golinear_piqa), ARC-e" in err
    assert not any(tmp_path.iterdir())
