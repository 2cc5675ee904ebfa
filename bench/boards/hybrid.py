"""The Figure 5 analog: strict GDN with a share of the layers kept as full attention, spread evenly or chosen by
`golinear diagnose`'s hardness score, on CR and LAMBADA.

Why its own table: the standard table lists every model flat; the paper's question here is a curve, quality against
the share of full-attention layers for two ways of choosing them. Rows come from the result store's full-set cells
(a row needs no column to be present; missing cells stay blank), read by what each cell's model info says it is
(`linearize`: gdn, no window, sinks, conv or LoRA; `keep_full` and `select`), not by folder name. 0 % is the strict
model the hybrids are made from, 100 % full attention; both end every curve.
"""
from __future__ import annotations

import pandas as pd

from golinear.bench.boards.figures import png_bytes, pyplot
from golinear.bench.boards.measured import CR_COLS, add_cr

COLUMNS = ["CR", "LAMBADA", "LAMBADA ppl"]
STRICT = {"mechanism": "gdn", "window": 0, "sinks": 0, "short_conv": False, "lora": False}


def hybrid_of(model: dict) -> tuple[float, str] | None:
    """(share of full-attention layers, selection) of a cell's model, or None when it is no strict-GDN hybrid:
    full attention is (1.0, 'full'), the strict model itself (0.0, 'none')."""
    if model.get("full_attention"):
        return 1.0, "full"
    info = model.get("info") or {}
    lin = info.get("linearize") or {}
    if not lin or any(lin.get(k, v) != v for k, v in STRICT.items()) or info.get("cache_options"):
        return None
    if lin.get("full_layers"):  # layers named by hand: no point of either curve
        return None
    share = float(lin.get("keep_full") or 0.0)
    return (share, lin.get("select") or "uniform") if share else (0.0, "none")


def hybrid_table(df: pd.DataFrame, cells: list[dict]) -> pd.DataFrame:
    """One row per strict-GDN model in the store (full sets only), by share of full-attention layers."""
    models = {c["key"]["model"]: c["model"] for c in cells}
    kinds = {key: hybrid_of(model) for key, model in models.items()}
    cols = ["share of full layers", "selection", "model", "out_norm"] + COLUMNS
    if df.empty:
        return pd.DataFrame(columns=cols)
    wanted = df["column"].isin(COLUMNS + CR_COLS) & df["model_key"].map(lambda k: kinds.get(k) is not None)
    f = df[df["limit"].isna() & wanted]
    rows = []
    for key, g in f.groupby("model_key", sort=False):
        share, select = kinds[key]
        norm = ((models[key].get("info") or {}).get("linearize") or {}).get("out_norm")
        row = {"share of full layers": f"{share:.0%}", "selection": select, "model": g["model"].iloc[0],
               "out_norm": "" if share == 1.0 else ("yes" if norm else "no"), "_share": share}
        row |= {c: float(g[g["column"] == c]["value"].mean()) for c in COLUMNS + CR_COLS if (g["column"] == c).any()}
        rows.append(add_cr(row))
    rows.sort(key=lambda r: (r["_share"], r["selection"], r["model"]))
    return pd.DataFrame(rows, columns=cols + ["_share"]).drop(columns="_share")  # (CR's five tasks: standard.md)


def hybrid_plot(table: pd.DataFrame) -> bytes | None:
    """PNG: CR and LAMBADA against the share of full-attention layers, one line per selection; the strict model
    (0 %, with the output RMSNorm where it has one) and full attention (100 %) end both lines."""
    if table.empty or not (table["selection"].isin(["uniform", "hardness"])).any():
        return None
    plt = pyplot()
    share = table["share of full layers"].str.rstrip("%").astype(float)
    ends = table[table["selection"].isin(["none", "full"]) & ((table["out_norm"] != "no") | (share == 100))]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), dpi=100)
    for ax, col in zip(axes, ["CR", "LAMBADA"]):
        for select, colour in (("uniform", "tab:blue"), ("hardness", "tab:orange")):
            t = pd.concat([table[table["selection"] == select], ends]).dropna(subset=[col])
            x = t["share of full layers"].str.rstrip("%").astype(float)
            order = x.argsort()
            ax.plot(x.iloc[order], t[col].iloc[order], marker="o", color=colour, label=select)
        ax.set_xlabel("full-attention layers (%)")
        ax.set_ylabel(f"{col} (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=10)
    fig.suptitle("strict GDN hybrids (Figure 5 analog)", fontsize=10)
    return png_bytes(fig)
