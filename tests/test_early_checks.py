"""Every check that can run before a model loads does, as one line with exit code 2 and
nothing written (the rows of the issue's hostile-user table that end in an error)."""
import json
import shutil
from pathlib import Path

import pytest

from golinear.bench.run.plan import default_data_dir
from golinear.bench.cli import main as golinear

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(default_data_dir() or "/nonexistent")
CKPT = ROOT / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"


def one_line_error(capsys, argv, expect):
    code = golinear(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err and err[-1].startswith(f"golinear {argv[0]}: error:") and expect in err[-1], err
    assert not any("Traceback" in line for line in err)


def damaged_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    shutil.copy(CKPT / "config.json", ck / "config.json")
    (ck / "new_params.safetensors").write_bytes((CKPT / "new_params.safetensors").read_bytes()[:100_000])
    return ck


def damaged_data(tmp_path):
    copy = tmp_path / "data"
    for sub in ("arc", "piqa", "hellaswag", "winogrande"):
        shutil.copytree(DATA / sub, copy / sub)
    shutil.copy(DATA / "SHA256SUMS", copy / "SHA256SUMS")
    easy = copy / "arc" / "ARC-Easy-test.jsonl"
    lines = easy.read_text().splitlines()
    row = json.loads(lines[0])
    row["answerKey"] = "B" if row["answerKey"] == "A" else "A"
    easy.write_text("\n".join([json.dumps(row)] + lines[1:]) + "\n")
    return copy


RUN_ROWS = [
    (["--models", "gdn-default", "--suites", "sniah", "--budgets", "128", "--sinks", "-1"], "--sinks -1"),
    (["--models", "gdn-default,window=100000", "--suites", "cr"], "window=100000 exceeds"),
    (["--models", "full", "--suites", "sniah", "--num-samples", "0"], "--num-samples 0"),
    (["--models", "full", "--suites", "cr", "--batch-size", "abc"], "--batch-size 'abc'"),
    (["--models", "full", "--suites", "cr", "--batch-size", "0"], "--batch-size '0'"),
    (["--models", "full,base=../../etc", "--suites", "cr"], "base '../../etc'"),
    (["--models", "mechanism=gdn,keep_full=0.5,select=metrics", "--suites", "cr"], "unknown layer selection"),
    (["--models", "NOTCKPT", "--suites", "cr"], "not a golinear checkpoint"),
    (["--models", "TRUNCATED", "--suites", "cr"], "new_params.safetensors' are unreadable"),
    (["--models", "full", "--suites", "cr", "--data-dir", "DAMAGED"], "ARC-Easy-test.jsonl' does not match"),
]


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
@pytest.mark.parametrize("args,expect", RUN_ROWS, ids=[r[1] for r in RUN_ROWS])
def test_run_rejects_before_loading_and_writes_nothing(tmp_path, capsys, args, expect):
    subs = {"NOTCKPT": tmp_path / "folder", "TRUNCATED": None, "DAMAGED": None}
    (tmp_path / "folder").mkdir()
    args = [str(damaged_checkpoint(tmp_path)) if a == "TRUNCATED" else str(damaged_data(tmp_path))
            if a == "DAMAGED" else str(subs[a]) if a in subs else a for a in args]
    one_line_error(capsys, ["run", *args, "--store", str(tmp_path / "store")], expect)
    assert not (tmp_path / "store").exists()


def test_train_rejects_a_bad_mechanism_before_data_and_folder(tmp_path, capsys):
    one_line_error(capsys, ["train", "--mechanism", "bogus", "--out", str(tmp_path / "run")],
                   "unknown mechanism 'bogus'")
    one_line_error(capsys, ["train", "--sinks", "-2", "--out", str(tmp_path / "run")], "sinks=-2: expected a non-negative integer")
    assert not (tmp_path / "run").exists()


def test_diagnose_rejects_before_writing(tmp_path, capsys):
    one_line_error(capsys, ["diagnose", "--fresh", "gdn:bad", "--out", str(tmp_path / "d")], "--fresh 'gdn:bad'")
    one_line_error(capsys, ["diagnose", "--fresh", "bogus", "--out", str(tmp_path / "d")], "unknown mechanism")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("content,expect", [("{}", "no 'cells' list"), ("[]", "found list"),
                                            ('{"cells": [', "not readable JSON"),
                                            ('{"cells": [{"task": "x"}]}', "cells[0] lacks")])
def test_check_rejects_a_malformed_baseline_before_evaluating(tmp_path, capsys, content, expect):
    (tmp_path / "b.json").write_text(content)
    one_line_error(capsys, ["check", "--model", "full", "--baseline", str(tmp_path / "b.json")], expect)


class Payload:
    """What a hostile pytorch_model.bin holds: unpickling it creates the file `path`."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
def test_a_pickled_backbone_is_refused_and_never_opened(tmp_path, capsys):
    """A base folder whose weights are a pytorch_model.bin: one line saying golinear never unpickles and what to
    do, before any model loads (it was an UnpicklingError traceback suggesting weights_only=False)."""
    import pickle
    from _tiny import write_tiny_backbone
    base = write_tiny_backbone(tmp_path / "base")
    for f in base.glob("*.safetensors"):
        f.unlink()
    opened = tmp_path / "unpickled"
    (base / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(opened)))
    words = ("holds its weights as pytorch_model.bin, a pickle, and golinear never unpickles (a pickle can run code); "
             "convert it to safetensors")
    one_line_error(capsys, ["run", "--models", f"full,base={base}", "--suites", "cr", "--store",
                            str(tmp_path / "store")], words)
    one_line_error(capsys, ["train", "--base", str(base), "--out", str(tmp_path / "run")], words)
    assert not opened.exists() and not (tmp_path / "store").exists() and not (tmp_path / "run").exists()


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
@pytest.mark.parametrize("spec,words", [
    ("gdn-default,window=²", "window='²': expected a non-negative integer written in the digits 0-9"),
    ("gdn,full_layers=1+²", "full_layers='1+²': expected layer indices written in the digits 0-9"),
    ("a" * 300, "is 300 bytes, and a file or folder name has at most 255"),
    ("checkpoints/" + "a" * 300, "is 300 bytes, and a file or folder name has at most 255"),
    ("full,base=" + "b" * 256, "base 'bbbb"),
    ("checkpoint=" + "c" * 256, "checkpoint 'cccc"),
    ("gdn-default,window=5" + "a" * 300, "window='5aaaa"),
], ids=["superscript", "full_layers", "long name", "long path", "long base", "long checkpoint",
        "long value"])
def test_odd_spec_text_is_one_line_naming_the_key(tmp_path, capsys, spec, words):
    """A non-ASCII digit names the key and what is allowed (int() failed on '²' unnamed; tests/test_spec.py has
    the digits int() took, such as '٣' as 3); a name over 255 bytes is said as such (it was an OSError traceback,
    Errno 36)."""
    one_line_error(capsys, ["run", "--models", spec, "--suites", "cr", "--store", str(tmp_path / "store")], words)
    assert not (tmp_path / "store").exists()


def test_a_store_path_with_a_long_name_is_one_line(tmp_path, capsys):
    store = tmp_path / ("s" * 256) / "store"
    words = "is 256 bytes, and a file or folder name has at most 255"
    one_line_error(capsys, ["run", "--models", "full", "--suites", "cr", "--store", str(store)], words)
    one_line_error(capsys, ["leaderboard", "--store", str(store)], words)
    one_line_error(capsys, ["store", "merge", str(tmp_path), "--store", str(store)], words)


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
def test_a_device_this_machine_lacks_is_refused_before_the_backbone_is_read(tmp_path, capsys, monkeypatch):
    import torch
    from golinear.models.backbones import backbone
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    read = []  # on a fresh machine the first read converts the GGUF (about a minute) before any error could show
    monkeypatch.setattr(backbone, "smollm2_path", lambda: read.append(1) or (_ for _ in ()).throw(AssertionError))
    code = golinear(["run", "--models", "press=kvzip,kv_budget=256", "--suites", "sniah", "--device", "cuda:0",
                     "--store", str(tmp_path / "store")])
    err = capsys.readouterr().err
    assert code == 2 and "CUDA is not available" in err.strip().splitlines()[-1], err
    assert not read  # the backbone is read after the device check
    assert not (tmp_path / "store").exists()
