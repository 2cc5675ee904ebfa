"""The training resume state as data: one safetensors file whose tensors are the state's tensors and whose metadata
holds the rest of it as JSON, so opening a run folder someone handed over never unpickles (a pickle can run code).

The state is a tree of dicts, lists, tuples, numbers, strings, tensors and numpy arrays (the RNG states); a tensor or
array becomes `{"__tensor__": name}` in the JSON (plus its numpy dtype for an array), a tuple `{"__tuple__": [...]}`
and a dict with keys that are not strings (the optimizer's per-parameter state) `{"__items__": [[key, value], ...]}`.
A state written by an older golinear as a pickle (`state.pt`) is refused with one line, never opened.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "state.safetensors"
LEGACY_STATE_FILE = "state.pt"
_META_KEY = "golinear_resume_state"


def _encode(obj, tensors: dict):
    if torch.is_tensor(obj):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": name}
    if isinstance(obj, np.ndarray):
        name = f"t{len(tensors)}"
        tensors[name] = torch.from_numpy(obj.astype(np.int64) if obj.dtype.kind in "iu" else obj.copy())
        return {"__tensor__": name, "numpy": obj.dtype.str}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: _encode(v, tensors) for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"resume state holds a {type(obj).__name__}, which is not saved as data")


def _decode(obj, tensors: dict):
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        t = tensors[obj["__tensor__"]]
        return t.numpy().astype(np.dtype(obj["numpy"])) if "numpy" in obj else t
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def save(state: dict, path: Path) -> None:
    """Write `state` to `path` (a safetensors file; the caller makes the write atomic)."""
    from safetensors.torch import save_file
    tensors: dict = {}
    tree = _encode(state, tensors)
    save_file(tensors, str(path), metadata={_META_KEY: json.dumps(tree)})


def load(path: Path) -> dict:
    """The state written by `save`; a file that is not one is a ValueError naming it."""
    from safetensors import safe_open
    check(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            tree = json.loads((f.metadata() or {})[_META_KEY])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        return _decode(tree, tensors)
    except Exception as e:  # not safetensors, no state in it, a name it lacks: the file is damaged either way
        raise ValueError(f"resume state {str(path)!r} is unreadable ({type(e).__name__}); delete it to start "
                         "over") from None


NUMBER = (int, float)
TOP = {"step": int, "total_steps": int, "world_size": int, "elapsed_s": NUMBER, "params": dict, "optimizer": dict,
       "rng": dict}  # what Trainer.load_state_dict reads without a default
OPTIONAL = {"loss_window": list, "meta": dict, "config": dict, "budget_note": (str, type(None))}


def check(path: Path) -> None:
    """The state's JSON read alone, no tensor (a moment, before any model loads): one line for a state that is not
    what `save` writes ({}, a list, a key missing or of another type, a tensor it names but lacks)."""
    from safetensors import safe_open
    try:
        with safe_open(str(path), framework="pt") as f:
            tree, names = json.loads((f.metadata() or {})[_META_KEY]), set(f.keys())
    except Exception as e:  # not safetensors, no state in it
        raise ValueError(f"resume state {str(path)!r} is unreadable ({type(e).__name__}); delete it (or --force) "
                         "to start over") from None
    problem = _problem(tree, names)
    if problem:
        raise ValueError(f"resume state {str(path)!r} is damaged ({problem}); delete it (or --force) to start over")


def _problem(tree, names: set) -> str | None:
    if not isinstance(tree, dict):
        return f"its metadata is a JSON {type(tree).__name__}, not an object"
    missing = [k for k in TOP if k not in tree]
    if missing:
        return f"it lacks {', '.join(missing)}"
    for key, kind in {**TOP, **OPTIONAL}.items():
        value = tree.get(key)
        if key in tree and (not isinstance(value, kind) or isinstance(value, bool)):
            return f"{key} is {json.dumps(value)[:40]}, not {_kind(kind)}"
    for key in ("step", "world_size", "total_steps", "elapsed_s"):
        if tree[key] < (1 if key in ("world_size", "total_steps") else 0):
            return f"{key} is {tree[key]}"
    if not all(isinstance(v, dict) and v.get("__tensor__") in names for v in tree["params"].values()):
        return "a parameter is not a tensor of the file"
    lacking = sorted(set(_tensor_names(tree)) - names)
    return f"it names tensor {lacking[0]!r}, which the file lacks" if lacking else None


def _kind(kind) -> str:
    return {int: "an integer", dict: "an object", list: "a list"}.get(kind, "a number" if kind == NUMBER else "text")


def _tensor_names(obj):
    if isinstance(obj, list):
        for v in obj:
            yield from _tensor_names(v)
    elif isinstance(obj, dict):
        if "__tensor__" in obj:
            yield str(obj["__tensor__"])
        for v in obj.values():
            yield from _tensor_names(v)


def refuse_legacy(out: Path) -> None:
    """A pickled state from an older golinear is never opened: one line saying what to do."""
    legacy = Path(out) / LEGACY_STATE_FILE
    if legacy.exists():
        raise ValueError(f"resume state {str(legacy)!r} is a pickle written by an older golinear, which golinear does "
                         "not open (a pickle can run code); delete it to start this run over")
