"""The result store's cells as one long table of reported columns (what every rendered table reads).

Why its own module: the leaderboard, the hybrid table and the claims all read the same columns (CR's five
tasks, S-NIAH, RULER) from the same long frame; here, below all of them, none has to import another's renderer.
"""
from __future__ import annotations

import math

import pandas as pd

from golinear.bench.boards.families import family_of
from golinear.bench.run.specs import scorer_by_file_name

CR_COLS = ["PIQA", "ARC-e", "ARC-c", "HellaSwag", "WinoGrande"]
STANDARD_COLS = CR_COLS + ["CR", "MMLU", "LAMBADA", "LAMBADA ppl"]
REF_STANDARD = {"piqa": "PIQA", "arc_easy": "ARC-e", "arc_challenge": "ARC-c", "hellaswag": "HellaSwag",
                "winogrande": "WinoGrande", "cr": "CR", "mmlu": "MMLU", "lambada": "LAMBADA"}
SNIAH_TASKS = ["S-NIAH-1", "S-NIAH-2", "S-NIAH-3"]
RULER_COLS = ["MK", "MQ", "MV", "CWE", "FWE", "HQA", "SQA", "VT"]
LOWER_IS_BETTER = {"LAMBADA ppl", "Books last word ppl"}


# ----------------------------------------------------------------------------- columns
def column_specs() -> list[tuple[str, str, str, bool]]:
    """(task, metric, column, scale_to_percent) for every reported number, from the suites' SUITES."""
    from golinear.bench.run.plan import ALL_SUITES, resolve_suites
    out = []
    for suite in ALL_SUITES:
        try:
            entries = resolve_suites([suite])
        except ValueError:
            continue
        out += [(e.task, e.metric, e.display, not e.long and e.metric not in ("perplexity", "word_perplexity"))
                for e in entries]
    return out


def budget_value(b):
    return math.inf if b in ("inf", None) or (isinstance(b, float) and math.isinf(b)) else float(b)


def budget_label(b) -> str:
    b = budget_value(b)
    return "inf" if math.isinf(b) else str(int(b))


def by_file_name(label: str | None) -> str | None:
    """A stored label with its scorer file named by its file name (cells stored before labels were)."""
    return ",".join(scorer_by_file_name(label)) if label and "scorer=" in label else label


def measured_frame(cells: list[dict]) -> pd.DataFrame:
    """Long table of measured numbers: one row per (cell, reported column)."""
    specs = column_specs()
    by_task = {}
    for task, metric, col, pct in specs:
        by_task.setdefault(task, []).append((metric, col, pct))
    rows = []
    for c in cells:
        wanted = by_task.get(c["task"]) or [(c["metric"], c.get("display") or c["task"],
                                             c.get("suite") in ("cr", "mmlu", "lambada"))]
        for metric, col, pct in wanted:
            m = next((v for k, v in c.get("metrics", {}).items() if k.split(",")[0] == metric), None)
            if m is None or m.get("value") is None:
                continue
            scale = 100.0 if pct else 1.0
            cfg = c["key"]["config"]
            model = c["model"]
            label, family = (by_file_name(model.get(k)) for k in ("label", "family"))
            family_id, family_name = family_of(model)
            rows.append({"suite": c.get("suite"), "column": col, "value": m["value"] * scale,
                         "stderr": None if m.get("stderr") is None else m["stderr"] * scale, "n": c.get("n"),
                         "backbone": model.get("backbone"), "model": label,
                         "family": family or label, "model_key": c["key"]["model"],
                         "family_id": family_id, "family_name": family_name,
                         "full_attention": bool(model.get("full_attention")),
                         "budget": budget_label(model.get("budget")), "new_params": model.get("new_parameters"),
                         "limit": cfg.get("limit"), "context_length": cfg.get("context_length"),
                         "num_samples": cfg.get("num_samples"), "digest": c.get("digest"),
                         "dtype": (model.get("args") or {}).get("dtype") or "float32",
                         "per_sample": c.get("per_sample") or None})
    return pd.DataFrame(rows)


# The study's long-context setting: the claims and the retention table compare S-NIAH and RULER cells at this
# context length and sample count only; cells at other settings (the needle-type and KV-compression matrices at
# 1K or 50 samples) have tables of their own and must not be averaged into a study cell.
STUDY_CONTEXT, STUDY_SAMPLES = 4096, 500
STUDY_DTYPE = "float32"  # the study's cells; a bf16 GPU run (the KV-compression matrix) has tables of its own


def study_setting(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` without the long-context cells measured at another context length or sample count."""
    if frame.empty:
        return frame
    long = frame["context_length"].notna()
    setting = (frame["context_length"] == STUDY_CONTEXT) & (frame["num_samples"] == STUDY_SAMPLES)
    return frame[(~long | setting) & (frame.get("dtype", STUDY_DTYPE) == STUDY_DTYPE)]


def add_cr(row: dict) -> dict:
    if row.get("CR") is None and all(row.get(c) is not None for c in CR_COLS):
        row["CR"] = sum(row[c] for c in CR_COLS) / len(CR_COLS)
    return row
