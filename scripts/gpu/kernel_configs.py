"""Record the card's Triton autotuning choices for the kernels a `golinear run` uses (models/attention/ops/kernel_configs.py).

Runs `golinear run` in this process with pinning off, so every kernel autotunes as it would on a fresh machine, then
merges the choices into the card's file (models/attention/ops/kernel_configs/<card>.json, or --out FILE):

    python scripts/gpu/kernel_configs.py [--out FILE] -- --suites sniah --context-length 4096 --num-samples 64 \\
        --batch-size 64 --device cuda --store STORE --models 'gdn-w56-s8-sc,dtype=bfloat16;gdn-w1016-s8-sc,dtype=bfloat16'

The rows should cover the mechanisms, dtypes and batch sizes the card's users run (a key recorded for one length
serves the others: kernel_configs.nearest). Run it where no Triton cache from another card or version is reused.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" not in argv:
        print("usage: kernel_configs.py [--out FILE] -- <golinear run arguments>", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="the file to merge into (default: this card's file)")
    args = ap.parse_args(argv[:cut])
    os.environ["GOLINEAR_KERNEL_CONFIGS"] = "off"  # tune every kernel: the choices are what this run records
    import torch
    if not torch.cuda.is_available():
        print("kernel_configs.py: no CUDA device here; the choices are a GPU's", file=sys.stderr)
        return 2
    from golinear.bench.cli import main as golinear
    from golinear.models.attention.ops import kernel_configs
    rc = golinear(["run", *argv[cut + 1:]])
    card = torch.cuda.get_device_name()
    out = args.out or kernel_configs.HERE / f"{kernel_configs.card_name(card)}.json"
    data = kernel_configs.record(out, card)
    n = sum(len(v) for v in data["kernels"].values())
    print(f"{out}: {len(data['kernels'])} kernels, {n} tuned keys ({card})")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
