"""`golinear run --dry-run`: every check of a run, then the cells still to evaluate and how long they should take at
the speeds the store measured (bench/run/estimate.py); no model loads and nothing is evaluated or written."""
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from golinear.bench.results.store import Store
from golinear.bench.run import estimate
from golinear.bench.run import specs as S
from golinear.bench.run.plan import plan_cells, resolve_suites
from golinear.bench.run.runner import run_matrix

ROOT = Path(__file__).resolve().parent.parent


def _a_stored_sniah_cell() -> dict:
    """A real S-NIAH cell record of the repository's store (its fields as `golinear run` writes them)."""
    for path in sorted((ROOT / "leaderboards" / "store" / "cells").glob("*/*.json")):
        cell = json.loads(path.read_text())
        if cell.get("suite") == "sniah":
            return cell
    pytest.skip("no S-NIAH cell in leaderboards/store")


def _planned(models: str, **kw):
    return plan_cells(S.parse_models(models), resolve_suites("sniah"), context_length=4096, **kw)


def _put(store: Store, cell, n: int, seconds: float, device="cuda:0", gpu="Card A", commit="a" * 40):
    """Store `cell` (a planned Cell) as evaluated: n samples in `seconds` on `device`, at `commit`."""
    record = copy.deepcopy(_a_stored_sniah_cell())
    record.update(key=cell.key.as_dict(), task=cell.entry.task, n=n, n_task=n, wall_time_s=seconds)
    record["model"] = {**record["model"], "label": cell.model.label, "family": cell.model.family}
    record["provenance"]["hardware"] = {"device": device, "gpu": gpu, "dtype": "torch.bfloat16"}
    record["provenance"]["git"] = {"commit": commit, "dirty": False}
    store.put(record)


def test_speeds_come_from_the_same_row_else_its_family_on_the_same_kind_of_device(tmp_path, monkeypatch):
    monkeypatch.setattr(estimate, "commit_times", lambda: {})
    store = Store(tmp_path / "store")
    cells = _planned("press=snapkv,kv_budget=256;press=snapkv,kv_budget=1024;press=knorm,kv_budget=256;full",
                     num_samples=500)
    by = {(c.model.label, c.entry.task): c for c in cells}
    _put(store, by[("snapkv (kvpress) @256", "golinear_sniah_1")], 500, 50.0)      # 10 samples/s on cuda
    _put(store, by[("knorm (kvpress) @256", "golinear_sniah_1")], 500, 5.0, device="cpu", gpu=None)  # cpu only
    done = {c.key.digest for c in cells if store.has(c.key)}
    todo = [c for c in cells if c.key.digest not in done]
    rows = {r["label"]: r for r in estimate.plan_rows(todo, estimate.measured_speeds(store.cell_files(), "cuda"))}
    snap = rows["snapkv (kvpress) @256"]
    assert snap["tasks"] == ["S-NIAH-2", "S-NIAH-3"] and snap["samples"] == 1000
    assert snap["seconds"] == pytest.approx(100.0) and not snap["family"]
    other = rows["snapkv (kvpress) @1024"]  # never measured: its family's speed, marked so
    assert other["family"] and other["seconds"] == pytest.approx(150.0)
    assert rows["knorm (kvpress) @256"]["seconds"] is None  # measured on the CPU only: no cuda speed
    assert rows["full"]["speed"] is None
    text = estimate.render(list(rows.values()), len(cells), len(done), store.root, "cuda")
    assert "12 cells planned, 2 already in" in text and "10 to evaluate" in text
    assert "10.0 (1 cells at its other budgets; Card A; code aaaaaaa)" in text
    assert "estimate: 4.2 min on cuda; 2 of 4 rows without one" in text  # 100 s + 150 s


def test_only_the_newest_codes_cells_set_a_speed(tmp_path, monkeypatch):
    store = Store(tmp_path / "store")
    cells = _planned("press=snapkv,kv_budget=256", num_samples=500)
    old, new = "1" * 40, "2" * 40
    _put(store, cells[0], 500, 250.0, commit=old)   # 2 samples/s, older code
    _put(store, cells[1], 500, 20.0, commit=new)    # 25 samples/s
    monkeypatch.setattr(estimate, "commit_times", lambda: {old: 100, new: 200})
    speeds = estimate.measured_speeds(store.cell_files(), "cuda")
    row = estimate.plan_rows(cells[2:], speeds)[0]
    assert row["speed"]["code"] == "2222222" and row["seconds"] == pytest.approx(20.0)
    monkeypatch.setattr(estimate, "commit_times", lambda: {old: 300, new: 200})
    row = estimate.plan_rows(cells[2:], estimate.measured_speeds(store.cell_files(), "cuda"))[0]
    assert row["speed"]["code"] == "1111111" and row["seconds"] == pytest.approx(250.0)


def test_a_dry_run_loads_and_writes_nothing_and_plans_for_a_device_not_here(tmp_path, monkeypatch):
    from golinear.bench.run import runner
    monkeypatch.setattr(runner, "build_lm", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(runner, "build_samples_first", lambda *a, **k: pytest.fail("samples were built"))
    store = Store(tmp_path / "store")
    cells = _planned("full;press=snapkv,kv_budget=256", num_samples=20)
    _put(store, cells[0], 20, 2.0)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    s = run_matrix("full;press=snapkv,kv_budget=256", "sniah", store.root, num_samples=20, device="cuda",
                   progress=False, dry_run=True)
    assert (s.planned, s.skipped, s.evaluated) == (6, 1, 0)
    assert "6 cells planned, 1 already in" in s.plan and "S-NIAH-2, S-NIAH-3" in s.plan
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # no claim, no probe, no cell
    with pytest.raises(ValueError, match="unknown device"):  # the device's name is still checked
        run_matrix("full", "sniah", store.root, num_samples=20, device="gpu", progress=False, dry_run=True)


def test_cli_dry_run_prints_the_plan_and_bad_input_still_exits_2(tmp_path):
    run = [sys.executable, "-m", "golinear.bench.cli", "run", "--suites", "sniah", "--num-samples", "5",
           "--store", str(tmp_path / "s"), "--dry-run"]
    ok = subprocess.run(run + ["--models", "gdn-default"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "3 cells planned, 0 already in" in ok.stdout and "estimate: none" in ok.stdout
    assert not (tmp_path / "s").exists()
    bad = subprocess.run(run + ["--models", "gdn-default,window=x"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "window" in bad.stderr
