"""The one way golinear writes a result file or folder: a reader sees the old version or the new, never half.

Write to a temp path beside the target (same file system), then `os.replace` it into place. The temp file
is created 0600 by `mkstemp`; before the rename it gets the mode an ordinary `open()` would have given
(0666 / 0777 minus the user's umask), so results are as readable as any other file the user writes. On any
exception (and on KeyboardInterrupt) the temp path is removed and the target is left as it was.
Imports only the standard library, so models/, bench/ and tasks/ can all use it.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def user_umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask sets it while reading)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, folder: bool = False):
    """Yield a temp path beside `path`; on success it replaces `path` (a folder replaces a whole folder).

    The temp name keeps the target's suffix (numpy's savez appends `.npz` to names without it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if folder:
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
    else:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=path.suffix)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, (0o777 if folder else 0o666) & ~user_umask())
        if folder and path.is_dir():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write `data` (text is UTF-8) to `path` atomically, flushed to disk before the rename."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)
