"""Which process holds a cell's claim (bench.results.store), and whether it still runs: a claim names its host, pid and
the process's start time, so a later process given the same pid (containers start their pids over) is not taken for
its owner."""
from __future__ import annotations

import os
import socket
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether a process of this machine still runs (a claim's or a temp folder's owner)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat's field 22), None where that cannot be
    read: a claim names it beside the pid, so a later process given the same pid is not taken for the claim's owner
    (containers start their pids over)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_gone(owner: dict) -> bool:
    """A claim's owner on this host that no longer runs: its pid is free, or taken by a process started later."""
    pid = owner.get("pid")
    if owner.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    start = owner.get("start")
    return not pid_alive(pid) or (isinstance(start, int) and process_start(pid) not in (None, start))


def this_process() -> dict:
    """This process as a claim names it."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "start": process_start(os.getpid())}
