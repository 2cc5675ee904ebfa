"""The paper's side of a claim: {backbone: {role: score}} read from leaderboards/reference/*.csv."""
from __future__ import annotations

import pandas as pd

from golinear.bench.claims.roles import DEFAULT, REF_CR, RULER_AGG, RULER_RET, SMALLEST, SWA
from golinear.bench.boards.measured import SNIAH_TASKS


def std_rows(ref, table: int, roles: dict, col: str = "cr", backbone: str | None = None) -> dict:
    """{backbone: {role: value}} from paper_standard.csv; roles: role -> (model, setting or None); CR is the
    mean of the five tasks where the paper prints none (Table 10)."""
    t = ref["standard"]
    t = t[(t["table"] == table) & ((t["backbone"] == backbone) if backbone else True)]
    out = {}
    for bb, g in t.groupby("backbone", sort=False):
        for role, (model, setting) in roles.items():
            r = g[(g["model"] == model) & (g["setting"].fillna("") == (setting or ""))]
            if len(r):
                r = r.iloc[0]
                v = r[col] if pd.notna(r[col]) or col != "cr" else sum(r[c] for c in REF_CR) / len(REF_CR)
                out.setdefault(bb, {})[role] = float(v)
    return out


def sniah_rows(ref, roles: dict) -> dict:
    """roles: role -> (model, budget): mean over S-NIAH-1/2/3."""
    t = ref["sniah"]
    out = {}
    for role, (model, budget) in roles.items():
        r = t[(t["model"] == model) & (t["budget"].astype(str) == str(budget))]
        if set(r["task"]) == set(SNIAH_TASKS):
            out.setdefault(r["backbone"].iloc[0], {})[role] = float(r["value"].mean())
    return out


def ruler_rows(ref) -> dict:
    t = ref["ruler"]
    g = t[t["model"] == "GDN (paper)"]
    sizes = sorted(g["budget"].astype(int))
    out = {}
    for size, b in (("small", sizes[0]), ("large", sizes[-1])):
        r = g[g["budget"].astype(int) == b].iloc[0]
        out |= {f"agg@{size}": float(r[RULER_AGG].mean()), f"ret@{size}": float(r[RULER_RET].mean()),
                f"avg@{size}": float(r["avg"])}
    return {g["backbone"].iloc[0]: out}


def default_recipe(col: str):
    return lambda ref: std_rows(ref, 7, DEFAULT, col) | std_rows(ref, 10, DEFAULT, col, SMALLEST)


def no_conv(col: str):
    """The paper's GDN with window 56 + 8 sinks and no conv (Table 2) against its full attention."""
    return lambda ref: std_rows(ref, 6, {"full": DEFAULT["full"], "gdn": ("GDN", SWA)}, col)
