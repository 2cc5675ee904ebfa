"""The result store: one JSON file per finished cell (model x task x configuration x data).

A cell is written atomically (models.util.atomic) only once its evaluation has finished, so a killed run
leaves either a whole cell or none; a re-run skips the cells already present. The store is a plain
folder, so stores from several machines merge by copying folders together.

Layout: ``<store>/cells/<model-slug>/<task>--<config-slug>--<hash>.json``. The hash covers the cell
key: model key, task, configuration and the sha256 of every data file the task reads (so a fixed data
file makes a new cell, never a stale hit). Cells written before data hashes were part of the key
(``leaderboards/store``) are still found, but only when the data hashes in their provenance equal the
current files'. A cell that fails validation on read (unparsable, wrong schema, key or value) is moved
to ``<store>/invalid/`` with a warning naming it, and counts as missing. Concurrent runs claim a cell
(``<store>/claims/<hash>.claim``, created exclusively) before evaluating it.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from golinear.bench.results.metric_ranges import cell_metrics_problem
from golinear.bench.results.processes import owner_gone, this_process
from golinear.models.util.atomic import atomic_write
from golinear.models.util.path_names import check_path
from golinear.models.training.data_hashes import file_sha256

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
    """What identifies a cell: which model (canonical spec string), which task, which configuration, and
    the data it reads ({file relative to the data folder: sha256}; None only in keys written before)."""
    model: str
    task: str
    config: dict = field(default_factory=dict)
    data: dict | None = None

    @classmethod
    def from_dict(cls, k: dict) -> "CellKey":
        return cls(k["model"], k["task"], k.get("config", {}), k.get("data"))

    def as_dict(self) -> dict:
        out = {"model": self.model, "task": self.task, "config": dict(sorted(self.config.items()))}
        if self.data is not None:
            out["data"] = dict(sorted(self.data.items()))
        return out

    @property
    def digest(self) -> str:
        return short_hash(self.as_dict(), 16)

    def without_data(self) -> "CellKey":
        """The key as written before data hashes were part of it."""
        return CellKey(self.model, self.task, self.config)

    def config_slug(self) -> str:
        parts = [f"{k}{v}" for k, v in sorted(self.config.items()) if v is not None]
        return slug("-".join(parts) or "default", 50)


def _is_number_or_none(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) or v in ("inf", "-inf")


def cell_problem(cell, path: Path | None = None) -> str | None:
    """Why a cell read from disk cannot be trusted, or None when it is a well-formed finished cell."""
    if not isinstance(cell, dict):
        return f"expected a JSON object, found {type(cell).__name__}"
    k = cell.get("key")
    if not (isinstance(k, dict) and isinstance(k.get("model"), str) and isinstance(k.get("task"), str)
            and isinstance(k.get("config", {}), dict) and isinstance(k.get("data") or {}, dict)):
        return "no valid 'key' (model, task, config)"
    digest = CellKey.from_dict(k).digest
    if cell.get("digest") != digest:
        return f"'digest' {cell.get('digest')!r} is not its key's hash {digest!r}"
    if path is not None and not path.name.endswith(f"--{digest}.json"):
        return f"file name does not end with its key's hash {digest!r}"
    if cell.get("task") != k["task"] or not isinstance(cell.get("metric"), str) or not cell["metric"]:
        return "'task' differs from the key's or 'metric' is missing"
    for name in ("value", "stderr"):  # None: lm-eval reported NaN (a finished cell all the same)
        if not _is_number_or_none(cell.get(name)):
            return f"{name!r} {cell.get(name)!r} is not a number"
    n = cell.get("n")
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
        return f"'n' {n!r} is not a count of documents"
    metrics = cell.get("metrics")
    if not isinstance(metrics, dict) or not all(isinstance(m, dict) and _is_number_or_none(m.get("value"))
                                                for m in metrics.values()):
        return "'metrics' is not a mapping of {value, stderr}"
    if not isinstance(cell.get("model"), dict):
        return "'model' is missing"
    samples = cell.get("per_sample", {})  # absent in cells stored before golinear kept them
    if not (isinstance(samples, dict) and all(isinstance(k, str) and _is_number_or_none(v) and v not in ("inf", "-inf")
                                              for k, v in samples.items())):
        return "'per_sample' is not a mapping of sample ids to numbers"
    return cell_metrics_problem(cell)


class Store:
    """A folder of cells. Cheap to construct; `ensure_writable` fails early on a bad output folder."""

    def __init__(self, root: str | os.PathLike):
        check_path(root, "result store")  # one line, not an OSError from the first stat()
        self.root = Path(root)

    @property
    def cells_dir(self) -> Path:
        return self.root / "cells"

    @property
    def invalid_dir(self) -> Path:
        return self.root / "invalid"

    @property
    def claims_dir(self) -> Path:
        return self.root / "claims"

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
        cell of 56k requests). Named by model fingerprint too: a changed model never reuses them. Only the
        holder of the cell's claim uses it, so two runs never share one."""
        if not fingerprint:
            raise ValueError(f"no model fingerprint for the request cache of {key.task!r} (the backend's "
                             "golinear_info lacks base_fingerprint)")
        model_dir = self.path_for(key, model_label).parent.name
        return self.root / "partial" / model_dir / f"{slug(key.task, 60)}--{key.digest}--{fingerprint}"

    # -- claims: one process evaluates a cell at a time
    def claim(self, key: CellKey) -> bool:
        """Take the cell for this process (True), or False while a live process holds it. A claim left by
        a dead process (same host) is taken over. A claim appears whole (written beside, then linked into
        place), so an empty or unreadable one is no claim at all and is taken over at once; a disk too full
        to write one is a one-line error that leaves nothing behind."""
        self.claims_dir.mkdir(parents=True, exist_ok=True)
        path = self.claims_dir / f"{key.digest}.claim"
        me = this_process()
        for _ in range(2):
            owner = self._claim_owner(path)
            if owner is not None:
                if owner == me:
                    return True
                if owner and not owner_gone(owner):
                    return False
                path.unlink(missing_ok=True)  # its process was killed, or nothing readable: take it over
            if self._link_claim(path, me):
                return True
        return False

    @staticmethod
    def _claim_owner(path: Path) -> dict | None:
        """The claim's owner, {} for a claim with nothing readable in it, None when there is no claim."""
        try:
            owner = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError):
            return {}
        return owner if isinstance(owner, dict) else {}

    def _link_claim(self, path: Path, me: dict) -> bool:
        """Create the claim with its content in one step (False when another process linked one first)."""
        from golinear.bench.results.request_cache import is_disk_full
        fd, tmp = tempfile.mkstemp(dir=self.claims_dir, prefix=".claim-")
        try:
            try:
                os.write(fd, json.dumps(me).encode())
            finally:
                os.close(fd)
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError as e:
            if is_disk_full(e):
                os.unlink(tmp)
                tmp = None
                try:
                    self.claims_dir.rmdir()
                except OSError:  # other claims in it
                    pass
                raise ValueError(f"disk full writing the claim {path} ({e.strerror}); nothing of the cell was "
                                 "written; free space and run the same command again") from None
            raise
        finally:
            if tmp is not None:
                os.unlink(tmp)

    def claimed_elsewhere(self, key: CellKey) -> bool:
        """Whether another live process holds this cell's claim (a look only; nothing is taken)."""
        owner = self._claim_owner(self.claims_dir / f"{key.digest}.claim")
        if not owner or owner == this_process():
            return False
        return not owner_gone(owner)

    def other_host_claim(self, key: CellKey) -> tuple[Path, dict] | None:
        """(claim file, owner) when a process on another host holds this cell: whether it is alive cannot be seen
        from here, so a run asks its user instead of waiting on it."""
        path = self.claims_dir / f"{key.digest}.claim"
        owner = self._claim_owner(path)
        return (path, owner) if owner and owner.get("host") != socket.gethostname() else None

    def release(self, key: CellKey) -> None:
        (self.claims_dir / f"{key.digest}.claim").unlink(missing_ok=True)
        try:
            self.claims_dir.rmdir()
        except OSError:
            pass

    # -- lookups
    def has(self, key: CellKey) -> bool:
        return self.get(key) is not None

    def get(self, key: CellKey) -> dict | None:
        """The valid finished cell of `key`, or None. An invalid cell file is moved aside (see module doc)."""
        found = self._find(key)
        if found is None and key.data is not None:
            found = self._find(key.without_data(), data=key.data)
        return found[1] if found else None

    def _read(self, path: Path) -> tuple[dict | None, str | None]:
        try:
            cell = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            return None, f"unreadable JSON ({e})"
        except RecursionError:
            return None, "unreadable JSON (nested too deeply)"
        except ValueError as e:  # e.g. an integer of more digits than Python converts
            return None, f"unreadable JSON ({str(e).splitlines()[0][:120]})"
        try:
            return cell, cell_problem(cell, path)
        except (OverflowError, ValueError, TypeError, RecursionError) as e:  # 10**400 where a number belongs, ...
            return cell, f"a value out of range ({type(e).__name__}: {str(e)[:120]})"

    def _find(self, key: CellKey, data: dict | None = None) -> tuple[Path, dict] | None:
        # The folder name depends on the label, the file name only on the key: match on the file name.
        if not self.cells_dir.exists():
            return None
        suffix = f"--{key.digest}.json"
        for p in sorted(self.cells_dir.glob(f"*/*{suffix}")):
            cell, problem = self._read(p)
            if problem:
                self.set_aside(p, problem)
                continue
            if data is not None and not legacy_data_matches(cell, data):
                continue  # written before data hashes were in the key, from other data: not this cell
            return p, cell
        return None

    def set_aside(self, path: Path, problem: str) -> Path:
        """Move an invalid cell file to <store>/invalid/ (kept for inspection, never counted as finished)."""
        dest = self.invalid_dir / path.parent.name / f"{path.name}.{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, dest)
        except FileNotFoundError:  # another run moved it first
            return dest
        print(f"golinear: invalid cell file {path} ({problem}); moved to {dest}, it will be re-evaluated",
              file=sys.stderr, flush=True)
        return dest

    def put(self, cell: dict) -> Path:
        """Write one finished cell atomically. The cell must carry its key under "key"."""
        key = CellKey.from_dict(cell["key"])
        cell = {"schema": SCHEMA, **cell, "key": key.as_dict(), "digest": key.digest}
        problem = cell_problem(json.loads(json.dumps(cell, default=str)))
        if problem:
            raise ValueError(f"refusing to store an invalid cell for {key.task!r}: {problem}")
        found = self._find(key)
        path = found[0] if found else self.path_for(key, cell.get("model", {}).get("label"))
        text = json.dumps(cell, indent=1, sort_keys=True, default=str) + "\n"
        atomic_write(path, text)
        return path

    def cell_files(self) -> list[tuple[Path, dict]]:
        """(file, cell) of every finished cell, in a stable order (by key digest). Half-written temp files are
        ignored; an invalid cell file is an error naming it (a leaderboard never silently drops a row)."""
        if not self.cells_dir.exists():
            return []
        out = []
        for p in sorted(self.cells_dir.glob("*/*.json")):
            if p.name.startswith("."):
                continue
            cell, problem = self._read(p)
            if problem:
                raise ValueError(f"corrupt cell file {p}: {problem}; `golinear run` moves it aside and "
                                 "re-evaluates it, or delete it")
            out.append((p, cell))
        return sorted(out, key=lambda pc: pc[1].get("digest", ""))

    def cells(self) -> list[dict]:
        """Every finished cell, in a stable order (by key digest); see cell_files."""
        return [cell for _, cell in self.cell_files()]

    def merge_from(self, other: "Store") -> int:
        """Copy the cells of another store that this one lacks; returns how many were added. A kept cell stays as it
        is, except that one stored before cells kept per-sample scores takes them from the same cell measured again
        with the same score (per_sample_added: that run's commit and hardware): the number does not change, a
        paired comparison can read it."""
        added = 0
        for cell in other.cells():
            kept = self.get(CellKey.from_dict(cell["key"]))
            if kept is None:
                self.put(cell)
                added += 1
            elif not kept.get("per_sample") and same_score_with_samples(kept, cell):
                prov = cell.get("provenance") or {}
                self.put({**kept, "per_sample": cell["per_sample"],
                          "per_sample_added": {k: prov.get(k) for k in ("git", "hardware", "versions")}})
        return added


def same_score_with_samples(kept: dict, new: dict) -> bool:
    """Whether `new` measured `kept`'s score again (same value and document count) and holds per-sample scores
    whose mean is that score."""
    samples, value = new.get("per_sample") or {}, kept.get("value")
    if not samples or value is None or new.get("value") is None or kept.get("n") != new.get("n"):
        return False
    close = (lambda a, b: abs(a - b) <= 1e-6 * max(1.0, abs(a)))  # noqa: E731
    return close(value, new["value"]) and close(value, sum(samples.values()) / len(samples))


def legacy_data_matches(cell: dict, data: dict) -> bool:
    """Whether a cell keyed without data hashes was measured on these files: every file its provenance
    lists has the same sha256 now, and it lists every data file (configs it did not list, such as an
    included template, are not held against it)."""
    files = ((cell.get("provenance") or {}).get("data") or {}).get("files")
    if not isinstance(files, dict) or not files or not data:
        return False
    same = all(data.get(k) == v for k, v in files.items())
    return same and all(k in files for k in data if not k.startswith("tasks" + os.sep))


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
