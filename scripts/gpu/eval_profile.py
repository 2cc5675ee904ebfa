"""Where a `golinear run` cell's time goes on a GPU: the run, in this process, with CUDA-synchronised timers around
each phase of generation (the decoders' prefill and decode, a press's compressed prefill, tokenisation, lm-eval's
own work), per cell; then a table of seconds per phase (leaderboards/eval-profile.md).

    python scripts/gpu/eval_profile.py OUT_DIR -- --suites sniah --context-length 4096 --num-samples 48 \\
        --batch-size 16 --device cuda --store STORE --models 'full,dtype=bfloat16;gdn-w56-s8-sc,dtype=bfloat16'
    python scripts/gpu/eval_profile.py --render OUT_DIR/cells.json [...] --out leaderboards/eval-profile.md

OUT_DIR/cells.json gets each cell as it finishes (a run stopped at a time limit keeps the cells it finished). The
timers synchronise the GPU, so phases add up to wall time but overlap nothing (a cell under the profile is a little
slower than without it)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

# (owner module, class or None, attribute) -> phase name
PHASES = [
    ("golinear.models.decoding.fast_decode", "FastDecoder", "prefill", "prefill (static decoder)"),
    ("golinear.models.decoding.fast_decode", "FastDecoder", "decode", "decode steps"),
    ("golinear.models.retention.generate", "RetentionDecoder", "prefill", "prefill (retention slots)"),
    ("golinear.models.retention.generate", "RetentionDecoder", "decode", "decode steps"),
    ("golinear.models.kv_compression.static_decode", "PressDecoder", "prefill", "press: prefill, whole"),
    ("golinear.models.kv_compression.static_decode", None, "compress_contexts", "press: compressed context"),
    ("golinear.models.kv_compression.static_decode", None, "compressed_prefill", "press: compressed context"),
    ("golinear.models.kv_compression.static_decode", "PressDecoder", "load", "press: cache into static buffers"),
    ("golinear.bench.backends.press_backend", "PressLM", "split_all", "press: tokenise and split"),
    ("golinear.bench.backends.lm_backend", "GolinearHF", "generate_until", "generation, whole"),
    ("golinear.bench.backends.press_backend", "PressLM", "generate_until", "generation, whole"),
    ("lm_eval", None, "simple_evaluate", "cell, whole (lm-eval)"),
]
ORDER = ["cell, whole (lm-eval)", "generation, whole", "prefill (static decoder)", "prefill (retention slots)",
         "press: prefill, whole", "press: compressed context", "press: cache into static buffers",
         "press: tokenise and split", "decode steps"]


def instrument(totals: dict):
    """Wrap each phase's function with a timer that synchronises CUDA before and after; returns the undo."""
    import importlib

    import torch

    active = set()

    def timed(fn, name):
        def run(*a, **k):
            if name in active:  # an override calling its base (RetentionDecoder.decode -> FastDecoder.decode)
                return fn(*a, **k)
            active.add(name)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                totals[name] = totals.get(name, 0.0) + time.perf_counter() - t0
                active.discard(name)
        return run

    undo = []
    for module, cls, attr, name in PHASES:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        undo.append((owner, attr, vars(owner).get(attr)))  # None: a module's lazy attribute (lm_eval's)
        setattr(owner, attr, timed(getattr(owner, attr), name))

    def restore():
        for owner, attr, fn in reversed(undo):
            setattr(owner, attr, fn) if fn is not None else delattr(owner, attr)
    return restore


def profile(out_dir: Path, run_args: list[str]) -> int:
    from golinear.bench.cli import main
    from golinear.bench.run import runner
    totals: dict[str, float] = {}
    undo = instrument(totals)
    cells, evaluate_cell = [], runner.evaluate_cell

    def cell(lm, c, *a, **k):
        before = dict(totals)
        t0 = time.perf_counter()
        out = evaluate_cell(lm, c, *a, **k)
        phases = {n: round(v - before.get(n, 0.0), 3) for n, v in totals.items() if v - before.get(n, 0.0) > 1e-3}
        cells.append({"model": c.model.label, "task": c.entry.task, "n": (out or {}).get("n"),
                      "wall_s": round(time.perf_counter() - t0, 3), "phases": phases,
                      "hardware": (out or {}).get("provenance", {}).get("hardware", {})})
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "cells.json").write_text(json.dumps({"args": run_args, "cells": cells}, indent=1) + "\n")
        return out
    runner.evaluate_cell = cell
    try:
        return main(["run", *run_args])
    finally:
        runner.evaluate_cell = evaluate_cell
        undo()


def render(files: list[Path]) -> str:
    lines = ["# Where evaluation time goes on a GPU", "",
             "Generated by `python scripts/gpu/eval_profile.py --render CELLS.json --out leaderboards/eval-profile.md` "
             "from runs of `scripts/gpu/eval_profile.py OUT_DIR -- <golinear run args>` (CUDA-synchronised timers "
             "around each phase, per cell; a phase inside another is counted in both). Seconds per cell.", ""]
    for f in files:
        data = json.loads(f.read_text())
        cards = {c.get("hardware", {}).get("gpu") for c in data["cells"]} - {None}
        lines += [f"`golinear run {shlex.join(data['args'])}`" + (f" on {', '.join(sorted(cards))}" if cards else ""), ""]
        present = [p for p in ORDER if any(p in c["phases"] for c in data["cells"])]
        lines += ["| row | task | samples | " + " | ".join(present) + " | samples/s |",
                  "|---|---|---|" + "---|" * len(present) + "---|"]
        for c in data["cells"]:
            wall = c["phases"].get("cell, whole (lm-eval)", c["wall_s"])
            per = f"{c['n'] / wall:.1f}" if c.get("n") and wall else "-"
            lines.append(f"| {c['model']} | {c['task']} | {c.get('n') or '-'} | "
                         + " | ".join(f"{c['phases'][p]:.2f}" if p in c["phases"] else "-" for p in present)
                         + f" | {per} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--render" in argv:
        ap = argparse.ArgumentParser(description=__doc__)
        ap.add_argument("--render", nargs="+", type=Path, required=True)
        ap.add_argument("--out", type=Path, required=True)
        args = ap.parse_args(argv)
        text = render(args.render)
        args.out.write_text(text)
        print(text)
        return 0
    if "--" not in argv or argv.index("--") != 1:
        print("usage: eval_profile.py OUT_DIR -- <golinear run args>  |  eval_profile.py --render CELLS.json ... "
              "--out FILE", file=sys.stderr)
        return 2
    return profile(Path(argv[0]), argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
