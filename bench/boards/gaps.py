"""The gap rows of the standard table: which rows a gap compares, and their labels (leaderboard.py writes them,
page.py draws them)."""
from __future__ import annotations

from golinear.bench.boards.measured import LOWER_IS_BETTER

GAP_LABEL = "Gap with full attention, points (full - best linearized)"
PAPER_BUDGET = "64"  # window 56 + 8 sinks: the cache budget of every linearized row of the paper's tables
MEASURED_GAP_LABEL = "Gap with full attention at the paper's budget (64), points (full - best linearized at 64)"
# the same-training control (scripts/study/recipes.txt): full attention with LoRA on Wq/Wk/Wv of about the default
# recipe's trainable parameters, trained on the same tokens; a gap to it is the cost of linearizing alone
CONTROL = "control-lora-r5"
CONTROL_GAP_LABEL = (f"Gap with the same-training control ({CONTROL}) at the paper's budget (64), points "
                     "(control - best linearized at 64)")


def gap_row(rows: list[dict], cols) -> dict | None:
    """Full attention minus the best linearized value per column (lower-is-better columns: skipped)."""
    full = [r for r in rows if r["is_full"]]
    lin = [r for r in rows if not r["is_full"]]
    if not full or not lin:
        return None
    gap = {}
    for c in cols:
        if c in LOWER_IS_BETTER or full[0].get(c) is None:
            continue
        vals = [r[c] for r in lin if r.get(c) is not None]
        if vals:
            gap[c] = round(full[0][c] - max(vals), 6)
    return gap
