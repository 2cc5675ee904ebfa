"""The request cache of an unfinished cell (`<store>/partial/.../<prefix>_rank<r>.db`, the sqlite file of lm-eval's
CachingLM): its values as JSON (never pickles: a store is a folder users hand each other, and lm-eval's own cache
unpickles what it reads), the cell it belongs to, how many requests it holds, setting a damaged or foreign one aside,
removing it, and what a full disk means for it.

Each file carries a header table naming the cell (its store prefix: task, key digest, model fingerprint), signed with
a key that never leaves this machine's golinear cache folder (HMAC-SHA256, `request-cache.key`), so a cache resumes
only where it was made: a store handed over brings no scored requests anyone could have edited. Before a cell runs,
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
FORMAT = "json-1"


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


def _key() -> bytes:
    """This machine's request-cache key (32 random bytes, made 0600 on first use in golinear's cache folder)."""
    import secrets

    from golinear.models.backbones.backbone import cache_dir
    import tempfile
    path = cache_dir() / "request-cache.key"
    if not path.exists():  # written beside (mkstemp: 0600), then linked into place whole
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".request-cache.key-")
        try:
            os.write(fd, secrets.token_bytes(32))
            os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:  # another run made it first: that key is the one
                pass
        finally:
            os.unlink(tmp)
    return path.read_bytes()


def signed(cell: str) -> str:
    import hashlib
    import hmac
    return hmac.new(_key(), cell.encode(), hashlib.sha256).hexdigest()


def open_db(db: Path, flag: str = "c", table: str = TABLE, autocommit: bool = True):
    from sqlitedict import SqliteDict
    if table == HEADER_TABLE:
        return SqliteDict(str(db), tablename=table, flag=flag, autocommit=autocommit, encode=json.dumps,
                          decode=json.loads)
    return SqliteDict(str(db), tablename=table, flag=flag, autocommit=autocommit, encode=encode, decode=decode)


def _caching_lm():
    from lm_eval.api.model import CachingLM

    class JsonCachingLM(CachingLM):
        """lm-eval's CachingLM over a SqliteDict whose values are JSON (bench.results.request_cache)."""

        def __init__(self, lm, cache_db: str) -> None:
            self.lm, self.cache_db = lm, cache_db
            Path(cache_db).parent.mkdir(parents=True, exist_ok=True)  # as lm-eval's own makes its folder
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
    db = db_path(prefix, rank)
    if db.exists():
        n, problem = read(db, prefix.name)
        if problem is None:
            return n
        set_aside(db, problem)
    db.parent.mkdir(parents=True, exist_ok=True)
    with open_db(db, table=HEADER_TABLE, autocommit=False) as h:
        h["cell"], h["format"], h["mac"] = prefix.name, FORMAT, signed(prefix.name)
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
