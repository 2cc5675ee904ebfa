"""Log filters for lm-eval messages a golinear user cannot act on (installed by the `golinear` command).

- "Overwriting default num_fewshot of T from 5 to 5" (or "from None to 0"): lm-eval logs it for every task
  and group it is given a shot count for, even when the count does not change (126 lines for 5-shot MMLU;
  an unset count means 0 to lm-eval); a real change (from 0 to 5, from None to 5) still shows.
- transformers' FutureWarning that `past_key_values` is deprecated (renamed `cache`): lm-eval's generation
  calls pass it, once per run; the rename is theirs to make.
- git's "fatal: not a git repository": lm-eval asks git for the current folder's commit in every evaluation and
  lets git's complaint reach the terminal outside a repository (`lm_eval_git_probe` asks quietly; the answer, a
  commit or none, is the same).
- transformers' "Loading weights" progress bar, once per model load: golinear's own bars say what is loading.
- kvpress's notices, logged each time a press is built (KVzipPress: "requires multiple forward passes ..."; a
  golinear press is built per prompt or batch): each said once per run (`SayOnce`), on every logger of the
  libraries in SAY_ONCE.
- In `golinear run` and the demo (`lm_eval_quiet_steps`), lm-eval's bars of its quick steps (building contexts,
  checking cached requests, tokenizing inputs) and its `bootstrapping for stddev` line and bar: a few of each
  per cell, done in a blink, dozens of lines in a log; the request bars ("Running ... requests") stay, and the
  bootstrapped standard errors are computed as before.
"""
from __future__ import annotations

import importlib.util
import logging
import subprocess
import warnings
from pathlib import Path

FEWSHOT_MESSAGE = "Overwriting default num_fewshot of %s from %s to %s"


class DropUnchangedFewshot(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg != FEWSHOT_MESSAGE or len(args) != 3:
            return True
        before, after = ("0" if a is None else str(a) for a in args[1:])
        return before != after


class SayOnce(logging.Filter):
    """Pass a message the first time this process logs it; drop it after (the notice is about the method, not
    the batch)."""

    def __init__(self):
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text in self.said:
            return False
        self.said.add(text)
        return True


FILTERS = {"lm_eval.evaluator": DropUnchangedFewshot}
SAY_ONCE = ("kvpress",)
DEPRECATED_KWARG = r"`past_key_values` is deprecated"


def module_loggers(package: str) -> list[str]:
    """The logger names `logging.getLogger(__name__)` gives in each module of an installed package, found without
    importing it (a logger's filter sees only its own records, not its children's); none when not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    names = []
    for root in spec.submodule_search_locations:
        for file in Path(root).rglob("*.py"):
            parts = file.relative_to(root).with_suffix("").parts
            names.append(".".join((package, *parts[:-1 if parts[-1] == "__init__" else None])))
    return sorted(set(names))


def quiet_git_commit_hash() -> str | None:
    """lm-eval's get_git_commit_hash, with git's stderr kept off the terminal."""
    try:
        out = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def lm_eval_git_probe() -> None:
    """Point lm-eval's evaluator at the quiet git probe (call once lm-eval is imported)."""
    import lm_eval.evaluator
    lm_eval.evaluator.get_git_commit_hash = quiet_git_commit_hash


KEPT_BARS = ("Running",)  # lm-eval's request bars: the slow part of a cell


def lm_eval_bar(*args, **kwargs):
    """lm-eval's tqdm with only the request bars drawn."""
    from tqdm import tqdm
    if not str(kwargs.get("desc") or "").startswith(KEPT_BARS):
        kwargs["disable"] = True
    return tqdm(*args, **kwargs)


def quiet_bootstrap(bootstrap_stderr):
    """lm-eval's bootstrap_stderr, its print and its bar kept off the terminal (the standard error is returned)."""
    import contextlib
    import functools
    import io

    @functools.wraps(bootstrap_stderr)
    def quiet(*args, **kwargs):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return bootstrap_stderr(*args, **kwargs)
    quiet.quiet = True
    return quiet


def lm_eval_quiet_steps() -> None:
    """Quiet lm-eval's quick steps for golinear's own runs (call once lm-eval is imported; idempotent)."""
    import lm_eval.api.metrics
    import lm_eval.api.model
    import lm_eval.api.task
    lm_eval.api.model.tqdm = lm_eval.api.task.tqdm = lm_eval_bar
    if not getattr(lm_eval.api.metrics.bootstrap_stderr, "quiet", False):
        lm_eval.api.metrics.bootstrap_stderr = quiet_bootstrap(lm_eval.api.metrics.bootstrap_stderr)


def install() -> None:
    """Attach each filter to its logger once (idempotent)."""
    warnings.filterwarnings("ignore", message=DEPRECATED_KWARG, category=FutureWarning)
    import os
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # the weight loading bar (transformers' own tqdm)
    for name, kind in FILTERS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
    for package in SAY_ONCE:
        for name in module_loggers(package):
            logger = logging.getLogger(name)
            if not any(isinstance(f, SayOnce) for f in logger.filters):
                logger.addFilter(SayOnce())
