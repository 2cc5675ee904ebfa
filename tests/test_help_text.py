"""`golinear COMMAND --help` tells a user what they need: every option's default (none an absolute path of this
checkout), the backends `golinear lm-eval` knows, and only suites the README and docs/evaluation.md name."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from golinear.bench.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens ("golinear-" / "hf") on a narrow one


def command_help(command: str) -> str:
    sub = build_parser(command)._subparsers._group_actions[0].choices[command]
    return " ".join(sub.format_help().split())


def option_help(command: str, option: str) -> str:
    text = command_help(command)
    start = text.index(f" {option} ")
    nxt = re.search(r" --[a-z]", text[start + len(option) + 2:])
    return text[start:start + len(option) + 2 + (nxt.start() if nxt else len(text))]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_help_prints_an_absolute_path_of_this_checkout(command):
    text = command_help(command)
    assert str(ROOT) not in text and str(Path.home()) not in text, text


@pytest.mark.parametrize("command, option", [("run", "--limit"), ("run", "--batch-size"), ("demo", "--batch-size"),
                                             ("check", "--batch-size"), ("leaderboard", "--reference-dir"),
                                             ("claims", "--reference-dir")])
def test_the_options_a_user_compares_state_their_default(command, option):
    assert "default" in option_help(command, option), option_help(command, option)


def test_runs_batch_size_says_why_it_differs_from_the_demos():
    text = option_help("run", "--batch-size")
    assert "default 1" in text and "demo" in text and "check" in text
    assert "default: 8" in option_help("demo", "--batch-size") and "default 8" in option_help("check", "--batch-size")


def test_lm_eval_help_names_every_golinear_backend():
    from golinear.bench.backends.lm_backend import BACKENDS
    text = command_help("lm-eval")
    assert all(f"`{b}`" in text for b in BACKENDS), text


def test_every_suite_run_offers_is_named_in_the_readme_and_evaluation_md():
    from golinear.bench.run.plan import ALL_SUITES
    assert all(s in command_help("run") for s in ALL_SUITES)
    for doc in ("README.md", "docs/evaluation.md"):
        named = {w for span in re.findall(r"`([^`]*)`", (ROOT / doc).read_text(encoding="utf-8"))
                 for w in re.split(r"[\s,]+", span)}  # `cr,mmlu,lambada` names three
        assert set(ALL_SUITES) <= named, (doc, set(ALL_SUITES) - named)
