"""Markdown tables: each cell escaped in one place (md_cell), and a plain pipe table for the claims, paper tables and
retention pages, whose long sentences padding would only widen.
"""
from __future__ import annotations

import re

import pandas as pd


def md_cell(value) -> str:
    """A table cell's text as Markdown shows it, whatever a label holds: a `|` cannot end the cell, a line break
    cannot end the row, and a `<` that could open an HTML tag is text (as the page escapes it; `<=` stays)."""
    text = " ".join(str(value).splitlines()).replace("|", "\\|")
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)


FORMULA = re.compile(r"^[=+@\t\r]|^-(?!\d*\.?\d*$)")  # what a spreadsheet would run as a formula (not "-", "-0.5")


def csv_cell(value):
    """A CSV cell a spreadsheet shows as text: one that would start a formula gets a leading apostrophe."""
    return "'" + value if isinstance(value, str) and FORMULA.search(value) else value


def md_table(table: pd.DataFrame) -> str:
    """A plain pipe table (no padding: the cells are long sentences)."""
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    return "\n".join(lines + ["| " + " | ".join(md_cell(v) for v in r) + " |" for r in table.itertuples(index=False)])
