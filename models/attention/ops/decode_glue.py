"""The decoder layer's glue in the fast decode step, fused (GOLINEAR_FUSED_DECODE, as fused_decode).

Around each attention step a Llama/Qwen decoder layer runs two RMSNorms, two residual adds and the MLP's
SiLU(gate) * up: about 25 small kernels per layer and token in eager PyTorch (tests/test_overhead.py), the same
for every configuration. FastDecoder's step instead runs `add_rms_norm` (residual add + the next norm, one
compiled kernel) twice per layer and `silu_mul` once; the projections stay the modules' own matmuls. The HF
modules are the definition; `usable` accepts only the norm and MLP classes whose formula is written here.
FastDecoder's chunked prefill runs the same formulas, compiled apart with dynamic shapes (models/decoding/fast_decode.py).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from golinear.models.attention.ops import fused_decode

RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")  # weight * x / rms(x), no offset
SILUS = ("SiLU", "SiLUActivation")  # torch's and transformers' (ACT2FN["silu"]) module


def usable(layers, final_norm, x: torch.Tensor) -> bool:
    """Whether every layer's norms and MLP (and the final norm) have the formulas below, with the mode on."""
    if not fused_decode.enabled(x):
        return False
    norms = [final_norm] + [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    mlps = [layer.mlp for layer in layers]
    return (all(type(n).__name__ in RMS_NORMS and not n._forward_hooks for n in norms)
            and all(type(getattr(m, "act_fn", None)).__name__ in SILUS and not m._forward_hooks
                    and all(hasattr(m, p) for p in ("gate_proj", "up_proj", "down_proj")) for m in mlps))


def rms_norm_formula(h, weight, eps: float):
    hf = h.float()
    return weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


def add_rms_norm_formula(h, a, weight, eps: float):
    """(h + a, RMSNorm(h + a)): a residual add and the norm after it."""
    h = h + a
    return h, rms_norm_formula(h, weight, eps)


def silu_mul_formula(g, u):
    return F.silu(g) * u


@functools.cache
def _compiled(name: str):
    return torch.compile(globals()[name], dynamic=False)


def rms_norm(h, norm):
    return _compiled("rms_norm_formula")(h, norm.weight, norm.variance_epsilon)


def add_rms_norm(h, a, norm):
    return _compiled("add_rms_norm_formula")(h, a, norm.weight, norm.variance_epsilon)


def mlp(module, x):
    """LlamaMLP/Qwen's down(silu(gate(x)) * up(x)) with the activation product in one kernel."""
    return module.down_proj(_compiled("silu_mul_formula")(module.gate_proj(x), module.up_proj(x)))
