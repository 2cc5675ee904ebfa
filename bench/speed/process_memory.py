"""Peak memory on the CPU: the process's resident-set high-water mark (Linux's VmHWM), reset per measurement.

Why: torch keeps no allocator statistics on the CPU, and a KV cache that grows with the prompt shows up in what
the machine must hold. `reset_peak` first returns freed memory to the system (garbage collection, glibc's
malloc_trim), then resets the mark to the current resident set (writing 5 to /proc/self/clear_refs); `peak_gib`
reads it. The figure is the whole process: weights, libraries and the interpreter are included, as CUDA's
max_memory_allocated includes the weights. NaN where the counters are missing (not Linux).
"""
from __future__ import annotations

import ctypes
import gc
from pathlib import Path

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def _libc_trim():
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: freed memory stays mapped, the mark may read high
        pass


def reset_peak():
    gc.collect()
    _libc_trim()
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        pass


def peak_gib() -> float:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 2**30  # kB
    except OSError:
        pass
    return float("nan")
