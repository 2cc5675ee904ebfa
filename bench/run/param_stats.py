"""Per-tensor statistics of a checkpoint's new parameters, kept in a `golinear check` baseline beside the scores.

The scores of a small subset move little when one weight of millions is damaged (one value changed from -0.0146
to 239 passed the score check), so `check` also compares, for each tensor of the checkpoint's
new_params.safetensors, its size, mean, standard deviation, largest magnitude and norm with the baseline's (read
from the file: cheap, no model) before evaluating anything. Only checkpoints have such a file: a baseline of full
attention or of a fresh (untrained) linearization carries none, and its check is the scores alone."""
from __future__ import annotations

import math
from pathlib import Path

STATS = ("numel", "mean", "std", "absmax", "norm")
REL_TOL = 1e-6  # float64 reductions of the same float32 file agree far closer; retrained weights differ far more


def checkpoint_folder(model: str) -> Path | None:
    from golinear.bench.run.specs import parse_model_spec
    ckpt = parse_model_spec(model).full.get("checkpoint")
    return Path(ckpt) if ckpt else None


def new_parameter_stats(model: str) -> dict | None:
    """{tensor: {numel, mean, std, absmax, norm}} of the model's checkpoint, or None when it has none."""
    folder = checkpoint_folder(model)
    if folder is None:
        return None
    import torch
    from safetensors.torch import load_file
    out = {}
    for name, t in sorted(load_file(str(folder / "new_params.safetensors")).items()):
        x = t.detach().to(torch.float64).reshape(-1)
        out[name] = {"numel": int(x.numel()), "mean": float(x.mean()), "std": float(x.std()) if x.numel() > 1 else 0.0,
                     "absmax": float(x.abs().max()), "norm": float(x.norm())}
    return out


def _close(a, b) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=REL_TOL,
                                                                                         abs_tol=1e-12)


def _fmt(v) -> str:
    return f"{v:.6g}" if isinstance(v, (int, float)) else repr(v)


def stats_problem(stats) -> str | None:
    """Why a baseline's 'parameters' entry is malformed, or None."""
    if not isinstance(stats, dict) or not all(isinstance(v, dict) and all(
            isinstance(v.get(k), (int, float)) and not isinstance(v.get(k), bool) and math.isfinite(v.get(k))
            for k in STATS) for v in stats.values()):
        return "'parameters' must map each tensor to finite " + ", ".join(STATS)
    return None


def stats_changes(baseline: dict, current: dict | None) -> list[str]:
    """'tensor: stat baseline -> current' for each difference (a tensor missing or added counts)."""
    if current is None:
        return ["the model has no checkpoint, but the baseline holds new-parameter statistics"]
    out = []
    for name in sorted(set(baseline) | set(current)):
        b, c = baseline.get(name), current.get(name)
        if b is None or c is None:
            out.append(f"{name}: {'missing' if c is None else 'not in the baseline'}")
            continue
        for k in STATS:
            if not _close(b.get(k), c.get(k)):
                out.append(f"{name}: {k} {_fmt(b.get(k))} -> {_fmt(c.get(k))}")
    return out
