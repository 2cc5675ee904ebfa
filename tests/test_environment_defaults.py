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


def test_importing_models_keeps_triton_autotuning_results():
    """Autotuning timings go to Triton's cache folder (read back by the next process); a user's choice is kept."""
    assert probe("golinear.models", "TRITON_CACHE_AUTOTUNING", None) == "1"
    assert probe("golinear.models", "TRITON_CACHE_AUTOTUNING", "0") == "0"


def test_importing_models_keeps_cudnn_attention_from_planning_every_decode_step():
    """SDPA prefers flash attention to cuDNN's (which plans anew for every key length); a user's choice is kept."""
    assert probe("golinear.models", "TORCH_CUDNN_SDPA_DEPRIORITIZED", None) == "1"
    assert probe("golinear.models", "TORCH_CUDNN_SDPA_DEPRIORITIZED", "0") == "0"


def test_a_backbone_loads_without_the_hub_kernels_package(tmp_path, monkeypatch):
    """transformers 5 swaps layers for Hugging Face Hub kernels by default, and refuses to load a model where the
    `kernels` package is missing (as on a bare GPU machine): golinear loads its backbones without them."""
    import transformers.modeling_utils as mu

    from golinear.models.backbones.backbone import load_backbone
    from tests._tiny import write_tiny_backbone
    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    monkeypatch.setattr(mu, "is_kernels_available", lambda *a, **k: False)
    model, _ = load_backbone(str(write_tiny_backbone(tmp_path / "tiny")))
    assert not model.use_kernels
