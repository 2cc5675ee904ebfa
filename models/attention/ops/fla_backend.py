"""CUDA implementations of `models.attention.ops` on flash-linear-attention (FLA 0.6.0) Triton kernels.

Same signatures and conventions as `models.attention.ops.reference` ([B, T, H, D] layout, fp32 states [B, H, K, V],
outputs in the input dtype). Imported only by the dispatch in `models.attention.ops` when tensors are on CUDA and
FLA imports. Which kernel backs each op:
  - gla_chunk / gla_recurrent: `chunk_gla` / `fused_recurrent_gla`; chunk_gla's inputs shorter than GLA_MIN_T
    tokens are zero-padded to it (see GLA_MIN_T: the H200 faulted on FLA's chunk size 32).
  - gdn_chunk: FLA's `ChunkGatedDeltaRuleFunction` with its backward run under a scoped bypass of the
    Hopper + triton<3.7.1 guard (FLA #640; gradients checked against the reference in tests/test_gpu.py
    for head dims 64 and 128 at T=4096 on the H200). gdn_recurrent: `fused_recurrent_gated_delta_rule`
    (forward only: FLA has no backward for it; with grad enabled and T > 1 the chunk kernel is used).
    gdn_step_inplace: the same kernel launched with its final state written over the initial one (the fused
    decode step, models.attention.ops.fused_decode).
  - linear_attn_chunk / _recurrent (Hedgehog): FLA's `chunk_linear_attn` / `fused_recurrent_linear_attn`
    with normalize=False and scale=1, on v augmented by a ones column (padded to a multiple of 16), so one
    kernel returns the numerator and the denominator phi_q^T Z together; the state carries Z in that
    column. FLA's own normalize=True returns only num/den, but the layer needs both (shared normaliser).
  - window_sink_attention: the window part on FLA's `parallel_attn` kernel (skips key blocks outside the
    window) when no gradient is needed, else a blocked PyTorch form with autograd; the sink keys are a
    small separate softmax merged through the log-sum-exp (FLA's sink_bias is a learned logit, not
    StreamingLLM sink tokens). docs/speed.md gives the measurement behind this choice.
  - window_sink_softmax (the layer's parallel pass; output without lse): window + sinks in ONE SDPA call,
    with or without autograd (`models.attention.ops.window.window_attention_blocked`, plain PyTorch).
  - short_conv: `models.attention.ops.conv` (plain PyTorch). window_sink_decode: the reference.
  - inference-only helpers of the prefill (no autograd; models.attention.projection / models.attention.mechanisms call them when
    `models.attention.ops.fast_inference` says so): `conv_fresh` (FLA's causal_conv1d forward kernel: one pass, fp32
    accumulation, a fresh contiguous output), `rope` (FLA's rotary kernel) and `l2norm` (FLA's
    l2norm forward kernel). The prefill's window + sinks is `window.window_attention_blocked` either way.
FLA's kernels are wrapped in torch.compiler.disable (opaque to torch.compile).
"""
from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.nn.functional as F

from golinear.models.attention.ops import reference
from golinear.models.attention.ops.reference import window_sink_decode  # noqa: F401  (a few small matmuls: fine on CUDA)
from golinear.models.attention.ops.conv import short_conv  # noqa: F401  (this backend's op, in plain PyTorch)
from golinear.models.attention.ops.window import (WINDOW_BLOCK, add_sinks, merge_attention, sink_part, window_attention_blocked,
                               window_part_blocked)

LN2 = math.log(2.0)


class _FLA:
    """FLA's kernels, imported on first use (the PyTorch parts of this module work without FLA)."""

    def __getattr__(self, name):
        load_fla()
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(name) from None


kernels = _FLA()


