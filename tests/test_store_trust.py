"""A store handed over is checked, not trusted: `golinear check --store` recomputes each cell from its own per-sample
scores, and `golinear store merge` names every key held with two values and never writes through a link out of the
store. Real cells from a tiny evaluation, edited as a hostile user would."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from golinear.bench.cli import main as golinear

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hostile_user import DATA, only_cell, tiny_base, tiny_run  # noqa: E402,F401 - the same tiny evaluation

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")


@pytest.fixture(scope="module")
def store(tiny_base, tmp_path_factory):
    """One finished LAMBADA cell of the tiny model (2 documents, per-sample scores kept)."""
    root = tmp_path_factory.mktemp("store") / "store"
    tiny_run(tiny_base, root)
    return root


def edit_value(store: Path, value: float) -> Path:
    (path,) = store.glob("cells/*/*.json")
    cell = json.loads(path.read_text())
    cell["value"] = value
    cell["metrics"][f"{cell['metric']},{cell['filter']}"]["value"] = value
    path.write_text(json.dumps(cell))
    return path


def test_check_recomputes_a_stored_cell_from_its_samples(store, tiny_base, tmp_path, capsys):
    cell = only_cell(store)
    assert cell["per_sample"] and len(cell["per_sample"]) == cell["n"]
    baseline = tmp_path / "baseline.json"
    argv = ["check", "--model", f"full,base={tiny_base}", "--baseline", str(baseline), "--suites", "lambada",
            "--limit", "2"]
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    assert golinear([*argv, "--update", "--store", str(copy)]) == 0
    assert golinear([*argv, "--store", str(copy)]) == 0  # the store as it was made: passed
    capsys.readouterr()
    edit_value(copy, 0.9 if cell["value"] != 0.9 else 0.1)  # "improved" by hand
    assert golinear([*argv, "--store", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "per-sample scores give" in out and "FAILED" in out and "passed" not in out, out


def test_merge_names_two_values_for_one_key_and_merges_nothing(store, tmp_path, capsys):
    dest, other = tmp_path / "dest", tmp_path / "other"
    shutil.copytree(store, dest)
    shutil.copytree(store, other)
    before = {p: p.read_bytes() for p in dest.rglob("*.json")}
    edited = edit_value(other, 0.9 if only_cell(store)["value"] != 0.9 else 0.1)
    capsys.readouterr()
    assert golinear(["store", "merge", str(other), "--store", str(dest)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "conflict" in err[0] and str(edited) in err[0], err
    assert "two values for one key" in err[1] and "Traceback" not in "".join(err)
    assert {p: p.read_bytes() for p in dest.rglob("*.json")} == before
    empty = tmp_path / "empty"  # the two sources disagree with each other
    assert golinear(["store", "merge", str(store), str(other), "--store", str(empty)]) == 2
    assert "conflict" in capsys.readouterr().err and not list(empty.glob("cells/*/*.json"))
    assert golinear(["store", "merge", str(store), "--store", str(dest)]) == 0  # the same values: no conflict


def test_merge_refuses_a_link_out_of_the_store(store, tmp_path, capsys):
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    model_dir = next(store.glob("cells/*")).name
    (dest / "cells").mkdir(parents=True)
    outside.mkdir()
    (dest / "cells" / model_dir).symlink_to(outside, target_is_directory=True)
    capsys.readouterr()
    assert golinear(["store", "merge", str(store), "--store", str(dest)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "outside the store" in err[0], err
    assert not list(outside.iterdir())
    (dest / "cells" / model_dir).unlink()
    (dest / "cells").rmdir()
    (dest / "cells").symlink_to(outside, target_is_directory=True)
    assert golinear(["store", "merge", str(store), "--store", str(dest)]) == 2
    assert not list(outside.iterdir())


def test_a_claim_from_another_host_is_one_line_before_any_model_loads(store, tiny_base, tmp_path, capsys):
    """A run finds a cell claimed on another host (whose process it cannot see): it says so in one line, naming the
    host and the file to delete, instead of waiting forever after loading the model."""
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    (path,) = copy.glob("cells/*/*.json")
    digest = json.loads(path.read_text())["digest"]
    path.unlink()
    (copy / "claims").mkdir()
    claim = copy / "claims" / f"{digest}.claim"
    claim.write_text(json.dumps({"pid": 4242, "host": "gpu-node-7"}))
    capsys.readouterr()
    argv = ["run", "--models", f"full,base={tiny_base}", "--suites", "lambada", "--limit", "2", "--store", str(copy)]
    assert golinear(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "'gpu-node-7'" in lines[-1] and str(claim) in lines[-1] and "delete" in lines[-1], err
    assert "Traceback" not in err and "Loading weights" not in err, err
    claim.unlink()
    assert golinear(argv) == 0
