"""`golinear check`: a regression check of one model on a fixed small subset against a committed baseline.

The baseline JSON names the subset (suites, limit) and holds, per task and metric, the value, its
stderr and n. The check evaluates the model on exactly that subset in a fresh store and fails (exit 1,
with a readable table) when a score moves the wrong way by more than z x the baseline's stderr (plus an
absolute floor), when n differs, or when a cell is missing. `--update` (re)writes the baseline.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from golinear.bench.cli_args import CHECK_LIMIT, CHECK_SUITES, CHECK_Z
from golinear.models.util.atomic import atomic_write

TMP_PREFIX = "golinear-check-"


def remove_stale_temp_stores() -> None:
    """Temp stores of `golinear check` runs whose process is gone (killed with SIGKILL: no cleanup ran)."""
    from golinear.bench.results.processes import pid_alive
    for d in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*-*"):
        pid = d.name[len(TMP_PREFIX):].split("-", 1)[0]
        if d.is_dir() and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def temp_store():
    """A temp store removed on every exit path: errors, Ctrl-C, SIGTERM (turned into SystemExit here) and,
    for SIGKILL, by the next check (the folder name carries the pid)."""
    remove_stale_temp_stores()
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-") as d:
            yield d
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


NOT_A_MEAN = ("perplexity", "bits_per_byte")  # metrics lm-eval aggregates otherwise than as a mean of samples


def samples_problem(cell: dict) -> str | None:
    """Why a cell's value is not the mean of its own per-sample scores (a value edited by hand), or None when it is,
    or when the cell holds none or its metric is not a mean."""
    samples, value = cell.get("per_sample") or {}, cell.get("value")
    if not samples or value is None or any(w in str(cell.get("metric")) for w in NOT_A_MEAN):
        return None
    mean = sum(samples.values()) / len(samples)
    if abs(mean - value) <= 1e-6 * max(1.0, abs(value)) and cell.get("n") in (None, len(samples)):
        return None
    return (f"{cell.get('task')} {cell.get('metric')} = {value:g} with n = {cell.get('n')}, but its {len(samples)} "
            f"per-sample scores give {mean:g}")


def evaluate_subset(model: str, suites: str, limit: int, store_dir=None, **run_kwargs) -> list[dict]:
    """One row per (task, metric) reported by the suites, evaluated on `model` in a store of its own (or the given
    one, whose cells are then recomputed from their per-sample scores: a value edited by hand is a row's problem)."""
    from golinear.bench.run.runner import resolve_suites, run_matrix
    with (temp_store() if store_dir is None else contextlib.nullcontext(store_dir)) as store:
        summary = run_matrix([model], suites, store, limit=limit, **run_kwargs)
        cells = {c["task"]: c for c in summary.cells if c}
    rows = []
    for e in resolve_suites(suites):
        cell = cells.get(e.task)
        m = None if cell is None else next((v for k, v in cell["metrics"].items() if k.split(",")[0] == e.metric), None)
        rows.append({"task": e.task, "metric": e.metric, "display": e.display, "higher_is_better": e.higher_is_better,
                     "value": None if m is None else m["value"], "stderr": None if m is None else m["stderr"],
                     "n": None if cell is None else cell["n"],
                     "problem": None if cell is None else samples_problem(cell)})
    return rows


def read_baseline(path: Path) -> dict:
    """A baseline file, checked before any evaluation: one line naming the file and the problem otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(f"baseline {str(path)!r} is not readable JSON: {e}") from None
    problem = baseline_problem(data)
    if problem:
        raise ValueError(f"baseline {str(path)!r}: {problem}; expected the form `golinear check --update` writes")
    return data


def _num(v, none_ok=False) -> bool:
    return (v is None and none_ok) or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def baseline_problem(data) -> str | None:
    if not isinstance(data, dict):
        return f"expected a JSON object, found {type(data).__name__}"
    cells = data.get("cells")
    if not isinstance(cells, list) or not cells:
        return "no 'cells' list (task, metric, value, stderr, n per score)"
    for i, c in enumerate(cells):
        if not (isinstance(c, dict) and isinstance(c.get("task"), str) and isinstance(c.get("metric"), str)
                and _num(c.get("value")) and _num(c.get("stderr"), none_ok=True)
                and isinstance(c.get("n"), int) and not isinstance(c.get("n"), bool) and c["n"] >= 1):
            return f"cells[{i}] lacks a task, metric, finite value, stderr or positive n"
    subset = data.get("subset", {})
    if not isinstance(subset, dict) or not isinstance(subset.get("suites", ""), str) \
            or not (isinstance(subset.get("limit", 1), int) and subset.get("limit", 1) >= 1):
        return "'subset' must hold suites (comma-separated) and a positive limit"
    if "parameters" in data:
        from golinear.bench.run.param_stats import stats_problem
        problem = stats_problem(data["parameters"])
        if problem:
            return problem
    tol = data.get("tolerance", {})
    if not isinstance(tol, dict) or not all(_num(tol.get(k, 0.0)) and tol.get(k, 0.0) >= 0 for k in ("z", "min_abs")):
        return "'tolerance' must hold non-negative numbers z and min_abs"
    return None


def compare(baseline: dict, current: list[dict], z: float, min_abs: float = 0.0) -> list[dict]:
    """Per baseline row: status ok / improved / DROP / MISSING / N-CHANGED, with delta and tolerance."""
    cur = {(r["task"], r["metric"]): r for r in current}
    out = []
    for b in baseline["cells"]:
        c = cur.get((b["task"], b["metric"]))
        row = {**b, "current": None, "delta": None, "tolerance": None}
        if c is None or c["value"] is None:
            row["status"] = "MISSING"
            out.append(row)
            continue
        tol = z * (b.get("stderr") or 0.0) + min_abs
        sign = 1.0 if b.get("higher_is_better", True) else -1.0
        delta = c["value"] - b["value"]
        row.update(current=c["value"], current_n=c["n"], delta=delta, tolerance=tol)
        if c["n"] != b["n"]:
            row["status"] = "N-CHANGED"
        elif not math.isfinite(c["value"]) or sign * delta < -tol:
            row["status"] = "DROP"
        elif sign * delta > tol:
            row["status"] = "improved"
        else:
            row["status"] = "ok"
        out.append(row)
    return out


def render(rows: list[dict]) -> str:
    from tabulate import tabulate

    def f(v):
        return "" if v is None else f"{v:.4f}"
    table = [[r["status"], r.get("display") or r["task"], r["metric"], f(r["value"]), f(r.get("stderr")),
              r.get("n"), f(r["current"]), f(r["delta"]), f(r["tolerance"])] for r in rows]
    return tabulate(table, headers=["status", "task", "metric", "baseline", "stderr", "n", "current", "delta",
                                    "tolerance"], disable_numparse=True)


FAILING = ("DROP", "MISSING", "N-CHANGED")


def run_check(model: str, baseline_path, update=False, suites=None, limit=None, z=None, min_abs=None,
              store_dir=None, **run_kwargs) -> tuple[int, str]:
    """(exit code, report). Exit 0: within tolerance (or baseline written); 1: regression."""
    path = Path(baseline_path)
    baseline = read_baseline(path) if path.exists() else None
    if baseline is None and not update:
        raise FileNotFoundError(f"baseline {str(path)!r} does not exist; create it with --update")
    for name, v in (("--z", z), ("--min-abs", min_abs)):
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} {v!r}: expected a non-negative number")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit {limit!r}: expected a positive integer")
    subset = (baseline or {}).get("subset", {})
    suites = suites or subset.get("suites") or CHECK_SUITES
    limit = limit or subset.get("limit") or CHECK_LIMIT
    tol = (baseline or {}).get("tolerance", {})
    z = z if z is not None else tol.get("z", CHECK_Z)
    min_abs = min_abs if min_abs is not None else tol.get("min_abs", 0.0)
    if update:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot write baseline {str(path)!r}: {e.strerror or e}") from None
    from golinear.bench.run.param_stats import new_parameter_stats, stats_changes
    head = (f"golinear check: {model!r} vs {path} (suites {suites}, first {limit} docs, tolerance "
            f"{z:g} x stderr + {min_abs:g})")
    stats = new_parameter_stats(model)  # cheap (the checkpoint file alone): damaged weights fail before evaluating
    if baseline is not None and not update and "parameters" in baseline:
        changes = stats_changes(baseline["parameters"], stats)
        if changes:
            return 1, "\n".join([head, *changes, f"FAILED: the new parameters differ from the baseline's in "
                                                   f"{len(changes)} statistic(s); scores not evaluated"])
    current = evaluate_subset(model, suites, int(limit), store_dir, **run_kwargs)
    edited = [r["problem"] for r in current if r.get("problem")]
    if edited:
        return 1, "\n".join([head, *edited, f"FAILED: {len(edited)} cell(s) of {store_dir} hold a value their own "
                                               "per-sample scores do not give (edited by hand?); nothing compared"])
    if update:
        missing = [r["task"] for r in current if r["value"] is None]
        if missing:
            raise ValueError(f"cannot write a baseline: no result for {missing}")
        data = {"name": path.stem, "model": model, "subset": {"suites": suites, "limit": int(limit)},
                "tolerance": {"z": z, "min_abs": min_abs},
                "cells": [{k: r[k] for k in ("task", "metric", "display", "higher_is_better", "value", "stderr", "n")}
                          for r in current]}
        if stats is not None:
            data["parameters"] = stats
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
        return 0, f"golinear check: baseline written to {path} ({len(current)} scores)"
    rows = compare(baseline, current, z, min_abs)
    bad = [r for r in rows if r["status"] in FAILING]
    verdict = (f"FAILED: {len(bad)} of {len(rows)} scores regressed or missing" if bad
               else f"passed: {len(rows)} scores within tolerance")
    return (1 if bad else 0), "\n".join([head, render(rows), verdict])


def main(args) -> int:
    code, report = run_check(args.model, args.baseline, update=args.update, suites=args.suites, limit=args.limit,
                             z=args.z, min_abs=args.min_abs, store_dir=args.store, data_dir=args.data_dir,
                             batch_size=args.batch_size, device=args.device, progress=False)
    print(report)
    return code
