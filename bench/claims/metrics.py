"""How a score is read: its unit, its direction, the two margins every rule uses, and the verdict words.

Why first: the rules, the evidence and the renderers all speak in these terms; this module imports none of them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """How a score is read: unit, direction, and the two margins every rule uses."""
    name: str
    unit: str
    higher_better: bool
    near: float  # "~": within this many units
    far: float  # ">>": ahead by at least this many
    digits: int = 2


CE = Metric("held-out CE", "nats", False, 0.02, 0.5, 3)
METRICS = {m.name: m for m in (
    Metric("CR", "points", True, 1.0, 5.0), Metric("LAMBADA", "points", True, 1.0, 5.0),
    Metric("S-NIAH", "points", True, 1.0, 5.0), Metric("RULER", "points", True, 1.0, 5.0), CE)}


VERDICTS = ("holds", "does not hold", "not measured")  # a verdict cell adds its caveats in brackets (caveats.py)


def better(a: float, b: float, m: Metric) -> float:
    """How far a is ahead of b in m's direction (negative: behind)."""
    return a - b if m.higher_better else b - a


def verdict(ok: bool | None) -> str:
    return VERDICTS[2] if ok is None else VERDICTS[0 if ok else 1]
