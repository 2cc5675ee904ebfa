"""Matplotlib figures as PNG bytes that are the same on every run, for the plots rendered beside the tables.

Why: the plots are committed next to the tables they draw and rewritten only when their bytes change; matplotlib
stamps its version into a PNG unless told not to, so every renderer in bench/ goes through these helpers.
"""
from __future__ import annotations

import io


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (CI and the device have no display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes without the version metadata; the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", metadata={"Software": None})
    pyplot().close(fig)
    return buf.getvalue()


def legend_entries(axes) -> tuple[list, list[str]]:
    """(handles, labels) of several panels for one shared legend: each label once, in order of first appearance."""
    handles = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    return list(handles.values()), list(handles)
