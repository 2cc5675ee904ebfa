"""The retention slots' equal-budget comparison as a picture: retention.md's suite means against the total budget.

Why: the question asked (do slots beat the default recipe and the untrained window at the same budget, and
where) is a set of curves over budgets 128-1024; the table answers it one cell at a time. Drawn from
bench.retention_table's long table, so a point here is a cell there (mean over seeds, the seeds' std as an error
bar). Rendered by `golinear claims` as retention.png.
"""
from __future__ import annotations

import pandas as pd

from golinear.bench.claims.retention_table import BASELINE
from golinear.bench.claims.roles import DEFAULT_ROLE
from golinear.bench.boards.figures import legend_entries, png_bytes, pyplot

PANELS = ("S-NIAH", "RULER", "MQ/MV/VT")  # the suite means the retention target reads


def series(table: pd.DataFrame) -> dict:
    """(panel, row) -> [(budget, mean, std or None)] in budget order, for every row with a point in that panel."""
    out = {}
    for (panel, row), g in table[table["column"].isin(PANELS)].groupby(["column", "row"], sort=False):
        g = g.sort_values("budget")
        out[(panel, row)] = [(int(b), float(m), None if pd.isna(s) else float(s))
                             for b, m, s in zip(g["budget"], g["mean"], g["std"])]
    return out


def plot(table: pd.DataFrame) -> bytes | None:
    """PNG: one panel per suite mean, one line per row (the untrained window dotted, the default recipe bold)."""
    lines = series(table)
    if not lines:
        return None
    plt = pyplot()
    rows = list(dict.fromkeys(row for _, row in lines))
    others = [r for r in rows if r not in (BASELINE, DEFAULT_ROLE)]
    colour = {BASELINE: "grey", DEFAULT_ROLE: "black"}
    colour |= {r: plt.get_cmap("tab10")(i % 10) for i, r in enumerate(others)}
    budgets = sorted({b for pts in lines.values() for b, _, _ in pts})
    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4), dpi=100, squeeze=False)
    for ax, panel in zip(axes[0], PANELS):
        for row in rows:
            pts = lines.get((panel, row))
            if not pts:
                continue
            xs, ys, err = zip(*pts)
            ax.errorbar(xs, ys, yerr=[e or 0.0 for e in err], color=colour[row], label=row, marker="o",
                        markersize=4, capsize=3, linewidth=2.2 if row == DEFAULT_ROLE else 1.2,
                        linestyle=":" if row == BASELINE else "-")
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_title(f"{panel} mean (4K)")
        ax.set_xlabel("total cache budget (sinks + window + slots)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy (points)")
    fig.tight_layout()
    fig.legend(*legend_entries(axes[0]), fontsize=10, loc="upper center", ncol=4, bbox_to_anchor=(0.5, 0.0))
    return png_bytes(fig)
