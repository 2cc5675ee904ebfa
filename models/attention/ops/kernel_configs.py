"""Triton autotuning paid once per card, not once per machine: FLA's kernel configurations recorded and pinned.

FLA's chunk kernels are `triton.autotune`d: in a new process every kernel compiles and times each candidate
configuration (10-30 a kernel) before its first real launch. That is most of a linearized row's first cell on a fresh
machine (about 45 s of 52 on an H100, docs/speed.md). Triton keeps the timings on disk for the next process
(TRITON_CACHE_AUTOTUNING, models/__init__.py), but a fresh machine, a new cluster node or a cleared cache pays again.

So the configurations the autotuner chose are data: `record(path)` writes every tuned kernel's choices (tuning key ->
Config) from this process as JSON, and `pin()` (called once FLA is imported, models.attention.ops.fla_backend) hands
each autotuner the recorded choice for the card it runs on before it would time anything: one compile per kernel,
no timing runs. A key never recorded takes the recorded entry of the same kernel whose non-numeric parts (dtypes,
flags) match and whose numbers (lengths, dims) are nearest; a kernel or a key with no such entry autotunes as before,
and so does a pinned configuration that does not compile for the new shape. Only speed depends on this: every
configuration computes the same function (FLA's tests hold each of them to the reference).

Files: `kernel_configs/<card>.json` beside this module, one per card (`card_file()`), written by
`scripts/gpu/kernel_configs.py`. GOLINEAR_KERNEL_CONFIGS=off turns pinning off; a path there uses that file instead.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).with_name("kernel_configs")
CONFIG_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def card_name(name: str) -> str:
    """A card's name as a file name: 'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3'."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_") or "unknown"


def card_file() -> Path | None:
    """The configuration file pinning uses here, or None (off, no CUDA, or none recorded for this card)."""
    choice = os.environ.get("GOLINEAR_KERNEL_CONFIGS", "").strip()
    if choice.lower() in ("off", "0", "none"):
        return None
    if choice:
        return Path(choice)
    import torch
    if not torch.cuda.is_available():
        return None
    path = HERE / f"{card_name(torch.cuda.get_device_name())}.json"
    return path if path.exists() else None


def autotuners(prefixes=("fla.", "golinear.")) -> dict:
    """Every Triton Autotuner reachable from the loaded modules under `prefixes`, by '<module>:<kernel name>'.

    A kernel is a module attribute wrapping its JITFunction in layers (heuristics over autotune over jit): each
    layer's `.fn` is followed down to the Autotuner."""
    from triton.runtime.autotuner import Autotuner
    found = {}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(prefixes):
            continue
        for obj in list(vars(mod).values()):
            for _ in range(4):
                if isinstance(obj, Autotuner):
                    base = obj.base_fn if hasattr(obj, "base_fn") else obj.fn
                    found[f"{getattr(base, '__module__', mod_name)}:{base.__name__}"] = obj
                    break
                try:
                    obj = getattr(obj, "fn", None)
                except Exception:  # a lazy module object whose attribute lookup imports: not a kernel
                    obj = None
                if obj is None:
                    break
    return found


