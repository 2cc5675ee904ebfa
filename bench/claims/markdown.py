"""A plain pipe table: the claims, paper tables and retention pages hold long sentences, which padding would
only widen.
"""
from __future__ import annotations

import pandas as pd


def md_table(table: pd.DataFrame) -> str:
    """A plain pipe table (no padding: the cells are long sentences)."""
    cell = lambda v: str(v).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in table.itertuples(index=False)])
