"""`golinear run --dry-run`: the cells a run would evaluate and how long they should take, from the speed the store
already measured for the same rows. A long run on a borrowed GPU is planned before it starts, and resumed knowing what
is left.

A row's speed is samples per second over its stored cells of the same suite and prompt length on the same kind of
device (cpu or cuda), counted from each cell's own wall time (first compile and graph capture included, as
scripts/gpu/eval_speed.py counts it); the cards it was measured on are named, since another card runs at another
speed, and only the cells of the newest version of the code count (by commit date where this checkout's git history
has the commit, else the newest cell file's): older code ran at its own speed. A row never
measured takes its family's (the same press or configuration at its other budgets), marked so: a
press's work hardly depends on its budget. A row with neither, or a cell whose sample count is not known before its
task loads (a short suite without --limit), gets no estimate, and the total says how many were left out.
"""
from __future__ import annotations

import subprocess

from tabulate import tabulate

from golinear.bench.run.plan import REPO_ROOT


def device_kind(device) -> str:
    """'cuda' for cuda / cuda:N (a cell records its device as cuda:0), else the name as given."""
    return str(device).split(":")[0]


def measured_speeds(cell_files: list, device) -> dict:
    """(model key, suite, context length) and ("family", family, suite, context length) -> {samples, seconds, cells,
    cards, code} over the stored cells (Store.cell_files) run on a device of the same kind, those of the newest
    version of the code among them (commit_times). Cells without a wall time or a sample count are passed over."""
    groups: dict = {}
    dated = commit_times()
    for path, cell in cell_files:
        hw = (cell.get("provenance") or {}).get("hardware") or {}
        n, wall = cell.get("n"), cell.get("wall_time_s")
        if device_kind(hw.get("device", "")) != device_kind(device) or not n or not wall:
            continue
        key, model = cell.get("key") or {}, cell.get("model") or {}
        where = (cell.get("suite"), (key.get("config") or {}).get("context_length"))
        full = str(((cell.get("provenance") or {}).get("git") or {}).get("commit") or "")
        code = full[:7] or "?"
        when = (1, dated[full]) if full in dated else (0, path.stat().st_mtime)  # a dated commit is newer than none
        for k in ((key.get("model"), *where), ("family", model.get("family"), *where)):
            row = groups.setdefault(k, {}).setdefault(code, {"samples": 0, "seconds": 0.0, "cells": 0, "cards": set(),
                                                             "code": code, "when": (0, 0.0)})
            row["samples"] += n
            row["seconds"] += wall
            row["cells"] += 1
            row["cards"].add(hw.get("gpu") or device_kind(hw.get("device", "?")))
            row["when"] = max(row["when"], when)
    return {k: max(by_code.values(), key=lambda r: r["when"]) for k, by_code in groups.items()}


def commit_times() -> dict:
    """{commit: its commit time} from this checkout's git history ({} without git or history)."""
    try:
        r = subprocess.run(["git", "-C", str(REPO_ROOT), "log", "--format=%H %ct"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {c: int(t) for c, t in (line.split() for line in r.stdout.splitlines() if line.count(" ") == 1)} \
        if r.returncode == 0 else {}


def samples_of(cell) -> int | None:
    """The samples (documents) a planned cell evaluates, where that is known before its task loads."""
    config = cell.config
    if cell.entry.long:
        return config.get("num_samples") or config.get("limit")
    return config.get("limit")


def plan_rows(todo: list, speeds: dict) -> list[dict]:
    """One row per model and suite of the to-do cells, in the order given: its tasks, samples (None where a cell's
    count is known only once its task loads), the measured speed it takes (None: none) and its seconds."""
    rows: dict = {}
    for c in todo:
        where = (c.entry.suite, c.config.get("context_length"))
        r = rows.get((c.model.key, c.entry.suite))
        if r is None:
            speed, family = speeds.get((c.model.key, *where)), False
            fam = getattr(c.model, "family", "")
            if not speed and fam and fam != c.model.label:
                speed = speeds.get(("family", fam, *where))
                family = bool(speed)
            r = rows[(c.model.key, c.entry.suite)] = {"label": c.model.label, "suite": c.entry.suite, "tasks": [],
                                                      "samples": 0, "speed": speed, "family": family}
        r["tasks"].append(c.entry.display or c.entry.task)
        n = samples_of(c)
        r["samples"] = None if n is None or r["samples"] is None else r["samples"] + n
    for r in rows.values():
        s = r["speed"]
        r["seconds"] = r["samples"] * s["seconds"] / s["samples"] if s and r["samples"] is not None else None
    return list(rows.values())


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 5940 else f"{seconds / 3600:.1f} h"


def render(rows: list[dict], planned: int, done: int, store, device) -> str:
    """The dry run's report: a table of the rows to evaluate and the total estimate."""
    head = (f"golinear run --dry-run: {planned} cells planned, {done} already in {store}, {planned - done} to evaluate "
            "(nothing was loaded or evaluated)")
    if not rows:
        return head
    on = device_kind(device)
    table = []
    for r in rows:
        s = r["speed"]
        speed = "-" if not s else (f"{s['samples'] / s['seconds']:.1f} ({s['cells']} cells" +
                                   (" at its other budgets" if r["family"] else "") +
                                   f"; {', '.join(sorted(s['cards']))}; code {s['code']})")
        table.append([r["label"], r["suite"], ", ".join(r["tasks"]),
                      "when loaded" if r["samples"] is None else str(r["samples"]), speed,
                      "-" if r["seconds"] is None else _minutes(r["seconds"])])
    timed = [r["seconds"] for r in rows if r["seconds"] is not None]
    left = len(rows) - len(timed)
    why = (f"{left} of {len(rows)} rows without one: no cell of theirs on {on} in the store, or a sample count known "
           "only once the task loads (a short suite without --limit)")
    foot = ((f"estimate: {_minutes(sum(timed))} on {on}" + (f"; {why}" if left else f" for all {len(rows)} rows") +
             ". A speed is the store's measured samples/s on the cards named; another card, batch size or code runs "
             "at its own") if timed else f"estimate: none; {why}")
    table_text = tabulate(table, headers=["row", "suite", "tasks to evaluate", "samples",
                                          f"measured samples/s on {on}", "estimate"],
                          tablefmt="simple", disable_numparse=True)
    return "\n".join([head, "", table_text, "", foot])
