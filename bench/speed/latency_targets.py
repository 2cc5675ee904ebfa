"""The latency targets, checked in one place from latency.csv's rows (no torch).

Each linearized configuration (every config but the full-attention baselines and the KV-cache compression rows,
which are neither) is checked within its group
(model, weights, dtype, device, batch) against the strongest baseline of the same run, only where the rows exist
(status ok, the value measured): a target whose rows are missing is not listed rather than called met. The
strongest baseline is, at each length, the full-attention row with the least prefill time, decode time or peak
memory (whichever the ratio is of); `against_fastest_full` states every linearized row that way, length by length,
beside its and the baseline's distance to the decode bandwidth bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

FULL, STATIC_FULL = "full", "full-static"  # HF's own eager model; the same backbone through models.decoding.fast_decode
STATIC_FULL_SDPA = "full-static-sdpa"  # that decoder's step with SDPA over the whole KV buffer (FastDecoder "sdpa")
BASELINES = (FULL, STATIC_FULL, STATIC_FULL_SDPA)
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


def best_full(bases: dict, column: str):
    """Per length, the least value of `column` over the full-attention rows, and which config has it (a DataFrame
    indexed by length with columns `column` and "config"), or None without such rows."""
    import pandas as pd
    have = [b[[column]].assign(config=name) for name, b in bases.items() if column in b and b[column].notna().any()]
    if not have:
        return None
    both = pd.concat(have).dropna(subset=[column])
    return both.rename_axis("length").reset_index().sort_values(column, kind="stable").groupby("length").first()


def prefill_vs_full(rows, bases):
    return _at_longest_common(rows, best_full(bases, "prefill_s"), "prefill_s", speed_up=True)


def decode_vs_fastest_full(rows, bases):
    return _at_longest_common(rows, best_full(bases, "decode_ms_per_token"), "decode_ms_per_token", speed_up=True)


def peak_memory_vs_full(rows, bases):
    return _at_longest_common(rows, best_full(bases, "peak_gib"), "peak_gib", speed_up=False)


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
    Target("prefill speed-up vs the fastest full attention", prefill_vs_full, 1.35, True, "x"),
    Target("decode speed-up vs the fastest full attention", decode_vs_fastest_full, 3.0, True, "x"),
    Target("decode spread over lengths (max/min - 1)", decode_spread, 0.10, False, "%"),
    Target("peak memory vs the smallest full attention", peak_memory_vs_full, 0.4, False, "x"),
    Target("decode vs bandwidth bound, worst length (stretch)", worst_decode_vs_bound, 2.0, False, "x", batch=8),
)


def is_press(df):
    """Which rows are KV-cache compression rows (a press name in the `press` column; rows from before the column
    have none): neither a full-attention baseline nor a linearized configuration."""
    if "press" not in df:
        return df.config != df.config  # all False
    return df.press.notna() & (df.press.astype(str).str.strip() != "")


def _groups(df):
    """(group fields, {baseline: its rows by length}, {linearized config: its rows by length}) per group; press
    rows are in neither."""
    ok = df[(df.status == "ok") & ~is_press(df)]
    for key, g in ok.groupby(GROUP):
        bases = {b: g[g.config == b].set_index("length") for b in BASELINES if (g.config == b).any()}
        configs = {config: c.set_index("length") for config, c in g[~g.config.isin(BASELINES)].groupby("config")}
        yield dict(zip(GROUP, key)), bases, configs


def against_fastest_full(df):
    """Every linearized row against the fastest full-attention row of its run at the same length (prefill and
    decode apart: the fastest may differ), with both rows' decode / bandwidth bound."""
    import pandas as pd
    out = []
    for group, bases, configs in _groups(df):
        pre, dec = best_full(bases, "prefill_s"), best_full(bases, "decode_ms_per_token")
        for config, c in configs.items():
            for length, r in c.iterrows():
                row = dict(group, config=config, length=int(length))
                if pre is not None and length in pre.index and r.prefill_s == r.prefill_s:
                    row.update(prefill_vs=pre.config[length], prefill_speed_up=pre.prefill_s[length] / r.prefill_s)
                if dec is not None and length in dec.index and r.decode_ms_per_token == r.decode_ms_per_token:
                    d = bases[dec.config[length]].loc[length]
                    row.update(decode_vs=dec.config[length],
                               decode_speed_up=dec.decode_ms_per_token[length] / r.decode_ms_per_token,
                               decode_vs_bound=r.get("decode_vs_bound"), full_decode_vs_bound=d.get("decode_vs_bound"))
                out.append(row)
    return pd.DataFrame(out, columns=GROUP + ["config", "length", "prefill_vs", "prefill_speed_up", "decode_vs",
                                              "decode_speed_up", "decode_vs_bound", "full_decode_vs_bound"])


