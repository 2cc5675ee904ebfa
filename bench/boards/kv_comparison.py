"""Linearize or compress the KV cache: S-NIAH at equal cache budgets, kvpress presses beside the linearized rows.

Why: at a fixed cache budget a user holding one pretrained model can linearize it or keep it and compress its KV
cache. sniah.md holds every cell; this table keeps the settings where a press was run (same context length,
samples and seed for every row) and lays the two families side by side at each budget, with full attention and
the untrained window + sinks as the bounds. Rendered by `golinear leaderboard` as kv-compression.md / .csv / .png,
and as the README's comparison table.
"""
from __future__ import annotations

import textwrap
from typing import NamedTuple

import pandas as pd

from golinear.bench.boards import intervals
from golinear.bench.boards.families import families
from golinear.bench.boards.fitted_format import fitted_value_type, needle_value_types
from golinear.bench.boards.markdown import md_cell
from golinear.bench.boards.figures import png_bytes, pyplot
from golinear.bench.boards.measured import RULER_COLS, SNIAH_TASKS, STUDY_CONTEXT, STUDY_SAMPLES, budget_value

KINDS = {"full": "full attention", "linearized": "linearized", "press": "KV-cache compression (kvpress)",
         "window": "untrained window + sinks",
         "press_qa": "KV-cache compression, question-aware (kvpress)",  # reads the question: not the main comparison
         "fitted": "linearized, scorer fitted to the test's needle format"}  # tuned to the test: shown, never "best"
NOTE = ("The budget is the number of KV entries per layer and KV head kept for decoding: sinks + window (+ retention "
        "slots) for a linearized model and the untrained window, the press's kv_budget for a press. A press prefills "
        "the whole prompt with full attention and compresses after it, so its peak memory grows with the prompt where "
        "a linearized model's does not (latency.md). Question-agnostic unless the row says question-aware: the context "
        "is compressed before the question is read, as a linearized model reads it. A linearized row whose "
        "retention scorer was fitted to the test's own needle format is shown as such and never counted as the best "
        "linearized row. Points (RULER's 0-100), greedy; "
        "the mean (bold) only where all three tasks are measured. ± is the 95 % interval over samples (1.96 standard "
        "errors; where every sample scored alike, 0 or 100, the Wilson interval [low, high]). At each budget the best press and the best linearized row are compared on the same samples (the "
        "paired difference, its 95 % interval): a winner is named only where the interval excludes 0.")
STREAMING = "streaming_llm (kvpress)"  # the press that keeps what the untrained window + sinks attends to
PLUS = " ±"  # the column of a value's 95 % half-width


class Suite(NamedTuple):
    """The tasks a comparison table holds: its mean's column, its task columns, how its text names them."""
    mean: str
    tasks: list[str]
    what: str


SNIAH = Suite("S-NIAH", SNIAH_TASKS, "S-NIAH-1/2/3")
RULER = Suite("RULER", RULER_COLS, "RULER's eight tasks")


def columns(suite: Suite) -> list[str]:
    return ["context", "n", "dtype", "superseded", "budget", "kind", "row", *suite.tasks, suite.mean,
            *(c + PLUS for c in (*suite.tasks, suite.mean)), "samples"]


def suite_of(t: pd.DataFrame) -> Suite:
    return RULER if RULER.mean in t.columns else SNIAH


COLUMNS = columns(SNIAH)
SETTING = ["context_length", "num_samples", "dtype"]  # a table: rows compared only with rows of the same setting
TABLE = ["context", "n", "dtype"]


def kind_of(r, tasks=SNIAH_TASKS) -> str:
    key = r["model_key"]
    if "press=" in key:
        return "press_qa" if "question_aware=true" in key else "press"
    if r["full_attention"]:
        return "full"
    if "mechanism=none" in key:
        return "window"
    fitted = fitted_value_type(r["model"] or "")  # bench.boards.fitted_format's rule: tuned to the test or not
    return "fitted" if fitted is not None and fitted in needle_value_types(tasks) else "linearized"


