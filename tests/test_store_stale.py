"""`golinear store stale`: cells of a checkpoint retrained in place are found, kept until --drop, and the committed
store holds none (the leaderboard would show two rows of one name, one of weights no longer in the tree)."""
from __future__ import annotations

from pathlib import Path

from golinear.bench.cli import main as cli
from golinear.bench.results.store import Store
from golinear.bench.results.store_stale import stale_cells
from golinear.models.spec import checkpoint_identity

ROOT = Path(__file__).resolve().parent.parent


def cell(model: str, task: str = "golinear_piqa") -> dict:
    return {"key": {"model": model, "task": task, "config": {"limit": 4, "seed": 1234}}, "model": {"label": "ck"},
            "task": task, "metric": "acc", "value": 0.5, "stderr": 0.1, "n": 4,
            "metrics": {"acc,none": {"value": 0.5, "stderr": 0.1}}}


def test_cells_of_a_retrained_folder_are_listed_then_dropped(tmp_path, capsys):
    ck = tmp_path / "checkpoints" / "ck"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text('{"linearize": {"mechanism": "gdn"}}')
    (ck / "new_params.safetensors").write_bytes(b"first weights")
    old = checkpoint_identity(ck)
    store = Store(tmp_path / "store")
    store.put(cell(f"base=smollm2-135m,checkpoint=ck,checkpoint_files={old}"))
    store.put(cell("base=smollm2-135m,checkpoint=elsewhere,checkpoint_files=0123456789"))  # no folder: not judged
    store.put(cell("base=smollm2-135m"))  # full attention
    args = ["store", "stale", "--store", str(store.root), "--checkpoints", str(ck.parent)]
    assert cli(args) == 0 and stale_cells(store, ck.parent) == []

    (ck / "new_params.safetensors").write_bytes(b"retrained weights")  # the folder retrained in place
    now = checkpoint_identity(ck)
    store.put(cell(f"base=smollm2-135m,checkpoint=ck,checkpoint_files={now}"))
    found = stale_cells(store, ck.parent)
    assert [(name, was, is_) for _, name, was, is_ in found] == [("ck", old, now)]
    capsys.readouterr()
    assert cli(args) == 1  # listed, nothing deleted
    assert f"ck: 1 cells of checkpoint_files={old}" in capsys.readouterr().out
    assert len(store.cells()) == 4
    assert cli(args + ["--drop"]) == 0
    kept = {c["key"]["model"] for c in store.cells()}
    assert kept == {"base=smollm2-135m", "base=smollm2-135m,checkpoint=elsewhere,checkpoint_files=0123456789",
                    f"base=smollm2-135m,checkpoint=ck,checkpoint_files={now}"}
    assert cli(args) == 0


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    Store(tmp_path / "store").put(cell("base=smollm2-135m"))
    assert cli(["store", "stale", "--store", str(tmp_path / "nowhere")]) == 2
    assert cli(["store", "stale", "--store", str(tmp_path / "store"), "--checkpoints", str(tmp_path / "none")]) == 2
    assert cli(["store", "stale", str(tmp_path), "--store", str(tmp_path / "store")]) == 2
    assert cli(["store", "merge", "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert "not a result store" in err and "does not exist" in err and "takes no SRC" in err and "needs at least" in err


def test_the_committed_store_holds_no_cells_of_replaced_checkpoints():
    found = stale_cells(Store(ROOT / "leaderboards" / "store"), ROOT / "checkpoints" / "smollm2-135m")
    assert not found, f"{len(found)} stale cells, e.g. {found[0]}: `golinear store stale --store leaderboards/store`"
