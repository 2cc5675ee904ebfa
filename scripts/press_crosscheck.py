"""Regenerates leaderboards/kv-crosscheck.{md,csv} (and its summary in docs/kv_compression.md): the StreamingLLM press against the untrained window + sinks
on the same S-NIAH prompts (bench/boards/press_crosscheck.py), per task: both scores and where the answers agree.

    python scripts/press_crosscheck.py --samples 20 --context-length 1024 --budget 256 --out leaderboards
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

TASKS = ("golinear_sniah_1", "golinear_sniah_2", "golinear_sniah_3")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated S-NIAH tasks")
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--context-length", type=int, default=1024)
    p.add_argument("--budget", type=int, default=256, help="KV entries kept: 8 sinks + window")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="leaderboards", help="folder for kv-crosscheck.md and kv-crosscheck.csv")
    a = p.parse_args(argv)
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    bad = [t for t in tasks if t not in TASKS]
    if bad or a.samples < 1 or a.budget <= 8 or a.context_length <= a.budget:
        print(f"error: tasks {bad} (allowed {list(TASKS)}), samples {a.samples} (>= 1), budget {a.budget} (> 8), "
              f"context length {a.context_length} (> budget)", file=sys.stderr)
        return 2
    from golinear.bench.boards.press_crosscheck import crosscheck, to_csv, to_markdown, with_summary
    rows, _, prov = crosscheck(tasks, budget=a.budget, context_length=a.context_length, samples=a.samples,
                               seed=a.seed, device=a.device)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kv-crosscheck.csv").write_text(to_csv(rows))
    (out / "kv-crosscheck.md").write_text(to_markdown(rows, prov))
    if a.out == "leaderboards":  # the shipped table: its summary in docs/kv_compression.md follows it
        doc = Path("docs/kv_compression.md")
        doc.write_text(with_summary(doc.read_text(), rows))
    print(to_markdown(rows, prov))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; nothing written", file=sys.stderr)
        sys.exit(130)
