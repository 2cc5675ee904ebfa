"""Cells that differ only in their data: which one is of the current data (by the data folder's SHA256SUMS).

A corrected data file keys new cells (bench.results.store), and the cells of the old file stay; two such cells of one
model, task and configuration would both reach a leaderboard, which would show one of them by hash order. The
leaderboard shows the cell whose data files have the sha256 SHA256SUMS lists now (and the repository's task
YAMLs as they are), says once which it left out, and `golinear store stale` lists those cells."""
from __future__ import annotations

import sys
from pathlib import Path

from golinear.bench.results.store import canonical_json
from golinear.models.training.data_hashes import file_sha256

REPO = Path(__file__).resolve().parents[2]


def read_sums(data_dir) -> dict[str, str]:
    """{file relative to the data folder: sha256} from its SHA256SUMS ({} without one)."""
    path = Path(data_dir) / "SHA256SUMS" if data_dir else None
    if path is None or not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            out[parts[1].strip().lstrip("*").removeprefix("./")] = parts[0]
    return out


def cell_data(cell: dict) -> dict:
    return cell["key"].get("data") or ((cell.get("provenance") or {}).get("data") or {}).get("files") or {}


def is_current(data: dict, sums: dict) -> bool | None:
    """Whether every file the cell read has its sha256 of now (None: none of them can be compared)."""
    seen = False
    for name, sha in data.items():
        if name.startswith("tasks/"):
            path = REPO / name
            now = file_sha256(path) if path.is_file() else None
        else:
            now = sums.get(name)
        if now is None:
            continue
        seen = True
        if now != sha:
            return False
    return True if seen else None


def other_data_cells(cell_files, data_dir) -> list[tuple[Path, Path]]:
    """(cell file left out, the file of the current data's cell) for each group of cells of one model, task and
    configuration measured on different data, where exactly one data version is the current one."""
    sums, groups, out = read_sums(data_dir), {}, []
    for path, cell in cell_files:
        k = cell["key"]
        groups.setdefault(canonical_json([k["model"], k["task"], k.get("config", {})]), []).append((path, cell))
    for members in groups.values():
        if len({canonical_json(cell_data(c)) for _, c in members}) < 2:
            continue
        current = [p for p, c in members if is_current(cell_data(c), sums)]
        if len(current) == 1:
            out += [(p, current[0]) for p, _ in members if p != current[0]]
    return out


def current_cells(cell_files, data_dir=None, command: str = "golinear leaderboard") -> list[dict]:
    """The cells to show: those of other data than the current left out, said once in one line (data_dir: the
    default data folder, tasks.standard.local_data.default_data_dir, when None)."""
    if data_dir is None:
        from golinear.tasks.standard.local_data import default_data_dir
        data_dir = default_data_dir()
    left_out = other_data_cells(cell_files, data_dir)
    if left_out:
        (old, now), more = left_out[0], len(left_out) - 1
        print(f"{command}: {len(left_out)} cell(s) of other data than {Path(data_dir) / 'SHA256SUMS'} not shown: "
              f"{old} (the current data's: {now}){f' and {more} more' if more else ''}; `golinear store stale` "
              "lists them", file=sys.stderr)
    drop = {p for p, _ in left_out}
    return [c for p, c in cell_files if p not in drop]
