"""Scoring (loglikelihood) throughput of full attention against a linearized model on the same CR requests.

lm-eval builds the requests of golinear_piqa and golinear_hellaswag (--limit documents each: 2 and 4 requests per
document); only the backend's `loglikelihood` call is timed (wrapped, not replaced), each model in turn, --repeats
times alternating, so both see the same machine load. Prints requests/s per model and the ratio.

    OMP_NUM_THREADS=2 .venv/bin/python scripts/score_throughput.py --limit 84 --batch-size 16   # 504 requests
"""
from __future__ import annotations

import argparse
import time

import lm_eval

import golinear.bench.backends.lm_backend as B
import golinear.tasks.standard as ts

TASKS = ["golinear_piqa", "golinear_hellaswag"]


def timed_scores(lm, limit: int) -> tuple[int, float]:
    """(requests, seconds inside lm.loglikelihood) of one lm-eval run on TASKS."""
    calls = []
    inner = lm.loglikelihood

    def loglikelihood(requests, disable_tqdm: bool = False):
        t0 = time.perf_counter()
        out = inner(requests, disable_tqdm=True)
        calls.append((len(requests), time.perf_counter() - t0))
        return out
    lm.loglikelihood = loglikelihood
    try:
        lm_eval.simple_evaluate(model=lm, tasks=TASKS, task_manager=ts.task_manager(), limit=limit, bootstrap_iters=0)
    finally:
        del lm.loglikelihood
    return sum(n for n, _ in calls), sum(s for _, s in calls)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=84, help="documents per task (84: 168 PIQA + 336 HellaSwag requests)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--linear", default="checkpoints/smollm2-135m/gdn-w56-s8-sc",
                   help="checkpoint folder of the linearized model (default: the shipped default recipe)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    lms = {"full": B.make_lm("golinear-hf", batch_size=args.batch_size, device=args.device),
           "linear": B.make_lm("linearized", checkpoint=args.linear, batch_size=args.batch_size, device=args.device)}
    runs = {name: [] for name in lms}
    for _ in range(args.repeats):
        for name, lm in lms.items():
            n, s = timed_scores(lm, args.limit)
            runs[name].append(n / s)
            print(f"{name}: {n} requests in {s:.1f} s ({n / s:.1f} requests/s)", flush=True)
    best = {name: max(v) for name, v in runs.items()}
    print(f"best of {args.repeats}: full {best['full']:.1f} requests/s, linear {best['linear']:.1f} requests/s, "
          f"linear / full = {best['linear'] / best['full']:.2f}x")


if __name__ == "__main__":
    main()
