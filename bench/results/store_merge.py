"""`golinear store merge SRC... --store DEST`: copy the finished cells of other stores into one.

Why: a GPU machine evaluates into a store of its own and returns its new cell files; this is the step that
adds them to the committed store (bench.results.store.Store.merge_from: a cell DEST already holds is kept as it is,
never overwritten; one stored before cells kept per-sample scores takes them from the same cell measured again with
the same score). Every source cell is validated first, so a damaged file stops the merge (exit 2) before
anything is written.
"""
from __future__ import annotations

from golinear.bench.results.store import Store


def merge(args) -> int:
    if not args.src:
        raise ValueError("golinear store merge needs at least one SRC store folder")
    dest = Store(args.store)
    sources = [Store(s) for s in args.src]
    for src in sources:
        if not src.cells_dir.is_dir():
            raise FileNotFoundError(f"{str(src.root)!r} is not a result store (no cells/ folder)")
        src.cells()  # validates every cell: ValueError naming a damaged file, before any write
    dest.ensure_writable()
    for src in sources:
        total = len(src.cells())
        added = dest.merge_from(src)
        print(f"golinear store merge: {added} of {total} cells from {src.root} added to {dest.root} "
              f"({total - added} already there)")
    return 0
