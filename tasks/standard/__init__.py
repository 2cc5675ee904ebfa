"""The paper's standard suites as lm-eval tasks that read a local data folder (or the Hub).

Each `golinear_*` task mirrors lm-eval's built-in task config and only replaces where the data comes
from (see local_data.py). `SUITES` says which tasks make a suite and which metric each reports;
`task_manager()` is the (cached) lm-eval TaskManager that knows our task folders.
"""
from __future__ import annotations

import difflib
import logging
from pathlib import Path

from .local_data import HUB, builtin_config, local_files, resolve_data_dir

HERE = Path(__file__).resolve().parent
TASK_DIRS = (HERE, HERE.parent / "ruler")


class SuiteTask(dict):
    """One reported number: task name, lm-eval metric key, display name, the built-in it mirrors."""


def _t(task, metric, display, builtin, builtin_yaml, num_fewshot=0):
    return SuiteTask(task=task, metric=metric, display=display, builtin=builtin, builtin_yaml=builtin_yaml,
                     num_fewshot=num_fewshot, higher_is_better=metric != "perplexity")


SUITES: dict[str, list[SuiteTask]] = {
    # zero-shot commonsense reasoning; the paper's CR average is the mean of these five
    "cr": [
        _t("golinear_piqa", "acc", "PIQA", "piqa", "piqa/piqa.yaml"),
        _t("golinear_arc_easy", "acc", "ARC-e", "arc_easy", "arc/arc_easy.yaml"),
        _t("golinear_arc_challenge", "acc_norm", "ARC-c", "arc_challenge", "arc/arc_challenge.yaml"),
        _t("golinear_hellaswag", "acc_norm", "HellaSwag", "hellaswag", "hellaswag/hellaswag.yaml"),
        _t("golinear_winogrande", "acc", "WinoGrande", "winogrande", "winogrande/default.yaml"),
    ],
    # 5-shot (set in the task YAML; the dev split is the few-shot pool)
    "mmlu": [_t("golinear_mmlu", "acc", "MMLU", "mmlu", None, num_fewshot=5)],
    "lambada": [
        _t("golinear_lambada_openai", "acc", "LAMBADA", "lambada_openai", "lambada/lambada_openai.yaml"),
        _t("golinear_lambada_openai", "perplexity", "LAMBADA ppl", "lambada_openai",
           "lambada/lambada_openai.yaml"),
    ],
    # choosing a training recipe off the test sets: LAMBADA's task on golinear's held-out books (books_lastword.py)
    "validation": [
        _t("golinear_books_lastword", "acc", "Books last word", None, None),
        _t("golinear_books_lastword", "perplexity", "Books last word ppl", None, None),
    ],
}


def suite_tasks(suite: str) -> list[str]:
    """Task names of a suite (unique, in order)."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; allowed: {sorted(SUITES)}")
    return list(dict.fromkeys(t["task"] for t in SUITES[suite]))


def builtin_yamls(task: str) -> list[str]:
    """lm-eval built-in YAMLs (relative to lm_eval/tasks) whose data a task of ours reads."""
    if task == "golinear_mmlu" or task.startswith("golinear_mmlu_"):
        mmlu = sorted(p.name for p in (HERE / "mmlu").glob("golinear_mmlu_*.yaml"))
        names = [n[len("golinear_"):] for n in mmlu]
        if task != "golinear_mmlu" and not task.endswith("_tasks") and task[len("golinear_"):] + ".yaml" in names:
            names = [task[len("golinear_"):] + ".yaml"]
        return [f"mmlu/default/{n}" for n in names]
    for entries in SUITES.values():
        for t in entries:
            if t["task"] == task:
                return [t["builtin_yaml"]] if t["builtin_yaml"] else []
    return []


def check_data(tasks: list[str], data_dir=None) -> str:
    """Resolve the data folder and check every file the tasks read exists (before any work starts).

    Returns the resolved folder (or "hub"). Tasks that are not ours (e.g. RULER) are not checked here.
    """
    resolved = resolve_data_dir(data_dir)
    if "golinear_books_lastword" in tasks:  # passages of the books corpus, which only a data folder holds
        if resolved == HUB:
            raise ValueError("golinear_books_lastword (the validation suite) reads the books corpus from a data folder; "
                             "give --data-dir or run `golinear data fetch`")
        from golinear.models.training.data import book_files
        book_files(resolved)
    if resolved != HUB:
        for task in tasks:
            for builtin in builtin_yamls(task):
                local_files(builtin, resolved)
    return resolved


_MANAGERS: dict[str, object] = {}


class _DropCustomDatasetNotice(logging.Filter):
    """lm-eval warns on every custom_dataset task (57 times for MMLU) about `--metadata`; not useful here."""

    def filter(self, record):
        return "Custom kwargs can be passed to `--metadata`" not in record.getMessage()


def compile_templates_once() -> None:
    """lm-eval parses and compiles a task's Jinja template again for every document it renders
    (`lm_eval.utils.apply_template`): 95% of the time that 5-shot MMLU takes to build its 56k requests
    (minutes per model). Here each template string is compiled once, in lm-eval's own environment, so the
    rendered prompts are the same strings."""
    import functools

    from lm_eval import utils
    if getattr(utils.apply_template, "golinear_cached", False):
        return
    compiled = functools.lru_cache(maxsize=4096)(utils.env.from_string)

    def apply_template(template: str, doc: dict) -> str:
        return compiled(template).render(**doc)

    apply_template.golinear_cached = True
    apply_template.uncached = utils.apply_template
    utils.apply_template = apply_template


def task_manager(data_dir=None, include_defaults=True):
    """An lm-eval TaskManager with the built-ins plus tasks/standard (and tasks/ruler if present).

    Built once per data folder and reused: indexing lm-eval's built-in YAMLs takes ~9 s. Our tasks do
    not need that index to run (they name the built-in files they mirror by path), so
    `include_defaults=False` skips it where only golinear tasks are evaluated (`golinear demo`). The
    resolved folder reaches our loaders as the task metadata `golinear_data_dir`.
    """
    resolved = resolve_data_dir(data_dir)
    compile_templates_once()
    key = resolved if include_defaults else (resolved, "golinear tasks only")
    if key not in _MANAGERS:
        from lm_eval.tasks import TaskManager
        task_logger = logging.getLogger("lm_eval.api.task")
        if not any(isinstance(f, _DropCustomDatasetNotice) for f in task_logger.filters):
            task_logger.addFilter(_DropCustomDatasetNotice())
        include = [str(d) for d in TASK_DIRS if d.is_dir()]
        _MANAGERS[key] = TaskManager(include_path=include, include_defaults=include_defaults,
                                     metadata={"golinear_data_dir": resolved})
    return _MANAGERS[key]


def validate_tasks(tasks: list[str], manager=None) -> list[str]:
    """Raise ValueError naming any task the TaskManager does not know (with close matches)."""
    manager = manager or task_manager()
    known = set(manager.all_tasks)
    for name in tasks:
        if name not in known:
            ours = sorted(n for n in known if n.startswith(("golinear_", "ruler_")) and "_mmlu_" not in n)
            close = difflib.get_close_matches(name, list(known), n=3)
            raise ValueError(f"unknown task {name!r}; did you mean {close}? golinear tasks: {ours}")
    return list(tasks)


__all__ = ["SUITES", "HUB", "suite_tasks", "check_data", "task_manager", "validate_tasks",
           "resolve_data_dir", "builtin_config", "builtin_yamls"]