def load_fla():
    """Import the FLA pieces used here; raises ImportError (no fla / no triton) like a plain import."""
    if "chunk_gla" in kernels.__dict__:
        return
    import fla.ops.common.chunk_o as chunk_o  # module global holding the Hopper/triton guard flag
    from fla.ops.attn.parallel import parallel_attn_fwd
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    from fla.ops.gated_delta_rule.chunk import ChunkGatedDeltaRuleFunction
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd_kernel
    from fla.ops.gla import chunk_gla, fused_recurrent_gla
    from fla.ops.linear_attn import chunk_linear_attn, fused_recurrent_linear_attn
    from fla.modules.causal_conv1d import causal_conv1d_fwd
    from fla.modules.norm.l2norm import l2norm_fwd
    from fla.modules.rotary.ops import rotary_embedding_fwdbwd

    class GDNChunkFunction(ChunkGatedDeltaRuleFunction):
        """FLA's chunk GDN, with the backward (where the guard sits) run under `hopper_guard_bypassed`."""

        @staticmethod
        def backward(ctx, do, dht):
            with hopper_guard_bypassed():
                return ChunkGatedDeltaRuleFunction.backward(ctx, do, dht)

    opaque = torch.compiler.disable  # FLA's Triton kernels are never traced into a torch.compile graph
    kernels.__dict__.update(
        chunk_o=chunk_o, parallel_attn_fwd=opaque(parallel_attn_fwd), chunk_gla=opaque(chunk_gla),
        fused_recurrent_gla=opaque(fused_recurrent_gla), GDNChunkFunction=GDNChunkFunction,
        gdn_chunk_apply=opaque(GDNChunkFunction.apply),
        fused_recurrent_gated_delta_rule=opaque(fused_recurrent_gated_delta_rule),
        chunk_linear_attn=opaque(chunk_linear_attn), fused_recurrent_linear_attn=opaque(fused_recurrent_linear_attn),
        causal_conv1d_fwd=opaque(causal_conv1d_fwd), l2norm_fwd=opaque(l2norm_fwd),
        rotary_embedding_fwdbwd=opaque(rotary_embedding_fwdbwd),
        gdn_step_launch=opaque(functools.partial(_gdn_step_launch, fused_recurrent_gated_delta_rule_fwd_kernel)))
    from golinear.models.attention.ops import kernel_configs
    kernel_configs.pin()  # this card's recorded autotuning choices: no timing runs in a new process


# ----------------------------------------------------------------------------------------------- GLA
def _same_dtype(*xs):
    """FLA's kernels need one dtype for q/k/v (mixed fp32/bf16 appears under autocast): use v's (the last);
    contiguous, as the layer hands over strided views (q and k are slices of one RoPE'd tensor)."""
    dt = xs[-1].dtype
    return tuple(x.to(dt).contiguous() for x in xs)


def _state_in(initial_state):
    return None if initial_state is None else initial_state.float().contiguous()


# FLA 0.6.0's chunk_gla picks its chunk size from T: min(64, max(16, next_pow2(T))) (fla/ops/gla/chunk.py,
# ChunkGLAFunction.forward); GDN and linear attention always run 64. On the H200 (triton 3.6) every GLA-family
# lm-eval run (fp32, the backends' default dtype) died with "CUDA error: misaligned address" at the first batch
# whose linear path had 17..32 tokens, i.e. chunk 32, after every earlier batch (chunk 64) had run. Isolated by
# Seen on an H200 (B 64, 9 heads of 64): fp32 inputs at T 17 and 32 fault in
# chunk_gla_fwd_kernel_o (config BK 64, BV 64, 8 warps, 2 stages); fp32 at T 15 (chunk 16) and 300, and bf16 at
# T 15/17/32, run. Shorter inputs are therefore zero-padded to GLA_MIN_T tokens, so chunk_gla runs chunk 64 only
# (fp32 T 17 and 32 then run and match the reference). Exact: padded tokens come after the real ones (causal),
# and with k = v = 0 and log decay 0 they leave the state as it is. 0 turns the padding off (the repro's arm).
GLA_MIN_T = 64


def _pad_time(x, n):
    """x [B, T, ...] with n zero rows appended along T (x itself when n == 0)."""
    return x if n == 0 else F.pad(x, (0, 0) * (x.dim() - 2) + (0, n))


def gla_chunk(q, k, v, log_a, scale, initial_state=None, output_final_state=False, chunk_size=64):
    reference.check_qkv(q, k, v)
    T = q.shape[1]
    if T == 0:
        return reference.gla_chunk(q, k, v, log_a, scale, initial_state, output_final_state, chunk_size)
    out_dtype = q.dtype
    pad = max(0, GLA_MIN_T - T)
    q, k, v = (_pad_time(x, pad) for x in _same_dtype(q, k, v))
    g = _pad_time(log_a.float(), pad).contiguous()  # (a strided view of the layer's log_a when sinks/window > 0)
    o, state = kernels.chunk_gla(q=q, k=k, v=v, g=g, scale=scale,
                                 initial_state=_state_in(initial_state), output_final_state=output_final_state)
    if pad:
        o = o[:, :T].contiguous()
    return o.to(out_dtype), state


