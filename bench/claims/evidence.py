"""Our side of a claim: the checkpoints' runs by recipe and the result store's cells, one value per seed.

A recipe's runs are its folders `<recipe>`, `<recipe>-10m`, `<recipe>-seedN`; the runs that reached their requested
steps are used, one per seed (mean +- sample std over them), else the longest one, labelled with its steps. A
checkpoint's store cells count only while they are of the folder's current files.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from golinear.bench.claims.metrics import CE
from golinear.bench.boards.measured import CR_COLS, RULER_COLS, SNIAH_TASKS, measured_frame, study_setting
from golinear.bench.results.store import Store
from golinear.models.spec import checkpoint_identity

RUN_NAME = re.compile(r"^(?P<recipe>.+?)(?:-10m|-seed(?P<seed>\d+))?$")


# ----------------------------------------------------------------------------- our evidence
@dataclass
class Run:
    name: str
    steps: int
    requested: int
    heldout: float | None
    full_attention_heldout: float | None
    seed: int = 0
    files: str = ""  # the folder's files hash, as store keys name it (`checkpoint_files=`)

    @property
    def finished(self) -> bool:
        return self.steps >= self.requested


@dataclass
class Evidence:
    """Our numbers: the checkpoints' runs by recipe and the store's long frame."""
    runs: dict = field(default_factory=dict)  # recipe -> [Run]
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)


def load_runs(checkpoints: Path) -> dict:
    """recipe -> its runs, from every `<folder>/train_config.json`."""
    runs = {}
    for cfg in sorted(Path(checkpoints).glob("*/train_config.json")):
        try:
            c = json.loads(cfg.read_text())
            res, s = c.get("results", {}), c.get("summary", {})
            run = Run(cfg.parent.name, int(s.get("step", 0)), int(c["train"]["steps"]),
                      res.get("heldout_loss_trained"), res.get("heldout_loss_full_attention"),
                      int(c["train"].get("seed", 0)), checkpoint_identity(cfg.parent) or "")
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{cfg}: not a `golinear train` record ({type(e).__name__}: {e})") from None
        runs.setdefault(RUN_NAME.match(run.name)["recipe"], []).append(run)
    return runs


def pick(runs: list[Run]) -> list[Run]:
    """The finished runs, one per seed (the first folder name of a seed: `<recipe>` before `<recipe>-10m`),
    else the longest run."""
    done = list({r.seed: r for r in sorted(runs, key=lambda r: r.name, reverse=True) if r.finished}.values())
    return sorted(done, key=lambda r: r.name) or sorted(runs, key=lambda r: -r.steps)[:1]


def store_value(frame: pd.DataFrame, target: str, metric: str, cols, run: Run | None = None) -> float | None:
    """Mean of `cols` for one model in the store, None unless every column is there (full sets only, long-context
    cells at the study's setting only; a checkpoint's cells only when they are of the folder's current files)."""
    if frame.empty:
        return None
    cols = cols or {"CR": CR_COLS, "LAMBADA": ["LAMBADA"], "S-NIAH": SNIAH_TASKS, "RULER": RULER_COLS}[metric]
    f = study_setting(frame[frame["limit"].isna()])
    if target == "full":
        f = f[f["full_attention"]]
    elif target.startswith("none@"):
        f = f[f["model_key"].str.contains("mechanism=none") & (f["budget"] == target[5:])]
    else:  # cache options after the recipe (a training-free row) are part of the family name
        opts = target[len(recipe_of(target)):]
        f = f[f["model_key"].str.contains(f"checkpoint_files={run.files}", regex=False)
              & (f["family"] == run.name + opts)]
    vals = f.groupby("column")["value"].mean()
    return float(vals[cols].mean()) if all(c in vals for c in cols) else None


def recipe_of(target: str) -> str:
    """A role's recipe: the target before any cache options (`gdn-w248-s8-sc,window=124,retain=124`)."""
    return target.split(",")[0]


def role_scores(ev: Evidence, target: str, cols, metric: str) -> tuple[list[float], str]:
    """Our values for one role under one metric (one per seed) and a label of where they come from."""
    recipe = recipe_of(target)
    if metric == CE.name:
        if recipe != target:  # cache options change no parameter: the folder's held-out CE is not this row's
            return [], ""
        if target == "full":
            vals = sorted({r.full_attention_heldout for rs in ev.runs.values() for r in rs} - {None})
            return vals[:1], "frozen full attention"
        runs = [r for r in pick(ev.runs.get(target, [])) if r.heldout is not None]
        return [r.heldout for r in runs], label(runs)
    if target == "full" or target.startswith("none@"):
        v = store_value(ev.frame, target, metric, cols)
        return ([] if v is None else [v]), ""
    runs = pick([r for r in ev.runs.get(recipe, []) if store_value(ev.frame, target, metric, cols, r) is not None])
    waiting = [r for r in pick(ev.runs.get(recipe, [])) if r.finished and r not in runs]
    return ([store_value(ev.frame, target, metric, cols, r) for r in runs],
            label(runs) + (f"; not yet evaluated: {label(waiting)}" if runs and waiting else ""))


def label(runs: list[Run]) -> str:
    if len(runs) == 1 and not runs[0].finished:
        return f"`{runs[0].name}`, {runs[0].steps} of {runs[0].requested} steps"
    return ", ".join(f"`{r.name}`" for r in runs)


def spread(vals: list[float]) -> str:
    if len(vals) < 2:
        return ""
    return f"{statistics.mean(vals):.4f} +- {statistics.stdev(vals):.4f} ({len(vals)} seeds)"


def evidence(store: Store, checkpoints: Path) -> Evidence:
    return Evidence(load_runs(checkpoints), measured_frame(store.cells()))
