"""Forward / backward seconds of one SmolLM2-shaped layer's attention op: the default recipe's ops (gdn_chunk +
window_sink_softmax) against `retention_prefill` with each score (docs/retention.md).

Shapes: H 9 query heads, Hkv 3, D 64, fp32, random inputs built as the layer builds them. The default recipe
gets `sinks + window + retain` as its window's budget split (sinks, window + retain), so both hold the same
cache budget. Each timing is the best of --repeats (after one warm-up). On the CPU it runs on one thread.

    .venv/bin/python scripts/bench_retention.py                          # T 1024, sinks 8, window 56, retain 8
    .venv/bin/python scripts/bench_retention.py --device cuda --dtype bfloat16 --T 4096 --window 60 --retain 60
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from golinear.models.attention import ops
from golinear.models.retention.prefill import retention_prefill, retention_prefill_walk

SCORES = ("proj_residual", "delta_error")
DTYPES = ("float32", "bfloat16")


def inputs(T, H, Hkv, D, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, T, n, D, generator=g) for n in (H, Hkv, Hkv))
    G = H // Hkv
    lin = dict(q=F.normalize(q, dim=-1), k=F.normalize(k, dim=-1).repeat_interleave(G, 2),
               v=v.repeat_interleave(G, 2), log_a=F.logsigmoid(torch.randn(1, T, H, generator=g) + 2),
               beta=torch.rand(1, T, H, generator=g))
    leaves = [x.to(device, dtype).requires_grad_(True) for x in (q, k, v, *lin.values())]
    return leaves[0], leaves[1], leaves[2], dict(zip(lin, leaves[3:]))


def default_recipe(q, k, v, lin, sinks, window, scale):
    """The layer's default path: GDN over the tokens that left the window + the window/sink softmax."""
    T, first = q.shape[1], sinks + window
    ent = {key: lin[key][:, sinks:T - window] for key in ("k", "v", "log_a", "beta")}
    out, _ = ops.gdn_chunk(lin["q"][:, first:], ent["k"], ent["v"], ent["log_a"], ent["beta"], scale)
    swa = ops.window_sink_softmax(q, k, v, sinks=sinks, window=window, scale=scale)
    return torch.cat([swa[:, :first], swa[:, first:] + out], 1)


def timed(fn, leaves, repeats, sync):
    """(forward s, backward s), each the best of `repeats` after a warm-up."""
    best = [float("inf"), float("inf")]
    for i in range(repeats + 1):
        for x in leaves:
            x.grad = None
        sync()
        t0 = time.perf_counter()
        y = fn()
        sync()
        t1 = time.perf_counter()
        y.float().sum().backward()
        sync()
        t2 = time.perf_counter()
        if i:
            best = [min(best[0], t1 - t0), min(best[1], t2 - t1)]
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--sinks", type=int, default=8)
    ap.add_argument("--window", type=int, default=56)
    ap.add_argument("--retain", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--scores", default=",".join(SCORES), help=f"comma-separated, from {SCORES}")
    ap.add_argument("--walk", action="store_true", help="also time the chunk walk for the arrival-time scores")
    a = ap.parse_args()
    if a.device == "cpu":
        torch.set_num_threads(1)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    scores = a.scores.split(",")
    if not set(scores) <= set(SCORES):
        raise SystemExit(f"--scores {a.scores!r}: allowed {SCORES}")
    q, k, v, lin = inputs(a.T, 9, 3, 64, a.device, getattr(torch, a.dtype))
    leaves = [q, k, v, *lin.values()]
    s, w, r, scale = a.sinks, a.window, a.retain, 64 ** -0.5
    print(f"T {a.T}, sinks {s}, window {w}, retain {r}, H 9, Hkv 3, D 64, {a.device}, {a.dtype}")
    rows = [(f"default recipe (sinks {s}, window {w + r})", lambda: default_recipe(q, k, v, lin, s, w + r, scale))]
    for score in scores:
        rows.append((f"retention {score}", lambda score=score: retention_prefill(
            q, k, v, lin, scale, scale, s, w, r, score, want_state=False)[0]))
        if a.walk and score != "delta_error":
            rows.append((f"retention {score} (walk)", lambda score=score: retention_prefill_walk(
                q, k, v, lin, scale, scale, s, w, r, score, want_state=False)[0]))
    for name, fn in rows:
        fwd, bwd = timed(fn, leaves, a.repeats, sync)
        print(f"{name:45s} forward {fwd:7.3f} s   backward {bwd:7.3f} s")


if __name__ == "__main__":
    main()