def table(df: pd.DataFrame, suite: Suite = SNIAH) -> pd.DataFrame:
    """One row per (setting, budget, model) at the settings where a press has cells of `suite`; the mean only where
    all its tasks are measured. A setting is a context length, a sample count and a dtype (a bf16 GPU run is not
    compared with a float32 one); once the study's setting (4K, 500 samples) has a table, the others are marked
    superseded."""
    sub = df[df["column"].isin(suite.tasks) & df["limit"].isna()] if len(df) else df
    if not len(sub) or not sub["model_key"].str.contains("press=", regex=False).any():
        return pd.DataFrame(columns=columns(suite))
    sub = sub.assign(kind=sub.apply(kind_of, axis=1, tasks=suite.tasks))
    settings = set(map(tuple, sub[sub["kind"].str.startswith("press")][SETTING].values))
    sub = sub[[s in settings for s in map(tuple, sub[SETTING].values)]]
    # families within each setting: the same recipe in another setting or dtype crowds no family
    sub = sub.assign(row=pd.concat([families(g) for _, g in sub.groupby(SETTING)]))
    study = any(c == STUDY_CONTEXT and n == STUDY_SAMPLES for c, n, _ in settings)
    out = []
    for (ctx, n, dtype, budget, kind, row), g in sub.groupby([*SETTING, "budget", "kind", "row"]):
        vals = g.groupby("column")["value"].mean()
        cells = {t: float(vals[t]) for t in suite.tasks if t in vals}
        mean = sum(cells.values()) / len(cells) if len(cells) == len(suite.tasks) else None
        # each task's standard error (a row of several cells, e.g. seeds: their mean's); the mean's from the three
        ses = {t: intervals.mean_stderr([intervals.task_stderr(v, se, m) for v, se, m
                                         in g[g["column"] == t][["value", "stderr", "n"]].values]) for t in cells}
        widths = {t + PLUS: None if se is None else intervals.Z * se for t, se in ses.items()}
        widths[suite.mean + PLUS] = intervals.half_width(list(ses.values())) if mean is not None else None
        out.append({"context": int(ctx), "n": int(n), "dtype": dtype,
                    "superseded": study and (ctx, n) != (STUDY_CONTEXT, STUDY_SAMPLES), "budget": budget,
                    "kind": KINDS[kind], "row": KINDS["full"] if kind == "full" else row, **cells, suite.mean: mean,
                    **widths, "samples": row_samples(g)})
    t = pd.DataFrame(out, columns=columns(suite))
    order = {k: i for i, k in enumerate(KINDS.values())}
    t["_b"], t["_k"] = t["budget"].map(budget_value), t["kind"].map(order)
    t = t.sort_values(["superseded", "context", "n", "dtype", "_b", "_k", "row"])  # the current table first
    return t.drop(columns=["_b", "_k"]).reset_index(drop=True)


def row_samples(g: pd.DataFrame) -> dict | None:
    """The row's per-sample scores over its cells (several cells of one sample, e.g. seeds: their mean);
    None when a cell holds none."""
    per = list(g["per_sample"]) if "per_sample" in g else []
    if not per or any(not isinstance(p, dict) for p in per):
        return None
    sums: dict[str, list[float]] = {}
    for p in per:
        for k, v in p.items():
            sums.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in sums.items()}


def best_pairs(t: pd.DataFrame):
    """((context, n, dtype), budget, best press row, best linearized row, paired comparison) at each budget of each
    setting where both families have an S-NIAH mean."""
    mean = suite_of(t).mean
    done = t[t[mean].notna()]
    for (ctx, n, dtype, budget), g in done.groupby([*TABLE, "budget"], sort=False):
        press, lin = g[g["kind"] == KINDS["press"]], g[g["kind"] == KINDS["linearized"]]
        if len(press) and len(lin):
            a, b = press.loc[press[mean].idxmax()], lin.loc[lin[mean].idxmax()]
            both = isinstance(a["samples"], dict) and isinstance(b["samples"], dict)
            yield (ctx, n, dtype), budget, a, b, intervals.paired(a["samples"], b["samples"]) if both else None


