"""The `golinear` command itself: a fast top-level help, and lm-eval's noise filtered (bench/quiet.py)."""
from __future__ import annotations

import argparse
import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from golinear.bench import quiet
from golinear.bench.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parent.parent


def test_top_level_help_imports_no_command_module():
    """`golinear --help` must not pay for torch / lm-eval: only the chosen command's module is imported."""
    code = ("import sys; from golinear.bench.cli import build_parser; build_parser().format_help(); "
            "print(sorted(m for m in ('torch', 'lm_eval', 'transformers', 'golinear.bench.run.runner') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_command_help_imports_neither_torch_nor_the_command(command):
    """`golinear COMMAND --help` builds its parser from the options module alone: no torch, lm-eval or
    transformers, and not the command's own module (imported only when the command runs)."""
    module = COMMANDS[command][0]
    code = ("import contextlib, io, sys\nfrom golinear.bench.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            f"    try:\n        main([{command!r}, '--help'])\n    except SystemExit:\n        pass\n"
            "assert '--help' in out.getvalue()\n"
            f"print(sorted(m for m in ('torch', 'lm_eval', 'transformers', {module!r}) if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_named_configurations_listed_in_params_help_are_the_backbones():
    from golinear.bench.cli_args import NAMED_CONFIG_NAMES
    from golinear.models.backbones.backbone import NAMED_CONFIGS
    assert NAMED_CONFIG_NAMES == tuple(NAMED_CONFIGS)


def test_help_lists_every_command_and_a_chosen_command_gets_its_options():
    text = build_parser().format_help()
    assert all(name in text for name in COMMANDS)
    sub = build_parser("params")._subparsers._group_actions[0].choices["params"]
    text = " ".join(sub.format_help().split())
    assert "--configs" in text and "(default: llama-3.1-8b,qwen3-8b,smollm2-135m)" in text


def _logged(logger_name: str, *args) -> str:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        logger.warning(*args)
    finally:
        logger.removeHandler(handler)
    return buf.getvalue()


def test_lm_eval_noise_is_dropped_and_real_changes_still_show():
    quiet.install()
    quiet.install()  # idempotent
    assert sum(isinstance(f, quiet.DropUnchangedFewshot) for f in logging.getLogger("lm_eval.evaluator").filters) == 1
    assert _logged("lm_eval.evaluator", quiet.FEWSHOT_MESSAGE, "golinear_mmlu_anatomy", 5, 5) == ""
    assert _logged("lm_eval.evaluator", quiet.FEWSHOT_MESSAGE, "golinear_piqa", None, 0) == ""
    assert "from 0 to 5" in _logged("lm_eval.evaluator", quiet.FEWSHOT_MESSAGE, "golinear_piqa", 0, 5)
    assert "from None to 5" in _logged("lm_eval.evaluator", quiet.FEWSHOT_MESSAGE, "golinear_piqa", None, 5)


def test_the_filtered_messages_are_lm_evals_own():
    """The filters match lm-eval's exact strings (an lm-eval upgrade that rewords them fails here)."""
    import inspect

    import lm_eval.evaluator
    assert f'"{quiet.FEWSHOT_MESSAGE}"' in inspect.getsource(lm_eval.evaluator)


def test_a_press_notice_is_said_once_per_run_not_per_batch(caplog):
    """kvpress's KVzipPress logs its prefill-overhead notice each time one is built (golinear builds one per prompt,
    models/kv_compression/kvzip.py): with the filters installed a run says it once; another message still shows."""
    kvzip_log = logging.getLogger("kvpress.presses.kvzip_press")
    for f in [f for f in kvzip_log.filters if isinstance(f, quiet.SayOnce)]:  # an earlier test's KVzip may have said it
        kvzip_log.removeFilter(f)
    quiet.install()
    import kvpress

    def said(text):
        return sum(text in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.WARNING):
        for ratio in (0.25, 0.5, 0.25):
            kvpress.KVzipPress(compression_ratio=ratio, layerwise=True)
        logging.getLogger("kvpress.presses.kvzip_press").warning("a different notice")
        quiet.install()  # idempotent: no second filter, and what was said stays said
        kvpress.KVzipPress(compression_ratio=0.5, layerwise=True)
    assert said("KVzipPress requires multiple forward passes") == 1
    assert said("a different notice") == 1
    assert sum(isinstance(f, quiet.SayOnce) for f in logging.getLogger("kvpress.presses.kvzip_press").filters) == 1


def test_every_option_of_every_command_has_a_help_text():
    missing = {}
    for name in COMMANDS:
        sub = build_parser(name)._subparsers._group_actions[0].choices[name]
        bare = [a.option_strings[-1] for a in sub._actions if a.option_strings and not (a.help or "").strip()]
        if bare:
            missing[name] = bare
    assert missing == {}


def test_no_default_output_folder_is_a_tracked_one():
    """A command run without --out/--out-dir writes under runs/, never over the committed tables (only `claims`,
    whose default store is the committed one, rewrites the committed files it renders from them)."""
    from golinear.bench.cli import COMMANDS, build_parser
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True).stdout.split()
    tops = {t.split("/")[0] for t in tracked}
    for name in COMMANDS:
        if name in ("lm-eval", "claims"):
            continue
        parser = build_parser(name)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        for action in sub._actions:
            if action.dest in ("out", "out_dir") and isinstance(action.default, str):
                assert action.default.startswith("runs/") and action.default.split("/")[0] not in tops, \
                    (name, action.default)


def test_a_full_disk_anywhere_is_one_line(monkeypatch, capsys):
    import errno
    import os

    from golinear.bench import cli

    from golinear.bench.speed import params

    def full(args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/somewhere/file")
    monkeypatch.setattr(params, "main", full)
    assert cli.main(["params"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["golinear params: error: disk full writing /somewhere/file (No space left on device); free space "
                   "and run the same command again"], err
