"""A number in the store is the number of the data and model it names.

Data-aware cell keys (and the committed store still found), SHA256SUMS and truncated-gzip checks,
invalid cell files set aside and re-evaluated, exclusive cell claims, umask file modes, an empty
store refused by the leaderboard."""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from golinear.bench.boards import leaderboard as L
from golinear.bench.run import plan as P
from golinear.bench.run import specs as S
from golinear.bench.run.provenance import ModelInfo
from golinear.bench.results.store import CellKey, Store
from golinear.models.util.atomic import atomic_write
from golinear.models.training.data_hashes import verify_files

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(P.default_data_dir() or "/nonexistent")
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")


def cell(task="golinear_piqa", data=None, value=0.5, provenance_files=None):
    key = {"model": "base=smollm2-135m", "task": task, "config": {"limit": 4, "num_fewshot": 0}}
    if data is not None:
        key["data"] = data
    c = {"key": key, "model": {"label": "full"}, "task": task, "metric": "acc", "value": value, "stderr": 0.1,
         "n": 4, "metrics": {"acc,none": {"value": value, "stderr": 0.1}}}
    if provenance_files is not None:
        c["provenance"] = {"data": {"files": provenance_files}}
    return c


# ----------------------------------------------------------------------------- data in the key
def test_data_hashes_are_part_of_the_key(tmp_path):
    store = Store(tmp_path)
    good, bad = {"arc/e.jsonl": "a" * 64}, {"arc/e.jsonl": "b" * 64}
    store.put(cell(data=bad, value=0.0))
    k_good = CellKey("base=smollm2-135m", "golinear_piqa", {"limit": 4, "num_fewshot": 0}, good)
    k_bad = CellKey("base=smollm2-135m", "golinear_piqa", {"limit": 4, "num_fewshot": 0}, bad)
    assert k_good.digest != k_bad.digest
    assert store.has(k_bad) and not store.has(k_good)  # the fixed data is a new cell, not a stale hit
    store.put(cell(data=good, value=0.5))
    assert {c["value"] for c in store.cells()} == {0.0, 0.5}  # merging keeps both apart


def test_old_cells_without_data_in_the_key_are_used_only_for_their_own_data(tmp_path):
    store = Store(tmp_path)
    files = {"piqa/valid.jsonl": "a" * 64, "tasks/standard/golinear_piqa.yaml": "c" * 64}
    store.put(cell(provenance_files=files))  # the form of leaderboards/store (key without data)
    key = CellKey("base=smollm2-135m", "golinear_piqa", {"limit": 4, "num_fewshot": 0},
                  {**files, "tasks/standard/_template_yaml": "d" * 64})
    assert store.has(key)  # same data: used (an extra config file it did not list is not held against it)
    edited = CellKey(key.model, key.task, key.config, {**key.data, "piqa/valid.jsonl": "b" * 64})
    assert not store.has(edited)


