"""The request cache of an unfinished cell (`<store>/partial/.../<prefix>_rank<r>.db`, lm-eval's CachingLM sqlite
file): how many requests it holds, setting a damaged one aside, removing it, and what a full disk means for it.

A damaged file (0 bytes, as a full disk leaves it, or not sqlite at all) is moved to `<store>/invalid/partial/`
with one line naming it, and the cell is evaluated from its start, as a damaged cell file is. A cell that fails
leaves no empty cache behind; one that holds scored requests is kept for the re-run (sqlite commits whole)."""
from __future__ import annotations

import errno
import os
import sqlite3
import sys
import time
from pathlib import Path


def db_path(prefix: Path, rank: int) -> Path:
    return Path(f"{prefix}_rank{rank}.db")  # CachingLM's file name for that rank


def set_aside(db: Path, problem: str) -> Path:
    """Move a damaged cache file to <store>/invalid/partial/<model>/ (kept for inspection, never read again)."""
    store_root = db.parent.parent.parent
    dest = store_root / "invalid" / "partial" / db.parent.name / f"{db.name}.{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(db, dest)
    except FileNotFoundError:
        return dest
    Path(f"{db}-journal").unlink(missing_ok=True)
    print(f"golinear: damaged request cache {db} ({problem}); moved to {dest}, the cell will be evaluated from "
          "its start", file=sys.stderr, flush=True)
    return dest


def cached_requests(prefix: Path | None, rank: int) -> int:
    """How many request results an earlier, killed attempt at this cell left in rank `rank`'s cache (0 when
    none, or when the file was damaged and has been set aside)."""
    if prefix is None or not db_path(prefix, rank).exists():
        return 0
    db = db_path(prefix, rank)
    from sqlitedict import SqliteDict
    try:
        with SqliteDict(str(db), flag="r") as d:
            return len(d)
    except (sqlite3.DatabaseError, RuntimeError) as e:  # not sqlite / no table (an empty file): sqlitedict's words
        set_aside(db, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
        return 0


def drop(prefix: Path) -> None:
    """Remove every rank's cache of a cell and the folders it leaves empty."""
    for p in prefix.parent.glob(prefix.name + "_rank*.db*"):
        p.unlink(missing_ok=True)
    for d in (prefix.parent, prefix.parent.parent):  # no empty folders left behind
        try:
            d.rmdir()
        except OSError:  # not empty (other cells' caches) or already gone
            pass


def drop_if_empty(prefix: Path, rank: int) -> int:
    """After a failed attempt: remove this rank's cache when it holds no scored request; returns how many it holds."""
    n = cached_requests(prefix, rank)
    if n == 0:
        for p in prefix.parent.glob(f"{db_path(prefix, rank).name}*"):
            p.unlink(missing_ok=True)
        for d in (prefix.parent, prefix.parent.parent):
            try:
                d.rmdir()
            except OSError:
                pass
    return n


def is_disk_full(e: BaseException) -> bool:
    """The OS's ENOSPC/EDQUOT, or sqlite's 'database or disk is full' (SQLITE_FULL)."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(e, sqlite3.OperationalError) and "disk is full" in str(e)


def disk_full_error(e: BaseException, prefix: Path | None, rank: int, fallback: Path) -> ValueError:
    """One line for a full disk met while evaluating or storing a cell; the cell's cache is kept only when it
    holds scored requests (sqlite commits whole), so nothing half-written is left behind."""
    where = getattr(e, "filename", None) or (db_path(prefix, rank) if prefix is not None and
                                             isinstance(e, sqlite3.Error) else fallback)
    kept = drop_if_empty(prefix, rank) if prefix is not None else 0
    left = f"its {kept} scored requests are kept for the re-run" if kept else "nothing of the cell was kept"
    return ValueError(f"disk full writing {where} ({e.strerror if isinstance(e, OSError) and e.strerror else e}); "
                      f"{left}; free space and run the same command again")