def gla_recurrent(q, k, v, log_a, scale, initial_state=None, output_final_state=False):
    reference.check_qkv(q, k, v)
    if q.shape[1] == 0:
        return reference.gla_recurrent(q, k, v, log_a, scale, initial_state, output_final_state)
    out_dtype = q.dtype
    q, k, v = _same_dtype(q, k, v)
    o, state = kernels.fused_recurrent_gla(q=q, k=k, v=v, gk=log_a.float().contiguous(), scale=scale,
                                           initial_state=_state_in(initial_state),
                                           output_final_state=output_final_state)
    return o.to(out_dtype), state


# ----------------------------------------------------------------------------------------------- GDN
@contextlib.contextmanager
def hopper_guard_bypassed():
    """Let FLA run its gated chunk backward on Hopper with triton < 3.7.1 (flash-linear-attention/issues/640) for this scope only."""
    chunk_o = kernels.chunk_o
    old = chunk_o.TRITON_ABOVE_3_4_0
    chunk_o.TRITON_ABOVE_3_4_0 = False
    try:
        yield
    finally:
        chunk_o.TRITON_ABOVE_3_4_0 = old


def gdn_chunk(q, k, v, log_a, beta, scale, initial_state=None, output_final_state=False, chunk_size=64):
    reference.check_qkv(q, k, v)
    reference.check_gates("log_a", log_a, q)
    reference.check_gates("beta", beta, q)
    if q.shape[1] == 0:
        return reference.gdn_chunk(q, k, v, log_a, beta, scale, initial_state, output_final_state, chunk_size)
    fla_chunk = chunk_size if chunk_size in (16, 32, 64) else 64  # the result does not depend on it
    out_dtype = q.dtype
    q, k, v = _same_dtype(q, k, v)
    # positional order of ChunkGatedDeltaRuleFunction.forward (FLA 0.6.0)
    o, state = kernels.gdn_chunk_apply(
        q, k, v, log_a.float().contiguous(), beta.to(q.dtype).contiguous(), scale, _state_in(initial_state),
        output_final_state, False, None, None, None,  # state_v_first, cu_seqlens, cu_seqlens_cpu, chunk_indices
        False, False, None, None,  # use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias
        False, False, None,  # use_beta_sigmoid_in_kernel, allow_neg_eigval, cp_context
        fla_chunk)
    return o.to(out_dtype), state


def gdn_recurrent(q, k, v, log_a, beta, scale, initial_state=None, output_final_state=False):
    reference.check_qkv(q, k, v)
    reference.check_gates("log_a", log_a, q)
    reference.check_gates("beta", beta, q)
    if q.shape[1] == 0:
        return reference.gdn_recurrent(q, k, v, log_a, beta, scale, initial_state, output_final_state)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, log_a, beta, initial_state))
    if needs_grad:  # FLA's fused recurrent GDN has no backward: same recurrence through the chunk kernel
        return gdn_chunk(q, k, v, log_a, beta, scale, initial_state, output_final_state)
    out_dtype = q.dtype
    q, k, v = _same_dtype(q, k, v)
    # keywords only: the 5th positional argument of this op is gk, not beta (fla.md footgun)
    o, state = kernels.fused_recurrent_gated_delta_rule(q=q, k=k, v=v, g=log_a.float().contiguous(),
                                                        beta=beta.to(q.dtype).contiguous(), scale=scale,
                                                        initial_state=_state_in(initial_state),
                                                        output_final_state=output_final_state)
    return o.to(out_dtype), state


def gdn_step_inplace(q, k, v, log_a, beta, scale, state):
    """gdn_recurrent with the fp32 state [B, H, K, V] updated in place (the decode step: no new state, no copy
    back): FLA's fused recurrent kernel with h0 = ht (each program loads its state slice before it stores it).
    q/k/v [B, T, H, D] contiguous, log_a [B, T, H] fp32, beta [B, T, H] in q's dtype -> o [B, T, H, V]."""
    reference.check_qkv(q, k, v)
    want = (q.shape[0], q.shape[2], q.shape[3], v.shape[-1])
    if state.dtype != torch.float32 or not state.is_contiguous() or tuple(state.shape) != want:
        raise ValueError(f"state {tuple(state.shape)} {state.dtype}: must be fp32, contiguous, {want}")
    o = torch.empty_like(v)
    kernels.gdn_step_launch(q.contiguous(), k.contiguous(), v.contiguous(), log_a.float().contiguous(),
                            beta.contiguous(), o, state, scale)
    return o


