"""The request cache of an unfinished cell (`<store>/partial/.../<prefix>_rank<r>.db`, the sqlite file of lm-eval's
CachingLM): its values as JSON (never pickles: a store is a folder users hand each other, and lm-eval's own cache
unpickles what it reads), the cell it belongs to, how many requests it holds, setting a damaged or foreign one aside,
removing it, and what a full disk means for it.

Each file carries a header table naming the cell (its store prefix: task, key digest, model fingerprint), signed with
a key that never leaves this machine's golinear cache folder (HMAC-SHA256, `request-cache.key`), and every row is
signed too (the cell, the request's hash and its result), so a cache resumes only where it was made and only as it
was written: a store handed over, or a row edited after an interrupted run, brings no scored request into a cell.
`golinear lm-eval --use_cache` writes and checks the same header and signatures. Before a cell runs,
an earlier attempt's file is read whole: one without the header (an older golinear's pickles, another program's
file), made for another cell or elsewhere (its header not signed with this machine's key), with another table layout, or with an entry that is not a result of the
shape lm-eval returns ((log-likelihood, is-greedy), a rolling log-likelihood or a generated text) is moved to
`<store>/invalid/partial/` with one line naming it, and the cell is evaluated from its start, as a damaged cell file
is. A cell that fails leaves no empty cache behind; one that holds scored requests is kept for the re-run (sqlite
commits whole). A cell that resumed says how many requests it read back (provenance `resumed_requests`)."""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import sqlite3
import sys
import time
from pathlib import Path

TABLE = "unnamed"        # the table lm-eval's CachingLM keeps its results in (SqliteDict's default)
HEADER_TABLE = "golinear"  # {"cell": <the prefix's name>, "format": FORMAT, "mac": signed(cell)}
FORMAT = "json-2"  # every row signed


def db_path(prefix: Path, rank: int) -> Path:
    return Path(f"{prefix}_rank{rank}.db")  # CachingLM's file name for that rank


# ----------------------------------------------------------------------------------------------- values as JSON
def encode(value) -> str:
    """One lm-eval result as JSON: (log-likelihood, is-greedy), a rolling log-likelihood, or a generated text."""
    if isinstance(value, str):
        return json.dumps({"text": value})
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return json.dumps({"ll": [float(value[0]), bool(value[1])]})
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return json.dumps({"x": float(value)})
    raise TypeError(f"request cache: a result of type {type(value).__name__} is not one lm-eval returns")


def decode(text) -> object:
    """The result `encode` wrote; anything else is a ValueError (the cache is then set aside, never trusted)."""
    v = json.loads(text)
    if isinstance(v, dict) and len(v) == 1:
        (kind, x), = v.items()
        if kind == "text" and isinstance(x, str):
            return x
        if kind == "ll" and isinstance(x, list) and len(x) == 2 and _number(x[0]) and isinstance(x[1], bool):
            return float(x[0]), x[1]
        if kind == "x" and _number(x):
            return float(x)
    raise ValueError("an entry is not a result lm-eval returns")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def signed(text: str) -> str:
    from golinear.models.util.signing import sign
    return sign(text)


def signed_row(cell: str, key: str, value) -> str:
    """A row as stored: the result's JSON and its signature over (cell, request hash, result)."""
    text = encode(value)
    return json.dumps({"v": json.loads(text), "mac": signed(f"{cell}\n{key}\n{text}")})


def checked_row(cell: str, key: str, stored) -> object:
    """The result a row holds, or a ValueError when its signature does not match (an edited or moved row)."""
    from golinear.models.util.signing import verify
    row = json.loads(stored)
    if not (isinstance(row, dict) and set(row) == {"v", "mac"}):
        raise ValueError("an entry is not a signed result")
    text = json.dumps(row["v"])
    if not verify(f"{cell}\n{key}\n{text}", row["mac"]):
        raise ValueError("an entry's signature does not match its result (edited after it was written)")
    return decode(text)


def cell_of(db: Path) -> str:
    """The cell a cache file belongs to: its name less `_rank<r>.db`."""
    return db.name.rsplit("_rank", 1)[0]


def open_db(db: Path, flag: str = "c", table: str = TABLE, autocommit: bool = True):
    from sqlitedict import SqliteDict
    if table == HEADER_TABLE:
        return SqliteDict(str(db), tablename=table, flag=flag, autocommit=autocommit, encode=json.dumps,
                          decode=json.loads)
    cell = cell_of(db)

    class SignedRows(SqliteDict):
        """Rows signed with their request's hash: read back only under the key they were written for."""

        def __setitem__(self, key, value):
            super().__setitem__(key, signed_row(cell, key, value))

        def __getitem__(self, key):
            return checked_row(cell, key, super().__getitem__(key))

        def iteritems(self):
            for key, stored in super().iteritems():
                yield key, checked_row(cell, key, stored)

        def itervalues(self):
            for _key, value in self.iteritems():
                yield value

        def update(self, items=(), **kwds):
            raise TypeError("request cache rows are written one by one (each signed)")

    return SignedRows(str(db), tablename=table, flag=flag, autocommit=autocommit, encode=str, decode=_text)


