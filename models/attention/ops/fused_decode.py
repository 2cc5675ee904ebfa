"""The default recipe's steady decode step in few kernels: GOLINEAR_FUSED_DECODE.

LinearizedAttention.step (models/attention/layers.py) is the definition; it issues ~50 small kernels per layer around one
FLA call, and the CUDA-graph-replayed step costs kernels x a launch floor. `fused_step` computes the same thing
as three regions:
  1. `_prepare` (one torch.compile'd pure function: inductor fuses it into a few kernels): the short conv over
     [q|k|v] with its state shift, RoPE, l2norm, the GDN gates, the ring-buffer reads (the token leaving the
     window) and writes, and the window + sink softmax;
  2. the GDN recurrent kernel, updating the fp32 state in place (fla_backend.gdn_step_inplace; the reference
     op and a copy elsewhere);
  3. the disjoint sum y_lin + y_swa and o_proj.
It serves GDN with a window (sinks and short conv optional, the conv on both paths: conv_on "both"), no retention
slots, no q/k norm, every row past
sinks + window (`steady`), inside FastDecoder's step (`decode_scope`: HF generate, hence lm-eval, keeps the
definition); every other step runs the definition. GOLINEAR_FUSED_DECODE: 'auto' (default: on for CUDA tensors),
'0' (off: the eager step), '1' (also on the CPU: the tests). The GPU tests (scripts/gpu/tests.sh) passed on an H200
(tests/test_gpu.py against the eager step; 8B dims, batch 8, 32K: 7.24 ms/token fused, 11.48 eager).
"""
from __future__ import annotations

import functools
import os

import torch

from golinear.models.attention import ops
from golinear.models.attention.ops import fla_backend

MODES = ("auto", "0", "1")  # GOLINEAR_FUSED_DECODE; the first is the default


def mode() -> str:
    value = os.environ.get("GOLINEAR_FUSED_DECODE", MODES[0]).strip() or MODES[0]
    if value not in MODES:
        raise ValueError(f"GOLINEAR_FUSED_DECODE={value!r}; allowed: {list(MODES)}")
    return value


decode_scope = ops.Scope()  # where the fused step may serve: FastDecoder's step (HF generate, so lm-eval, keeps
# the definition)


def enabled(x: torch.Tensor) -> bool:
    """The mode says yes for x, inside decode_scope, without autograd."""
    m = mode()
    return decode_scope.active and m != "0" and (m == "1" or x.is_cuda) and not torch.is_grad_enabled()


def applies(layer, x: torch.Tensor, steady: bool) -> bool:
    """Whether `fused_step` serves this layer's step (else LinearizedAttention.step's definition runs)."""
    if not (steady and enabled(x)):
        return False
    return (layer.mechanism == "gdn" and layer.window > 0 and layer.q_norm is None
            and not layer.conv_linear_only  # one convolved q/k/v for both paths
            and not torch.is_autocast_enabled(x.device.type))


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def _l2norm(x, eps=1e-6):
    sq = x.float().pow(2).sum(-1, keepdim=True)
    return x * torch.rsqrt(sq + eps).to(x.dtype)


