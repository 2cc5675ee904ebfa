"""`golinear store merge SRC... --store DEST`: copy the finished cells of other stores into one.

Why: a GPU machine evaluates into a store of its own and returns its new cell files; this is the step that
adds them to the committed store (bench.results.store.Store.merge_from: a cell DEST already holds is kept as it is,
never overwritten; one stored before cells kept per-sample scores takes them from the same cell measured again with
the same score). Every source cell is validated first, so a damaged file stops the merge (exit 2) before
anything is written; so do two different values for one key (each such cell is named: neither is kept silently)
and a folder of DEST that is a link leading out of it (a merge writes inside DEST only).
"""
from __future__ import annotations

import sys
from pathlib import Path

from golinear.bench.results.store import CellKey, Store


def links_out(store: Store) -> list[Path]:
    """The folders a write into `store` would pass through that are links leading outside it."""
    root = store.root.resolve()
    folders = [store.cells_dir, *(store.cells_dir.iterdir() if store.cells_dir.is_dir() else [])]
    return [p for p in folders if p.is_symlink() and not p.resolve().is_relative_to(root)]


def same_value(a: dict, b: dict) -> bool:
    va, vb = a.get("value"), b.get("value")
    close = va == vb or (va is not None and vb is not None and abs(va - vb) <= 1e-6 * max(1.0, abs(va)))
    return close and a.get("n") == b.get("n")


def conflicts(dest: Store, sources: list[Store]) -> list[str]:
    """One line per key that DEST and the sources (or two sources) hold with different values."""
    seen: dict[str, tuple[Path, dict]] = {}
    lines = []
    for store in [dest, *sources]:
        for path, cell in (store.cell_files() if store.cells_dir.is_dir() else []):
            digest = CellKey.from_dict(cell["key"]).digest
            if digest not in seen:
                seen[digest] = (path, cell)
            elif not same_value(seen[digest][1], cell):
                first, kept = seen[digest]
                lines.append(f"{cell['task']} of {cell['key']['model']!r}: {first} holds {kept.get('value')!r} "
                             f"(n {kept.get('n')}), {path} holds {cell.get('value')!r} (n {cell.get('n')})")
    return lines


def merge(args) -> int:
    if not args.src:
        raise ValueError("golinear store merge needs at least one SRC store folder")
    dest = Store(args.store)
    sources = [Store(s) for s in args.src]
    for src in sources:
        if not src.cells_dir.is_dir():
            raise FileNotFoundError(f"{str(src.root)!r} is not a result store (no cells/ folder)")
        src.cells()  # validates every cell: ValueError naming a damaged file, before any write
    outside = links_out(dest)
    if outside:
        raise ValueError(f"--store {str(dest.root)!r}: {outside[0]} is a link to {outside[0].resolve()}, outside the "
                         "store; a merge writes inside the store only (replace the link with a folder)")
    clashes = conflicts(dest, sources)
    for line in clashes:
        print(f"golinear store merge: conflict: {line}", file=sys.stderr)
    if clashes:
        raise ValueError(f"{len(clashes)} cell(s) hold two values for one key (listed above); nothing was merged: "
                         "remove the wrong one (or evaluate it again) and merge again")
    dest.ensure_writable()
    for src in sources:
        total = len(src.cells())
        added = dest.merge_from(src)
        print(f"golinear store merge: {added} of {total} cells from {src.root} added to {dest.root} "
              f"({total - added} already there)")
    return 0
