"""Linearize or compress the KV cache: S-NIAH at equal cache budgets, kvpress presses beside the linearized rows.

Why: at a fixed cache budget a user holding one pretrained model can linearize it or keep it and compress its KV
cache. sniah.md holds every cell; this table keeps the settings where a press was run (same context length,
samples and seed for every row) and lays the two families side by side at each budget, with full attention and
the untrained window + sinks as the bounds. Rendered by `golinear leaderboard` as kv-compression.md / .csv / .png,
and as the README's comparison table.
"""
from __future__ import annotations

import pandas as pd

from golinear.bench.boards.families import families
from golinear.bench.boards.markdown import md_cell
from golinear.bench.boards.figures import legend_entries, png_bytes, pyplot
from golinear.bench.boards.measured import SNIAH_TASKS, budget_value

KINDS = {"full": "full attention", "linearized": "linearized", "press": "KV-cache compression (kvpress)",
         "window": "untrained window + sinks",
         "press_qa": "KV-cache compression, question-aware (kvpress)"}  # reads the question: not the main comparison
NOTE = ("The budget is the number of KV entries per layer and KV head kept for decoding: sinks + window (+ retention "
        "slots) for a linearized model and the untrained window, the press's kv_budget for a press. A press prefills "
        "the whole prompt with full attention and compresses after it, so its peak memory grows with the prompt where "
        "a linearized model's does not (latency.md). Question-agnostic unless the row says question-aware: the context "
        "is compressed before the question is read, as a linearized model reads it. Points (RULER's 0-100), greedy; "
        "the mean (bold) only where all three tasks are measured.")
STREAMING = "streaming_llm (kvpress)"  # the press that keeps what the untrained window + sinks attends to
COLUMNS = ["context", "n", "budget", "kind", "row", *SNIAH_TASKS, "S-NIAH"]


def kind_of(r) -> str:
    key = r["model_key"]
    if "press=" in key:
        return "press_qa" if "question_aware=true" in key else "press"
    if r["full_attention"]:
        return "full"
    return "window" if "mechanism=none" in key else "linearized"


def table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (setting, budget, model) at the settings where a press has S-NIAH cells; the mean only where
    all three tasks are measured."""
    sub = df[df["column"].isin(SNIAH_TASKS) & df["limit"].isna()] if len(df) else df
    if not len(sub) or not sub["model_key"].str.contains("press=", regex=False).any():
        return pd.DataFrame(columns=COLUMNS)
    sub = sub.assign(kind=sub.apply(kind_of, axis=1))
    settings = set(map(tuple, sub[sub["kind"].str.startswith("press")][["context_length", "num_samples"]].values))
    sub = sub[[s in settings for s in map(tuple, sub[["context_length", "num_samples"]].values)]]
    sub = sub.assign(row=families(sub))  # within the comparison's settings: the study's seeds there crowd no family
    out = []
    for (ctx, n, budget, kind, row), g in sub.groupby(["context_length", "num_samples", "budget", "kind", "row"]):
        vals = g.groupby("column")["value"].mean()
        cells = {t: float(vals[t]) for t in SNIAH_TASKS if t in vals}
        mean = sum(cells.values()) / 3 if len(cells) == 3 else None
        out.append({"context": int(ctx), "n": int(n), "budget": budget,
                    "kind": KINDS[kind], "row": KINDS["full"] if kind == "full" else row, **cells, "S-NIAH": mean})
    t = pd.DataFrame(out, columns=COLUMNS)
    order = {k: i for i, k in enumerate(KINDS.values())}
    t["_b"], t["_k"] = t["budget"].map(budget_value), t["kind"].map(order)
    return t.sort_values(["context", "n", "_b", "_k", "row"]).drop(columns=["_b", "_k"]).reset_index(drop=True)


def fmt(v) -> str:
    return "" if v is None or pd.isna(v) else f"{v:.2f}"


def agreement(g: pd.DataFrame, n: int) -> str:
    """The cross-check in one sentence: the StreamingLLM press against the untrained window + sinks at each budget
    where both ran (they attend to the same tokens at the prompt's end; the press's were computed with full
    attention), as the largest per-task difference in points and in samples."""
    press = g[g["row"] == STREAMING].set_index("budget")
    window = g[g["kind"] == KINDS["window"]].set_index("budget")
    parts = []
    for b in [b for b in press.index if b in window.index]:
        pairs = [(press.at[b, t], window.at[b, t]) for t in SNIAH_TASKS
                 if pd.notna(press.at[b, t]) and pd.notna(window.at[b, t])]
        if pairs:
            gap = max(abs(p - w) for p, w in pairs)
            parts.append(f"at {b}, " + ", ".join(f"{p:.2f} against {w:.2f}" for p, w in pairs)
                         + f" (largest difference {gap:.2f} points, {round(gap * n / 100)} of {n} samples)")
    return ("Cross-check, the StreamingLLM press against the untrained window + sinks on the same samples, per task: "
            + "; ".join(parts) + ".") if parts else ""


def to_markdown(t: pd.DataFrame) -> str:
    head = "| budget | family | row | " + " | ".join(SNIAH_TASKS) + " | mean |\n|---|---|---|" + "---:|" * 4
    parts = []
    for (ctx, n), g in t.groupby(["context", "n"], sort=False):
        lines = [f"| {r['budget']} | {r['kind']} | {md_cell(r['row'])} | " + " | ".join(fmt(r[c]) for c in SNIAH_TASKS)
                 + (f" | **{fmt(r['S-NIAH'])}** |" if pd.notna(r["S-NIAH"]) else " |  |") for _, r in g.iterrows()]
        check = agreement(g, n)
        parts.append(f"S-NIAH-1/2/3 at {ctx} tokens, {n} samples a task, the same samples for every row:\n\n"
                     + head + "\n" + "\n".join(lines) + (f"\n\n{check}" if check else ""))
    return "\n\n".join(parts) if parts else "No press has been evaluated on S-NIAH yet (`golinear run --models " \
                                             "press=snapkv --suites sniah --budgets 256,1024`)."


def plot(t: pd.DataFrame) -> bytes | None:
    """S-NIAH mean against the budget: a line per row, solid for linearized, dashed for presses."""
    t = t[t["S-NIAH"].notna()]
    if not len(t):
        return None
    plt = pyplot()
    settings = list(t.groupby(["context", "n"], sort=False))
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4), squeeze=False)
    style = {KINDS["linearized"]: "-", KINDS["press"]: "--", KINDS["window"]: ":", KINDS["press_qa"]: "-."}
    for ax, ((ctx, n), g) in zip(axes[0], settings):
        full = g[g["kind"] == KINDS["full"]]["S-NIAH"]
        if len(full):
            ax.axhline(full.mean(), color="black", lw=1, label="full attention")
        for (kind, row), r in g[g["kind"] != KINDS["full"]].groupby(["kind", "row"], sort=False):
            r = r.assign(x=r["budget"].map(budget_value)).sort_values("x")
            ax.plot(r["x"], r["S-NIAH"], style[kind], marker="o", label=f"{row}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("cache budget (KV entries per layer and KV head)")
        ax.set_title(f"S-NIAH mean, {ctx} tokens, {n} samples a task", fontsize=9)
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy (%)")
    fig.legend(*legend_entries(axes[0]), fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return png_bytes(fig)