def _text(stored) -> str:
    return stored.decode() if isinstance(stored, bytes) else stored  # undecodable bytes: a UnicodeDecodeError


def _caching_lm():
    from lm_eval.api.model import CachingLM

    class JsonCachingLM(CachingLM):
        """lm-eval's CachingLM over a SqliteDict whose values are JSON (bench.results.request_cache)."""

        def __init__(self, lm, cache_db: str) -> None:
            self.lm, self.cache_db = lm, cache_db
            Path(cache_db).parent.mkdir(parents=True, exist_ok=True)  # as lm-eval's own makes its folder
            check_or_start(Path(cache_db))  # `golinear lm-eval --use_cache` too: header and rows checked
            self.dbdict = open_db(Path(cache_db))
            lm.set_cache_hook(self.get_cache_hook())
    return JsonCachingLM


@contextlib.contextmanager
def json_values():
    """While inside, lm-eval's `use_cache` builds its cache with JSON values (it names CachingLM through its module)."""
    import lm_eval.api.model as api_model
    original = api_model.CachingLM
    api_model.CachingLM = _caching_lm()
    try:
        yield
    finally:
        api_model.CachingLM = original


# ----------------------------------------------------------------------------------------------- one cell's file
def set_aside(db: Path, problem: str) -> Path:
    """Move a damaged cache file to <store>/invalid/partial/<model>/ (kept for inspection, never read again); one
    outside a store (`golinear lm-eval --use_cache`) to `<file>.invalid-<time>` beside it."""
    stamp = f"{time.strftime('%Y%m%dT%H%M%S')}.{time.time_ns() % 10**9:09d}-{os.getpid()}"
    if db.parent.parent.name == "partial":
        dest = db.parent.parent.parent / "invalid" / "partial" / db.parent.name / f"{db.name}.{stamp}"
    else:
        dest = db.with_name(f"{db.name}.invalid-{stamp}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(db, dest)
    except FileNotFoundError:
        return dest
    Path(f"{db}-journal").unlink(missing_ok=True)
    print(f"golinear: damaged request cache {db} ({problem}); moved to {dest}, the cell will be evaluated from "
          "its start", file=sys.stderr, flush=True)
    return dest


def read(db: Path, cell: str) -> tuple[int, str | None]:
    """(requests it holds, why it cannot be used or None): every entry is decoded, nothing is changed."""
    from sqlitedict import SqliteDict
    try:
        if db.stat().st_size == 0:
            return 0, "an empty file, as a full disk leaves it"
        tables = SqliteDict.get_tablenames(str(db))
        if HEADER_TABLE not in tables:
            return 0, "no golinear header: an older golinear's pickled values or another program's file"
        with open_db(db, flag="r", table=HEADER_TABLE) as h:
            header = dict(h.items())
        if header.get("format") != FORMAT or header.get("cell") != cell:
            return 0, f"made for {header.get('cell')!r} ({header.get('format')}), not for this cell"
        import hmac
        if not hmac.compare_digest(str(header.get("mac", "")), signed(cell)):
            return 0, "made elsewhere (its header is not signed with this machine's key), so its scores are not read"
        if TABLE not in tables:  # killed before its first scored request
            return 0, None
        with open_db(db, flag="r") as d:
            return sum(1 for _ in d.values()), None
    except (sqlite3.DatabaseError, RuntimeError, OSError) as e:  # not sqlite, another layout: sqlite's words
        return 0, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    except (ValueError, TypeError, AttributeError, RecursionError) as e:  # an entry or the header is not ours
        return 0, (str(e).splitlines() or [type(e).__name__])[0][:200]


def prepare(prefix: Path, rank: int) -> int:
    """Before a cell runs: the requests an earlier, killed attempt left in rank `rank`'s cache (0 when none, or
    when the file was damaged or foreign and has been set aside); a new file gets its header."""
    return check_or_start(db_path(prefix, rank))


def check_or_start(db: Path) -> int:
    """The requests a cache file holds when its header and every row check out; otherwise it is set aside and a
    new file, with its header, is started (0)."""
    cell = cell_of(db)
    if db.exists():
        n, problem = read(db, cell)
        if problem is None:
            return n
        set_aside(db, problem)
    db.parent.mkdir(parents=True, exist_ok=True)
    with open_db(db, table=HEADER_TABLE, autocommit=False) as h:
        h["cell"], h["format"], h["mac"] = cell, FORMAT, signed(cell)
        h.commit()
    return 0


def cached_requests(prefix: Path | None, rank: int) -> int:
    """How many readable request results rank `rank`'s cache of this cell holds (0 when none or unreadable)."""
    if prefix is None or not db_path(prefix, rank).exists():
        return 0
    return read(db_path(prefix, rank), prefix.name)[0]


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
