"""The `golinear` console command: one subcommand per module, imported only to run it.

COMMANDS names, per command, the module whose `main(args) -> int` runs it and the light module holding its
options (bench.cli_args / models.training.cli_args: one function per command, named after it). Building a parser
imports only the options module, so `golinear --help` and `golinear COMMAND --help` answer without torch
or lm-eval (tests/test_cli.py checks it for every command). A command in PASS_THROUGH hands all its arguments to
another program's parser (`golinear lm-eval ...` to lm-eval's); only its bare `--help` is answered here.
"""
from __future__ import annotations

import argparse
import errno
import gc
import importlib
import re
import sys

from golinear.bench import quiet

COMMANDS = {  # name: (module that runs it, module of its options, help)
    "demo": ("golinear.bench.demo", "golinear.bench.cli_args",
             "main job: evaluate the embedded default (full attention and the default recipe)"),
    "params": ("golinear.bench.speed.params", "golinear.bench.cli_args", "new-parameter counts per mechanism on named configurations"),
    "run": ("golinear.bench.run.runner", "golinear.bench.cli_args",
            "evaluate models x suites x configurations into the result store (resumable)"),
    "leaderboard": ("golinear.bench.boards.leaderboard", "golinear.bench.cli_args", "render leaderboards/*.md|csv|html from the result store"),
    "claims": ("golinear.bench.claims.render", "golinear.bench.cli_args",
               "render leaderboards/claims.md|csv: each claim of the paper, ours at 135M, a verdict by a rule "
               "(and seeds, tables .md|csv, retention .md|csv|png)"),
    "store": ("golinear.bench.results.store_cli", "golinear.bench.cli_args",
              "store merge SRC...: add the cells of other result stores to --store (kept cells never change); "
              "store stale: list (--drop: delete) the cells of checkpoints retrained in place"),
    "check": ("golinear.bench.run.check", "golinear.bench.cli_args", "regression check against a committed baseline"),
    "latency": ("golinear.bench.speed.latency", "golinear.bench.cli_args", "latency/memory sweep over prompt lengths against full attention"),
    "generation": ("golinear.bench.speed.generation", "golinear.bench.cli_args",
                   "generation throughput on S-NIAH-1: full attention vs batched linearized"),
    "bundle": ("golinear.bench.offline.bundle", "golinear.bench.cli_args",
               "prepare a folder (or parts) for a GPU machine without network: wheels, backbone, data, checkpoints"),
    "data": ("golinear.bench.offline.data_fetch", "golinear.bench.cli_args",
             "data fetch --out DIR: build the data folder (suites, haystacks, books corpus) from its public sources"),
    "train": ("golinear.models.training.train_cli", "golinear.models.training.cli_args",
              "train the new parameters of a linearized model (frozen backbone)"),
    "diagnose": ("golinear.models.training.diagnostics", "golinear.models.training.cli_args",
                 "approximation diagnostics: nMSE, key concentration, residuals"),
    "lm-eval": ("golinear.bench.backends.lm_eval_cli", "golinear.bench.cli_args",
                "lm-eval's own command line (every option) with golinear's backends and tasks known to it"),
    "cards": ("golinear.bench.boards.cards", "golinear.bench.cli_args",
              "write each checkpoint's model card (README.md) from its config and the result store's scores"),
}
PASS_THROUGH = {"lm-eval": "lm_eval_args"}  # commands whose arguments all belong to another program's parser

INTERRUPTED = {  # what a Ctrl-C leaves, per command that keeps work across runs
    "run": "; the finished cells are stored and the cell in progress keeps its scored requests: run the same "
           "command again to resume",
    "train": " before training began; nothing was saved",  # once training runs, Ctrl-C stops it with its state saved
    "data": "; the files already built are kept and a download resumes where it stopped: run the same command again",
}

SAYS_DEFAULT = re.compile(r"(?<![\w-])default\b", re.IGNORECASE)  # "(default 8)", not "gdn-default"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends each option's default to its help text, unless the text already says it or there is none
    to say (an off switch, an unset option whose help says what happens without it)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or SAYS_DEFAULT.search(action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the options of `command` only (from its options module; the command's own module is
    not imported), so `--help` stays fast."""
    parser = argparse.ArgumentParser(
        prog="golinear", description="Benchmark suite for post hoc linearized transformers (arXiv 2607.07706).",
        epilog="`golinear COMMAND --help` lists a command's options with their defaults; start with `golinear demo`.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, options, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        p.set_defaults(_module=module)
        if name == command:
            getattr(importlib.import_module(options), name.replace("-", "_"))(p)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if argv[:1] == [command] and command in PASS_THROUGH and argv[1:] not in (["-h"], ["--help"]):
        args = argparse.Namespace(command=command, _module=COMMANDS[command][0], **{PASS_THROUGH[command]: argv[1:]})
    else:
        parser = build_parser(command)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
    quiet.install()
    try:
        return int(importlib.import_module(args._module).main(args) or 0)
    except (ValueError, FileNotFoundError) as e:  # bad input: one clear line, no traceback
        print(f"golinear {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ConnectionError as e:  # no network: without a local data folder, the Hub was the data's source
        print(f"golinear {args.command}: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}; without a "
              "local data folder the suites' documents come from the Hugging Face Hub: give one with --data-dir or "
              "GOLINEAR_DATA, or build one with `golinear data fetch --out DIR` (what it holds: docs/data.md)", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"golinear {args.command}: error: disk full writing {e.filename or 'a file'} ({e.strerror}); free "
              "space and run the same command again", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, as SIGTERM is quiet (what is done stays; see INTERRUPTED)
        pass
    finally:
        end_process_group()
    gc.collect()  # the interrupted frames' progress bars close (and print) before the line below, not after it
    print(f"\ngolinear {args.command}: interrupted (Ctrl-C){INTERRUPTED.get(args.command, '')}", file=sys.stderr)
    return 130


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
