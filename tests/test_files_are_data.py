"""Files a user can be handed (a run folder's resume state, a store's request cache, a bundle's wheels) are read as
data: nothing in them is unpickled or executed, and a damaged or foreign one is set aside or refused in one line."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from golinear.bench.cli import main as golinear
from golinear.bench.run.plan import default_data_dir

DATA = Path(default_data_dir() or "/nonexistent")
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")

from test_hostile_train import cli_train, signals_restored  # noqa: E402,F401 - the same tiny training run
from test_hostile_user import only_cell, tiny_base, tiny_run  # noqa: E402,F401 - the same tiny evaluation


class RunsCode:
    """Unpickling this creates the file it names: proof that a pickle was opened."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


# ------------------------------------------------------------------------------------------------ resume state
def test_resume_state_round_trips_without_pickle(tmp_path):
    import random

    import numpy as np
    import torch

    from golinear.models.training import resume_state
    from golinear.models.training.train_utils import rng_state
    p = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.AdamW([p], lr=1e-3)
    p.sum().backward()
    opt.step()
    state = {"step": 3, "note": None, "loss_window": [1.5, float("inf")], "params": {"w": p.detach().clone()},
             "optimizer": opt.state_dict(), "rng": rng_state(), "world_size": 1,
             "total_steps": 10, "elapsed_s": 2.5}  # every key a trainer state holds (load checks them)
    resume_state.save(state, tmp_path / "s.safetensors")
    back = resume_state.load(tmp_path / "s.safetensors")
    assert back["step"] == 3 and back["note"] is None and back["loss_window"] == [1.5, float("inf")]
    assert torch.equal(back["params"]["w"], state["params"]["w"])
    assert set(back["optimizer"]["state"]) == {0} and torch.equal(back["optimizer"]["state"][0]["exp_avg"],
                                                                    opt.state_dict()["state"][0]["exp_avg"])
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    opt.load_state_dict(back["optimizer"])  # the optimizer takes it back
    random.setstate(back["rng"]["python"])
    np.random.set_state(back["rng"]["numpy"])
    assert back["rng"]["numpy"][1].dtype == np.uint32 and np.array_equal(back["rng"]["numpy"][1],
                                                                         state["rng"]["numpy"][1])
    assert b"__reduce__" not in (tmp_path / "s.safetensors").read_bytes()


def test_a_pickled_resume_state_is_refused_unopened(tmp_path, capsys, signals_restored):
    """An older golinear's state.pt (a pickle) is never opened: here one that would run code when unpickled."""
    run = tmp_path / "run"
    run.mkdir()
    marker = tmp_path / "code-ran"
    (run / "state.pt").write_bytes(pickle.dumps(RunsCode(marker)))
    from _tiny import write_books, write_tiny_backbone
    write_tiny_backbone(tmp_path / "base")
    write_books(tmp_path / "data")
    before = sorted(os.listdir(run))
    capsys.readouterr()
    assert cli_train(tmp_path, "--steps", "4") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "state.pt" in err[0] and "pickle" in err[0] and "delete it" in err[0], err
    assert not marker.exists() and sorted(os.listdir(run)) == before  # nothing ran, nothing was written


def test_a_damaged_resume_state_is_one_line(tmp_path, capsys, signals_restored):
    from golinear.models.training.train import STATE_FILE
    assert cli_train(tmp_path, "--steps", "12", "--stop-after", "3") == 0
    (tmp_path / "run" / STATE_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}")
    capsys.readouterr()
    assert cli_train(tmp_path, "--steps", "12") == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "resume state" in last and "unreadable" in last, err


# ------------------------------------------------------------------------------------------------ request caches
def test_request_cache_values_are_json_of_lm_eval_results():
    from golinear.bench.results.request_cache import decode, encode
    for v in [(-1.25, True), "the answer", -3.5]:
        assert decode(encode(v)) == v
    assert isinstance(decode(encode((-1.0, False))), tuple)
    for bad in ['{"ll": [1.0]}', '{"ll": ["x", true]}', '{"text": 3}', '[1, 2]', '{"x": NaN}', '{"x": 1, "y": 2}']:
        with pytest.raises(ValueError):
            decode(bad)


