"""`golinear run` indexes lm-eval's built-in task YAMLs (~10 s a process) only when a task asked for is one of them."""
from __future__ import annotations

from golinear.bench.run.execute import build_task_manager


def test_our_tasks_are_found_without_the_builtin_index():
    tm = build_task_manager(None, tasks={"golinear_piqa", "golinear_lambada_openai"})
    assert {"golinear_piqa", "golinear_lambada_openai"} <= set(tm.all_tasks)
    assert "arc_easy" not in tm.all_tasks  # lm-eval's own tasks were not indexed


def test_a_builtin_task_brings_the_builtin_index():
    tm = build_task_manager(None, tasks={"golinear_piqa", "arc_easy"})
    assert {"golinear_piqa", "arc_easy"} <= set(tm.all_tasks)
