"""Dispatch seam between the pure-PyTorch reference ops and the CUDA kernels (FLA).

Each op picks its backend per call from its first tensor: CUDA tensors with flash-linear-attention
importable go to `models.attention.ops.fla_backend` (same signatures), everything else to
`models.attention.ops.reference`. FLA is imported only on the first CUDA call. `GOLINEAR_OPS=reference|fla`
forces a backend (`fla` raises if FLA cannot be imported); `backend_name(x)` says which one a tensor gets.
`compiled(fn)`: the layers' pure-PyTorch elementwise regions (gates, feature maps, l2norm, RoPE, combine)
run through torch.compile when GOLINEAR_COMPILE=1 (default off), fusing their many small kernels; the
compiled regions call no op, and FLA's kernels are wrapped in torch.compiler.disable (fla_backend).
`fast_inference(x)`: whether the prefill's inference-only kernels (fla_backend.conv_fresh, rope, l2norm) serve
x: only inside `prefill_scope()` (models.decoding.prefill), so other forwards (lm-eval, HF generate, training) keep their
numerics; `GOLINEAR_FAST_PREFILL=0` turns them off there too.
"""
from __future__ import annotations

import contextlib
import functools
import os

import torch

from golinear.models.attention.ops import reference
from golinear.models.attention.ops.compile import compile_enabled, compiled, warn_compile_experimental  # noqa: F401

_warn_compile_experimental = warn_compile_experimental  # (the name tests/test_overhead.py uses)

BACKENDS = ("auto", "reference", "fla")
OPS = ("gla_chunk", "gla_recurrent", "gdn_chunk", "gdn_recurrent", "linear_attn_chunk",
       "linear_attn_recurrent", "short_conv", "window_sink_attention", "window_sink_decode",
       "window_sink_softmax")


@functools.lru_cache(maxsize=1)
def _fla_module():
    """models.attention.ops.fla_backend, or the ImportError that stopped it (cached either way)."""
    try:
        from golinear.models.attention.ops import fla_backend
        fla_backend.load_fla()
        return fla_backend
    except Exception as e:  # no fla / no triton / no GPU driver: the reference serves
        return e


def fla_available() -> bool:
    return not isinstance(_fla_module(), Exception)


def _mode() -> str:
    mode = os.environ.get("GOLINEAR_OPS", "auto").strip().lower() or "auto"
    if mode not in BACKENDS:
        raise ValueError(f"GOLINEAR_OPS={mode!r}; allowed: {list(BACKENDS)}")
    return mode


def backend_for(x):
    mode = _mode()
    if mode == "reference":
        return reference
    if mode == "fla" or getattr(x, "is_cuda", False):
        mod = _fla_module()
        if not isinstance(mod, Exception):
            return mod
        if mode == "fla":
            raise ImportError(f"GOLINEAR_OPS=fla but flash-linear-attention is not usable here: {mod}")
    return reference


FAST_PREFILL = ("1", "0")  # GOLINEAR_FAST_PREFILL: on (default) / off


class Scope:
    """A re-entrant region flag: `with scope():` marks the code inside; `scope.active` says whether we are in it."""

    def __init__(self):
        self.depth = 0

    @property
    def active(self) -> bool:
        return self.depth > 0

    @contextlib.contextmanager
    def __call__(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1


prefill_scope = Scope()  # where fast_inference may say yes: the chunked prefill of models.decoding.prefill


def fast_inference(x) -> bool:
    """Inside prefill_scope, no autograd, x on CUDA with the FLA backend, not compiled (GOLINEAR_COMPILE=1 fuses
    the plain forms instead) and GOLINEAR_FAST_PREFILL on."""
    flag = os.environ.get("GOLINEAR_FAST_PREFILL", "1").strip() or "1"
    if flag not in FAST_PREFILL:
        raise ValueError(f"GOLINEAR_FAST_PREFILL={flag!r}; allowed: {list(FAST_PREFILL)}")
    return (prefill_scope.active and flag == "1" and getattr(x, "is_cuda", False) and not torch.is_grad_enabled()
            and not compile_enabled() and backend_for(x) is not reference)


def backend_name(x) -> str:
    return "reference" if backend_for(x) is reference else "fla"


# The chunked/recurrent CPU ops are loops of small matmuls: with several OpenMP threads they collapse
# (50x slower measured on 2 cores as soon as another process competes), with one they run at full speed.
_SINGLE_THREAD_ON_CPU = {"gla_chunk", "gla_recurrent", "gdn_chunk", "gdn_recurrent", "linear_attn_chunk",
                         "linear_attn_recurrent", "window_sink_attention", "window_sink_decode",
                         "window_sink_softmax"}


@contextlib.contextmanager
def _one_thread():
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _dispatching(name):
    def op(*args, **kwargs):
        first = args[0] if args else next(iter(kwargs.values()), None)
        backend = backend_for(first)
        if backend is reference and name in _SINGLE_THREAD_ON_CPU and not getattr(first, "is_cuda", False):
            with _one_thread():
                return getattr(reference, name)(*args, **kwargs)
        return getattr(backend, name)(*args, **kwargs)
    op.__name__ = name
    op.__doc__ = getattr(reference, name).__doc__
    return op


gla_chunk = _dispatching("gla_chunk")
gla_recurrent = _dispatching("gla_recurrent")
gdn_chunk = _dispatching("gdn_chunk")
gdn_recurrent = _dispatching("gdn_recurrent")
linear_attn_chunk = _dispatching("linear_attn_chunk")
linear_attn_recurrent = _dispatching("linear_attn_recurrent")
short_conv = _dispatching("short_conv")
window_sink_attention = _dispatching("window_sink_attention")
window_sink_decode = _dispatching("window_sink_decode")
window_sink_softmax = _dispatching("window_sink_softmax")
