"""`golinear leaderboard`: render the result store (and the paper's reported rows) as md, csv and html.

Outputs in --out: `standard.{md,csv}` (CR tasks, CR average, MMLU, LAMBADA; one row per model
configuration, a "gap with full attention" row per backbone), `sniah.{md,csv}` (Table 8 analog:
S-NIAH by cache budget), `ruler.{md,csv}` (Table 9 analog), `hybrid.{md,csv}` and `hybrid.png` (Figure 5
analog: bench/boards/hybrid.py), `sniah_budget.png` and `index.html` (all of it in one self-contained page).
Rendering is deterministic: no timestamps, stable sorting, files
rewritten only when their content changes.

The paper's "Gap with Full, %" (Tables 1-3) is full attention minus the best linearized row of the
same table and backbone, per column, in accuracy points (e.g. Table 1, Llama CR: 73.98 - 63.08 = 10.9). Every row
of those tables holds the paper's cache budget (window 56 + 8 sinks); ours span budgets up to 1,024, where nearly every
prompt fits the softmax window, so our gap row compares the linearized rows at the paper's budget only
(PAPER_BUDGET): the best row across budgets would measure the window, not the linearization.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from golinear.bench.cli_args import REFERENCE_DIR
from golinear.bench.boards.families import families, family_of
from golinear.bench.boards.fitted_format import row_label
from golinear.bench.boards.markdown import csv_cell, md_cell
from golinear.bench.boards.figures import legend_entries, png_bytes, pyplot
from golinear.bench.boards import kv_comparison, kv_memory, kv_tradeoff
from golinear.bench.boards.hybrid import hybrid_plot, hybrid_table
from golinear.bench.boards.measured import (REF_STANDARD, RULER_COLS, SNIAH_TASKS, STANDARD_COLS, STUDY_DTYPE,
                            add_cr, budget_label, budget_value, measured_frame)
from golinear.bench.boards.gaps import (CONTROL, CONTROL_GAP_LABEL, GAP_LABEL, MEASURED_GAP_LABEL,  # noqa: F401
                                         PAPER_BUDGET, gap_row)
from golinear.bench.boards.page import render_page
from golinear.bench.results.store import Store
from golinear.bench.results.store_conflicts import current_cells
from golinear.models.util.atomic import atomic_write


# ----------------------------------------------------------------------------- formatting
def fmt(v, digits=2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def fmt_params(n) -> str:
    if n is None or n == "" or (isinstance(n, float) and math.isnan(n)):
        return ""
    if isinstance(n, str):
        return n
    n = float(n)
    if n == 0:
        return "0"
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"


# ----------------------------------------------------------------------------- tables
def standard_table(df: pd.DataFrame, reference: pd.DataFrame | None) -> pd.DataFrame:
    """Measured rows (+ gap row per backbone and subset) then the paper's rows (+ gap row per table)."""
    out = []
    std = df[df["column"].isin(STANDARD_COLS)] if len(df) else df
    groups = {}
    for _, r in (std.iterrows() if len(std) else []):
        groups.setdefault((r["backbone"], r["limit"] if r["limit"] == r["limit"] else None), {}) \
              .setdefault(r["model_key"], []).append(r)
    for (backbone, limit) in sorted(groups, key=lambda k: (str(k[0]), -1 if k[1] is None else k[1])):
        rows = []
        for key, items in groups[(backbone, limit)].items():
            first = items[0]
            row = {"status": "measured", "source": "measured", "backbone": backbone, "model": first["model"],
                   "setting": key, "params": fmt_params(first["new_params"]), "cache": first["budget"],
                   "limit": "full set" if limit is None else f"first {int(limit)}",
                   "is_full": bool(first["full_attention"])}
            for it in items:
                row[it["column"]] = float(it["value"])
            rows.append(add_cr(row))
        rows.sort(key=lambda r: (not r["is_full"], str(r["model"]), r["setting"]))
        out += rows
        at_budget = [r for r in rows if str(r["cache"]) == PAPER_BUDGET and not r["is_full"]]
        gap = gap_row([r for r in rows if r["is_full"]] + at_budget, STANDARD_COLS)
        if gap is not None:
            out.append({"status": "gap", "source": "measured", "backbone": backbone, "model": MEASURED_GAP_LABEL,
                        "limit": rows[0]["limit"], **gap})
        control = [{**r, "is_full": True} for r in rows if r["model"] == CONTROL]
        gap = gap_row(control + at_budget, STANDARD_COLS) if control else None
        if gap is not None:
            out.append({"status": "gap", "source": "measured", "backbone": backbone, "model": CONTROL_GAP_LABEL,
                        "limit": rows[0]["limit"], **gap})
    if reference is not None:
        for (table, backbone), grp in reference.groupby(["table", "backbone"], sort=False):
            rows = []
            for _, r in grp.iterrows():
                row = {"status": "reported", "source": r["source"], "backbone": backbone, "model": r["model"],
                       "setting": r["setting"] if isinstance(r["setting"], str) else "",
                       "params": r["params"] if isinstance(r["params"], str) else "",
                       "cache": r["cache"] if isinstance(r["cache"], str) else "-",  # "NA" in the paper: not given
                       "limit": "full set", "is_full": r["model"] == "Full attention"}
                for k, col in REF_STANDARD.items():
                    v = r[k]
                    row[col] = None if pd.isna(v) else float(v)
                rows.append(add_cr(row))
            out += rows
            gap = gap_row(rows, STANDARD_COLS)
            if gap is not None and table in (5, 6, 7, 10):  # Table 4 prints no gap row (mixed methods)
                out.append({"status": "gap", "source": rows[0]["source"], "backbone": backbone,
                            "model": GAP_LABEL, "limit": "full set", **gap})
    cols = ["status", "source", "backbone", "model", "setting", "params", "cache", "limit"] + STANDARD_COLS
    table = pd.DataFrame(out, columns=cols)
    return table


