"""Random-weight backbones as small folders: `config.json`, a tokenizer and `golinear_random.json`, no weights.

Why: the scaling runs need 8B- and 32B-dimension backbones on a machine with no network, and a
16-64 GB weight folder would cost minutes of GPU time to write and read. Here the weights are a function
of (seed, parameter name, shape, device type): every parameter is drawn on its own generator seeded by
(seed, crc32(name)), so any rank can make any parameter, or only its FSDP shard of it, without reading a file
or talking to another rank, and every rank of one device type gets the same values (CPU and CUDA generators
differ). Matrices ~ N(0, initializer_range), norm weights 1, other vectors 0. `load_backbone` builds such a
folder on the meta device and fills it in place on the target device; `models.training.train_fsdp.load_sharded` fills
each rank's shards. The tokenizer is copied from another backbone (by default the embedded SmolLM2's); the
config keeps its own vocabulary size, so the tokenizer's ids (49,152 for SmolLM2) index a larger embedding.
"""
from __future__ import annotations

import contextlib
import json
import zlib
from pathlib import Path

import torch

MARKER = "golinear_random.json"


def read_spec(path) -> dict | None:
    """The folder's random-weight spec, or None for an ordinary backbone."""
    marker = Path(str(path)) / MARKER
    return json.loads(marker.read_text()) if marker.is_file() else None


def param_value(name: str, shape, seed: int, std: float, device, dtype=torch.float32) -> torch.Tensor:
    """The full value of backbone parameter `name`: a function of (seed, name, shape, device type)."""
    if len(shape) == 1:
        fill = 1.0 if name.endswith("norm.weight") else 0.0
        return torch.full(tuple(shape), fill, dtype=dtype, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 63))
    return torch.empty(tuple(shape), dtype=torch.float32, device=device).normal_(0.0, std, generator=gen).to(dtype)


def skeleton(path, dtype=torch.float32, attn_implementation: str = "sdpa"):
    """The model on the meta device (no memory), frozen."""
    import transformers
    from golinear.models.backbones.configs import check_architecture
    config = transformers.AutoConfig.from_pretrained(str(path))
    check_architecture(config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                              attn_implementation=attn_implementation)
    return model.eval().requires_grad_(False)


def plan(model) -> dict:
    """Backbone parameter names (before linearizing) -> the name their values are drawn under (tied ones alias
    the first), and the state-dict keys the fingerprint covers."""
    first, alias = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        alias[name] = first.setdefault(id(p), name)
    return {"alias": alias, "keys": sorted(model.state_dict()),
            "std": float(getattr(model.config, "initializer_range", 0.02))}


def real_buffers(model) -> dict:
    """Copies of the buffers that hold values (e.g. made on the CPU by linearize): to put back after to_empty."""
    return {n: b.detach().clone() for n, b in model.named_buffers() if b.device.type != "meta"}


def restore_buffers(model, device, saved: dict | None = None) -> None:
    """Give every buffer its value after meta/to_empty: `saved` ones copied back, rotary inv_freq recomputed."""
    saved = saved or {}
    for mod_name, module in model.named_modules():
        for name, buf in module.named_buffers(recurse=False):
            full = f"{mod_name}.{name}" if mod_name else name
            if full in saved:
                buf.data = saved[full].to(device=device, dtype=buf.dtype)
                continue
            if not type(module).__name__.endswith("RotaryEmbedding"):
                raise ValueError(f"random backbone: no rule for buffer {full} ({type(module).__name__})")
            with torch.device("cpu"):
                donor = type(module)(model.config)
            buf.data = getattr(donor, name).to(device=device, dtype=buf.dtype)


def build(path, dtype=torch.float32, device="cpu", attn_implementation: str = "sdpa"):
    """The whole random backbone on `device` (one process, or one replica of data parallelism)."""
    spec = read_spec(path)
    model = skeleton(path, dtype, attn_implementation)
    p = plan(model)
    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(param_value(name, param.shape, spec["seed"], p["std"], param.device, param.dtype))
    restore_buffers(model, device)
    return model


@contextlib.contextmanager
def new_parameters_on_cpu(model):
    """Linearize a meta skeleton with its new parameters made on the CPU: LinearizedAttention creates them on
    the q projection's device, and LoRA beside q/k/v, so these get (untouched, uninitialised) CPU storage
    meanwhile. The new parameters then take the same random draws as a one-process CPU run (or rank 0 of a
    loaded FSDP run)."""
    from golinear.models.attention.projection import decoder_layers
    projs = [getattr(layer.self_attn, name) for layer in decoder_layers(model) for name in ("q_proj", "k_proj", "v_proj")]
    for m in projs:
        m.to_empty(device="cpu")
    try:
        yield
    finally:
        for m in projs:
            m.to("meta")


def fill_sharded(model, p: dict, seed: int, device, new_full: dict) -> str:
    """Fill every rank's shards after fully_shard + to_empty: backbone parameters from param_value (drawn whole
    on `device`, one at a time, each rank keeping its shard), new parameters from `new_full` (CPU tensors every
    rank holds alike). Returns the backbone fingerprint a one-process build would have (models.backbones.backbone)."""
    import hashlib
    from golinear.models.training.sharding import shard_like
    samples = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in new_full:
                value = new_full[name]
            else:
                canon = name.replace(".base_layer", "")  # PEFT's LoRA wraps the frozen q/k/v projections
                if canon not in p["alias"]:
                    raise ValueError(f"random backbone: parameter {name} is neither new nor in the backbone")
                value = param_value(p["alias"][canon], param.shape, seed, p["std"], device, param.dtype)
                flat = value.reshape(-1)
                samples[canon] = (list(value.shape), flat[:: max(1, flat.numel() // 4096)][:4096].float().cpu())
            local = shard_like(value, param)
            target = param.to_local() if hasattr(param, "to_local") else param
            target.copy_(local.to_local() if hasattr(local, "to_local") else local)
    h = hashlib.sha256()  # models.backbones.backbone.fingerprint's recipe, over the state-dict keys (tied ones too)
    for key in p["keys"]:
        shape, sample = samples[p["alias"].get(key, key)]
        h.update(key.encode())
        h.update(json.dumps(shape).encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]
