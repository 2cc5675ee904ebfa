"""Re-key a store's checkpoint cells to `models.spec.checkpoint_identity` (the migration of 2026-12-01).

Store keys named a checkpoint by a hash of every file in its folder (`checkpoint_files=`), so the run's log and
loss plot were part of the model's identity, and a copy that carried only the loaded files keyed its
cells apart from the same checkpoint in the tree. Keys now hash the two files the loader reads (config.json,
new_params.safetensors). This rewrites a cell's key only when it provably names the checkpoint folder as it is
now: its old hash is that of the folder's files (all of them, or the loaded files + train_config.json, a
copy without the log and plot), and the weights fingerprint its run recorded is the folder's. Other cells (of files
since replaced) are left as they are and listed. Values, provenance and every other field are kept.

`--rename OLD=NEW` re-keys the cells of checkpoint folder OLD to folder NEW (a checkpoint renamed, or its
config.json's note edited): each cell only when the weights fingerprint its run recorded is NEW's; the label
and family follow the new name.

`--partial DIR` also renames the request caches of unfinished S-NIAH/RULER cells (a store's `partial/`, e.g.
<store>: `golinear run` names them by the cell key) at the study's settings (4K, 500 samples,
seed 42; `--data-dir` for the task files' hashes), so a killed long cell resumes under the new key.

    .venv/bin/python scripts/store/rekey_checkpoints.py [--store leaderboards/store] [--checkpoints DIR]
        [--partial <store> --data-dir ../shared/data] [--rename OLD=NEW]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from golinear.bench.results.store import Store  # noqa: E402
from golinear.models.checkpoint.weights import checkpoint_fingerprint  # noqa: E402
from golinear.models.spec import CONFIG, WEIGHTS, checkpoint_identity, local_files_identity  # noqa: E402

FILES = re.compile(r"(?<=,)checkpoint_files=([0-9a-f]+)")


def with_files(model_key: str, ident: str) -> str:
    """The model key with its `checkpoint_files=` hash replaced."""
    m = FILES.search(model_key)
    return model_key[:m.start(1)] + ident + model_key[m.end(1):]


def old_identities(folder: Path) -> set[str]:
    """The hashes keys gave this folder before: all its files, or a copy without the log and plot."""
    return {local_files_identity(folder), local_files_identity(folder, (CONFIG, WEIGHTS, "train_config.json"))}


def rekey_partials(root: Path, ck: Path, data_dir: str) -> int:
    """Rename the request caches of the checkpoints' S-NIAH/RULER cells from each old key to the new one."""
    from golinear.bench.run.plan import cell_data, plan_cells, resolve_suites
    from golinear.bench.results.store import CellKey
    from golinear.bench.run.specs import parse_model_spec
    store, entries, moved = Store(root), resolve_suites("sniah,ruler"), 0
    data = {e.task: cell_data(e, data_dir) for e in entries}
    for folder in sorted(p for p in ck.iterdir() if (p / CONFIG).is_file()):
        cells = plan_cells([parse_model_spec(str(folder))], entries, context_length=4096, num_samples=500,
                           seed=42, data=data)
        for c in cells:
            new_key, label = c.key, c.model.label
            for old in old_identities(folder) - {checkpoint_identity(folder)}:
                old_key = CellKey(with_files(new_key.model, old), new_key.task, new_key.config, new_key.data)
                src = store.request_cache(old_key, label, "FP").parent
                for f in src.glob(f"*--{old_key.digest}--*"):
                    dst = store.request_cache(new_key, label, "FP").parent / f.name.replace(old_key.digest,
                                                                                             new_key.digest)
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    f.rename(dst)
                    moved += 1
                if src.is_dir() and not any(src.iterdir()):
                    src.rmdir()
    return moved


def rename_cells(store: Store, ck: Path, old: str, new: str) -> tuple[int, list[str]]:
    """Re-key the cells of checkpoint `old` as those of folder `ck/new`, when their recorded weights are new's."""
    folder = ck / new
    ident, weights = checkpoint_identity(folder), checkpoint_fingerprint(folder)
    moved, kept = 0, []
    for path in sorted(store.cells_dir.glob("*/*.json")):
        cell = json.loads(path.read_text())
        parts = cell["key"]["model"].split(",")
        if f"checkpoint={old}" not in parts:
            continue
        recorded = cell.get("model", {}).get("info", {}).get("checkpoint_fingerprint")
        if recorded != weights:
            kept.append(f"{path.relative_to(store.root)} (weights {recorded}, {new}'s are {weights})")
            continue
        parts = [f"checkpoint={new}" if p == f"checkpoint={old}" else p for p in parts]
        cell["key"]["model"] = with_files(",".join(parts), ident)
        for field in ("family", "label"):
            value = cell.get("model", {}).get(field)
            if value == old or str(value).startswith(old + ","):
                cell["model"][field] = new + value[len(old):]
        path.unlink()
        store.put(cell)
        moved += 1
    return moved, kept


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="leaderboards/store")
    ap.add_argument("--checkpoints", default="checkpoints/smollm2-135m")
    ap.add_argument("--partial", help="a store folder whose partial/ request caches to rename too")
    ap.add_argument("--data-dir", default="../shared/data", help="the data folder (with --partial)")
    ap.add_argument("--rename", metavar="OLD=NEW", help="re-key checkpoint OLD's cells to the folder NEW")
    args = ap.parse_args(argv)
    store, ck = Store(args.store), Path(args.checkpoints)
    if args.rename:
        old, _, new = args.rename.partition("=")
        if not old or not (ck / new / CONFIG).is_file():
            print(f"rekey_checkpoints: --rename {args.rename!r}: NEW must be a checkpoint folder in {ck}")
            return 2
        moved, kept = rename_cells(store, ck, old, new)
        for d in store.cells_dir.glob("*/"):
            if not any(d.iterdir()):
                d.rmdir()
        print(f"rekey_checkpoints: {moved} cells of {old} re-keyed to {new}; {len(kept)} left as they are"
              + "".join(f"\n  {k}" for k in kept))
        return 0
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
        if m.group(1) not in old_identities(folder) or recorded != checkpoint_fingerprint(folder):
            kept.append(f"{path.relative_to(store.root)} (files {m.group(1)}, weights {recorded})")
            continue
        cell["key"]["model"] = with_files(model, new)
        store.put(cell)
        path.unlink()
        moved += 1
    for d in store.cells_dir.glob("*/"):
        if not any(d.iterdir()):
            d.rmdir()
    print(f"rekey_checkpoints: {moved} cells re-keyed to the loaded files' hash; {len(kept)} left as they are"
          + "".join(f"\n  {k}" for k in kept))
    if args.partial:
        print(f"rekey_checkpoints: {rekey_partials(Path(args.partial), ck, args.data_dir)} request-cache files "
              f"renamed in {args.partial}/partial")
    return 0


if __name__ == "__main__":
    sys.exit(main())
