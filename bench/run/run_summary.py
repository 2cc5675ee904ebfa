"""The compact table `golinear run` ends with: one row per model, one column per evaluated score."""
from __future__ import annotations

from tabulate import tabulate

FRACTION_METRICS = ("acc", "acc_norm", "exact_match", "contains")  # 0..1, shown in percent
PERCENT_METRICS = ("score",)  # S-NIAH / RULER: 0..100 already


def score_text(cell: dict) -> str:
    """A score as the leaderboard shows it: accuracies and long-context scores in percent (one decimal),
    perplexities as they are."""
    value, metric = cell.get("value"), str(cell.get("metric", ""))
    if value is None or isinstance(value, str):
        return "-" if value is None else value
    if metric.startswith(FRACTION_METRICS) and 0.0 <= value <= 1.0:
        return f"{100 * value:.1f}"
    if metric.startswith(PERCENT_METRICS):
        return f"{value:.1f}"
    return f"{value:.2f}"


def noise_note(cells: list[dict | None]) -> str:
    """Why a quick subset's differences mean nothing: how far one document or sample moves a score at these n."""
    ns = sorted({int(c["n"]) for c in cells if c and c.get("n")})
    if not ns:
        return ""
    span = (f"{ns[0]}" if ns[0] == ns[-1] else f"{ns[0]}-{ns[-1]}", f"{100 / ns[-1]:.0f}" if ns[0] == ns[-1]
            else f"{100 / ns[-1]:.0f}-{100 / ns[0]:.0f}")
    return (f"With n of {span[0]} one document or sample moves a score by {span[1]} points: differences between "
            "the rows this size are noise, not results (a full run: docs/demo.md)")


def cell_model(cell: dict) -> str:
    return cell.get("model", {}).get("label") or cell.get("key", {}).get("model", "?")


def task_table(cells: list[dict | None]) -> str:
    """Tasks x models (one row per task, its n, one column per model and, for two models, their difference in
    points): as narrow for twenty tasks as for one; '' when there is no cell."""
    models: list[str] = []
    rows: dict[str, dict] = {}
    for cell in cells:
        if not cell:
            continue
        model, task = cell_model(cell), cell.get("display") or cell.get("task", "?")
        if model not in models:
            models.append(model)
        row = rows.setdefault(task, {"n": cell.get("n"), "values": {}, "text": {}})
        row["text"][model] = score_text(cell)
        if isinstance(cell.get("value"), (int, float)):
            row["values"][model] = float(score_text(cell))
    if not rows:
        return ""
    headers = ["task", "n", *models] + ([f"{models[1]} - {models[0]}"] if len(models) == 2 else [])
    table = []
    for task, row in rows.items():
        line = [task, "-" if row["n"] is None else str(row["n"])] + [row["text"].get(m, "-") for m in models]
        if len(models) == 2:
            a, b = (row["values"].get(m) for m in models)
            line.append("-" if a is None or b is None else f"{b - a:+.1f}")
        table.append(line)
    return tabulate(table, headers=headers, tablefmt="simple", disable_numparse=True,
                    colalign=("left", *["right"] * (len(headers) - 1)))


def score_table(cells: list[dict | None]) -> str:
    """Models x scores of the given cells (missing ones left out); '' when there is none."""
    rows: dict[str, dict[str, str]] = {}
    columns: list[str] = []
    for cell in cells:
        if not cell:
            continue
        model = cell_model(cell)
        column = cell.get("display") or cell.get("task", "?")
        if cell.get("n") is not None and (cell.get("key", {}).get("config", {}).get("limit") is not None):
            column += f" (n={cell['n']})"
        if column not in columns:
            columns.append(column)
        rows.setdefault(model, {})[column] = score_text(cell)
    if not rows:
        return ""
    table = [[m] + [r.get(c, "-") for c in columns] for m, r in rows.items()]
    return tabulate(table, headers=["model"] + columns, tablefmt="simple", disable_numparse=True)