def _gdn_step_launch(kernel, q, k, v, g, beta, o, state, scale):
    """The launch of FLA 0.6.0's fused_recurrent_gated_delta_rule_fwd with ht = h0 = state (its block sizes)."""
    import triton
    B, T, H, K = k.shape
    V = v.shape[-1]
    BV = min(8, triton.next_power_of_2(V))
    kernel[(triton.cdiv(V, BV) * B * H,)](
        q=q, k=k, v=v, g=g, gk=None, gv=None, beta=beta, A_log=None, dt_bias=None, o=o, h0=state, ht=state,
        cu_seqlens=None, scale=scale, T=T, H=H, HV=H, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV,
        IS_BETA_HEADWISE=True, USE_QK_L2NORM_IN_KERNEL=False, APPLY_BETA_SIGMOID=False, ALLOW_NEG_EIGVAL=False,
        STATE_V_FIRST=False, num_warps=1, num_stages=3)


# ----------------------------------------------------------------------------------------------- linear attention
def _augment(v, S0, Z0):
    """v [B,T,H,V] -> [B,T,H,V'] with a ones column at V (V' = V+1 rounded up to 16); state likewise."""
    B, T, H, V = v.shape
    Vp = -(-(V + 1) // 16) * 16
    ones = v.new_ones(B, T, H, 1)
    v_aug = torch.cat([v, ones, v.new_zeros(B, T, H, Vp - V - 1)], -1)
    state = None
    if S0 is not None:
        state = torch.cat([S0.float(), Z0.float().unsqueeze(-1), S0.new_zeros(*S0.shape[:3], Vp - V - 1,
                                                                              dtype=torch.float32)], -1)
    return v_aug, state


def _split(o, state, V, output_final_state):
    num, den = o[..., :V], o[..., V]
    final = (state[..., :V], state[..., V]) if (output_final_state and state is not None) else None
    return num, den, final


def _linear_attn(fn, phi_q, phi_k, v, initial_state, output_final_state):
    reference.check_qkv(phi_q, phi_k, v, "phi_q", "phi_k")
    S0 = Z0 = None
    if initial_state is not None:
        S0, Z0 = initial_state
    phi_q, phi_k, v = _same_dtype(phi_q, phi_k.to(phi_q.dtype), v.to(phi_q.dtype))  # feature maps' precision
    v_aug, state = _augment(v, S0, Z0)
    o, final = fn(q=phi_q, k=phi_k, v=v_aug, scale=1.0, initial_state=state,
                  output_final_state=output_final_state, normalize=False)
    num, den, final = _split(o, final, v.shape[-1], output_final_state)
    return num.to(phi_q.dtype), den.to(phi_q.dtype), final


def linear_attn_chunk(phi_q, phi_k, v, initial_state=None, output_final_state=False, chunk_size=64):
    if phi_q.shape[1] == 0:
        return reference.linear_attn_chunk(phi_q, phi_k, v, initial_state, output_final_state, chunk_size)
    return _linear_attn(kernels.chunk_linear_attn, phi_q, phi_k, v, initial_state, output_final_state)


def linear_attn_recurrent(phi_q, phi_k, v, initial_state=None, output_final_state=False):
    if phi_q.shape[1] == 0:
        return reference.linear_attn_recurrent(phi_q, phi_k, v, initial_state, output_final_state)
    return _linear_attn(kernels.fused_recurrent_linear_attn, phi_q, phi_k, v, initial_state, output_final_state)


# ----------------------------------------------------------------------------------------------- window + sinks
def window_sink_softmax(q, k, v, sinks, window, scale):
    """window_sink_attention's output alone (no lse), q/k/v at the same positions: one fused attention
    call for window + sinks, forward and backward (the layer's parallel pass). -> out in q's dtype."""
    reference.grouped(q, k)
    T = q.shape[1]
    if window >= T and k.shape[1] == T and q.dtype != torch.float64 and T > 0:
        return causal_softmax(q, k, v, scale)
    if window < 1 or window >= T or q.dtype == torch.float64 or k.shape[1] != T:
        return window_sink_attention(q, k, v, sinks, window, scale)[0]
    return window_attention_blocked(q, k, v, window, scale, sinks=min(sinks, T)).to(q.dtype)


def causal_softmax(q, k, v, scale):
    """Causal softmax attention of q/k/v at the same positions [B, T, H, D], GQA aware, autograd or not: a window
    that reaches every earlier key (window >= T) sees exactly this, and SDPA's causal kernel runs it without the
    T x T scores the reference holds (a full-attention control trains through it). -> out in q's dtype."""
    out_dtype = q.dtype
    q, k = q.to(v.dtype), k.to(v.dtype)  # one dtype; SDPA takes the layer's strided views as they are
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                       scale=scale, enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2).to(out_dtype)


