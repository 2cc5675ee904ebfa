"""The hostile-user cases of docs/store.md's second table: each refused or repaired in one line, nothing
half-written (early checks, damaged request caches, a full disk, impossible scores, Ctrl-C)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import main as golinear
from bench.plan import default_data_dir

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
    from tasks.standard import local_data
    link = tmp_path / "shared-link"
    link.symlink_to(DATA.resolve(), target_is_directory=True)
    monkeypatch.setattr(local_data, "DEFAULT_DATA_DIR", link)
    monkeypatch.delenv(local_data.ENV_VAR, raising=False)
    assert local_data.resolve_data_dir(None) == local_data.resolve_data_dir(str(link)) == str(DATA.resolve())