def _plain(value):
    """A tuning key's part as JSON: ints, floats, bools, None and strings stay; tuples become lists."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _config_dict(config) -> dict:
    return {"kwargs": dict(config.kwargs), **{f: getattr(config, f, None) for f in CONFIG_FIELDS}}


def record(path: Path, card: str) -> dict:
    """Write the tuned choices of every autotuner in this process to `path` (merged into what it holds)."""
    import triton
    data = json.loads(path.read_text()) if path.exists() else {"card": card, "kernels": {}}
    data["card"], data["triton"] = card, triton.__version__
    for name, tuner in sorted(autotuners().items()):
        entries = {json.dumps(e["key"]): e for e in data["kernels"].get(name, [])}
        for key, config in tuner.cache.items():
            entry = {"key": _plain(key), "config": _config_dict(config)}
            entries[json.dumps(entry["key"])] = entry
        if entries:
            data["kernels"][name] = [entries[k] for k in sorted(entries)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return data


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _distance(recorded, key) -> float | None:
    """How far a recorded key is from `key`: None where they differ in anything but numbers, else the summed
    |log ratio| of their numbers (a key recorded at 4096 tokens serves 3000 before 64)."""
    if isinstance(recorded, list) and isinstance(key, list):
        if len(recorded) != len(key):
            return None
        total = 0.0
        for r, k in zip(recorded, key):
            d = _distance(r, k)
            if d is None:
                return None
            total += d
        return total
    if _numeric(recorded) and _numeric(key):
        return abs(math.log((abs(recorded) + 1) / (abs(key) + 1)))
    return 0.0 if recorded == key else None


def nearest(entries: list, key) -> dict | None:
    """The recorded configuration for `key`: its own entry, else the nearest compatible one (see _distance)."""
    key = _plain(key)
    best, best_d = None, None
    for entry in entries:
        d = _distance(entry["key"], key)
        if d is not None and (best_d is None or d < best_d):
            best, best_d = entry, d
    return best["config"] if best else None


def tuning_key(tuner, args, kwargs) -> tuple:
    """The key Triton's Autotuner.run tunes under (triton 3.x): the named key arguments, then every tensor's dtype."""
    all_args = {**dict(zip(tuner.arg_names, args)), **kwargs}
    named = {k: v for k, v in all_args.items() if k in tuner.arg_names}
    key = [named[k] for k in tuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuple(key)


def _pinned_run(tuner, entries):
    """`tuner.run`, first filling its cache with the recorded configuration for a key it has not tuned."""
    import triton
    from triton.runtime.errors import OutOfResources
    original = tuner.run

    def run(*args, **kwargs):
        if len(tuner.configs) <= 1:
            return original(*args, **kwargs)
        key = tuning_key(tuner, args, kwargs)
        if key in tuner.cache:
            return original(*args, **kwargs)
        chosen = nearest(entries, key)
        if chosen is None:
            return original(*args, **kwargs)
        tuner.cache[key] = triton.Config(dict(chosen["kwargs"]), **{f: chosen[f] for f in CONFIG_FIELDS
                                                                   if chosen.get(f) is not None})
        try:
            return original(*args, **kwargs)
        except (OutOfResources, triton.CompilationError):  # the recorded choice does not fit this shape: tune it
            del tuner.cache[key]
            return original(*args, **kwargs)

    run.golinear_pinned = True
    return run


def pin(path: Path | None = None) -> int:
    """Pin the recorded configurations onto the loaded autotuners; returns how many kernels got some."""
    try:
        path = path if path is not None else card_file()
        if path is None:
            _say_none_recorded()
            return 0
        kernels = json.loads(Path(path).read_text())["kernels"]
    except (OSError, ValueError, KeyError) as e:  # only speed depends on pinning: warn and autotune
        warnings.warn(f"golinear: kernel configurations {str(path)!r} not used ({type(e).__name__}: {e})")
        return 0
    pinned = 0
    for name, tuner in autotuners().items():
        if name in kernels and not getattr(tuner.run, "golinear_pinned", False):
            tuner.run = _pinned_run(tuner, kernels[name])
            pinned += 1
    return pinned


def _say_none_recorded():
    """On a CUDA card with no recorded file (and pinning not turned off): say once why the first cell is slow."""
    import torch
    if os.environ.get("GOLINEAR_KERNEL_CONFIGS", "").strip() or not torch.cuda.is_available():
        return
    card = torch.cuda.get_device_name()
    warnings.warn(f"golinear: no recorded kernel configurations for {card!r}: FLA's kernels autotune in this process "
                  f"(its first cell is slower); `python scripts/gpu/kernel_configs.py -- <golinear run arguments>` "
                  f"records them for this card")
