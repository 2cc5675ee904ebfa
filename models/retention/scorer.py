"""A fitted retention score (the policy models.cache.policies.fitted): per layer and KV head, a linear map
from a key's RoPE-pair magnitudes to how much the token is worth a retention slot.

The features are the D/2 norms of the rotate-half pairs (i, i + D/2), which RoPE leaves unchanged, so a scorer
fitted on the backbone's keys applies to the layer's keys after RoPE. A scorer file is a safetensors file with
`weight` [L, Hkv, D/2] and `bias` [L, Hkv] (L = the backbone's layers) and, in its metadata, what it was fitted on
(`base_fingerprint`: the frozen weights', checked when a model loads it). `scripts/retention_scorer_probe.py fit`
writes one; docs/retention.md says what the committed one (`checkpoints/smollm2-135m/scorers/value.safetensors`)
was fitted to. The scores are fixed when a token arrives, as `proj_residual`'s are; the op takes them as "given".
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from golinear.models.util.atomic import atomic_path

TENSORS = ("weight", "bias")


def pair_magnitudes(k: torch.Tensor) -> torch.Tensor:
    """[..., D] keys -> [..., D/2] fp32 norms of the rotate-half RoPE pairs (i, i + D/2): invariant under RoPE."""
    half = k.shape[-1] // 2
    return torch.sqrt(k[..., :half].float() ** 2 + k[..., half:].float() ** 2)


def arrival_scores(k: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One layer's keys [..., Hkv, D] -> scores [..., Hkv] in fp32 (weight [Hkv, D/2], bias [Hkv])."""
    return (pair_magnitudes(k) * weight.float()).sum(-1) + bias.float()


def save_scorer(path, weight: torch.Tensor, bias: torch.Tensor, meta: dict) -> Path:
    """Write a scorer file atomically; `meta` (JSON values) says what it was fitted on."""
    if weight.dim() != 3 or tuple(bias.shape) != tuple(weight.shape[:2]):
        raise ValueError(f"a scorer is weight [L, Hkv, D/2] and bias [L, Hkv]; got {tuple(weight.shape)}, "
                         f"{tuple(bias.shape)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file({"weight": weight.float().contiguous(), "bias": bias.float().contiguous()}, str(tmp),
                  metadata={"golinear_scorer": json.dumps(meta, sort_keys=True)})
    return path


def load_scorer(path) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(weight [L, Hkv, P], bias [L, Hkv], meta) of a scorer file; a one-line error naming the file when it is
    missing, unreadable or not a scorer."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"retention scorer file {str(path)!r} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            names, meta = set(f.keys()), f.metadata() or {}
            tensors = {n: f.get_tensor(n) for n in TENSORS if n in names}
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"retention scorer file {str(path)!r} is unreadable ({e})") from None
    if set(tensors) != set(TENSORS) or "golinear_scorer" not in meta:
        raise ValueError(f"{str(path)!r} is not a retention scorer file (needs tensors {list(TENSORS)} and "
                         f"golinear_scorer metadata; scripts/retention_scorer_probe.py fit writes one)")
    weight, bias = tensors["weight"], tensors["bias"]
    if weight.dim() != 3 or tuple(bias.shape) != tuple(weight.shape[:2]):
        raise ValueError(f"retention scorer file {str(path)!r}: weight {tuple(weight.shape)} and bias "
                         f"{tuple(bias.shape)} are not [L, Hkv, D/2] and [L, Hkv]")
    return weight, bias, json.loads(meta["golinear_scorer"])


def scorer_for_model(path, config, base_fingerprint: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A scorer file's (weight, bias), checked against the backbone it is applied to: its layers, KV heads and
    head dim, and (when both are known) the frozen weights' fingerprint it was fitted on."""
    weight, bias, meta = load_scorer(path)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    want = (config.num_hidden_layers, config.num_key_value_heads, head_dim // 2)
    if tuple(weight.shape) != want:
        raise ValueError(f"retention scorer {str(path)!r} has weight {tuple(weight.shape)}; this backbone needs "
                         f"[layers, KV heads, head_dim/2] = {list(want)}")
    fitted_on = meta.get("base_fingerprint")
    if fitted_on and base_fingerprint and fitted_on != base_fingerprint:
        raise ValueError(f"retention scorer {str(path)!r} was fitted on base weights {fitted_on}, but this model's "
                         f"are {base_fingerprint}; fit one on this base (scripts/retention_scorer_probe.py fit)")
    return weight, bias
