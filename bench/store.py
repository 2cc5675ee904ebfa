"""The result store: one JSON file per finished cell (model x task x configuration).

A cell is written atomically (temp file + os.replace) only once its evaluation has finished, so a
killed run leaves either a whole cell or none; a re-run skips the cells already present. The store
is a plain folder, so stores from several machines merge by copying folders together.

Layout: ``<store>/cells/<model-slug>/<task>--<config-slug>--<hash>.json``. The hash covers the cell
key (model key, task, configuration); the slugs are only there for people browsing the folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = 1


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def short_hash(obj, n: int = 12) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:n]


def slug(text: str, max_len: int = 60) -> str:
    s = re.sub(r"[^A-Za-z0-9._=+-]+", "_", str(text)).strip("_")
    return (s or "x")[:max_len]


@dataclass(frozen=True)
class CellKey:
    """What identifies a cell: which model (canonical spec string), which task, which configuration."""
    model: str
    task: str
    config: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"model": self.model, "task": self.task, "config": dict(sorted(self.config.items()))}

    @property
    def digest(self) -> str:
        return short_hash(self.as_dict(), 16)

    def config_slug(self) -> str:
        parts = [f"{k}{v}" for k, v in sorted(self.config.items()) if v is not None]
        return slug("-".join(parts) or "default", 50)


class Store:
    """A folder of cells. Cheap to construct; `ensure_writable` fails early on a bad output folder."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @property
    def cells_dir(self) -> Path:
        return self.root / "cells"

    def ensure_writable(self) -> None:
        """Create the store folder and prove we can write there (before any evaluation starts)."""
        try:
            self.cells_dir.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=self.cells_dir, prefix=".probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise ValueError(f"result store {str(self.root)!r} is not writable: {e.strerror or e}") from None

    def path_for(self, key: CellKey, model_label: str | None = None) -> Path:
        model_dir = slug(model_label or key.model, 48) + "-" + short_hash(key.model, 8)
        return self.cells_dir / model_dir / f"{slug(key.task, 60)}--{key.config_slug()}--{key.digest}.json"

    def request_cache(self, key: CellKey, model_label: str | None, fingerprint: str | None) -> Path:
        """Where an unfinished cell keeps the per-request results lm-eval has scored so far (its CachingLM
        sqlite files, `<prefix>_rank<r>.db`), so a killed run resumes inside a long cell (5-shot MMLU is one
        cell of 56k requests). Named by model fingerprint too: a changed model never reuses them."""
        model_dir = self.path_for(key, model_label).parent.name
        return self.root / "partial" / model_dir / f"{slug(key.task, 60)}--{key.digest}--{fingerprint or 'nofp'}"

    @staticmethod
    def cached_requests(prefix: Path | None, rank: int) -> int:
        """How many request results an earlier, killed attempt at this cell left in rank `rank`'s cache."""
        db = Path(f"{prefix}_rank{rank}.db") if prefix else None  # CachingLM's file name for that rank
        if db is None or not db.exists():
            return 0
        from sqlitedict import SqliteDict
        with SqliteDict(str(db), flag="r") as d:
            return len(d)

    @staticmethod
    def drop_request_cache(prefix: Path) -> None:
        for p in prefix.parent.glob(prefix.name + "_rank*.db*"):
            p.unlink(missing_ok=True)
        for d in (prefix.parent, prefix.parent.parent):  # no empty folders left behind
            try:
                d.rmdir()
            except OSError:  # not empty (other cells' caches) or already gone
                pass

    def has(self, key: CellKey) -> bool:
        return self._find(key) is not None

    def get(self, key: CellKey) -> dict | None:
        path = self._find(key)
        return json.loads(path.read_text()) if path else None

    def _find(self, key: CellKey) -> Path | None:
        # The folder name depends on the label, the file name only on the key: match on the file name.
        if not self.cells_dir.exists():
            return None
        suffix = f"--{key.digest}.json"
        for d in self.cells_dir.iterdir():
            if d.is_dir():
                for p in d.glob(f"*{suffix}"):
                    return p
        return None

    def put(self, cell: dict) -> Path:
        """Write one finished cell atomically. The cell must carry its key under "key"."""
        k = cell["key"]
        key = CellKey(k["model"], k["task"], k.get("config", {}))
        cell = {"schema": SCHEMA, **cell, "key": key.as_dict(), "digest": key.digest}
        existing = self._find(key)
        path = existing or self.path_for(key, cell.get("model", {}).get("label"))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(cell, f, indent=1, sort_keys=True, default=str)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

    def cells(self) -> list[dict]:
        """Every finished cell, in a stable order (by key digest). Half-written temp files are ignored."""
        if not self.cells_dir.exists():
            return []
        out = []
        for p in sorted(self.cells_dir.glob("*/*.json")):
            if p.name.startswith("."):
                continue
            try:
                out.append(json.loads(p.read_text()))
            except json.JSONDecodeError as e:  # only possible if someone edited a cell by hand
                raise ValueError(f"corrupt cell file {p}: {e}") from None
        return sorted(out, key=lambda c: c.get("digest", ""))

    def merge_from(self, other: "Store") -> int:
        """Copy the cells of another store that this one lacks; returns how many were added."""
        added = 0
        for cell in other.cells():
            k = cell["key"]
            key = CellKey(k["model"], k["task"], k.get("config", {}))
            if not self.has(key):
                self.put(cell)
                added += 1
        return added


def file_sha256(path: Path, _cache: dict = {}) -> str:  # noqa: B006 - process-wide memo by (path, size, mtime)
    st = path.stat()
    memo_key = (str(path), st.st_size, st.st_mtime_ns)
    if memo_key not in _cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _cache[memo_key] = h.hexdigest()
    return _cache[memo_key]


def hash_data_paths(paths, skip_roots=()) -> dict[str, str]:
    """sha256 of every file named (or inside a folder named) in `paths`; folders in skip_roots are skipped."""
    skip = {Path(p).resolve() for p in skip_roots}
    out = {}
    for p in sorted({Path(p).resolve() for p in paths}):
        if p in skip or not p.exists():
            continue
        files = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
        for q in files:
            out[str(q)] = file_sha256(q)
    return out
