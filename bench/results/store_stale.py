"""`golinear store stale --checkpoints DIR`: the cells of checkpoints whose folder now holds other weights.

Why: a cell names its checkpoint by folder name plus a hash of the two files the model loads
(models.spec.ModelSpec.store_key), so a folder retrained in place (strict `gdn`: 653 steps, then the paper's 10M
tokens) keys new cells while its old ones stay, and the leaderboard shows two rows of one name, one of them of
weights no longer in the tree. This lists those cells, and the cells of data since changed beside the current
data's (bench.results.store_conflicts); `--drop` deletes their files (git history keeps them).
Exit 1 while any are left, so it can guard a committed store.
"""
from __future__ import annotations

from pathlib import Path

from golinear.tasks.standard.local_data import default_data_dir
from golinear.bench.results.store import Store
from golinear.bench.results.store_conflicts import other_data_cells
from golinear.models.spec import checkpoint_identity, store_key_parts


def stale_cells(store: Store, checkpoints: Path) -> list[tuple[Path, str, str, str]]:
    """(cell file, checkpoint name, the files hash the cell was made with, the folder's hash now) for every cell
    whose checkpoint has a folder under `checkpoints` holding other files. Cells of checkpoints with no folder
    there (evaluated from elsewhere) are not judged."""
    current, out = {}, []
    for path, cell in store.cell_files():
        parts = store_key_parts(cell["key"]["model"])
        name, files = parts.get("checkpoint"), parts.get("checkpoint_files")
        if not (name and files):
            continue
        if name not in current:
            current[name] = checkpoint_identity(checkpoints / name) if (checkpoints / name).is_dir() else None
        if current[name] and current[name] != files:
            out.append((path, name, files, current[name]))
    return out


def stale(args) -> int:
    if args.src:
        raise ValueError(f"golinear store stale takes no SRC folders (got {' '.join(args.src)!r}); it checks --store")
    store, checkpoints = Store(args.store), Path(args.checkpoints)
    if not store.cells_dir.is_dir():
        raise FileNotFoundError(f"{str(store.root)!r} is not a result store (no cells/ folder)")
    if not checkpoints.is_dir():
        raise FileNotFoundError(f"checkpoints folder {str(checkpoints)!r} does not exist")
    found = stale_cells(store, checkpoints)
    data_dir = args.data_dir if getattr(args, "data_dir", None) else default_data_dir()
    other_data = other_data_cells(store.cell_files(), data_dir)
    for old_path, now_path in other_data:  # a cell of data since changed, beside the current data's cell
        print(f"{old_path}: measured on other data than {Path(data_dir) / 'SHA256SUMS'} (the current data's cell: "
              f"{now_path})")
    found += [(p, None, None, None) for p, _ in other_data]
    groups = {}
    for path, name, old, now in found[:len(found) - len(other_data)]:
        groups.setdefault((name, old, now), []).append(path)
    for (name, old, now), paths in sorted(groups.items()):
        print(f"{name}: {len(paths)} cells of checkpoint_files={old}; {checkpoints / name} now holds {now} "
              f"({paths[0].parent})")
    if args.drop:
        for path, *_ in found:
            path.unlink()
        print(f"golinear store stale: {len(found)} cells dropped from {store.root}")
        return 0
    print(f"golinear store stale: {len(found)} cells of replaced checkpoints or of other data in {store.root}"
          + (" (drop them with --drop)" if found else ""))
    return 1 if found else 0