def paired_table(t: pd.DataFrame) -> pd.DataFrame:
    """kv-compression-paired.csv: each budget's best press against its best linearized row on the same samples."""
    mean = suite_of(t).mean
    out = []
    for (ctx, n, dtype), budget, a, b, p in best_pairs(t):
        out.append({"context": int(ctx), "n": int(n), "dtype": dtype, "superseded": a["superseded"], "budget": budget,
                    "press": a["row"], f"press {mean}": a[mean],
                    "linearized": b["row"], f"linearized {mean}": b[mean],
                    **({"pairs": p["n"], "difference": p["diff"], "low": p["lo"], "high": p["hi"]} if p else {}),
                    "verdict": intervals.verdict(p, "press", "linearized").split(":")[0]})
    return pd.DataFrame(out, columns=["context", "n", "dtype", "superseded", "budget", "press", f"press {mean}",
                                      "linearized", f"linearized {mean}", "pairs", "difference", "low", "high",
                                      "verdict"])


def fmt(v) -> str:
    return "" if v is None or pd.isna(v) else f"{v:.2f}"


def fmt_pm(value, width, n=None) -> str:
    """A value and its 95 % interval: ± its half-width, or, where every sample scored alike (0 or 100 points),
    the Wilson interval's ends."""
    if value is None or pd.isna(value) or width is None or pd.isna(width):
        return fmt(value)
    if n and value in (0.0, 100.0):
        lo, hi = intervals.wilson(value / 100, int(n))
        return f"{fmt(value)} [{100 * lo:.1f}, {100 * hi:.1f}]"
    return f"{fmt(value)} ±{width:.1f}"


def agreement(g: pd.DataFrame, n: int, tasks=SNIAH_TASKS) -> str:
    """The cross-check in one sentence: the StreamingLLM press against the untrained window + sinks at each budget
    where both ran (they attend to the same tokens at the prompt's end; the press's were computed with full
    attention), as the largest per-task difference in points and in samples."""
    press = g[g["row"] == STREAMING].set_index("budget")
    window = g[g["kind"] == KINDS["window"]].set_index("budget")
    parts = []
    for b in [b for b in press.index if b in window.index]:
        pairs = [(press.at[b, t], window.at[b, t]) for t in tasks
                 if pd.notna(press.at[b, t]) and pd.notna(window.at[b, t])]
        if pairs:
            gap = max(abs(p - w) for p, w in pairs)
            parts.append(f"at {b}, " + ", ".join(f"{p:.2f} against {w:.2f}" for p, w in pairs)
                         + f" (largest difference {gap:.2f} points, {round(gap * n / 100)} of {n} samples)")
    return ("Cross-check, the StreamingLLM press against the untrained window + sinks on the same samples, per task: "
            + "; ".join(parts) + ".") if parts else ""


def to_markdown(t: pd.DataFrame) -> str:
    suite = suite_of(t)
    head = ("| budget | family | row | " + " | ".join(suite.tasks) + " | mean |\n|---|---|---|"
            + "---:|" * (len(suite.tasks) + 1))
    parts = []
    for (ctx, n, dtype), g in t.groupby(TABLE, sort=False):
        lines = [f"| {r['budget']} | {r['kind']} | {md_cell(r['row'])} | "
                 + " | ".join(fmt_pm(r[c], r[c + PLUS], n) for c in suite.tasks)
                 + (f" | **{fmt_pm(r[suite.mean], r[suite.mean + PLUS], len(suite.tasks) * n)}** |"
                    if pd.notna(r[suite.mean]) else " |  |")
                 for _, r in g.iterrows()]
        check = agreement(g, n, suite.tasks)
        pairs = [f"- at {budget}: {md_cell(a['row'])} against {md_cell(b['row'])}: "
                 + intervals.verdict(p, "the press", "the linearized row")
                 for setting, budget, a, b, p in best_pairs(t) if setting == (ctx, n, dtype)]
        paired = (f"\n\nThe best press against the best linearized row, paired on the same samples ({suite.what} "
                  "together):\n\n" + "\n".join(pairs)) if pairs else ""
        old = (f" (superseded by the {STUDY_SAMPLES}-sample table at {STUDY_CONTEXT} tokens above)"
               if g["superseded"].iloc[0] else "")
        parts.append(f"{suite.what} at {ctx} tokens, {n} samples a task, {dtype}{old}, the same samples for every "
                     "row:\n\n"
                     + head + "\n" + "\n".join(lines) + paired + (f"\n\n{check}" if check else ""))
    if parts or suite is not SNIAH:
        return "\n\n".join(parts)
    return ("No press has been evaluated on S-NIAH yet (`golinear run --models press=snapkv --suites sniah "
            "--budgets 256,1024`).")


