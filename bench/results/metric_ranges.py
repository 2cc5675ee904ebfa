"""Which values a stored metric can take, so a cell that cannot be right (a NaN, an accuracy of 7.5, a `value`
that is not its own metric's) is refused on read, write and merge (bench.results.store.cell_problem) instead of
reaching a leaderboard. lm-eval's accuracies are fractions; the RULER/S-NIAH scores are percentages."""
from __future__ import annotations

import math

FRACTIONS = ("acc", "acc_norm", "exact_match", "f1", "mcc", "brier_score")  # in [0, 1]
PERCENTAGES = ("score", "string_match_all", "string_match_part")  # in [0, 100]
POSITIVE = ("perplexity", "word_perplexity", "byte_perplexity")  # finite and > 0
NON_NEGATIVE = ("bits_per_byte",)


def number_problem(name: str, value) -> str | None:
    """Why `value` cannot be metric `name` ('acc', or lm-eval's 'acc,none'), or None. None is allowed: lm-eval
    reported NaN for it (a finished cell all the same); a stored NaN or infinity is not."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} {value!r} is not a number"
    if not math.isfinite(value):
        return f"{name} {value!r} is not finite"
    base = name.split(",", 1)[0]
    if base in FRACTIONS and not 0.0 <= value <= 1.0:
        return f"{name} {value!r} is outside [0, 1]"
    if base in PERCENTAGES and not 0.0 <= value <= 100.0:
        return f"{name} {value!r} is outside [0, 100]"
    if base in POSITIVE and value <= 0:
        return f"{name} {value!r} is not > 0"
    if base in NON_NEGATIVE and value < 0:
        return f"{name} {value!r} is negative"
    return None


def cell_metrics_problem(cell: dict) -> str | None:
    """The ranges of a cell's value, stderr and every metric, and `value` equal to its own entry in `metrics`."""
    name = cell["metric"]
    problem = number_problem(name, cell.get("value"))
    if problem:
        return f"'value': {problem}"
    stderr = cell.get("stderr")
    if isinstance(stderr, float) and (math.isnan(stderr) or stderr < 0):  # an infinite stderr is lm-eval's to give
        return f"'stderr' {stderr!r} is not a non-negative number"
    for key, m in cell["metrics"].items():
        problem = number_problem(key, m.get("value"))
        if problem:
            return f"'metrics': {problem}"
    own = cell["metrics"].get(f"{name},{cell.get('filter') or 'none'}")
    if own is not None and "value" in cell and own.get("value") != cell["value"]:
        return f"'value' {cell.get('value')!r} differs from its metric's {own.get('value')!r} in 'metrics'"
    if cell["n"] < 1:
        return f"'n' {cell['n']} is not at least 1"
    size = cell.get("n_task")  # the task's size as lm-eval counted it (cells written since it was recorded)
    if size is not None:
        full = (cell.get("key") or {}).get("config", {}).get("limit") is None
        if isinstance(size, bool) or not isinstance(size, int) or cell["n"] > size or (full and cell["n"] != size):
            return f"'n' {cell['n']} does not fit the task's size {size!r} ({'full set' if full else 'a limit'})"
    return None