def families_by_dtype(sub: pd.DataFrame) -> pd.Series:
    """bench.boards.families within each dtype: a bf16 run of a recipe does not crowd its float32 family."""
    if not len(sub) or "dtype" not in sub:  # (a frame built without dtypes: one dtype)
        return families(sub)
    return pd.concat([families(g) for _, g in sub.groupby("dtype")])


def sniah_table(df: pd.DataFrame, reference: pd.DataFrame | None) -> pd.DataFrame:
    """Table 8 analog: rows (model family, task), columns cache budgets (inf = full attention)."""
    rows = {}
    sub = df[df["column"].isin(SNIAH_TASKS)] if len(df) else df
    fams = families_by_dtype(sub)
    for i, r in (sub.iterrows() if len(sub) else []):
        fam = "full attention" if r["full_attention"] else row_label(fams[i], r["model"], [r["column"]])
        key = ("measured", "measured", r["backbone"], fam, r["column"], r["context_length"], r["n"],
               r.get("dtype", STUDY_DTYPE))
        rows.setdefault(key, {})[r["budget"]] = float(r["value"])
    if reference is not None:
        for _, r in reference.iterrows():
            key = ("reported", r["source"], r["backbone"], r["model"], r["task"], r["context_length"], None, "")
            rows.setdefault(key, {})[budget_label(r["budget"])] = float(r["value"])
    budgets = sorted({b for v in rows.values() for b in v}, key=budget_value)
    out = []
    for key in sorted(rows, key=lambda k: (k[0] != "measured", str(k[1]), str(k[2]), k[3] != "full attention",
                                           str(k[3]), str(k[4]))):
        status, source, backbone, model, task, ctx, n, dtype = key
        out.append({"status": status, "source": source, "backbone": backbone, "model": model, "task": task,
                    "context": int(ctx) if ctx == ctx and ctx is not None else "",
                    "n": int(n) if n is not None and n == n else "", "dtype": dtype, **rows[key]})
    return pd.DataFrame(out, columns=["status", "source", "backbone", "model", "task", "context", "n", "dtype"]
                        + budgets)


