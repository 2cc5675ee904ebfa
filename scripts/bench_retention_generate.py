"""Batched decoding of a model with retention slots (models.retention_generate) against HF generate one prompt at a
time, on an untrained SmolLM2 linearization (gdn, sinks 8, window 48, retain 8, short conv): wall time of each path
and how many generations are identical. Prompts are random token ids of slightly different lengths; no EOS.

    .venv/bin/python scripts/bench_retention_generate.py --score proj_residual --batch 4 --length 256 --new 32
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from models.batch_generate import decoder_for, generate_batch  # noqa: E402
from models.load import load_model  # noqa: E402
from models.spec import RETAIN_SCORES  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--score", default="proj_residual", choices=RETAIN_SCORES)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=256, help="the longest prompt; row b has length - 7 b tokens")
    p.add_argument("--new", type=int, default=32, help="greedy tokens per prompt")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    a = p.parse_args(argv)
    if a.length - 7 * (a.batch - 1) < 1:
        raise SystemExit(f"--length {a.length} leaves no tokens for row {a.batch - 1}; use >= {7 * a.batch - 6}")
    model, _, _ = load_model(mechanism="gdn", window=48, sinks=8, short_conv=True, retain=8, retain_score=a.score,
                             dtype=a.dtype, device=a.device, seed=0)
    model.generation_config.eos_token_id = None  # every row generates --new tokens on both paths
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (a.length - 7 * b,), generator=g).tolist() for b in range(a.batch)]
    with torch.no_grad():
        t0 = time.perf_counter()
        batched = generate_batch(decoder_for(model), prompts, a.new)
        t_batched = time.perf_counter() - t0
        t0 = time.perf_counter()
        alone = [model.generate(torch.tensor([q], device=model.device), max_new_tokens=a.new, do_sample=False,
                                pad_token_id=0)[0, len(q):].tolist() for q in prompts]
        t_alone = time.perf_counter() - t0
    same = sum(x == y for x, y in zip(batched, alone))
    print(f"score={a.score} batch={a.batch} length<={a.length} new={a.new} {a.device} {a.dtype}: batched "
          f"{t_batched:.1f} s, one at a time {t_alone:.1f} s ({t_alone / t_batched:.2f}x), identical {same}/{a.batch}")


if __name__ == "__main__":
    main()
