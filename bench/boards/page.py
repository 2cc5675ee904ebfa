"""The leaderboard page (`leaderboards/index.html`): one self-contained file a researcher opens first.

Why a page of its own: the tables hold over a hundred rows whose settings run to 150 characters, so the page
opens on the first table's top rows in a short scrolling box (a reader sees scores at once), then the headline
figures (score against cache budget per model family, the gap to full attention, speed against prompt length),
then the other tables, each with the scores first and the settings and provenance folded into
a <details> cell. A small inline script sorts any column (first click: best first), filters rows by text, and one
switch shows or hides the paper's reported rows. Everything is inline (PNG data URIs, CSS, script): no network.
"""
from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import pandas as pd

from golinear.bench.boards.figures import png_bytes, pyplot
from golinear.bench.boards.gaps import CONTROL_GAP_LABEL

FOLDED = ("status", "source", "setting")  # long or repetitive: in the row's details cell, still searchable
LEADING = ("model", "task", "cache", "share of full layers", "selection")  # what a row is, before its scores
NOT_SCORES = {"n", "HQA n", "context", "params", "cache", "limit"}  # numbers, but not results
LOWER_IS_BETTER = {"LAMBADA ppl", "Books last word ppl"}
HEADLINE_SCORES = ("CR", "Avg", "MMLU", "LAMBADA")  # averages and headline tasks, in front of the rest
EXTRA_FIGURES = {  # figures other commands write into the same folder, shown when present
    "kv-compression.png": ("Linearize or compress",
                           "S-NIAH mean against the cache budget: the linearized rows beside KV-cache compression "
                           "(kvpress presses) of the same full-attention model at the same budgets; at each budget "
                           "the rows sit side by side around it, bars their 95 % intervals "
                           "(leaderboards/kv-compression.md)."),
    "latency.png": ("Speed against prompt length",
                    "Decode latency and memory against prompt length, full attention against the linearized "
                    "default (`golinear latency`; leaderboards/latency.md)."),
    "retention.png": ("Retention slots", "Accuracy of the retention-slot models by budget (`golinear claims`)."),
}

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em 2em;max-width:120em;color:#222}
h1{margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}
.figs{display:grid;grid-template-columns:repeat(auto-fit,minmax(34em,1fr));grid-auto-flow:dense;gap:1em}
figure{margin:0;border:1px solid #e3e3e3;padding:.5em;background:#fff}.figs figure.wide{grid-column:1/-1}
figure img{max-width:100%;height:auto}figcaption{font-size:13px;color:#444}
.controls{position:sticky;top:0;background:#fafafa;padding:.4em;border:1px solid #ddd;z-index:2}
.scroll{overflow:auto;max-width:100%;max-height:85vh;margin:.5em 0 1em;border:1px solid #e3e3e3}
table.board{border-collapse:collapse;font-size:13px}
.board td,.board th{border:1px solid #d6d6d6;padding:2px 6px;text-align:right;vertical-align:top}
.board th{background:#f0f0f0;cursor:pointer;position:sticky;top:0;white-space:nowrap}
.board th.nosort{cursor:default}.board th[aria-sort=descending]::after{content:" \\25BC"}
.board th[aria-sort=ascending]::after{content:" \\25B2"}
.board td.text,.board th.text{text-align:left;white-space:nowrap}.board td.text:first-child{white-space:normal}
.board td.score{font-variant-numeric:tabular-nums}
.board th.score{background:#e6eefa}
tr.paper{color:#555;background:#f7f7f7}tr.gap{font-style:italic;background:#fff4e0}
body.hide-paper tr.paper{display:none}tr.nomatch{display:none}
details{text-align:left;max-width:40em;font-size:12px}summary{cursor:pointer;color:#036}
.badge{font-size:11px;padding:0 4px;border-radius:3px;background:#e0ecd8;margin-left:4px}
tr.paper .badge{background:#e3e3e3}tr.gap .badge{background:#f7dfb5}
input.filter{width:24em}
"""

SCRIPT = """
(function(){
  function key(td){var t=td?td.textContent.trim().replace(/,/g,''):'';var v=parseFloat(t);
    return t===''?null:(isNaN(v)||!/^[-+]?[0-9.]+(e[-+]?[0-9]+)?$/i.test(t)?t.toLowerCase():v);}
  function sortBy(table,i,th){
    var dir=th.getAttribute('aria-sort');
    dir=dir?(dir==='descending'?'ascending':'descending'):th.dataset.first;
    table.querySelectorAll('th').forEach(function(h){h.removeAttribute('aria-sort');});
    th.setAttribute('aria-sort',dir);
    var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows),sign=dir==='ascending'?1:-1;
    rows.sort(function(a,b){var x=key(a.cells[i]),y=key(b.cells[i]);
      if(x===null||y===null)return (x===null)-(y===null);
      if(typeof x!==typeof y)return typeof x==='number'?-1:1;
      return x<y?-sign:x>y?sign:0;});
    rows.forEach(function(r){body.appendChild(r);});
  }
  document.querySelectorAll('table.board').forEach(function(table){
    table.querySelectorAll('th').forEach(function(th,i){
      if(!th.classList.contains('nosort'))th.addEventListener('click',function(){sortBy(table,i,th);});});
  });
  document.querySelectorAll('input.filter').forEach(function(box){
    box.addEventListener('input',function(){var q=box.value.toLowerCase();
      document.getElementById(box.dataset.table).tBodies[0].querySelectorAll('tr').forEach(function(r){
        r.classList.toggle('nomatch',q!==''&&r.textContent.toLowerCase().indexOf(q)<0);});});
  });
  var sw=document.getElementById('show-paper');
  function apply(){document.body.classList.toggle('hide-paper',!sw.checked);}
  sw.addEventListener('change',apply);apply();
})();
"""


# ----------------------------------------------------------------------------- figures
def _budget_x(label) -> float:
    return math.inf if str(label) == "inf" else float(label)


def score_by_budget_plot(standard: pd.DataFrame, family_of_key: dict, score: str = "CR") -> bytes | None:
    """PNG: a score of the full-set measured rows against cache budget, one line per model family (a family
    measured at one budget only is a point); full attention a dotted horizontal line."""
    rows = standard[(standard["status"] == "measured") & (standard["limit"] == "full set")
                    & standard[score].notna()] if len(standard) else standard
    if not len(rows):
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
    full = rows[rows["cache"] == "inf"]
    for _, r in full.iterrows():
        ax.axhline(float(r[score]), color="black", linestyle=":", linewidth=1.2, label=f"{r['model']} (full attention)")
    finite = rows[rows["cache"] != "inf"].copy()
    finite["family"] = [family_of_key.get(k, m) for k, m in zip(finite["setting"], finite["model"])]
    finite["x"] = [_budget_x(c) for c in finite["cache"]]
    groups = sorted(finite.groupby("family"), key=lambda g: (-g[1]["x"].nunique(), -g[1][score].max(), g[0]))
    cmap = plt.get_cmap("tab10")
    for i, (family, g) in enumerate(groups):
        g = g.groupby("x")[score].max().sort_index()
        many = len(g) > 1
        style = dict(color=cmap(i % 10) if many else "grey", marker="o", markersize=4 if many else 3,
                     linewidth=1.2, linestyle="-" if many else "none", alpha=1.0 if many else 0.5)
        ax.plot(list(g.index), list(g.values), label=family if many else None, **style)
    if any(finite.groupby("family")["x"].nunique() == 1):
        ax.plot([], [], color="grey", marker="o", linestyle="none", alpha=0.5, label="other models (one budget each)")
    ax.set_xscale("symlog", base=2, linthresh=32)
    xs = sorted(set(finite["x"]))
    ax.set_xticks(xs, [str(int(x)) for x in xs])
    ax.set_xlabel("cache budget, tokens (sinks + window + slots)")
    ax.set_ylabel(f"{score} (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)
    return png_bytes(fig)


def gap_plot(standard: pd.DataFrame, columns=("CR", "MMLU", "LAMBADA")) -> bytes | None:
    """PNG: full attention (and, where measured, the same-training control) minus the best linearized row at the
    paper's budget, per table and backbone (ours and the paper's)."""
    gaps = standard[(standard["status"] == "gap") & (standard["limit"] == "full set")] if len(standard) else standard
    columns = [c for c in columns if len(gaps) and gaps[c].notna().any()]
    if not columns:
        return None
    plt = pyplot()
    def who(source, model):  # a measured gap is with untrained full attention, or with the same-training control
        return ("ours" + (", vs the same-training control" if model == CONTROL_GAP_LABEL else "")
                if source == "measured" else str(source))
    labels = [who(s, m) + f", {b}" for s, m, b in zip(gaps["source"], gaps["model"], gaps["backbone"])]
    fig, axes = plt.subplots(1, len(columns), figsize=(3.4 * len(columns) + 2.5, 0.32 * len(labels) + 1.4), dpi=100,
                             sharey=True, squeeze=False)
    for ax, col in zip(axes[0], columns):
        vals = [float(v) if pd.notna(v) else 0.0 for v in gaps[col]]
        colours = ["tab:orange" if s == "measured" else "tab:blue" for s in gaps["source"]]
        ax.barh(range(len(vals)), vals, color=colours)
        ax.set_title(f"{col}: gap, points")
        ax.axvline(0, color="black", linewidth=0.8)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(labels)), labels, fontsize=10)
    axes[0][0].invert_yaxis()
    return png_bytes(fig)


# ----------------------------------------------------------------------------- tables
def _text(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:,.2f}" if isinstance(v, float) else str(v)  # thousands separated: 146,553,448.60


def column_order(table: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    """(leading, score, other) visible columns; FOLDED columns go to the details cell."""
    cols = [c for c in table.columns if c not in FOLDED]
    lead = [c for c in LEADING if c in cols]
    scores = [c for c in cols if c not in lead and c not in NOT_SCORES and pd.api.types.is_numeric_dtype(
        pd.to_numeric(table[c], errors="coerce")) and pd.to_numeric(table[c], errors="coerce").notna().any()
        and table[c].map(lambda v: v is None or isinstance(v, (int, float))).all()]
    scores = [c for c in HEADLINE_SCORES if c in scores] + [c for c in scores if c not in HEADLINE_SCORES]
    other = [c for c in cols if c not in lead and c not in scores]
    return lead, scores, other


FIRST_TABLE_HEIGHT = "28em"  # the first table's box: its top rows, then the figures, within the first screens


def table_html(table_id: str, table: pd.DataFrame, height: str | None = None) -> str:
    if table.empty:
        return "<p><i>no rows</i></p>"
    lead, scores, other = column_order(table)
    folded = [c for c in FOLDED if c in table.columns]
    head = "".join(f"<th class='text' data-first='ascending'>{html.escape(c)}</th>" for c in lead)
    head += "".join(f"<th class='score' data-first='{'ascending' if c in LOWER_IS_BETTER else 'descending'}'"
                    f">{html.escape(str(c))}</th>" for c in scores)
    head += "".join(f"<th class='text' data-first='ascending'>{html.escape(c)}</th>" for c in other)
    head += "<th class='nosort text'>details</th>" if folded else ""
    body = []
    for _, r in table.iterrows():
        status, source = str(r.get("status", "measured")), str(r.get("source", "measured"))
        classes = [status] + (["paper"] if source not in ("measured", "nan") else [])
        cells = []
        for i, c in enumerate(lead):
            badge = f"<span class='badge'>{html.escape(status)}</span>" if i == 0 and "status" in table.columns else ""
            cells.append(f"<td class='text'>{html.escape(_text(r[c]))}{badge}</td>")
        cells += [f"<td class='score'>{html.escape(_text(r[c]))}</td>" for c in scores]
        cells += [f"<td class='text'>{html.escape(_text(r[c]))}</td>" for c in other]
        if folded:
            summary = html.escape(source if source != "measured" else "settings")
            inner = "<br>".join(f"<b>{html.escape(c)}</b>: {html.escape(_text(r[c]))}" for c in folded)
            cells.append(f"<td class='text'><details><summary>{summary}</summary>{inner}</details></td>")
        body.append(f"<tr class='{' '.join(classes)}'>" + "".join(cells) + "</tr>")
    box_style = f' style="max-height:{height}"' if height else ""
    return (f"<p><input class='filter' type='search' data-table='{table_id}' placeholder='filter rows (any text)'>"
            f"</p><div class='scroll'{box_style}>"
            f"<table class='board' id='{table_id}'><thead><tr>{head}</tr></thead><tbody>\n"
            + "\n".join(body) + "\n</tbody></table></div>")


def _img(alt: str, png: bytes) -> str:
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


WIDE_PX = 1000  # a figure drawn wider than this takes a whole row of the grid (not shrunk into one column)


def png_width(png: bytes) -> int:
    return int.from_bytes(png[16:20], "big")  # the IHDR chunk's width, right after the 8-byte signature


def figure_html(title: str, caption: str, png: bytes) -> str:
    wide = " class='wide'" if png_width(png) > WIDE_PX else ""
    return (f"<figure{wide}>{_img(title, png)}<figcaption><b>{html.escape(title)}.</b> {html.escape(caption)}"
            "</figcaption></figure>")


# ----------------------------------------------------------------------------- page
def render_page(sections: list[tuple[str, str, str, pd.DataFrame]], images: dict[str, bytes | None],
                family_of_key: dict, out_dir: Path) -> str:
    """The page. sections: (name, title, note, table) with the standard table named "standard"; images: section
    name -> its own plot (shown under its table); family_of_key: measured model key -> family name; out_dir: where
    the other commands' figures (EXTRA_FIGURES) are read from."""
    tables = {name: table for name, _, _, table in sections}
    standard = tables.get("standard", pd.DataFrame())
    figures = []
    cr = score_by_budget_plot(standard, family_of_key) if len(standard) else None
    if cr:
        figures.append(figure_html("Score against cache budget", "CR (mean of the five zero-shot common-reasoning "
                                   "tasks, full test sets) of every measured model family by its cache budget; "
                                   "dotted: full attention.", cr))
    if images.get("sniah"):
        figures.append(figure_html("S-NIAH against cache budget", "Needle retrieval accuracy by cache budget "
                                   "(measured: solid; the paper's: dashed).", images["sniah"]))
    gap = gap_plot(standard) if len(standard) else None
    if gap:
        figures.append(figure_html("Gap to full attention", "Full attention minus the best linearized model at the "
                                   "paper's cache budget (window 56 + 8 sinks), in points, per table and backbone "
                                   "(orange: ours at 135M; blue: the paper's).", gap))
    for i, (name, (title, caption)) in enumerate(EXTRA_FIGURES.items()):
        if (Path(out_dir) / name).is_file():  # linearize-or-compress second, beside the first; the others last
            at = min(1, len(figures)) if i == 0 else len(figures)
            figures.insert(at, figure_html(title, caption, (Path(out_dir) / name).read_bytes()))
    parts = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'><title>golinear leaderboard</title>",
             f"<style>{STYLE}</style></head><body>", "<h1>golinear leaderboard</h1>",
             "<p>Post hoc linearized transformers on one suite. Rows marked <b>measured</b> come from the result "
             "store; rows from the paper (arXiv 2607.07706) are marked <b>reported</b> with their table in "
             "<i>details</i>. Accuracies in %. Click a column to sort it (best first), type to filter.</p>",
             "<div class='controls'><label><input type='checkbox' id='show-paper' checked> show the paper's "
             "reported rows</label> &middot; " + " &middot; ".join(
                 f"<a href='#{n}'>{html.escape(t)}</a>" for n, t, _, _ in sections) + "</div>",
             ]
    figs = "<h2 id='figures'>Headline figures</h2><div class='figs'>" + "".join(figures) + "</div>"
    for i, (name, title, note, table) in enumerate(sections):
        parts.append(f"<h2 id='{name}'>{html.escape(title)}</h2><p>{html.escape(note)}</p>")
        parts.append(table_html(f"table-{name}", table, FIRST_TABLE_HEIGHT if i == 0 else None))
        if images.get(name) and name != "sniah":
            parts.append(_img(title, images[name]))
        if i == 0:
            parts.append(figs)
    if not sections:
        parts.append(figs)
    parts.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(parts) + "\n"
