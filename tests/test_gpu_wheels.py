"""scripts/gpu/wheels.txt carries every distribution the project needs at run time that the H200 image
lacks (scripts/gpu/device_packages.txt): a missing one (wonderwords, once) fails each evaluation on the device."""
from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(path: Path, column: int) -> set[str]:
    rows = [line.split() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {_norm(Requirement(row[column]).name) for row in rows}


def _missing(carried: set[str], device: set[str]) -> set[str]:
    """Distributions reached from pyproject's dependencies (through what we carry, not through what the device
    has: those bring their own) that neither list holds."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    todo, seen, missing = [Requirement(d) for d in deps], set(), set()
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        if name in seen:
            continue
        seen.add(name)
        if name in device:
            continue
        if name not in carried:
            missing.add(name)
            continue
        for extra in req.extras | {""}:
            for line in metadata.requires(req.name) or []:
                sub = Requirement(line)
                if sub.marker is None or sub.marker.evaluate({"extra": extra, "python_version": "3.12"}):
                    todo.append(sub)
    return missing


def test_the_carried_wheels_cover_what_the_device_lacks():
    carried = _names(ROOT / "scripts/gpu/wheels.txt", 1)
    device = _names(ROOT / "scripts/gpu/device_packages.txt", 0)
    assert _missing(carried, device) == set()
    assert _missing(carried - {"wonderwords"}, device) == {"wonderwords"}  # the check can fail