def against_fastest_markdown(df, group: dict) -> list[str]:
    """against_fastest_full's rows of one group as a Markdown table (nothing without linearized rows)."""
    t = against_fastest_full(df)
    for k, v in group.items():
        t = t[t[k].astype(str) == str(v)]
    if t.empty:
        return []
    num = (lambda v, f: "-" if v is None or v != v else format(v, f))  # noqa: E731
    lines = ["Each linearized row against the fastest full-attention row of this run at the same length (speed-up "
             "= its time / the row's), beside both rows' decode / bandwidth bound:", "",
             "| length | config | prefill speed-up | vs | decode speed-up | vs | decode/bound | that full row's "
             "decode/bound |", "|---:|---|---:|---|---:|---|---:|---:|"]
    for _, r in t.sort_values(["config", "length"]).iterrows():
        lines.append(f"| {r.length} | {r.config} | {num(r.prefill_speed_up, '.2f')}x | {r.prefill_vs} "
                     f"| {num(r.decode_speed_up, '.2f')}x | {r.decode_vs} | {num(r.decode_vs_bound, '.2f')} "
                     f"| {num(r.full_decode_vs_bound, '.2f')} |")
    return lines + [""]


def target_checks(df):
    """One row per (group, linearized config, target) that the CSV has the rows for: the value, where it was
    taken, the target and whether it is met."""
    import pandas as pd
    out = []
    for group, bases, configs in _groups(df[df.device != "cpu"]):  # CPU timings: too noisy for GPU targets
        for config, c in configs.items():
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


PRESS_VS = "gdn-default"  # a press row's decode is held to it: both decode over a cache of about the same size
PRESS_GAP = 0.15  # at most this much further from the bandwidth bound


def press_checks(df):
    """One row per (GPU group, press config) with gdn-default measured beside it: the press's decode/bound minus
    gdn-default's at the same length, at the length where it is largest."""
    import pandas as pd
    ok = df[(df.status == "ok") & (df.device != "cpu")] if "decode_vs_bound" in df else df.iloc[:0]
    out = []  # (rows from before the bound columns have nothing to check)
    for key, g in ok.groupby(GROUP):
        lin = g[g.config == PRESS_VS].set_index("length")["decode_vs_bound"].dropna()
        for config, p in g[is_press(g)].groupby("config"):
            gap = (p.set_index("length")["decode_vs_bound"] - lin).dropna()
            if len(gap):
                at = gap.idxmax()
                out.append(dict(zip(GROUP, key), config=config,
                                target=f"decode/bound minus {PRESS_VS}'s, worst length",
                                value=f"{gap[at]:+.2f} at {int(at)}", wanted=f"≤ {PRESS_GAP:g}",
                                met="met" if gap[at] <= PRESS_GAP else "not met"))
    return pd.DataFrame(out, columns=GROUP + ["config", "target", "value", "wanted", "met"])


def checks_markdown(df) -> list[str]:
    """The target checks as Markdown lines (nothing when no configuration has the rows to check)."""
    import pandas as pd
    checks, presses = target_checks(df), press_checks(df)
    if checks.empty and presses.empty:
        return []
    checks = pd.concat([c for c in (checks, presses) if not c.empty]).drop(columns=["weights", "dtype"])
    return ["## Targets, from the GPU rows above", "",
            "Each linearized configuration against the strongest full-attention row of the same run (model, "
            "weights, dtype, device, batch): the least prefill time, decode time or peak memory at that length; "
            f"ratios at the longest length both have. Each press row's decode against {PRESS_VS}'s in the same "
            "group, both as measured / bandwidth bound, at the length where the press is furthest behind.", "",
            checks.to_markdown(index=False), ""]
