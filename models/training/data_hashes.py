"""sha256 of data files, and the data folder's `SHA256SUMS` check.

A benchmark number is the number of the data it read: the result store keys cells by these hashes, and
a file that does not match the folder's `SHA256SUMS` (a damaged or edited copy) is refused before any
evaluation or training, naming the file.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from pathlib import Path

SUMS_FILE = "SHA256SUMS"


def file_sha256(path: str | os.PathLike, _cache: dict = {}) -> str:  # noqa: B006 - memo by (path, size, mtime)
    path = Path(path)
    st = path.stat()
    memo_key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo_key not in _cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _cache[memo_key] = h.hexdigest()
    return _cache[memo_key]


def read_sums(data_dir: str | os.PathLike) -> dict[str, str]:
    """`SHA256SUMS` of a folder as {relative path: sha256}; {} when the folder has none."""
    sums = Path(data_dir) / SUMS_FILE
    if not sums.is_file():
        return {}
    out = {}
    for n, line in enumerate(sums.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        digest, _, name = line.strip().partition(" ")
        name = name.strip().lstrip("*")
        if len(digest) != 64 or not name:
            raise ValueError(f"{sums}: line {n} is not '<sha256>  <file>'")
        out[os.path.normpath(name)] = digest.lower()
    return out


def verify_files(files, data_dir: str | os.PathLike | None) -> dict[str, str]:
    """sha256 of each file, checked against `data_dir`'s SHA256SUMS where it lists the file.

    Returns {path relative to data_dir (absolute if outside it): sha256}. A missing file raises
    FileNotFoundError, a mismatch ValueError; both name the file."""
    root = Path(data_dir).resolve() if data_dir else None
    sums = read_sums(root) if root else {}
    out = {}
    for f in sorted({Path(f).resolve() for f in files}):
        if not f.is_file():
            raise FileNotFoundError(f"data file {str(f)!r} does not exist")
        rel = os.path.relpath(f, root) if root and f.is_relative_to(root) else str(f)
        digest = file_sha256(f)
        want = sums.get(os.path.normpath(rel))
        if want is not None and want != digest:
            raise ValueError(f"data file {str(f)!r} does not match {root / SUMS_FILE} (sha256 {digest[:16]}..., "
                             f"listed {want[:16]}...): a damaged or edited copy; restore it or fix the list")
        if f.name.endswith(".gz"):
            check_gzip_complete(f, digest)
        out[rel] = digest
    return out


def check_gzip_complete(path: Path, digest: str, _ok: set = set()) -> None:  # noqa: B006 - memo by sha256
    """A truncated or damaged .gz (not caught by SHA256SUMS when the folder has none) fails here, naming it,
    instead of as an EOFError half-way through an evaluation."""
    if digest in _ok:
        return
    try:
        with gzip.open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    except (EOFError, OSError, zlib.error) as e:
        raise ValueError(f"data file {str(path)!r} is a damaged or truncated gzip file ({e})") from None
    _ok.add(digest)