@needs_data
def test_committed_store_cells_are_still_found():
    entries = P.resolve_suites("cr,mmlu,lambada")
    data = {e.task: P.cell_data(e, str(DATA)) for e in entries}
    store = Store(ROOT / "leaderboards" / "store")
    for model in ("full", str(ROOT / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc")):
        cells = P.plan_cells([S.parse_model_spec(model)], entries, data=data)
        assert len(cells) == 7 and all(store.has(c.key) for c in cells), model


@needs_data
def test_sha256sums_mismatch_and_truncated_gzip_name_the_file(tmp_path):
    copy = tmp_path / "data"
    (copy / "arc").mkdir(parents=True)
    easy = copy / "arc" / "ARC-Easy-test.jsonl"
    easy.write_bytes((DATA / "arc" / "ARC-Easy-test.jsonl").read_bytes())
    (copy / "SHA256SUMS").write_text((DATA / "SHA256SUMS").read_text())
    assert verify_files([easy], copy)  # an exact copy passes
    lines = easy.read_text().splitlines()
    row = json.loads(lines[0])
    row["answerKey"] = "B" if row["answerKey"] == "A" else "A"
    easy.write_text("\n".join([json.dumps(row)] + lines[1:]) + "\n")
    with pytest.raises(ValueError, match="ARC-Easy-test.jsonl' does not match .*SHA256SUMS"):
        verify_files([easy], copy)
    gz = copy / "x.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"a": 1}\n' * 5000)[:-40])  # not listed in SHA256SUMS
    with pytest.raises(ValueError, match="x.jsonl.gz' is a damaged or truncated gzip"):
        verify_files([gz], copy)


# ----------------------------------------------------------------------------- invalid cells
@pytest.mark.parametrize("content", ["", "{trunc", "null", "{}", "[]", "\x00\xff garbage"])
def test_invalid_cell_is_set_aside_and_counts_as_missing(tmp_path, capsys, content):
    store = Store(tmp_path)
    path = store.put(cell())
    key = CellKey.from_dict(json.loads(path.read_text())["key"])
    with pytest.raises(ValueError, match=f"corrupt cell file {path}"):  # the leaderboard names it, no traceback
        path.write_text(content, errors="surrogateescape")
        store.cells()
    assert not store.has(key)  # never counted as finished
    kept = list((tmp_path / "invalid").rglob("*"))
    assert not path.exists() and any(p.is_file() for p in kept)  # kept aside, not deleted
    assert str(path) in capsys.readouterr().err
    store.put(cell())  # and re-evaluated into its place
    assert store.has(key) and len(store.cells()) == 1


def test_a_cell_whose_content_does_not_match_its_name_is_invalid(tmp_path):
    store = Store(tmp_path)
    path = store.put(cell())
    c = json.loads(path.read_text())
    c["key"]["task"] = "golinear_arc_easy"  # digest no longer matches the key
    path.write_text(json.dumps(c))
    assert not store.has(CellKey.from_dict(cell()["key"]))
    c2 = json.loads(json.dumps(cell()))
    with pytest.raises(ValueError, match="invalid cell"):
        store.put({**c2, "value": "high"})
    for bad in ({"t/0/abc": "right"}, ["t/0/abc"], {"t/0/abc": "inf"}):  # per-sample scores are numbers by id
        with pytest.raises(ValueError, match="'per_sample' is not a mapping of sample ids to numbers"):
            store.put({**c2, "per_sample": bad})
    assert store.put({**c2, "per_sample": {"t/0/abc": 1.0, "t/1/def": 0}}).is_file()


# ----------------------------------------------------------------------------- claims
def test_claims_are_exclusive_and_taken_over_from_dead_processes(tmp_path):
    store = Store(tmp_path)
    key = CellKey("m", "t", {})
    assert store.claim(key) and store.claim(key)  # ours: idempotent
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, '.');"
                              "from golinear.bench.results.store import Store, CellKey;"
                              f"print(Store({str(tmp_path)!r}).claim(CellKey('m', 't', {{}})))"],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert other.communicate(timeout=60)[0].strip() == "False"  # a live holder: refused
    store.release(key)
    dead = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, '.');"
                           "from golinear.bench.results.store import Store, CellKey;"
                           f"print(Store({str(tmp_path)!r}).claim(CellKey('m', 't', {{}})))"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dead.stdout.strip() == "True"  # it claimed and exited without releasing (as a kill -9 would)
    assert store.claim(key)  # its dead claim is taken over


def test_a_claim_whose_pid_a_later_process_took_is_taken_over(tmp_path):
    """A claim names its process's start time beside the pid: where the pid now belongs to a process started later
    (a container's pids start over; a resumed run met its own stopped claim so), the claim is a dead one."""
    import json
    import socket
    from golinear.bench.results.processes import process_start
    store = Store(tmp_path)
    key = CellKey("m", "t", {})
    start = process_start(os.getpid())
    if start is None:
        pytest.skip("no /proc here: a claim is the pid alone")
    store.claims_dir.mkdir(parents=True, exist_ok=True)
    claim = store.claims_dir / f"{key.digest}.claim"
    claim.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "start": start - 1}))
    assert not store.claimed_elsewhere(key) and store.claim(key)  # our pid, another process's start: gone
    assert json.loads(claim.read_text())["start"] == start
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a live process with the start time it has: still held
        owner = {"pid": other.pid, "host": socket.gethostname(), "start": process_start(other.pid)}
        claim.write_text(json.dumps(owner))
        assert store.claimed_elsewhere(key) and not store.claim(key)
    finally:
        other.kill()
        other.wait()


# ----------------------------------------------------------------------------- files and modes
def test_atomic_write_uses_the_umask_and_leaves_nothing_on_failure(tmp_path):
    old = os.umask(0o027)
    try:
        p = atomic_write(tmp_path / "a.json", "{}")
        assert (p.stat().st_mode & 0o777) == 0o640
    finally:
        os.umask(old)
    p = atomic_write(tmp_path / "b.json", "{}")
    assert (p.stat().st_mode & 0o777) == 0o666 & ~old
    from golinear.models.util.atomic import atomic_path
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "b.json") as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert (tmp_path / "b.json").read_text() == "{}" and sorted(os.listdir(tmp_path)) == ["a.json", "b.json"]


def test_store_cells_are_written_with_the_users_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = Store(tmp_path).put(cell())
    finally:
        os.umask(old)
    assert (path.stat().st_mode & 0o777) == 0o644