def ruler_table(df: pd.DataFrame, reference: pd.DataFrame | None) -> pd.DataFrame:
    """Table 9 analog: rows (model family, budget), columns the RULER subsets and their average."""
    rows = {}
    sub = df[df["column"].isin(RULER_COLS)] if len(df) else df
    fams = families_by_dtype(sub)
    for i, r in (sub.iterrows() if len(sub) else []):
        fam = "full attention" if r["full_attention"] else row_label(fams[i], r["model"], RULER_COLS)
        key = ("measured", "measured", r["backbone"], fam, r["budget"], r["context_length"],
               r.get("dtype", STUDY_DTYPE))
        d = rows.setdefault(key, {})
        d[r["column"]] = float(r["value"])
        d["HQA n" if r["column"] == "HQA" else "n"] = int(r["n"]) if r["column"] == "HQA" else max(
            int(r["n"]), d.get("n", 0))
    if reference is not None:
        for _, r in reference.iterrows():
            key = ("reported", r["source"], r["backbone"], r["model"], budget_label(r["budget"]),
                   r["context_length"], "")
            rows[key] = {c: float(r[c]) for c in RULER_COLS} | {"Avg": float(r["avg"])}
    out = []
    for key in sorted(rows, key=lambda k: (k[0] != "measured", str(k[1]), str(k[2]), k[3] != "full attention",
                                           str(k[3]), budget_value(k[4]))):
        status, source, backbone, model, budget, ctx, dtype = key
        d = dict(rows[key])
        if "Avg" not in d and all(c in d for c in RULER_COLS):
            d["Avg"] = sum(d[c] for c in RULER_COLS) / len(RULER_COLS)
        out.append({"status": status, "source": source, "backbone": backbone, "model": model, "cache": budget,
                    "context": int(ctx) if ctx == ctx and ctx is not None else "", "dtype": dtype, "n": "",
                    "HQA n": "", **d})
    return pd.DataFrame(out, columns=["status", "source", "backbone", "model", "cache", "context", "dtype"]
                        + RULER_COLS + ["Avg", "n", "HQA n"])


# ----------------------------------------------------------------------------- rendering
def _display(table: pd.DataFrame) -> pd.DataFrame:
    """Strings for md/html: numbers with 2 decimals, empty cells blank."""
    t = table.copy().astype(object)
    for c in t.columns:
        t[c] = [("" if v is None or (isinstance(v, float) and math.isnan(v)) else
                 fmt(v) if isinstance(v, float) else str(v)) for v in t[c]]
    return t


def to_markdown(table: pd.DataFrame) -> str:
    if table.empty:
        return "_no rows_\n"
    return _display(table).map(md_cell).to_markdown(index=False, disable_numparse=True) + "\n"


def to_csv(table: pd.DataFrame) -> str:
    return table.map(csv_cell).to_csv(index=False, float_format="%.4f", lineterminator="\n")


def plotted_rows(table: pd.DataFrame) -> tuple[pd.DataFrame, object]:
    """(rows, context) the S-NIAH plot draws: those at the context length most measured rows have, and of each model
    and task the row with the most samples, so that a panel holds one line (one dotted line for full attention)
    per model, not one per run."""
    measured = table[table["status"] == "measured"]
    contexts = (measured if len(measured) else table)["context"]
    context = contexts.mode().iloc[0] if len(contexts) else None
    rows = table[table["context"] == context] if context is not None else table
    if "dtype" in rows:  # the study's dtype (a bf16 GPU run has its own table, kv-compression.md)
        rows = rows[rows["dtype"].fillna("").isin(["", STUDY_DTYPE])]
    samples = pd.to_numeric(rows["n"], errors="coerce").fillna(0)
    rows = rows.assign(_n=samples).sort_values("_n", ascending=False, kind="stable")
    rows = rows.drop_duplicates(["status", "model", "task"]).drop(columns="_n").sort_index()
    return rows, context


