"""What a verdict rests on, named in its cell: "holds (one seed; fitted to the test format)".

Why: a verdict on held-out cross-entropy is not one on the paper's metric, a margin from one seed has no spread to
measure it against, and a scorer fitted on the test's own needle format is tuned to the test. A reader of the
verdict column alone should see each of these without reading the row.
"""
from __future__ import annotations

from golinear.bench.claims.metrics import CE, VERDICTS
from golinear.bench.claims.roles import fitted_to_test

FITTED, ONE_SEED, CE_ONLY = "fitted to the test format", "one seed", "on held-out CE only"
CAVEATS = (FITTED, ONE_SEED, CE_ONLY)  # the order a cell names them in


def untrained(target: str) -> bool:
    """Full attention and the untrained window have no seeds to count."""
    return target == "full" or target.startswith("none@")


def caveats(metric: str, targets: dict, seeds: dict) -> set:
    """The caveats of a verdict decided on `metric` from roles {role: target} with {role: number of seeds}."""
    out = {CE_ONLY} if metric == CE.name else set()
    if any(seeds.get(r) == 1 and not untrained(t) for r, t in targets.items()):
        out.add(ONE_SEED)
    if any(fitted_to_test(t) for t in targets.values()):
        out.add(FITTED)
    return out


def cell(ok: bool | None, found: set) -> str:
    """The verdict cell: 'holds', 'does not hold' or 'not measured', the caveats after it in brackets."""
    named = [c for c in CAVEATS if c in found]
    return VERDICTS[2] if ok is None else f"{VERDICTS[0 if ok else 1]}" + (f" ({'; '.join(named)})" if named else "")


def base(verdict_cell: str) -> str:
    """The verdict of a cell without its caveats."""
    return verdict_cell.split(" (", 1)[0]
