"""Peak memory beside the KV-compression scores: what each family holds at 4K and 32K tokens at one budget.

Why: a press that compresses after the prompt prefills it with full attention, so its peak grows with the prompt;
a press that compresses after every chunk (the memory-matched row) and a linearized model do not. The rows are a
`golinear latency` run kept in kv-memory/latency.csv beside the tables (docs/kv_compression.md gives the command);
only its peak memory is read here, one column per prompt length.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from golinear.bench.boards.kv_comparison import KINDS
from golinear.bench.speed.latency_targets import BASELINES


def family(config: str) -> str:
    """The comparison table's family of a latency configuration."""
    if config in BASELINES:
        return KINDS["full"]
    if "(kvpress" in config:
        return KINDS["press"]
    return KINDS["window"] if config.startswith("swa-sink") else KINDS["linearized"]


def table(csv_path: Path) -> pd.DataFrame:
    """One row per configuration: peak GiB per prompt length; empty without the file."""
    if not Path(csv_path).exists():
        return pd.DataFrame()
    df = pd.read_csv(csv_path)
    df = df[df.status == "ok"]
    wide = df.pivot_table(index="config", columns="length", values="peak_gib", aggfunc="last")
    wide.columns = [f"{int(c)} tokens" for c in wide.columns]
    wide.insert(0, "family", [family(c) for c in wide.index])
    order = [KINDS[k] for k in ("full", "press", "linearized", "window")]
    wide["_f"] = wide["family"].map(order.index)
    return wide.sort_values(["_f"]).drop(columns="_f").reset_index()


def markdown(csv_path: Path) -> str:
    t = table(csv_path)
    if t.empty:
        return ""
    df = pd.read_csv(csv_path)
    where = ", ".join(sorted({f"{r.model} {r.dtype} on {r.device}, batch {r.batch}, {r.date}"
                              for r in df.itertuples()}))
    lengths = [c for c in t.columns if c.endswith(" tokens")]
    # the growth is the row's own: each decoder also holds buffers of its own, so levels differ at any length
    grow = f"{lengths[0].split()[0]} to {lengths[-1].split()[0]}"
    head = ("| row | family | " + " | ".join(lengths) + f" | growth, {grow} |\n|---|---|"
            + "---:|" * (len(lengths) + 1))
    lines = [f"| {r['config']} | {r['family']} | " + " | ".join(f"{r[c]:.2f}" for c in lengths)
             + f" | {r[lengths[-1]] - r[lengths[0]]:+.2f} |" for _, r in t.iterrows()]
    device = "the process's peak resident set" if (df.device == "cpu").all() else "peak memory"
    return (f"Peak memory in GiB ({device} over prefill + decode, weights included; {where}; "
            f"`golinear latency` rows in kv-memory/latency.csv):\n\n" + head + "\n" + "\n".join(lines))