def _prepare(q_raw, k_raw, v_raw, ab, conv_parts, conv, cos, sin, A_log, dt_bias, sink_k, sink_v, ring_k, ring_v,
             lin_k, lin_v, lin_log_a, lin_beta, pos, window: int, scale: float):
    """Everything of a steady GDN decode step but the recurrence, for B rows at their own positions.

    q_raw [B, H*D], k_raw/v_raw [B, Hkv*D] (projections), ab [B, 2H], conv_parts the short convs' q, k, v taps
    ([*, W] each) or None, cos/sin [B, D], pos [B]. Writes conv, ring_k/v and lin_* in place; returns (q, k, v, log_a, beta) of the
    linear op (q of this token, the rest of the token leaving the window, [B, 1, H, ...]) and y_swa [B, 1, H, D]."""
    B, dtype = q_raw.shape[0], v_raw.dtype
    Hkv, D = ring_k.shape[2], ring_k.shape[3]
    H = q_raw.shape[1] // D
    x = torch.cat([q_raw, k_raw, v_raw], -1)
    if conv_parts is not None:  # y_t = sum_i w_i x_{t-W+1+i}, the state holding the last W-1 inputs
        w = torch.cat(conv_parts).to(dtype)
        W = w.shape[1]
        y = x * w[:, W - 1]
        for i in range(W - 1):
            y = y + conv[:, :, i].to(dtype) * w[:, i]
        conv.copy_(torch.cat([conv[:, :, 1:], x.unsqueeze(-1).to(conv.dtype)], -1))
        x = y
    qk = x[:, :(H + Hkv) * D].view(B, H + Hkv, D)
    v = x[:, (H + Hkv) * D:].view(B, Hkv, D)
    qk = (qk * cos.unsqueeze(1) + _rotate_half(qk) * sin.unsqueeze(1)).to(dtype)
    q, k = qk[:, :H], qk[:, H:]
    qk_n = _l2norm(qk)
    groups = H // Hkv
    cur = dict(k=qk_n[:, H:].repeat_interleave(groups, 1), v=v.repeat_interleave(groups, 1))
    a, b = ab.float().split([H, H], -1)
    cur["log_a"] = -A_log.float().exp() * torch.nn.functional.softplus(a + dt_bias.float())
    cur["beta"] = torch.sigmoid(b)
    rows, slot = torch.arange(B, device=pos.device), pos % window
    leaving = []
    for key, buf in (("k", lin_k), ("v", lin_v), ("log_a", lin_log_a), ("beta", lin_beta)):
        leaving.append(buf[rows, slot].unsqueeze(1))
        buf.index_put_((rows, slot), cur[key].to(buf.dtype))
    ring_k.index_put_((rows, slot), k.to(ring_k.dtype))
    ring_v.index_put_((rows, slot), v.to(ring_v.dtype))
    # products and sums, not matmuls: a few rows against s + w keys, which inductor fuses into its reductions; the
    # sinks and the ring apart (a concatenation of them would be a copy of the whole window a step), one softmax
    qg = q.reshape(B, 1, Hkv, groups, D).float()
    parts = [(ring_k, ring_v)] if sink_k is None else [(sink_k, sink_v), (ring_k, ring_v)]
    scores = torch.cat([(qg * kp.float().unsqueeze(3)).sum(-1) for kp, _ in parts], 1) * scale  # [B, L, Hkv, G]
    p = torch.softmax(scores, 1)
    at = [0, parts[0][0].shape[1], scores.shape[1]]
    swa = sum((p[:, a:b].unsqueeze(-1) * vp.float().unsqueeze(3)).sum(1) for (_, vp), a, b in zip(parts, at, at[1:]))
    swa = swa.reshape(B, 1, H, D).to(dtype)
    lk, lv, la, lb = leaving
    return qk_n[:, :H].unsqueeze(1).contiguous(), lk, lv, la, lb.to(dtype), swa  # (FLA reads dense rows)


@functools.cache
def _compiled_prepare():
    """_prepare through torch.compile (static shapes: one graph per batch size and layer shape, shared by layers)."""
    return torch.compile(_prepare, dynamic=False)


def prepare(*args, **kwargs):
    return _compiled_prepare()(*args, **kwargs)


def fused_step(layer, x, position_embeddings, state, pos):
    """LinearizedAttention.step(x, pe, state, pos, rows, steady=True) for a layer `applies` accepts."""
    B = x.shape[0]
    cos, sin = position_embeddings
    x2 = x[:, 0]
    lin = layer.lin
    conv = layer.conv
    ab = torch.nn.functional.linear(x2, _gate_weight(lin))
    rl = state.ring_lin
    q, k, v, log_a, beta, swa = prepare(
        layer.q_proj(x2), layer.k_proj(x2), layer.v_proj(x2), ab, None if conv is None else (conv.q, conv.k, conv.v),
        state.conv, cos[:, 0], sin[:, 0], lin.A_log, lin.dt_bias, state.sink_k, state.sink_v, state.ring_k,
        state.ring_v, rl["k"], rl["v"], rl["log_a"], rl["beta"], pos, layer.window, layer.scaling)
    if ops.backend_for(q) is fla_backend:
        o = fla_backend.gdn_step_inplace(q, k, v, log_a, beta, lin.scale, state.state)
    else:
        o, new = ops.gdn_recurrent(q, k, v, log_a, beta, lin.scale, initial_state=state.state,
                                   output_final_state=True)
        state.state.copy_(new)
    if lin.out_norm is not None:
        o = lin.out_norm(o)
    y = o + swa
    return layer.o_proj(y.reshape(B, 1, -1))


def _gate_weight(lin) -> torch.Tensor:
    """[a_proj; b_proj] weights, concatenated once and kept while neither changes (a copy per step is a kernel)."""
    wa, wb = lin.a_proj.weight, lin.b_proj.weight
    key = (wa.data_ptr(), wa._version, wb.data_ptr(), wb._version)
    cached = getattr(lin, "_fused_gate_weight", None)
    if cached is None or cached[0] != key:
        cached = (key, torch.cat([wa, wb]).detach())
        lin._fused_gate_weight = cached
    return cached[1]