def sniah_plot(table: pd.DataFrame) -> bytes | None:
    """PNG: S-NIAH accuracy vs cache budget, one panel per task at one context length (plotted_rows), one line per
    model measured at two budgets or more (reported: dashed); a model at one budget is a grey point (the table names
    it), so the legend stays readable at page width. Full attention (budget inf) is a horizontal line: dotted black
    measured, dash-dotted grey reported."""
    if table.empty:
        return None
    plt = pyplot()
    meta = ("status", "source", "backbone", "model", "task", "context", "n", "dtype")
    finite = [b for b in table.columns if b not in meta and b != "inf"]
    if not finite:
        return None
    table, context = plotted_rows(table)
    points = {(r["status"], r["model"]): sum(pd.notna(r[b]) and r[b] != "" for b in finite) for _, r in table.iterrows()}
    lines = sorted({m for m, n in points.items() if n > 1}, key=lambda k: (k[0] != "measured", k[1]))
    colours = {m: plt.get_cmap("tab20")(i % 20) for i, m in enumerate(lines)}
    tasks = [t for t in SNIAH_TASKS if t in set(table["task"])]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), dpi=100, sharey=True, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for _, r in table[table["task"] == task].iterrows():
            m = (r["status"], r["model"])
            xs = [int(b) for b in finite if pd.notna(r[b]) and r[b] != ""]
            if m in colours and xs:
                ax.plot(xs, [float(r[str(b)]) for b in xs], label=f"{r['model']} ({r['status']})", color=colours[m],
                        linewidth=1.2, markersize=4, linestyle="-" if r["status"] == "measured" else "--",
                        marker="o" if r["status"] == "measured" else "x")
            elif xs:
                ax.plot(xs, [float(r[str(b)]) for b in xs], color="grey", marker="o", markersize=3, linestyle="none",
                        alpha=0.5, label="other rows, one budget each (see the table)")
            if "inf" in table.columns and pd.notna(r["inf"]) and r["inf"] != "":
                measured = r["status"] == "measured"
                ax.axhline(float(r["inf"]), color="black" if measured else "grey", linestyle=":" if measured else "-.",
                           linewidth=1.2, label=f"full attention ({r['status']})")
        ax.set_xscale("log", base=2)
        ax.set_xticks([int(b) for b in finite], [str(b) for b in finite])
        ax.set_title(f"{task} at {int(context):,} tokens" if context not in (None, "") else task, fontsize=11)
        ax.set_xlabel("cache budget (sinks + window + slots)")
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy (%)")
    fig.legend(*legend_entries(axes[0]), fontsize=10, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2,
               frameon=False)
    return png_bytes(fig)


def write_if_changed(path: Path, data: bytes | str) -> bool:
    data = data.encode() if isinstance(data, str) else data
    if path.exists() and path.read_bytes() == data:
        return False
    atomic_write(path, data)
    return True


def load_reference(reference_dir: Path = REFERENCE_DIR) -> dict:
    ref = {}
    for name in ("standard", "sniah", "ruler"):
        p = Path(reference_dir) / f"paper_{name}.csv"
        ref[name] = pd.read_csv(p, dtype={"cache": str, "params": str, "train_tokens_b": str, "budget": str,
                                          "setting": str}) if p.exists() else None
    return ref


NOTES = {
    "standard": "Zero-shot PIQA, ARC-e, ARC-c (acc_norm), HellaSwag (acc_norm), WinoGrande; CR = their mean; "
                "5-shot MMLU; LAMBADA OpenAI acc and perplexity. Gap rows: full attention minus the best "
                "linearized row of the same backbone (and subset), in points, as the paper's Tables 1-3; ours "
                "compare the rows at the paper's cache budget (64: window 56 + 8 sinks), as every row of its tables "
                "holds. The untrained full attention is the reference: a trained row also gains from fine-tuning "
                "on book text, so a gap below 0 is not a linearization better than softmax.",
    "sniah": "Table 8 analog: S-NIAH accuracy by cache budget (sinks + window tokens; inf = full attention).",
    "ruler": "Table 9 analog: extended RULER subsets and their average by cache budget. HQA n is the number of "
             "HotpotQA questions scored (100 at most offline).",
    "hybrid": "Figure 5 analog: strict GDN with a share of its layers kept as full attention, spread evenly "
              "(uniform) or the hardest by `golinear diagnose` (hardness); 0 % is the strict model itself, 100 % "
              "full attention. Full test sets; CR and LAMBADA in %; hybrid.png plots them (recipes: "
              "scripts/study/recipes.txt, gdn-full*).",
}