def cache_prefix(store_root, clean):
    from golinear.bench.run.provenance import ModelInfo
    from golinear.bench.results.store import CellKey, Store
    prefix = Store(store_root).request_cache(CellKey.from_dict(clean["key"]), clean["model"]["label"],
                                             ModelInfo.from_info(clean["model"]["info"]).weights_fingerprint)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    return prefix


def _pickled_cache(db, marker, prefix):
    """lm-eval's own cache layout (pickled values), one value of which runs code when unpickled."""
    from sqlitedict import SqliteDict
    with SqliteDict(str(db), autocommit=True) as d:  # sqlitedict's default: pickle
        d["0" * 64] = RunsCode(marker)


def _foreign_header(db, marker, prefix):
    from golinear.bench.results import request_cache
    cell = "lambada--0123456789abcdef--otherweights"
    with request_cache.open_db(db, table=request_cache.HEADER_TABLE) as h:
        h["cell"], h["format"], h["mac"] = cell, request_cache.FORMAT, request_cache.signed(cell)
    with request_cache.open_db(db) as d:
        d["0" * 64] = (-0.5, True)


def _made_elsewhere(db, marker, prefix):
    """This cell's cache as another machine would write it: the right cell, a header signed with another key, and
    results of the right shape but edited (a perfect score) - the edit a reader could not otherwise see."""
    import hashlib
    import hmac

    from golinear.bench.results import request_cache
    with request_cache.open_db(db, table=request_cache.HEADER_TABLE) as h:
        h["cell"], h["format"] = prefix.name, request_cache.FORMAT
        h["mac"] = hmac.new(b"another machine's key", prefix.name.encode(), hashlib.sha256).hexdigest()
    with request_cache.open_db(db) as d:
        d["0" * 64] = (-0.01, True)


def _other_schema(db, marker, prefix):
    import sqlite3
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE golinear (a INTEGER, b INTEGER)")
    con.execute("CREATE TABLE unnamed (x TEXT)")
    con.commit()
    con.close()


def _undecodable(db, marker, prefix):
    import sqlite3

    from golinear.bench.results import request_cache
    with request_cache.open_db(db, table=request_cache.HEADER_TABLE) as h:
        h["cell"], h["format"], h["mac"] = prefix.name, request_cache.FORMAT, request_cache.signed(prefix.name)
    with request_cache.open_db(db) as d:
        d["0" * 64] = (-0.5, True)
    con = sqlite3.connect(db)
    con.execute("INSERT INTO unnamed (key, value) VALUES (?, ?)", ("1" * 64, b"\x80\x04\x95 not json"))
    con.commit()
    con.close()


@needs_data
@pytest.mark.parametrize("make,says", [(_pickled_cache, "no golinear header"), (_foreign_header, "not for this cell"),
                                       (_made_elsewhere, "not signed with this machine's key"),
                                       (_other_schema, "no such column"), (_undecodable, "decode")],
                         ids=["pickled", "other-cell", "made-elsewhere", "other-schema", "undecodable"])
def test_a_foreign_or_damaged_request_cache_is_set_aside_unopened(tmp_path, tiny_base, capsys, make, says):
    """A request cache handed over inside a store is read as data: a pickled one (here one that would run code),
    one made for another cell or on another machine (its results edited), another table layout or an entry that
    does not parse is moved aside in one line and the cell is evaluated from its start, to the clean run's score."""
    clean = only_cell(tiny_run(tiny_base, tmp_path / "clean") or tmp_path / "clean")
    store = tmp_path / "store"
    prefix = cache_prefix(store, clean)
    db = prefix.parent / f"{prefix.name}_rank0.db"
    marker = tmp_path / "code-ran"
    make(db, marker, prefix)
    content = db.read_bytes()
    capsys.readouterr()
    err = tiny_run(tiny_base, store, capsys)
    lines = [ln for ln in err.splitlines() if "damaged request cache" in ln]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in err, err[-2000:]
    assert not marker.exists()
    moved = list((store / "invalid" / "partial").glob(f"*/{db.name}.*"))
    assert len(moved) == 1 and moved[0].read_bytes() == content
    redone = only_cell(store)
    assert redone["value"] == clean["value"] and "resumed_requests" not in redone["provenance"]
    assert not (store / "partial").exists()


