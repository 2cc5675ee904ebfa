"""Seconds of the slot decisions of one layer's retention prefill (docs/retention.md): `fold_steps`
(O(T log T), a wavelet matrix) against `fold_steps_pairwise` (O(T^2), the rule it is tested against), on random
arrival-time scores [batch, T, KV heads]; checks both give the same steps where both run. Each timing is the best
of --repeats after a warm-up; on the CPU one thread.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_fold_steps.py              # T 4096..32768, batch 8, 8 KV heads
    .venv/bin/python scripts/bench_fold_steps.py --device cuda --pairwise-max 32768
"""
from __future__ import annotations

import argparse
import time

import torch

from golinear.models.retention.static import fold_steps, fold_steps_pairwise


def best_time(fn, repeats, sync):
    best, out = float("inf"), None
    for i in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        if i:
            best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="4096,16384,32768", help="comma-separated prompt lengths")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8, help="8: Llama-3.1-8B's, the latency rows' shape")
    ap.add_argument("--sinks", type=int, default=8)
    ap.add_argument("--window", type=int, default=28)
    ap.add_argument("--retain", type=int, default=28)
    ap.add_argument("--pairwise-max", type=int, default=4096, help="time the pairwise rule up to this T")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    if a.device == "cpu":
        torch.set_num_threads(1)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    args = (a.sinks, a.window, a.retain)
    print(f"batch {a.batch}, KV heads {a.kv_heads}, sinks {a.sinks}, window {a.window}, retain {a.retain}, {a.device}")
    for T in (int(t) for t in a.T.split(",")):
        scores = torch.randn(a.batch, T, a.kv_heads, generator=torch.Generator().manual_seed(T)).to(a.device)
        fast, fold = best_time(lambda: fold_steps(scores, *args), a.repeats, sync)
        line = f"T {T:6d}: fold_steps {fast:8.3f} s"
        if T <= a.pairwise_max:
            slow, ref = best_time(lambda: fold_steps_pairwise(scores, *args), a.repeats, sync)
            line += f"   pairwise {slow:8.3f} s ({slow / fast:.1f}x)   same steps: {torch.equal(fold, ref)}"
        print(line)


if __name__ == "__main__":
    main()
