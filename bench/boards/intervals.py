"""95 % intervals for the tables: of a mean over samples, and of the paired difference of two rows on the same samples.

Why: 50 samples a task put about ±6 points (±13 at the 95 % level) on an S-NIAH score, so two rows a few points
apart are not told apart by their means alone. A row's interval is its mean ± 1.96 standard errors (lm-eval's
stderr of the mean over samples; a mean of tasks combines theirs as independent). Two rows measured on the same
samples are compared by the difference on each sample (paired): its mean ± 1.96 standard errors; a winner is named
only where that interval excludes 0.
"""
from __future__ import annotations

import math

Z = 1.96


def mean_stderr(stderrs: list) -> float | None:
    """The standard error of the mean of independent means with these standard errors (None if one is missing)."""
    if not stderrs or any(s is None or (isinstance(s, float) and math.isnan(s)) for s in stderrs):
        return None
    return math.sqrt(sum(s * s for s in stderrs)) / len(stderrs)


def half_width(stderrs: list) -> float | None:
    """The 95 % half-width of that mean."""
    se = mean_stderr(stderrs)
    return None if se is None else Z * se


def wilson(p: float, n: int) -> tuple[float, float]:
    """The 95 % Wilson interval (0..1) of a proportion p of n samples: where every sample scored alike (p = 0 or
    1) the standard error is 0, and this interval is the honest one (0 of 50: [0, 0.071])."""
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def task_stderr(value: float, stderr: float | None, n: int | None) -> float | None:
    """A pass/fail score's standard error, or where all n samples scored alike (0 or 100 points, stderr 0) the
    Wilson interval's half-range / 1.96 in points (what a mean over tasks combines)."""
    if stderr == 0 and n and value in (0.0, 100.0):
        lo, hi = wilson(value / 100, int(n))
        return 100 * (hi - lo) / 2 / Z
    return stderr


def paired(a: dict[str, float], b: dict[str, float]) -> dict | None:
    """a - b over the samples both hold (keys: sample ids): {n, diff, lo, hi}; None below 2 shared samples."""
    shared = sorted(set(a) & set(b))
    if len(shared) < 2:
        return None
    d = [a[k] - b[k] for k in shared]
    n = len(d)
    mean = sum(d) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)
    return {"n": n, "diff": mean, "lo": mean - Z * se, "hi": mean + Z * se}


def verdict(p: dict | None, a: str, b: str) -> str:
    """Which row is better, as far as the paired interval tells."""
    if p is None:
        return "no paired comparison (the cells hold no per-sample scores on shared samples)"
    span = f"{p['diff']:+.2f} points [{p['lo']:+.2f}, {p['hi']:+.2f}] over {p['n']} paired samples"
    if p["lo"] > 0:
        return f"{a} better: {span}"
    if p["hi"] < 0:
        return f"{b} better: {span}"
    return f"no difference: {span}"
