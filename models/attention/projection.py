"""The frozen q/k/v projection (+ Qwen3's q/k norm, the short conv, RoPE), written once, and the decoder layers.

Used by LinearizedAttention (parallel pass, chunked prefill, decode step), by the static-cache decoder for a
hybrid's full-attention layers and by the diagnostics. Two forms of one computation:
  - fused (linearized layers): [q|k|v] in one matmul when the projections are plain nn.Linear and T > 1, the
    short conv as one depthwise conv over [q|k|v], RoPE on q and k at once (launch overhead, tests/test_overhead.py);
  - on CUDA without autograd (ops.fast_inference), every row at the same positions (cos/sin of batch 1) and no
    q/k norm, inside the chunked prefill: FLA's conv kernel writes [q|k] and v as two contiguous tensors and
    FLA's rotary kernel rotates [q|k] (2 passes over [q|k|v] instead of 9 for the conv, 3 over [q|k] instead of
    5 for RoPE);
  - separate (a stock attention module): the three projections and apply_rotary_pos_emb, exactly the backbone's
    own attention, so a full-attention layer decoded here equals the model's forward.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, rotate_half

from golinear.models.attention import ops
from golinear.models.attention.ops import fla_backend
from golinear.models.attention.ops.conv import last_inputs


def decoder_layers(model):
    """The decoder layers of a *ForCausalLM (model.model.layers); ValueError for another class."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ValueError(f"unsupported model class {type(model).__name__}: expected a *ForCausalLM with .model.layers")
    return inner.layers


def matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the frozen projections compute in: autocast's when it is on (casting to it first is what
    the autocast linear does anyway), else x's."""
    if torch.is_autocast_enabled(x.device.type) and x.dtype == torch.float32:
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """apply_rotary_pos_emb's formula on [B, T, heads, D] (q and k heads at once), cast to dtype. Without
    autograd and compile: x*cos plus two in-place multiply-adds on the halves (3 passes over x instead of
    the formula's 6: rotate_half's neg and cat, two products, the sum)."""
    if torch.is_grad_enabled() or ops.compile_enabled():
        return rope_formula(x, cos, sin, dtype)
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    h = x.shape[-1] // 2
    out = x * cos
    out[..., :h].addcmul_(x[..., h:], sin[..., :h], value=-1)
    out[..., h:].addcmul_(x[..., :h], sin[..., h:])
    return out.to(dtype)


@ops.compiled
def rope_formula(x, cos, sin, dtype):
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return ((x * cos) + (rotate_half(x) * sin)).to(dtype)


def fused_qkv(attn, x: torch.Tensor) -> torch.Tensor:
    """[q|k|v] = x W^T in one matmul [B, T, (H+2Hkv)D] when the projections are plain nn.Linear (no LoRA,
    no hooks); else the three projections, concatenated. One token at a time (decoding) also takes the
    three projections: concatenating the weights would copy them on every step."""
    mods = (attn.q_proj, attn.k_proj, attn.v_proj)
    plain = x.shape[1] > 1 and all(type(m) is nn.Linear and not m._forward_hooks and not m._forward_pre_hooks
                                   for m in mods)
    biases = [m.bias for m in mods]
    if plain and (all(b is None for b in biases) or all(b is not None for b in biases)):
        bias = None if biases[0] is None else torch.cat(biases)
        return F.linear(x, torch.cat([m.weight for m in mods]), bias)
    return torch.cat([m(x) for m in mods], -1)


def project_qkv(attn, x: torch.Tensor, position_embeddings, conv_weight=None, conv_state=None,
                want_conv_state: bool = True, fused: bool = True):
    """(qk, q, k, v, new conv state) of an attention module `attn` (q/k/v_proj, optional q/k_norm, head_dim):
    q [B,T,H,D], k/v [B,T,Hkv,D] after the short conv (conv_weight [C, W] over [q|k|v], fused form only;
    conv_state [B, C, W-1] the previous inputs, None: zeros), q/k norm and RoPE; qk [B,T,H+Hkv,D] is q and k
    in one tensor (q, k are its slices) when RoPE ran on both at once, else None; the new conv state is
    [B, C, W-1] (None without conv or when not wanted). The fused form needs attn.num_heads/num_kv_heads
    (LinearizedAttention); the separate form takes the backbone's attention module as it is."""
    B, T = x.shape[:2]
    D = attn.head_dim
    cos, sin = position_embeddings
    new_conv = None
    q_norm = getattr(attn, "q_norm", None)
    if not fused:
        q, k, v = (m(x).view(B, T, -1, D) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
    elif q_norm is None and T > 1 and cos.shape[0] == 1 and cos.dtype == x.dtype and ops.fast_inference(x):
        return _project_fast(attn, x, cos[0], sin[0], conv_weight, conv_state, want_conv_state)
    else:
        H, Hkv = attn.num_heads, attn.num_kv_heads
        qkv = fused_qkv(attn, x)
        if conv_weight is not None:
            qkv, new_conv = ops.short_conv(qkv, conv_weight, state=conv_state, output_final_state=want_conv_state)
        # split (not slices): its backward is one cat instead of a zero-filled copy per slice
        qk, v = (t.unflatten(-1, (-1, D)) for t in qkv.split([(H + Hkv) * D, Hkv * D], -1))
        # under autocast RoPE's fp32 cos/sin promote q/k while v stays bf16: FLA kernels need one dtype
        if q_norm is None:  # RoPE on q and k at once (the same formula as apply_rotary_pos_emb)
            qk = rope(qk, cos, sin, v.dtype)
            q, k = qk.split([H, Hkv], 2)
            return qk, q, k, v, new_conv
        q, k = qk.split([H, Hkv], 2)
    if q_norm is not None:
        q, k = q_norm(q), attn.k_norm(k)
    q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    if fused:
        q, k = q.to(v.dtype), k.to(v.dtype)
    return None, q, k, v, new_conv


def _project_fast(attn, x, cos, sin, conv_weight, conv_state, want_conv_state):
    """project_qkv's fused form on FLA's conv and rotary kernels (no autograd; cos/sin [T, D] shared by every
    row): the same values up to bf16 rounding (each kernel accumulates in fp32 and rounds once)."""
    B, T = x.shape[:2]
    H, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    qkv = fused_qkv(attn, x)
    n = (H + Hkv) * D
    new_conv = None
    if conv_weight is None:
        qk, v = qkv[..., :n].contiguous(), qkv[..., n:]
    else:
        W = conv_weight.shape[1]
        if conv_state is not None and tuple(conv_state.shape) != (B, qkv.shape[-1], W - 1):
            raise ValueError(f"conv state {tuple(conv_state.shape)} must be {(B, qkv.shape[-1], W - 1)}")
        part = (lambda a, b: None) if conv_state is None else (lambda a, b: conv_state[:, a:b])
        qk = fla_backend.conv_fresh(qkv[..., :n], conv_weight[:n], part(0, n))
        v = fla_backend.conv_fresh(qkv[..., n:], conv_weight[n:], part(n, qkv.shape[-1]))
        new_conv = last_inputs(qkv, conv_state, W) if want_conv_state else None
    qk = fla_backend.rope(qk.view(B, T, H + Hkv, D), cos, sin)
    q, k = qk.split([H, Hkv], 2)
    return qk, q, k, v.unflatten(-1, (Hkv, D)), new_conv


_rope_formula = rope_formula  # (the name the GPU tests use)
