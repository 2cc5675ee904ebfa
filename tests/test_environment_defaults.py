"""Environment defaults the packages set on import, before any library reads them (each in a fresh interpreter)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def probe(module: str, var: str, value: str | None) -> str:
    """What `var` reads after `import module`, started with `var` unset (None) or set to value."""
    env = {k: v for k, v in os.environ.items() if k != var} | ({var: value} if value is not None else {})
    code = f"import os, {module}; print(os.environ[{var!r}])"
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True).stdout.strip()


def test_importing_bench_keeps_lm_eval_from_forking_a_bootstrap_pool():
    """lm-eval's stderr bootstrap runs in the process (DISABLE_MULTIPROC) once bench is imported; a user's own
    setting is kept."""
    assert probe("golinear.bench", "DISABLE_MULTIPROC", None) == "1"
    assert probe("golinear.bench", "DISABLE_MULTIPROC", "yes") == "yes"


def test_importing_models_configures_the_tokenizers_parallelism():
    """The setting is explicit before any tokenizer runs (the library's fork handler then leaves forked children
    alone); a user's own choice is kept."""
    assert probe("golinear.models", "TOKENIZERS_PARALLELISM", None) == "true"
    assert probe("golinear.models", "TOKENIZERS_PARALLELISM", "false") == "false"
