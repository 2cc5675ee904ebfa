"""The repository's scripts (scripts/..., no package) imported by path for their tests."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(relative: str, register: bool = False):
    """scripts/<relative> as a new module named after its file; `register`: also in sys.modules, where a script's
    dataclasses and pickled classes are looked up by that name."""
    path = SCRIPTS / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod
