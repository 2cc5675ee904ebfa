"""The whole trade-off at each budget in one table: the better family on S-NIAH and what each side costs to run.

Why: the comparison's verdict says which family keeps more of the needle at a budget; a user choosing also weighs
what the press pays for it (a full-attention prefill, so peak memory that grows with the prompt, and KVzip's extra
passes) against the linearized model. The scores are the current (not superseded) table's paired comparison; the
costs are `golinear latency` rows at Llama-3.1-8B dimensions in latency.csv: the best press at that budget, exactly
as it ran (a press measured at another budget is not borrowed), and gdn-default, the linearized configuration
measured at those dimensions, on the same card, prompt length and batch.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

LINEARIZED = "gdn-default"  # the paper's default recipe (window 56 + 8 sinks) at 8B dimensions
MODEL = "llama-3.1-8b"


def _cost_rows(csv_path: Path) -> pd.DataFrame:
    """The GPU rows at 8B dimensions that measured something, indexed by (device, config, length, batch)."""
    if not Path(csv_path).exists():
        return pd.DataFrame()
    df = pd.read_csv(csv_path)
    df = df[(df["model"] == MODEL) & (df["device"] != "cpu") & (df["status"] == "ok")]
    return df.drop_duplicates(["device", "config", "length", "batch"], keep="last").set_index(
        ["device", "config", "length", "batch"])


def _where(costs: pd.DataFrame, presses: list[str]) -> tuple[str, int, int] | None:
    """(card, length, batch) to state the costs at: the card that measured most of these presses (else any card
    with the linearized row), its longest length where the linearized row was measured, batch 1."""
    if costs.empty:
        return None
    have = costs.reset_index()
    lin = have[(have["config"] == LINEARIZED) & (have["batch"] == 1)]
    if lin.empty:
        return None
    hits = have[have["config"].isin(presses)].groupby("device").size()
    cards = [d for d in hits.sort_values(ascending=False).index if d in set(lin["device"])]
    card = cards[0] if cards else lin["device"].iloc[-1]
    return card, int(lin[lin["device"] == card]["length"].max()), 1


def _cost(costs: pd.DataFrame, where, config: str) -> str:
    card, length, batch = where
    if (card, config, length, batch) not in costs.index:
        return "not measured | | "
    r = costs.loc[(card, config, length, batch)]
    return f"{r['prefill_s']:.2f} | {r['decode_ms_per_token']:.2f} ({r['decode_vs_bound']:.2f}x) | {r['peak_gib']:.2f} "


def markdown(paired: pd.DataFrame, latency_csv: Path) -> str:
    """A table per budget of the current setting, or "" without a paired comparison there."""
    cur = paired[~paired["superseded"].astype(bool)] if len(paired) else paired
    if not len(cur):
        return ""
    costs = _cost_rows(latency_csv)
    where = _where(costs, [f"{p} @{b}" for p, b in zip(cur["press"], cur["budget"])])
    head = ("| budget | best press | S-NIAH | best linearized | S-NIAH | press - linearized [95 %] | answer |"
            + (" press prefill s | press decode ms/token (x bound) | press peak GiB |"
               f" {LINEARIZED} prefill s | {LINEARIZED} decode ms/token (x bound) | {LINEARIZED} peak GiB |"
               if where else ""))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for _, r in cur.iterrows():
        diff = (f"{r['difference']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}]" if pd.notna(r.get("difference"))
                else "no paired samples")
        line = (f"| {r['budget']} | {r['press']} | {r['press S-NIAH']:.2f} | {r['linearized']} | "
                f"{r['linearized S-NIAH']:.2f} | {diff} | {r['verdict']} |")
        if where:
            line += f" {_cost(costs, where, f'{r.press} @{r.budget}')}| {_cost(costs, where, LINEARIZED)}|"
        lines.append(line)
    first = cur.iloc[0]
    intro = (f"The trade-off at each budget (S-NIAH-1/2/3 at {int(first['context'])} tokens, {int(first['n'])} "
             f"samples a task, {first['dtype']}: the paired comparison above")
    if where:
        card, length, batch = where
        intro += (f"; the cost of each side at Llama-3.1-8B dimensions, random weights, on {card}, {length} tokens, "
                  f"batch {batch}, from latency.csv: the best press as it ran at that budget, and {LINEARIZED}, the "
                  "linearized configuration measured at those dimensions (window 56 + 8 sinks); decode against its "
                  "bandwidth bound in parentheses; latency.md has the other lengths and batches")
    return intro + "):\n\n" + "\n".join(lines)