def render(store, out_dir, reference_dir=REFERENCE_DIR) -> list[Path]:
    """Write every leaderboard file; returns the paths that changed."""
    out_dir = Path(out_dir)
    store = store if isinstance(store, Store) else Store(store)
    if not store.root.exists():
        raise FileNotFoundError(f"result store {str(store.root)!r} does not exist (run `golinear run` first)")
    cells = current_cells(store.cell_files())  # of two data versions of a cell, the current one
    if not cells:  # rendering would replace the tables with reference rows only
        raise ValueError(f"result store {str(store.root)!r} holds no cells; nothing to render (run `golinear run` "
                         "first, or point --store at a store with results)")
    df = measured_frame(cells)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"output folder {str(out_dir)!r} is not writable: {e.strerror or e}") from None
    ref = load_reference(reference_dir)
    tables = {"standard": standard_table(df, ref["standard"]),
              "sniah": sniah_table(df, ref["sniah"]), "ruler": ruler_table(df, ref["ruler"]),
              "hybrid": hybrid_table(df, cells)}
    png = sniah_plot(tables["sniah"])
    titles = {"standard": "Common reasoning, MMLU, LAMBADA", "sniah": "S-NIAH by cache budget",
              "ruler": "Extended RULER by cache budget", "hybrid": "Strict GDN hybrids"}
    changed = []
    for name, table in tables.items():
        md = f"# {titles[name]}\n\n{NOTES[name]}\n\n" + to_markdown(table)
        for path, data in ((out_dir / f"{name}.md", md), (out_dir / f"{name}.csv", to_csv(table))):
            if write_if_changed(path, data):
                changed.append(path)
    images = {"sniah": ("sniah_budget.png", png), "hybrid": ("hybrid.png", hybrid_plot(tables["hybrid"]))}
    for name, image in images.values():
        if image and write_if_changed(out_dir / name, image):
            changed.append(out_dir / name)
    kv = kv_comparison.table(df)
    ruler = kv_comparison.table(df, kv_comparison.RULER)  # the same comparison on RULER, where a press ran it
    paired = kv_comparison.paired_table(kv)
    old = kv["superseded"].astype(bool)  # (only where the study's setting has a table of its own)
    parts = [kv_comparison.to_markdown(kv[~old]),  # the current table and its costs first
             kv_tradeoff.markdown(paired, out_dir / "latency.csv"),
             "![S-NIAH mean against the cache budget](kv-compression.png)",
             kv_comparison.to_markdown(ruler) if len(ruler) else "",
             kv_comparison.to_markdown(kv[old]) if old.any() else ""]
    kv_md = ("# Linearize or compress the KV cache\n\nGenerated by `golinear leaderboard` (bench/boards/kv_comparison.py) from "
             "the result store. " + kv_comparison.NOTE + "\n\n" + "\n\n".join(p for p in parts if p) + "\n")
    memory = kv_memory.markdown(out_dir / "kv-memory" / "latency.csv")
    kv_md += f"\n{memory}\n" if memory else ""
    for path, data in ((out_dir / "kv-compression.md", kv_md), (out_dir / "kv-compression.csv", to_csv(kv.drop(columns="samples"))),
                       (out_dir / "kv-compression-paired.csv", to_csv(paired)),
                       (out_dir / "kv-compression-ruler.csv", to_csv(ruler.drop(columns="samples")) if len(ruler) else None),
                       (out_dir / "kv-compression-ruler-paired.csv",
                        to_csv(kv_comparison.paired_table(ruler)) if len(ruler) else None),
                       (out_dir / "kv-compression.png", kv_comparison.plot(kv))):
        if data is not None and write_if_changed(path, data):
            changed.append(path)
    page = render_page([(n, titles[n], NOTES[n], tables[n]) for n in tables], {n: images[n][1] for n in images},
                       dict(zip(df.get("model_key", []), df.get("family_name", []))), out_dir)
    if write_if_changed(out_dir / "index.html", page):
        changed.append(out_dir / "index.html")
    return changed


def main(args) -> int:
    changed = render(args.store, args.out, args.reference_dir)
    print(f"golinear leaderboard: {len(changed)} file(s) changed in {args.out}")
    for p in changed:
        print(f"  {p}")
    return 0
