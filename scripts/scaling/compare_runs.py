"""Do two `golinear train` run folders hold the same checkpoint files? Same file names, the same tensor names,
shapes and dtypes in new_params.safetensors, config.json equal but for the training record; prints one line
(for the scaling checks) and exits 1 if not. Values are compared only with --atol (a GPU one-process run draws
its new parameters on the GPU, an FSDP run on the CPU: equal values are checked on CPU by tests/test_scaling.py).

    python3 scripts/scaling/compare_runs.py RUN_A RUN_B [--atol X]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def compare(a: Path, b: Path, atol: float | None = None) -> tuple[bool, str]:
    from safetensors.torch import load_file
    fa, fb = sorted(p.name for p in a.iterdir()), sorted(p.name for p in b.iterdir())
    ta, tb = load_file(a / "new_params.safetensors"), load_file(b / "new_params.safetensors")
    layout = lambda t: {k: (tuple(v.shape), str(v.dtype)) for k, v in t.items()}  # noqa: E731
    ca, cb = (json.loads((r / "config.json").read_text()) for r in (a, b))
    for c in (ca, cb):
        c.pop("training", None)
    problems = []
    if fa != fb:
        problems.append(f"files {fa} vs {fb}")
    if layout(ta) != layout(tb):
        problems.append("tensor names/shapes/dtypes differ")
    if ca != cb:
        problems.append("config.json differs: " + ", ".join(sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))))
    if atol is not None and not problems:
        worst = max(float((ta[k].float() - tb[k].float()).abs().max()) for k in ta)
        if worst > atol:
            problems.append(f"values differ by up to {worst:.3g} > {atol}")
    ok = not problems
    return ok, (f"checkpoint files {a.name} vs {b.name}: " + ("same files, tensor names, shapes, dtypes and config"
                if ok else "; ".join(problems)) + f" ({len(ta)} tensors)")


def main(argv: list[str]) -> int:
    atol = float(argv[argv.index("--atol") + 1]) if "--atol" in argv else None
    ok, line = compare(Path(argv[0]), Path(argv[1]), atol)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
