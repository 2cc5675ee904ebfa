"""Paths a user types that no file system can hold: a file or folder name over 255 bytes.

stat() on such a path raises OSError (ENAMETOOLONG) where a missing file is a plain False; these helpers make it
one line naming the path (`check_path`), or "no such folder" where text may be a spec rather than a path
(`is_folder`), so no command shows a traceback for it.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

NAME_MAX = 255  # bytes in one file or folder name (Linux and macOS file systems)


def long_name(path) -> str | None:
    """The first name in `path` longer than NAME_MAX bytes, or None."""
    return next((p for p in Path(str(path)).expanduser().parts if len(os.fsencode(p)) > NAME_MAX), None)


def too_long(path) -> str:
    """What a message says of a path with a name over NAME_MAX bytes ("" when it has none)."""
    name = long_name(path)
    if name is None:
        return ""
    return (f"the name {name[:24] + '...' + name[-8:]!r} is {len(os.fsencode(name))} bytes, and a file or folder "
            f"name has at most {NAME_MAX}")


def check_path(path, what: str) -> None:
    """A ValueError naming `what` when `path` holds a name no file system can hold."""
    if long_name(path) is not None:
        raise ValueError(f"{what} {str(path)[:80] + ('...' if len(str(path)) > 80 else '')!r}: {too_long(path)}; "
                         "give a shorter one")


def is_folder(path) -> bool:
    """Path.is_dir, False for a path no file system can hold (a spec string is tried as a folder first)."""
    try:
        return Path(str(path)).expanduser().is_dir()
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            return False
        raise
