"""`golinear train` plus each rank's peak GPU memory, for the scaling table.

    accelerate launch ... scripts/scaling/train_peak.py PEAK_PREFIX train --base ... --out RUN ...

Runs `bench.cli train ...` in this process, then writes PEAK_PREFIX.rank<R>.json (max allocated / reserved
GiB since start, which covers the held-out evaluations too). Kept outside models/training/train_cli.py, which others
are editing; the prefix keeps these per-rank files out of the run folder, so an FSDP run folder holds the same
files as a one-process run's."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def peak_record(rank: int) -> dict:
    import torch
    rec = {"rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "device": "cpu",
           "peak_allocated_gib": None, "peak_reserved_gib": None}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        dev = torch.cuda.current_device()
        rec.update(device=torch.cuda.get_device_name(dev),
                   peak_allocated_gib=round(torch.cuda.max_memory_allocated(dev) / 2 ** 30, 3),
                   peak_reserved_gib=round(torch.cuda.max_memory_reserved(dev) / 2 ** 30, 3))
    return rec


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] != "train":
        print(__doc__)
        return 2
    from golinear.bench.cli import main as cli
    rc = cli(argv[1:])
    rank = int(os.environ.get("RANK", "0"))
    path = Path(f"{argv[0]}.rank{rank}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    base = argv[argv.index("--base") + 1] if "--base" in argv else None
    from golinear.models.backbones.random_base import read_spec  # the renderer names the dimensions from it off the device
    spec = read_spec(base) if base and Path(base).is_dir() else None
    path.write_text(json.dumps({**peak_record(rank), "returncode": rc, "base": base, "random_spec": spec}) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
