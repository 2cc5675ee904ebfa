"""Re-key a store's checkpoint cells to `models.spec.checkpoint_identity` (the migration of 2026-12-01).

Store keys named a checkpoint by a hash of every file in its folder (`checkpoint_files=`), so the run's log and
loss plot were part of the model's identity, and a device call that carried only the loaded files keyed its
cells apart from the same checkpoint in the tree. Keys now hash the two files the loader reads (config.json,
new_params.safetensors). This rewrites a cell's key only when it provably names the checkpoint folder as it is
now: its old hash is that of the folder's files (all of them, or the loaded files + train_config.json, the
copy device calls carried), and the weights fingerprint its run recorded is the folder's. Other cells (of files
since replaced) are left as they are and listed. Values, provenance and every other field are kept.

    .venv/bin/python scripts/store/rekey_checkpoints.py [--store leaderboards/store] [--checkpoints DIR]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.store import Store  # noqa: E402
from models.spec import CONFIG, WEIGHTS, checkpoint_identity, local_files_identity  # noqa: E402

FILES = re.compile(r"(?<=,)checkpoint_files=([0-9a-f]+)")


def old_identities(folder: Path) -> set[str]:
    """The hashes keys gave this folder before: all its files, or the copy a device call carried."""
    return {local_files_identity(folder), local_files_identity(folder, (CONFIG, WEIGHTS, "train_config.json"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="leaderboards/store")
    ap.add_argument("--checkpoints", default="checkpoints/smollm2-135m")
    args = ap.parse_args(argv)
    store, ck = Store(args.store), Path(args.checkpoints)
    moved, kept = 0, []
    for path in sorted(store.cells_dir.glob("*/*.json")):
        cell = json.loads(path.read_text())
        model = cell["key"]["model"]
        name = dict(p.split("=", 1) for p in model.split(",")).get("checkpoint")
        m = FILES.search(model)
        if not name or not m:
            continue
        folder = ck / name
        new = checkpoint_identity(folder) if folder.is_dir() else None
        if new is None or m.group(1) == new:
            continue
        recorded = cell.get("model", {}).get("info", {}).get("checkpoint_fingerprint")
        weights = hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest()[:16]
        if m.group(1) not in old_identities(folder) or recorded != weights:
            kept.append(f"{path.relative_to(store.root)} (files {m.group(1)}, weights {recorded})")
            continue
        cell["key"]["model"] = model[:m.start(1)] + new + model[m.end(1):]
        store.put(cell)
        path.unlink()
        moved += 1
    for d in store.cells_dir.glob("*/"):
        if not any(d.iterdir()):
            d.rmdir()
    print(f"rekey_checkpoints: {moved} cells re-keyed to the loaded files' hash; {len(kept)} left as they are"
          + "".join(f"\n  {k}" for k in kept))
    return 0


if __name__ == "__main__":
    sys.exit(main())