SPREAD = 0.6  # the rows at one budget spread over this many octaves, so no row's interval hides another's
MARGIN = 0.5  # octaves of axis beside the outermost budgets
LEGEND_CHARS = 90  # a longer row name wraps: the legend, under its panel, stays no wider than the panel


def figure(t: pd.DataFrame):
    """S-NIAH mean against the budget with its 95 % interval, a panel per setting not superseded: a line per row,
    solid for linearized, dashed for presses. Each panel spans the budgets it holds (ticks at them) and has its own
    legend of the rows it draws; the rows at one budget sit side by side around it. None when no row has a mean."""
    t = t[t["S-NIAH"].notna()]
    if (~t["superseded"]).any():  # the current table alone: the superseded ones stay in the markdown
        t = t[~t["superseded"]]
    if not len(t):
        return None
    plt = pyplot()
    settings = list(t.groupby(TABLE, sort=False))
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4), squeeze=False)
    style = {KINDS["linearized"]: "-", KINDS["press"]: "--", KINDS["window"]: ":", KINDS["press_qa"]: "-.",
             KINDS["fitted"]: "-."}
    rows = list(dict.fromkeys(t[t["kind"] != KINDS["full"]]["row"]))  # one colour per row across the panels
    colour = {r: plt.get_cmap("tab20")(i % 20) for i, r in enumerate(rows)}
    for ax, ((ctx, n, dtype), g) in zip(axes[0], settings):
        full = g[g["kind"] == KINDS["full"]]["S-NIAH"]
        if len(full):
            ax.axhline(full.mean(), color="black", lw=1, label="full attention")
        drawn = list(g[g["kind"] != KINDS["full"]].groupby(["kind", "row"], sort=False))
        for i, ((kind, row), r) in enumerate(drawn):
            shift = SPREAD * (i / (len(drawn) - 1) - 0.5) if len(drawn) > 1 else 0.0
            r = r.assign(x=r["budget"].map(budget_value) * 2 ** shift).sort_values("x")
            ax.errorbar(r["x"], r["S-NIAH"], yerr=r["S-NIAH" + PLUS].astype(float).fillna(0), fmt=style[kind],
                        marker="o", markersize=4, elinewidth=1.5, capsize=3, color=colour[row],
                        label=textwrap.fill(row, LEGEND_CHARS))
        budgets = sorted({budget_value(b) for b in g[g["kind"] != KINDS["full"]]["budget"]})
        ax.set_xscale("log", base=2)
        ax.set_xlim(budgets[0] / 2 ** MARGIN, budgets[-1] * 2 ** MARGIN)
        ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
        ax.minorticks_off()
        ax.set_xlabel("cache budget (KV entries per layer and KV head)")
        ax.set_title(f"S-NIAH mean and 95 % interval, {ctx} tokens, {n} samples a task, {dtype}"
                     + (" (superseded)" if g["superseded"].iloc[0] else ""), fontsize=9)
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    axes[0][0].set_ylabel("accuracy (%)")
    return fig


def plot(t: pd.DataFrame) -> bytes | None:
    """kv-compression.png: the figure's PNG bytes, None when no row has a mean."""
    fig = figure(t)
    return None if fig is None else png_bytes(fig)
