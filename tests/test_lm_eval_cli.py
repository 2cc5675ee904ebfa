"""`golinear lm-eval`: lm-eval's own command line with golinear's backends and tasks, from any folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from golinear.bench.backends.lm_eval_cli import include_paths
from golinear.tasks.standard import TASK_DIRS

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = ROOT / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"


def golinear(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "golinear.bench.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1200)


def test_our_task_folders_come_first_then_the_users():
    assert include_paths(None) == [str(d) for d in TASK_DIRS]
    assert include_paths("/my/tasks") == [str(d) for d in TASK_DIRS] + ["/my/tasks"]


def test_every_lm_eval_option_passes_through(tmp_path):
    out = golinear(["lm-eval", "run", "--help"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert all(opt in out.stdout for opt in ("--model_args", "--include_path", "--log_samples",
                                             "--apply_chat_template"))


@pytest.mark.slow
def test_a_checkpoint_on_a_golinear_task_from_another_folder(tmp_path):
    out = golinear(["lm-eval", "--model", "linearized", "--model_args", f"checkpoint={CHECKPOINT}", "--tasks",
                    "golinear_piqa", "--limit", "2", "--output_path", str(tmp_path / "results")], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "|golinear_piqa|" in out.stdout
    result = json.loads(next((tmp_path / "results").rglob("results_*.json")).read_text())
    assert result["results"]["golinear_piqa"]["alias"] == "golinear_piqa"
    assert result["config"]["model"] == "linearized" and result["config"]["limit"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("model,args,task,extra", [
    ("golinear-hf", "base=smollm2-135m", "golinear_piqa", []),
    ("golinear-press", "press=streaming_llm,kv_budget=256", "golinear_sniah_1",
     ["--metadata", '{"max_seq_lengths": [1024], "num_samples": 1}']),
])
def test_every_backend_the_readme_names_runs_from_another_folder(tmp_path, model, args, task, extra):
    """`golinear lm-eval` knows each golinear backend (`linearized` above; these two here) outside the repository."""
    from golinear.bench.backends.lm_backend import BACKENDS
    readme = (ROOT / "README.md").read_text()
    assert all(f"`{b}`" in readme for b in BACKENDS)
    out = golinear(["lm-eval", "--model", model, "--model_args", args, "--tasks", task, "--limit", "1", *extra],
                   tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "no model for this name" not in out.stderr and f"{model} (" in out.stdout, out.stdout[-2000:]