def window_part_fla(q, k, v, window, scale):
    """window_part_blocked's (out, lse) on FLA's parallel_attn forward kernel (no autograd; out in v's dtype);
    window >= T: causal."""
    T = q.shape[1]
    w = None if window >= T else window
    o, lse2 = kernels.parallel_attn_fwd(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g_cumsum=None,
                                        sink_bias=None, scale=scale, window_size=w)
    return o, lse2 * LN2  # FLA keeps the log-sum-exp in base 2


def window_sink_attention(q, k, v, sinks, window, scale, q_offset=0):
    reference.grouped(q, k)
    B, Tq, Hq, D = q.shape
    Tk = k.shape[1]
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if Tq == 0 or (q_offset and q_offset + Tq != Tk) or (not q_offset and Tq != Tk) or \
            (needs_grad and window > 4 * WINDOW_BLOCK) or q.dtype == torch.float64:
        return reference.window_sink_attention(q, k, v, sinks, window, scale, q_offset)
    out_dtype = q.dtype
    q, k, v = _same_dtype(q, k, v)
    if q_offset:  # keys 0..Tk-1, queries the last Tq of them: pad queries in front, drop their rows
        q = torch.cat([q.new_zeros(B, q_offset, Hq, D), q], 1)
    T = q.shape[1]
    if window > 0:
        if needs_grad:
            o_w, lse_w = window_part_blocked(q, k, v, window, scale)
        else:
            o_w, lse_w = window_part_fla(q, k, v, window, scale)
    else:
        o_w = q.new_zeros(B, T, Hq, v.shape[-1], dtype=torch.float32)
        lse_w = q.new_full((B, T, Hq), -math.inf, dtype=torch.float32)
    s = min(sinks, Tk)
    if s > 0 and window < T:
        pos = torch.arange(T, device=q.device)
        if window > 0 and not needs_grad:
            out, lse = add_sinks(q, o_w, lse_w, k[:, :s], v[:, :s], window, scale, pos)
        else:
            o_s, lse_s = sink_part(q, k[:, :s], v[:, :s], window, scale, pos)
            out, lse = merge_attention(o_w, lse_w, o_s, lse_s)
    else:
        out, lse = o_w, lse_w
    out, lse = out[:, q_offset:], lse[:, q_offset:]
    return out.to(out_dtype), lse


# ----------------------------------------------------------------------------------------------- prefill helpers
def conv_fresh(x, weight, state=None):
    """short_conv's output alone, no autograd: FLA's causal conv kernel on x [B, T, C] (any strides: a channel
    slice of [q|k|v] is read in place), weight [C, W], state [B, C, W-1] (the previous inputs; None: zeros).
    -> y [B, T, C] contiguous, in x's dtype (fp32 accumulation, one rounding)."""
    if state is not None:  # FLA's state holds W inputs, of which the kernel reads the last W-1
        state = torch.nn.functional.pad(state.to(x.dtype), (1, 0)).contiguous()
    y, _ = kernels.causal_conv1d_fwd(x=x, weight=weight.contiguous(), bias=None, residual=None,
                                     initial_state=state, output_final_state=False, activation=None)
    return y


def rope(x, cos, sin):
    """RoPE of x [B, T, H, D] (contiguous; rotate_half convention, every row at the same positions) on FLA's
    rotary kernel: cos/sin [T, D] are HF's tables of those positions (their two halves equal), in x's dtype.
    Not in place: the kernel is autotuned on its first call per shape, and every trial run would rotate x again."""
    half = x.shape[-1] // 2
    return kernels.rotary_embedding_fwdbwd(x, cos[:, :half].contiguous(), sin[:, :half].contiguous())


def l2norm(x, eps=1e-6):
    """models.attention.mechanisms.l2norm on FLA's kernel (x contiguous): x * rsqrt(sum(x^2) + eps), fp32 inside."""
    return kernels.l2norm_fwd(x, eps)[0]