@needs_data
def test_a_resumed_cell_reads_its_own_json_cache(tmp_path, tiny_base, monkeypatch, capsys):
    """The cache a killed attempt left is read back (JSON) and the cell equals a clean run; the same cache with a
    row edited (its signature kept) is set aside and the cell evaluated from its start."""
    from golinear.bench.backends import lm_backend
    clean = only_cell(tiny_run(tiny_base, tmp_path / "clean") or tmp_path / "clean")
    real, calls = lm_backend.GolinearHF._model_call, []

    def dies_on_second(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return real(self, *a, **k)
    monkeypatch.setattr(lm_backend.GolinearHF, "_model_call", dies_on_second)
    with pytest.raises(KeyboardInterrupt):
        from golinear.bench.run.runner import run_matrix
        run_matrix(f"full,base={tiny_base}", "lambada", tmp_path / "store", limit=2, progress=False)
    dbs = list((tmp_path / "store").glob("partial/*/*_rank0.db"))
    assert len(dbs) == 1
    import sqlite3
    rows = sqlite3.connect(dbs[0]).execute("SELECT value FROM unnamed").fetchall()
    assert len(rows) == 1 and rows[0][0].startswith('{"v": {"ll": [')  # JSON text, not a pickle
    monkeypatch.undo()
    import shutil
    shutil.copytree(tmp_path / "store", tmp_path / "edited")
    edited = next((tmp_path / "edited").glob("partial/*/*_rank0.db"))
    con = sqlite3.connect(edited)  # the row's result made perfect, its signature kept
    (stored,) = con.execute("SELECT value FROM unnamed").fetchone()
    row = json.loads(stored)
    row["v"] = {"ll": [0.0, True]}
    con.execute("UPDATE unnamed SET value = ?", (json.dumps(row),))
    con.commit()
    con.close()
    resumed = only_cell(tiny_run(tiny_base, tmp_path / "store") or tmp_path / "store")
    assert resumed["provenance"]["resumed_requests"] == 1 and resumed["value"] == clean["value"]
    err = tiny_run(tiny_base, tmp_path / "edited", capsys)
    assert "signature does not match" in err and "Traceback" not in err, err[-2000:]
    redone = only_cell(tmp_path / "edited")
    assert "resumed_requests" not in redone["provenance"] and redone["value"] == clean["value"]


def test_lm_eval_use_cache_checks_header_and_rows(tmp_path):
    """`golinear lm-eval --use_cache` reads a cache as `golinear run` does: one handed over without golinear's
    header, or with an edited row, is set aside beside itself; its own rows are read back."""
    import sqlite3

    from golinear.bench.results import request_cache
    prefix = tmp_path / "mycache"
    db = request_cache.db_path(prefix, 0)
    with request_cache.open_db(db) as d:  # rows without a header: a cache made elsewhere
        d["a" * 64] = (0.0, True)
    assert request_cache.check_or_start(db) == 0
    assert len(list(tmp_path.glob("mycache_rank0.db.invalid-*"))) == 1
    with request_cache.open_db(db) as d:
        d["a" * 64] = (-3.25, False)
    assert request_cache.check_or_start(db) == 1
    with request_cache.open_db(db, flag="r") as d:
        assert d["a" * 64] == (-3.25, False)
    con = sqlite3.connect(db)
    con.execute("UPDATE unnamed SET value = replace(value, '-3.25, false', '0.0, true')")
    con.commit()
    con.close()
    with request_cache.open_db(db, flag="r") as d, pytest.raises(ValueError, match="signature"):
        d["a" * 64]
    with request_cache.json_values():  # what `golinear lm-eval` wraps lm-eval's CachingLM in
        from lm_eval.api.model import CachingLM
        from lm_eval.models.dummy import DummyLM
        caching = CachingLM(DummyLM(), str(prefix) + "_rank0.db")
    caching.dbdict.close()
    assert len(list(tmp_path.glob("mycache_rank0.db.invalid-*"))) == 2
    assert request_cache.read(db, "mycache") == (0, None)


# ------------------------------------------------------------------------------------------------ the converted backbone
def real_conversion() -> Path:
    """This machine's genuine conversion of the packaged GGUF (made once, about a minute, where there is none)."""
    from golinear.models.backbones import backbone
    return backbone.smollm2_path()


def link_conversion(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "golinear_content.json":
            os.link(f, dest / f.name)


def test_a_converted_backbone_without_its_record_is_converted_again(tmp_path, monkeypatch, capsys):
    """A cache folder without the conversion's content record (an older golinear's, or copied from elsewhere) is not
    taken at first sight: the packaged GGUF is converted again in its place; one with its record is verified."""
    from golinear.models.backbones import backbone, backbone_content
    genuine = real_conversion()
    monkeypatch.setenv("GOLINEAR_CACHE", str(tmp_path))
    target = tmp_path / "smollm2-135m-instruct"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"weights from elsewhere")
    (target / "tokenizer.json").write_text("{}")
    converted = []

    def convert(t):  # stands in for the minute-long dequantization: the genuine conversion's files, linked
        converted.append(t)
        for f in t.iterdir():
            f.unlink()
        link_conversion(genuine, t)
        backbone_content.write_record(t, backbone_content.GGUF_SHA256)
    monkeypatch.setattr(backbone, "convert_smollm2", convert)
    assert backbone.smollm2_path() == target and converted == [target]
    assert "has no content record" in capsys.readouterr().err
    assert backbone.smollm2_path() == target and len(converted) == 1  # recorded now: verified, not converted
    record = json.loads((target / backbone_content.RECORD).read_text())
    record["gguf_sha256"] = None  # what an older golinear recorded at first sight
    (target / backbone_content.RECORD).write_text(json.dumps(record))
    assert backbone.smollm2_path() == target and len(converted) == 2
    (target / "generation_config.json").unlink()  # a link to the genuine file: replaced, not edited in place
    (target / "generation_config.json").write_text("{}")
    with pytest.raises(ValueError, match="is damaged: generation_config.json"):
        backbone.smollm2_path()


def test_converted_weights_edited_with_their_record_are_refused(tmp_path, monkeypatch):
    """The converted content is pinned in the code: weights edited and a record rewritten to match them are refused
    in one line naming the file (the genuine conversion passes)."""
    from golinear.models.backbones import backbone, backbone_content
    genuine = real_conversion()
    assert backbone_content.content(genuine) == backbone_content.CONTENT_SHA256
    monkeypatch.setenv("GOLINEAR_CACHE", str(tmp_path))
    target = tmp_path / "smollm2-135m-instruct"
    link_conversion(genuine, target)
    backbone_content.write_record(target, backbone_content.GGUF_SHA256)
    assert backbone.smollm2_path() == target
    weights = bytearray((genuine / "model.safetensors").read_bytes())
    weights[-4:] = b"\x00\x00\x80\x3f"  # one weight set to 1.0
    (target / "model.safetensors").unlink()
    (target / "model.safetensors").write_bytes(bytes(weights))
    backbone_content.write_record(target, backbone_content.GGUF_SHA256)  # the record rewritten to match
    with pytest.raises(ValueError, match="model.safetensors has sha256 .* golinear pins"):
        backbone.smollm2_path()


# ------------------------------------------------------------------------------------------------ --include-path
SHADOW = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files: {{test: /nonexistent.jsonl}}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
"""


@needs_data
def test_an_include_path_task_that_shadows_golinears_is_refused(tmp_path, capsys):
    """A cell is stored under its task's name: a user's YAML of the same name would be served as golinear's."""
    from golinear.bench.run.execute import refuse_shadowing
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "mine.yaml").write_text(SHADOW.format(name="my_own_task"))
    refuse_shadowing(str(tasks), str(DATA))  # a new name is fine
    (tasks / "shadow.yaml").write_text(SHADOW.format(name="golinear_lambada_openai"))
    capsys.readouterr()
    store = tmp_path / "store"
    assert golinear(["run", "--models", "full", "--suites", "lambada", "--limit", "2", "--include-path", str(tasks),
                     "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "defines golinear_lambada_openai, which golinear defines too" in err[0], err
    assert not store.exists()


# ------------------------------------------------------------------------------------------------ no data folder
@pytest.fixture
def no_data_folder(monkeypatch, tmp_path):
    """No ../shared/data, no $GOLINEAR_DATA, no network to the Hub (its offline mode fails at once)."""
    from golinear.models.util import data_dir
    monkeypatch.setattr(data_dir, "DEFAULT_DATA_DIR", tmp_path / "no-such-folder")
    monkeypatch.delenv("GOLINEAR_DATA", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("argv,needs", [
    (["run", "--models", "full", "--suites", "lambada", "--limit", "2", "--store", "st"], "Hugging Face Hub"),
    (["run", "--models", "full", "--suites", "sniah", "--num-samples", "1", "--context-length", "1024",
      "--store", "st"], "needs a local data folder"),
    (["demo"], "Hugging Face Hub"),
    (["train", "--steps", "2", "--out", "o"], "the books corpus needs a local data folder"),
    (["generation", "--device", "cpu", "--out-dir", "g"], "S-NIAH-1's prompts (paul_graham_essays/) needs a local"),
], ids=["hub-suite", "long-suite", "demo", "train", "generation"])
def test_without_data_and_network_each_command_answers_in_one_line(no_data_folder, capsys, argv, needs):
    assert golinear(argv) == 2
    full = capsys.readouterr().err
    err = [ln for ln in full.strip().splitlines() if ln.startswith("golinear ")]
    assert "Traceback" not in full and err and needs in err[-1], err
    assert all(k in err[-1] for k in ("--data-dir", "GOLINEAR_DATA", "golinear data fetch")), err


def test_another_transformers_version_pins_the_weights_tensors(tmp_path, monkeypatch):
    """Under a transformers other than the one the file pins were taken with (its config.json names its own version),
    the conversion is accepted by its weights' tensors; tensors edited with the record rewritten are still refused."""
    import transformers

    from golinear.models.backbones import backbone, backbone_content
    genuine = real_conversion()
    assert backbone_content.weights_sha256(genuine / "model.safetensors") == backbone_content.WEIGHTS_SHA256
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    monkeypatch.setenv("GOLINEAR_CACHE", str(tmp_path))
    target = tmp_path / "smollm2-135m-instruct"
    link_conversion(genuine, target)
    config = json.loads((genuine / "config.json").read_text())
    (target / "config.json").unlink()
    (target / "config.json").write_text(json.dumps({**config, "transformers_version": "5.17.0"}))
    backbone_content.write_record(target, backbone_content.GGUF_SHA256)
    assert backbone.smollm2_path() == target  # another version's config.json: accepted by the tensors
    weights = bytearray((genuine / "model.safetensors").read_bytes())
    weights[-4:] = b"\x00\x00\x80\x3f"  # one weight set to 1.0
    (target / "model.safetensors").unlink()
    (target / "model.safetensors").write_bytes(bytes(weights))
    backbone_content.write_record(target, backbone_content.GGUF_SHA256)
    with pytest.raises(ValueError, match="the tensors of model.safetensors have sha256 .* golinear pins"):
        backbone.smollm2_path()


def test_a_conversion_under_another_transformers_is_checked_where_it_was_written(tmp_path, monkeypatch):
    """Converting under a transformers other than the pinned one checks the weights' tensors in the folder being
    written, before it is moved into place (GPU machines come with their own transformers). The dequantization stands
    in as loading this machine's genuine conversion: the same weights, in a second instead of a minute."""
    import torch
    import transformers

    from golinear.models.backbones import backbone, backbone_content
    genuine = real_conversion()
    load_model, load_tokenizer = transformers.AutoModelForCausalLM.from_pretrained, transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: load_model(str(genuine), dtype=torch.float32))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: load_tokenizer(str(genuine)))
    # another version than the pinned one (loading a model resets transformers.__version__, so the pin moves)
    monkeypatch.setattr(backbone_content, "CONVERTED_WITH", "0.0.0")
    target = tmp_path / "smollm2-135m-instruct"
    backbone.convert_smollm2(target)
    assert backbone_content.weights_sha256(target / "model.safetensors") == backbone_content.WEIGHTS_SHA256
    assert backbone_content.recorded(target)


@pytest.mark.slow
def test_the_backbone_converts_to_its_pinned_files_offline(tmp_path):
    """An offline cluster (HF_HUB_OFFLINE=1, as `golinear bundle`'s run.sh sets) converts the GGUF to the pinned
    files: transformers would otherwise write local_files_only=true into tokenizer_config.json, a file that is not
    the pinned one. A fresh process, since the hub's offline flag is read when it is imported."""
    import subprocess
    import sys
    code = ("import pathlib, sys; from golinear.models.backbones import backbone; "
            "backbone.convert_smollm2(pathlib.Path(sys.argv[1]))")
    env = dict(os.environ, HF_HUB_OFFLINE="1", GOLINEAR_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "smollm2")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"local_files_only": false' in (tmp_path / "smollm2" / "tokenizer_config.json").read_text()
