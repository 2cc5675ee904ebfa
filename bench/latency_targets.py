"""The latency targets, checked in one place from latency.csv's rows (no torch).

Each linearized configuration (every config but the two full-attention baselines) is checked within its group
(model, weights, dtype, device, batch) against the baselines of the same run, only where the rows exist
(status ok, the value measured): a target whose rows are missing is not listed rather than called met.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

FULL, STATIC_FULL = "full", "full-static"  # HF's own eager model; the same backbone through models.fast_decode
BASELINES = (FULL, STATIC_FULL)
GROUP = ["model", "weights", "dtype", "device", "batch"]


def _at_longest_common(rows, base, column: str, speed_up: bool):
    """(ratio, where) at the longest length both have a value for: base/rows for a speed-up, else rows/base."""
    if base is None:
        return None
    have = rows[column].dropna().index.intersection(base[column].dropna().index)
    if len(have) == 0:
        return None
    L = max(have)
    a, b = rows[column][L], base[column][L]
    return (b / a if speed_up else a / b), f"at {int(L)}"


def prefill_vs_full(rows, bases):
    return _at_longest_common(rows, bases.get(FULL), "prefill_s", speed_up=True)


def decode_vs_static_full(rows, bases):
    return _at_longest_common(rows, bases.get(STATIC_FULL), "decode_ms_per_token", speed_up=True)


def peak_memory_vs_full(rows, bases):
    return _at_longest_common(rows, bases.get(FULL), "peak_gib", speed_up=False)


def decode_spread(rows, bases):
    """max/min - 1 of the decode time over the lengths measured (flat: independent of the prompt length)."""
    dec = rows.decode_ms_per_token.dropna()
    if len(dec) < 2:
        return None
    return dec.max() / dec.min() - 1, f"over {int(dec.index.min())}..{int(dec.index.max())}"


def worst_decode_vs_bound(rows, bases):
    """The largest measured / bound ratio over the lengths (rows from before the bound have none)."""
    ratio = rows["decode_vs_bound"].dropna() if "decode_vs_bound" in rows else rows.index[:0]
    return None if len(ratio) == 0 else (ratio.max(), f"at {int(ratio.idxmax())}")


@dataclass(frozen=True)
class Target:
    name: str
    measure: Callable  # (a config's rows indexed by length, {baseline: its rows}) -> (value, where) or None
    threshold: float
    at_least: bool  # met when value >= threshold (else value <= threshold)
    unit: str  # "x" (a ratio) or "%"
    batch: int | None = None  # checked at this batch size only (None: at every one)

    def met(self, value: float) -> bool:
        return value >= self.threshold if self.at_least else value <= self.threshold

    def shown(self, value: float) -> str:
        return f"{100 * value:.1f}%" if self.unit == "%" else f"{value:.2f}x"

    def wanted(self) -> str:
        shown = f"{100 * self.threshold:g}%" if self.unit == "%" else f"{self.threshold:g}x"
        return ("≥ " if self.at_least else "≤ ") + shown


TARGETS = (
    Target("prefill speed-up vs full", prefill_vs_full, 1.35, True, "x"),
    Target("decode speed-up vs full-static", decode_vs_static_full, 3.0, True, "x"),
    Target("decode spread over lengths (max/min - 1)", decode_spread, 0.10, False, "%"),
    Target("peak memory vs full", peak_memory_vs_full, 0.4, False, "x"),
    Target("decode vs bandwidth bound, worst length (stretch)", worst_decode_vs_bound, 2.0, False, "x", batch=8),
)


def target_checks(df):
    """One row per (group, linearized config, target) that the CSV has the rows for: the value, where it was
    taken, the target and whether it is met."""
    import pandas as pd
    out = []
    ok = df[df.status == "ok"]
    for key, g in ok.groupby(GROUP):
        group = dict(zip(GROUP, key))
        bases = {b: g[g.config == b].set_index("length") for b in BASELINES if (g.config == b).any()}
        for config, c in g[~g.config.isin(BASELINES)].groupby("config"):
            c = c.set_index("length")
            for t in TARGETS:
                if t.batch is not None and int(group["batch"]) != t.batch:
                    continue
                got = t.measure(c, bases)
                if got is None or not math.isfinite(got[0]):
                    continue
                value, where = got
                out.append(dict(group, config=config, target=t.name, value=f"{t.shown(value)} {where}",
                                wanted=t.wanted(), met="met" if t.met(value) else "not met"))
    return pd.DataFrame(out, columns=GROUP + ["config", "target", "value", "wanted", "met"])


def checks_markdown(df) -> list[str]:
    """The target checks as Markdown lines (nothing when no configuration has the rows to check)."""
    checks = target_checks(df)
    if checks.empty:
        return []
    checks = checks.drop(columns=["weights", "dtype"])
    return ["## Targets, from the rows above", "",
            "Each linearized configuration against the baselines of the same run (model, weights, dtype, "
            "device, batch); ratios at the longest length both have.", "",
            checks.to_markdown(index=False), ""]
