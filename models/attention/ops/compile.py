"""GOLINEAR_COMPILE: torch.compile for the elementwise regions of a layer, off by default (experimental; the
eager path is the checked one). Apart from the op dispatcher (models.attention.ops) so the op modules can use it."""
from __future__ import annotations

import functools
import os
import warnings

import torch


def compile_enabled() -> bool:
    mode = os.environ.get("GOLINEAR_COMPILE", "0").strip() or "0"
    if mode not in ("0", "1"):
        raise ValueError(f"GOLINEAR_COMPILE={mode!r}; allowed: '0' (eager, default) or '1' (torch.compile)")
    return mode == "1"


@functools.cache
def warn_compile_experimental() -> None:
    warnings.warn("GOLINEAR_COMPILE=1 is experimental: on the H200 (2026-11-29) its fp32 gradients differed from "
                  "eager by 1.6e-3 (relative; tests/test_gpu_overhead.py allows 1e-4; on the CPU reference path they "
                  "agree to 1e-6, so FLA's TF32 dot products are the likely cause, not verified) and a training step "
                  "was slower than eager (343 vs 315 ms); the default eager path is the checked one", stacklevel=3)


def compiled(fn):
    """fn, or torch.compile(fn) (built on first use) while GOLINEAR_COMPILE=1; checked on every call."""
    holder = {}

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not compile_enabled():
            return fn(*args, **kwargs)
        warn_compile_experimental()  # once per process
        if "fn" not in holder:
            holder["fn"] = torch.compile(fn)
        return holder["fn"](*args, **kwargs)
    run.eager = fn
    run.compiled_fn = lambda: holder.get("fn")  # None until compiled
    return run
