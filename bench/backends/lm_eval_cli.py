"""`golinear lm-eval ...`: lm-eval's own command line, with golinear's backends and tasks known to it.

lm-eval 0.4.13 finds a model backend only in its own registry, filled when the module defining the backend is
imported, and tasks only in its own folder or an `--include_path`; it has no discovery of a third-party
package's backends or tasks. So the plain `lm_eval` command knows neither `linearized` nor `golinear_piqa`.
This command imports bench.backends.lm_backend and bench.backends.press_backend (registering `linearized`, `golinear-hf` and
`golinear-press`: every backend bench.backends.lm_backend.BACKENDS names), adds golinear's task
folders to the include path (after them any `--include_path` of the user's), picks CUDA when there is one and
the CPU otherwise when `--device` is not given (lm-eval would name cuda:0), and hands every other argument to
lm-eval's parser unchanged: `golinear lm-eval run --help` lists them all.
"""
from __future__ import annotations

import sys

from golinear.tasks.standard import TASK_DIRS


def include_paths(user_path) -> list[str]:
    """golinear's task folders, then the user's own (lm-eval lets later folders override earlier ones)."""
    ours = [str(d) for d in TASK_DIRS if d.is_dir()]
    return ours + ([user_path] if user_path else [])


def run_lm_eval(argv: list[str]) -> int:
    from golinear.bench.backends.lm_backend import default_device  # the import registers 'linearized' and 'golinear-hf'
    import golinear.bench.backends.press_backend  # noqa: F401 - registers 'golinear-press'
    from lm_eval.__main__ import HarnessCLI, setup_logging

    setup_logging()
    saved = sys.argv
    sys.argv = ["golinear lm-eval", *argv]  # lm-eval's parser reads sys.argv (and inserts `run` when omitted)
    try:
        cli = HarnessCLI()
        args = cli.parse_args()
    finally:
        sys.argv = saved
    if hasattr(args, "include_path"):  # `run`, `ls` and `validate` take it
        args.include_path = include_paths(args.include_path)
    if getattr(args, "command", None) == "run" and getattr(args, "device", None) is None:
        args.device = default_device()  # lm-eval would say cuda:0 even on a machine without CUDA
    from golinear.bench.quiet import lm_eval_git_probe
    from golinear.bench.results.request_cache import json_values
    lm_eval_git_probe()
    with json_values():  # `--use_cache` keeps JSON, never pickles (bench.results.request_cache)
        cli.execute(args)
    return 0


def main(args) -> int:
    return run_lm_eval(list(args.lm_eval_args))
