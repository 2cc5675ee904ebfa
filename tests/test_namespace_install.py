"""golinear installs under one namespace: beside another project's top-level `models`, both import.

Why: the folders are named bench, models and tasks, names other projects use for their own top-level packages;
installed, they are golinear.bench, golinear.models and golinear.tasks (pyproject's package-dir), so a user's
`models` package and golinear's never shadow each other. Built as a wheel (what `pip install golinear` gets, not
the editable finder) into a fresh virtual environment; the heavy dependencies come from the running interpreter's
site-packages through a .pth line, so nothing but the two packages is installed.
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run(*cmd, cwd=None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          env=env | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv with golinear's wheel and a tiny package `tinymodels` whose import name is `models`."""
    tmp = tmp_path_factory.mktemp("ns")
    wheels = tmp / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", wheels, ROOT)
    tiny = tmp / "tiny"
    (tiny / "models").mkdir(parents=True)
    (tiny / "models" / "__init__.py").write_text('WHO = "tiny"\n')
    (tiny / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=61"]\n'
                                         'build-backend = "setuptools.build_meta"\n\n'
                                         '[project]\nname = "tinymodels"\nversion = "0.0.1"\n\n'
                                         '[tool.setuptools]\npackages = ["models"]\n')
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", wheels, tiny)
    env = tmp / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", env)
    py = env / "bin" / "python"
    purelib = Path(run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    # the dependencies (torch, transformers, lm-eval, ...) of the interpreter running this test, after the venv's own
    deps = [p for p in site.getsitepackages() + sys.path if p.endswith("-packages") and Path(p).is_dir()]
    (purelib / "zz_dependencies.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    golinear_whl = next(wheels.glob("golinear-*.whl"))
    tiny_whl = next(wheels.glob("tinymodels-*.whl"))
    run(sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", golinear_whl, tiny_whl) \
        if pip_has_python_option() else install_by_unzip(purelib, env, golinear_whl, tiny_whl)
    return env, golinear_whl


def pip_has_python_option() -> bool:
    return "--python" in subprocess.run([sys.executable, "-m", "pip", "--help"], capture_output=True,
                                        text=True).stdout


def install_by_unzip(purelib: Path, env: Path, *wheels: Path) -> None:
    """A wheel is a zip of its install tree (pure Python: no compiled parts), and an entry point a small script."""
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            z.extractall(purelib)


def test_the_wheel_holds_one_namespace(venv):
    _, whl = venv
    names = zipfile.ZipFile(whl).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"golinear"}, tops
    assert "golinear/models/spec/schema.py" in names and "golinear/bench/cli.py" in names
    assert any(n.startswith("golinear/tasks/") and n.endswith(".yaml") for n in names)  # the task YAMLs ship
    # so do data fetch's source lists and the demo's passage
    assert {"golinear/bench/offline/data_files.tsv", "golinear/bench/offline/books_files.tsv",
            "golinear/bench/demo_passage.txt"} <= set(names)


def test_golinear_and_another_models_package_both_import(venv, tmp_path):
    env, _ = venv
    code = ("import models, golinear.models.spec, golinear.bench.cli, golinear.tasks; "
            "import golinear.models.attention.layers as layers; "
            "assert models.WHO == 'tiny', models.__file__; "
            "assert '/golinear/models/' in golinear.models.spec.__file__; "
            "assert 'site-packages/golinear/' in layers.__file__, layers.__file__; "
            "print(models.__file__, golinear.models.__path__[0])")
    out = run(env / "bin" / "python", "-c", code, cwd=tmp_path)  # cwd: no repository folder on the path
    tiny, ours = out.split()
    assert tiny.endswith("site-packages/models/__init__.py") and ours.endswith("site-packages/golinear/models")


def test_the_console_command_runs_from_the_namespace(venv, tmp_path):
    env, _ = venv
    code = "import sys; from golinear.bench.cli import main; sys.argv = ['golinear', '--help']; main()"
    assert "COMMAND" in run(env / "bin" / "python", "-c", code, cwd=tmp_path)
