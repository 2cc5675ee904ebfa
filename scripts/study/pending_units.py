"""Which (model, suite) units of a device_eval.sh call still miss cells in the store, without loading a model.

Why: each unit is a `golinear run` process whose imports and planning cost seconds even when every cell is
done; late in the study most units are. Reads `spec<TAB>suite` lines on stdin and writes the pending ones to
stdout (a summary on stderr); a third column, if any, is the unit's --tasks (device_eval.sh's PLAN; - for all). The
options after `--` are the run's own (--store, --data-dir, --limit, --context-length, --num-samples, --seed),
parsed by `golinear run`'s parser and planned by bench.plan, so a unit counts as done exactly when `golinear
run` would skip all of its cells. Any error: every unit is printed
(the runs then decide for themselves).
"""
from __future__ import annotations

import sys


def pending(lines: list[str], run_args: list[str]) -> list[str]:
    from bench.cli import build_parser
    from bench.plan import cell_data, check_data_dir, default_data_dir, plan_cells, resolve_suites
    from bench.specs import parse_model_spec
    from bench.store import Store
    out, data_cache = [], {}
    for line in lines:
        spec, suite, *tasks = line.rstrip("\n").split("\t")
        a = build_parser("run").parse_args(["run", "--models", spec, "--suites", suite, *run_args])
        data_dir = check_data_dir(a.data_dir if a.data_dir is not None else default_data_dir())
        entries = resolve_suites(suite, tasks=tasks[0] if tasks and tasks[0] != "-" else None)
        data = {e.task: data_cache.get((e.task, data_dir)) or cell_data(e, data_dir) for e in entries}
        data_cache.update({(t, data_dir): d for t, d in data.items()})
        cells = plan_cells([parse_model_spec(spec)], entries, limit=a.limit, sinks=a.sinks,
                           context_length=a.context_length, num_samples=a.num_samples, seed=a.seed, data=data)
        if not all(Store(a.store).has(c.key) for c in cells):
            out.append(line)
    return out


def main(argv: list[str]) -> int:
    lines = [line for line in sys.stdin if line.strip()]
    run_args = argv[argv.index("--") + 1:] if "--" in argv else []
    try:
        todo = pending(lines, run_args)
    except Exception as e:  # noqa: BLE001 - a planning problem must not hide units from the runs
        print(f"pending_units: {type(e).__name__}: {e}; keeping all {len(lines)} units", file=sys.stderr)
        todo = lines
    sys.stdout.writelines(todo)
    print(f"pending_units: {len(todo)} of {len(lines)} units miss cells", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
