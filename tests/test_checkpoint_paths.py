"""A shipped checkpoint is found by its folder name from any working directory; a missing one names where it looked."""
import subprocess
import sys
from pathlib import Path

import pytest

from golinear.models.spec.checkpoint_paths import SHIPPED, resolve_checkpoint
from golinear.models.spec import ModelSpec

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"


def test_a_shipped_checkpoint_resolves_by_name_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_checkpoint("gdn-w56-s8-sc") == DEFAULT
    assert resolve_checkpoint("smollm2-135m/gdn-w56-s8-sc") == DEFAULT
    spec = ModelSpec.from_string("gdn-w56-s8-sc")
    assert spec.checkpoint == str(DEFAULT)
    assert spec.store_key().startswith("base=smollm2-135m,checkpoint=gdn-w56-s8-sc,checkpoint_files=")
    assert ModelSpec.from_string("gdn-w56-s8-sc,window=28,retain=28").checkpoint == str(DEFAULT)
    assert ModelSpec.from_string("checkpoint=gdn-w56-s8-sc").checkpoint == str(DEFAULT)
    # a preset keeps its meaning; the shipped strict-GDN folder is reached through its backbone folder
    assert ModelSpec.from_string("gdn").checkpoint is None
    assert ModelSpec.from_string("smollm2-135m/gdn").checkpoint == str(SHIPPED / "smollm2-135m" / "gdn")


def test_a_folder_in_the_working_directory_comes_first(tmp_path, monkeypatch):
    import shutil
    shutil.copytree(DEFAULT, tmp_path / "gdn-w56-s8-sc")
    monkeypatch.chdir(tmp_path)
    assert ModelSpec.from_string("gdn-w56-s8-sc").checkpoint == str(tmp_path / "gdn-w56-s8-sc")


def test_extra_checkpoint_folders_from_the_environment(tmp_path, monkeypatch):
    import shutil
    shutil.copytree(DEFAULT, tmp_path / "mine" / "my-run")
    monkeypatch.setenv("GOLINEAR_CHECKPOINTS", str(tmp_path / "mine"))
    assert resolve_checkpoint("my-run") == tmp_path / "mine" / "my-run"


def test_a_missing_checkpoint_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        ModelSpec.from_string("checkpoint=no-such-run")
    msg = str(e.value)
    assert "'no-such-run'" in msg and str(tmp_path / "no-such-run") in msg
    assert str(SHIPPED / "no-such-run") in msg and str(SHIPPED / "smollm2-135m" / "no-such-run") in msg
    with pytest.raises(ValueError) as e:
        ModelSpec.from_string("no-such-run")
    assert str(SHIPPED / "smollm2-135m" / "no-such-run") in str(e.value)


def test_the_cli_refuses_a_missing_checkpoint_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "golinear.bench.cli", "run", "--models", "checkpoint=no-such-run",
                        "--suites", "cr", "--store", str(tmp_path / "s")], cwd=tmp_path, capture_output=True,
                       text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "looked in" in lines[0] and str(SHIPPED / "smollm2-135m" / "no-such-run") in lines[0]
    assert not (tmp_path / "s").exists()