# ----------------------------------------------------------------------------- leaderboard
def test_leaderboard_refuses_an_empty_or_missing_store(tmp_path):
    (tmp_path / "empty" / "cells").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds no cells"):
        L.render(tmp_path / "empty", tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        L.render(tmp_path / "missing", tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing rewritten with reference rows only


def test_leaderboard_cli_names_a_null_cell(tmp_path):
    path = Store(tmp_path / "s").put(cell())
    path.write_text("null")
    proc = subprocess.run([sys.executable, "-m", "golinear.bench.cli", "leaderboard", "--store", str(tmp_path / "s"),
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and str(path) in proc.stderr and "Traceback" not in proc.stderr


def test_request_cache_is_keyed_by_the_models_weights(tmp_path):
    store, key = Store(tmp_path), CellKey("m", "golinear_piqa", {})
    full = ModelInfo.from_info({"base_fingerprint": "bd29", "checkpoint_fingerprint": None}).weights_fingerprint
    ckpt = ModelInfo.from_info({"base_fingerprint": "bd29", "checkpoint_fingerprint": "77aa"}).weights_fingerprint
    assert (full, ckpt) == ("bd29", "bd29-77aa")
    assert store.request_cache(key, "x", full) != store.request_cache(key, "x", ckpt)
    with pytest.raises(ValueError, match="no model fingerprint"):
        store.request_cache(key, "x", ModelInfo.from_info({}).weights_fingerprint)


def test_a_claim_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A disk with no room left: one line, no claim (an empty one made the next run wait a minute); an empty or
    unreadable claim (as older versions could leave) is no claim and is taken over at once."""
    import errno
    import os
    store, key = Store(tmp_path), CellKey("m", "t", {})
    real_write = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "write", full)
    with pytest.raises(ValueError, match="disk full writing the claim .*free space and run the same command again"):
        store.claim(key)
    assert not (tmp_path / "claims").exists()
    monkeypatch.setattr(os, "write", real_write)
    store.claims_dir.mkdir()
    (store.claims_dir / f"{key.digest}.claim").write_text("")
    assert not store.claimed_elsewhere(key) and store.claim(key)
    assert json.loads((store.claims_dir / f"{key.digest}.claim").read_text())["pid"] == os.getpid()
    (store.claims_dir / f"{key.digest}.claim").write_text("[" * 100000)
    assert store.claim(key)


@pytest.mark.parametrize("damage", ["huge-number", "deep-nesting"])
def test_a_cell_that_breaks_the_parser_is_set_aside(tmp_path, capsys, damage):
    """A number of 400 digits, or 200,000 nested brackets: set aside in one line, never a crash of every re-run."""
    store = Store(tmp_path)
    path = store.put(cell())
    key = CellKey.from_dict(json.loads(path.read_text())["key"])
    text = path.read_text()
    assert '"value": 0.5' in text and '"metrics": {' in text
    if damage == "huge-number":
        text = text.replace('"value": 0.5', '"value": 1' + "0" * 400, 1)
    else:
        text = text.replace('"metrics": {', '"junk": ' + "[" * 200000 + "]" * 200000 + ', "metrics": {', 1)
    path.write_text(text)
    with pytest.raises(ValueError, match=f"corrupt cell file {path}"):  # the leaderboard names it, no traceback
        store.cells()
    assert store.get(key) is None and not path.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "invalid cell file" in err[0] and "moved to" in err[0], err


def test_a_scorer_a_checkpoint_names_elsewhere_keys_its_cells(tmp_path):
    """A checkpoint's config.json may name its scorer file by an absolute path outside the folder: that file's
    content is part of the key, so changing it keys other cells (a scorer inside the folder keys as before)."""
    import shutil

    from golinear.models.spec import ModelSpec, checkpoint_identity
    shipped = ROOT / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"
    folder = tmp_path / "ck"
    folder.mkdir()
    for name in ("config.json", "new_params.safetensors"):
        shutil.copy(shipped / name, folder / name)
    plain = checkpoint_identity(folder)
    scorer = tmp_path / "elsewhere" / "scorer.safetensors"
    scorer.parent.mkdir()
    scorer.write_bytes(b"scorer one")
    config = json.loads((folder / "config.json").read_text())
    config["linearize"]["scorer"] = str(scorer)
    (folder / "config.json").write_text(json.dumps(config))
    spec = ModelSpec(checkpoint=str(folder))
    first = spec.store_key()
    scorer.write_bytes(b"scorer two")
    assert spec.store_key() != first and checkpoint_identity(folder) != plain
    scorer.unlink()
    assert checkpoint_identity(folder).endswith("+missing")
    config["linearize"]["scorer"] = "scorer.safetensors"  # beside the weights, as golinear saves it
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "scorer.safetensors").write_bytes(b"scorer one")
    assert "+" not in checkpoint_identity(folder)
