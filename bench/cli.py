"""The `golinear` console command: one subcommand per module, imported lazily.

Each module named in COMMANDS defines `add_arguments(parser)` and `main(args) -> int`.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "demo": ("bench.demo", "main job: evaluate the embedded default (full attention and the default recipe)"),
    "params": ("bench.params", "new-parameter counts per mechanism on named configurations"),
    "run": ("bench.runner", "evaluate models x suites x configurations into the result store (resumable)"),
    "leaderboard": ("bench.leaderboard", "render leaderboards/*.md|csv|html from the result store"),
    "check": ("bench.check", "regression check against a committed baseline"),
    "latency": ("bench.latency", "latency/memory sweep over prompt lengths against full attention"),
    "train": ("models.train", "train the new parameters of a linearized model (frozen backbone)"),
    "diagnose": ("models.diagnostics", "approximation diagnostics: nMSE, key concentration, residuals"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="golinear", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        try:
            importlib.import_module(module).add_arguments(p)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            p.set_defaults(_missing=True)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_missing", False):
        print(f"golinear {args.command}: not available in this build", file=sys.stderr)
        return 2
    try:
        return int(importlib.import_module(args._module).main(args) or 0)
    except (ValueError, FileNotFoundError) as e:  # bad input: one clear line, no traceback
        print(f"golinear {args.command}: error: {e}", file=sys.stderr)
        return 2
    finally:
        end_process_group()


def end_process_group() -> None:
    """Destroy the process group a launcher run set up, before the interpreter shuts down.

    Left to interpreter teardown, gloo's worker threads can outlive it and the process aborts with
    "terminate called without an active exception" (SIGABRT) after its work is done (pytorch#190489);
    it happened in CI to a rank of a finished `golinear train` under `accelerate launch`.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
