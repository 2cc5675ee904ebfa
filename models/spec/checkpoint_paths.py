"""Where a checkpoint given by name is found, so `gdn-w56-s8-sc` works from any working directory.

A name is tried as a path first (relative to the working directory), then under each folder of
`GOLINEAR_CHECKPOINTS` (os.pathsep-separated; the offline bundle sets it) and under the shipped `checkpoints/`
folder, each also one level down (the per-backbone folders, e.g. `checkpoints/smollm2-135m/`). A name not found
is an error listing every place it was looked for.
"""
from __future__ import annotations

import os
from pathlib import Path

from golinear.models.util.path_names import check_path, is_folder

SHIPPED = Path(__file__).resolve().parents[2] / "checkpoints"
ENV = "GOLINEAR_CHECKPOINTS"
CONFIG = "config.json"


def search_roots() -> list[Path]:
    """The folders a bare checkpoint name is looked up in, in order."""
    return [Path(p).expanduser() for p in os.environ.get(ENV, "").split(os.pathsep) if p] + [SHIPPED]


def candidates(name: str) -> list[Path]:
    """Every folder `name` may denote, in the order they are tried."""
    path = Path(str(name)).expanduser()
    out = [path]
    if path.is_absolute():
        return out
    for root in search_roots():
        out.append(root / path)
        if root.is_dir():  # per-backbone folders (those that are not themselves checkpoints)
            out += [sub / path for sub in sorted(root.iterdir()) if sub.is_dir() and not (sub / CONFIG).exists()]
    return out


def find_checkpoint(name: str) -> Path | None:
    """The first existing folder `name` denotes, or None."""
    return next((c for c in candidates(name) if is_folder(c)), None)


def resolve_checkpoint(name: str) -> Path:
    """The checkpoint folder `name` denotes; FileNotFoundError naming where it looked when there is none."""
    found = find_checkpoint(name)
    if found is None:
        check_path(name, "checkpoint")  # a name no folder can have: said as such
        looked = [str(candidates(name)[0].absolute())] + [str(c) for c in candidates(name)[1:]]
        raise FileNotFoundError(f"checkpoint folder {str(name)!r} does not exist; looked in: {', '.join(looked)}")
    return found
