"""CUDA implementations of `models.ops` on flash-linear-attention (FLA 0.6.0) Triton kernels.

Same signatures and conventions as `models.ops.reference` ([B, T, H, D] layout, fp32 states [B, H, K, V],
outputs in the input dtype). Imported only by the dispatch in `models.ops` when tensors are on CUDA and
FLA imports. Which kernel backs each op:
  - gla_chunk / gla_recurrent: `chunk_gla` / `fused_recurrent_gla`.
  - gdn_chunk: FLA's `ChunkGatedDeltaRuleFunction` with its backward run under a scoped bypass of the
    Hopper + triton<3.7.1 guard (FLA #640; gradients checked against the reference in tests/test_gpu.py
    for head dims 64 and 128 at T=4096 on the H200). gdn_recurrent: `fused_recurrent_gated_delta_rule`
    (forward only: FLA has no backward for it; with grad enabled and T > 1 the chunk kernel is used).
  - linear_attn_chunk / _recurrent (Hedgehog): FLA's `chunk_linear_attn` / `fused_recurrent_linear_attn`
    with normalize=False and scale=1, on v augmented by a ones column (padded to a multiple of 16), so one
    kernel returns the numerator and the denominator phi_q^T Z together; the state carries Z in that
    column. FLA's own normalize=True returns only num/den, but the layer needs both (shared normaliser).
  - window_sink_attention: the window part on FLA's `parallel_attn` kernel (skips key blocks outside the
    window) when no gradient is needed, else a blocked PyTorch form with autograd; the sink keys are a
    small separate softmax merged through the log-sum-exp (FLA's sink_bias is a learned logit, not
    StreamingLLM sink tokens). docs/speed.md gives the measurement behind this choice.
  - window_sink_softmax (the layer's parallel pass; output without lse): window + sinks in ONE SDPA call
    (`window_attention_blocked`: query blocks of 64, each against the sinks plus the run of keys its window
    reaches, under a cached additive mask; GQA as G rows per block, no key expansion), with or without
    autograd. The fast decoder's prefill uses the same function with the previous chunk's keys.
  - short_conv: without autograd shifted multiply-adds in x's dtype (one fused kernel under
    GOLINEAR_COMPILE=1); with autograd one depthwise conv1d. window_sink_decode: the reference.
FLA's kernels are wrapped in torch.compiler.disable (opaque to torch.compile).
"""
from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.nn.functional as F

from models.ops import compile_enabled, compiled, reference
from models.ops.reference import window_sink_decode  # noqa: F401  (a few small matmuls: fine on CUDA)

LN2 = math.log(2.0)
WINDOW_BLOCK = 64  # query block of the differentiable window path


class _FLA:
    """FLA's kernels, imported on first use (the PyTorch parts of this module work without FLA)."""

    def __getattr__(self, name):
        load_fla()
        return self.__dict__[name]


kernels = _FLA()


def load_fla():
    """Import the FLA pieces used here; raises ImportError (no fla / no triton) like a plain import."""
    if "chunk_gla" in kernels.__dict__:
        return
    import fla.ops.common.chunk_o as chunk_o  # module global holding the #640 guard flag
    from fla.ops.attn.parallel import parallel_attn_fwd
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    from fla.ops.gated_delta_rule.chunk import ChunkGatedDeltaRuleFunction
    from fla.ops.gla import chunk_gla, fused_recurrent_gla
    from fla.ops.linear_attn import chunk_linear_attn, fused_recurrent_linear_attn

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
        chunk_linear_attn=opaque(chunk_linear_attn), fused_recurrent_linear_attn=opaque(fused_recurrent_linear_attn))


# ----------------------------------------------------------------------------------------------- GLA
def _same_dtype(*xs):
    """FLA's kernels need one dtype for q/k/v (mixed fp32/bf16 appears under autocast): use v's (the last);
    contiguous, as the layer hands over strided views (q and k are slices of one RoPE'd tensor)."""
    dt = xs[-1].dtype
    return tuple(x.to(dt).contiguous() for x in xs)


def _state_in(initial_state):
    return None if initial_state is None else initial_state.float().contiguous()


def gla_chunk(q, k, v, log_a, scale, initial_state=None, output_final_state=False, chunk_size=64):
    reference._check_qkv(q, k, v)
    if q.shape[1] == 0:
        return reference.gla_chunk(q, k, v, log_a, scale, initial_state, output_final_state, chunk_size)
    out_dtype = q.dtype
    q, k, v = _same_dtype(q, k, v)
    o, state = kernels.chunk_gla(q=q, k=k, v=v, g=log_a.float(), scale=scale,
                                 initial_state=_state_in(initial_state), output_final_state=output_final_state)
    return o.to(out_dtype), state


def gla_recurrent(q, k, v, log_a, scale, initial_state=None, output_final_state=False):
    reference._check_qkv(q, k, v)
    if q.shape[1] == 0:
        return reference.gla_recurrent(q, k, v, log_a, scale, initial_state, output_final_state)
    out_dtype = q.dtype
    q, k, v = _same_dtype(q, k, v)
    o, state = kernels.fused_recurrent_gla(q=q, k=k, v=v, gk=log_a.float(), scale=scale,
                                           initial_state=_state_in(initial_state),
                                           output_final_state=output_final_state)
    return o.to(out_dtype), state


# ----------------------------------------------------------------------------------------------- GDN
@contextlib.contextmanager
def hopper_guard_bypassed():
    """Let FLA run its gated chunk backward on Hopper with triton < 3.7.1 (FLA #640) for this scope only."""
    chunk_o = kernels.chunk_o
    old = chunk_o.TRITON_ABOVE_3_4_0
    chunk_o.TRITON_ABOVE_3_4_0 = False
    try:
        yield
    finally:
        chunk_o.TRITON_ABOVE_3_4_0 = old


def gdn_chunk(q, k, v, log_a, beta, scale, initial_state=None, output_final_state=False, chunk_size=64):
    reference._check_qkv(q, k, v)
    reference._check_gates("log_a", log_a, q)
    reference._check_gates("beta", beta, q)
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
    reference._check_qkv(q, k, v)
    reference._check_gates("log_a", log_a, q)
    reference._check_gates("beta", beta, q)
    if q.shape[1] == 0:
        return reference.gdn_recurrent(q, k, v, log_a, beta, scale, initial_state, output_final_state)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, log_a, beta, initial_state))
    if needs_grad:  # FLA's fused recurrent GDN has no backward: same recurrence through the chunk kernel
        return gdn_chunk(q, k, v, log_a, beta, scale, initial_state, output_final_state)
    out_dtype = q.dtype
    q, k, v = _same_dtype(q, k, v)
    # keywords only: the 5th positional argument of this op is gk, not beta (fla.md footgun)
    o, state = kernels.fused_recurrent_gated_delta_rule(q=q, k=k, v=v, g=log_a.float(), beta=beta.to(q.dtype),
                                                        scale=scale, initial_state=_state_in(initial_state),
                                                        output_final_state=output_final_state)
    return o.to(out_dtype), state


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
    reference._check_qkv(phi_q, phi_k, v, "phi_q", "phi_k")
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


# ----------------------------------------------------------------------------------------------- short conv
def short_conv(x, weight, state=None, output_final_state=False):
    """Without autograd: W shifted multiply-adds in x's dtype on the [B, T, D] layout (no fp32 copies,
    transposes or padded copy of x); with autograd: one depthwise conv1d (cuDNN), in fp32 like the
    reference, or in the autocast dtype under autocast (where conv1d would be cast down anyway)."""
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[-1] or weight.shape[1] < 1:
        return reference.short_conv(x, weight, state, output_final_state)  # raises the reference's error
    if state is not None:
        reference._check_state(state, (x.shape[0], x.shape[-1], weight.shape[1] - 1), "state")
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                    (state is not None and state.requires_grad)):
        return _short_conv_autograd(x, weight, state, output_final_state)
    B, T, D = x.shape
    W = weight.shape[1]
    w = weight.to(x.dtype)
    if compile_enabled():  # one fused kernel (GOLINEAR_COMPILE=1)
        return _short_conv_fused(x, w, state), (_last_inputs(x, state, W) if output_final_state else None)
    y = x * w[:, W - 1]
    for i in range(W - 1):
        shift = W - 1 - i  # tap i reads input t - shift
        if shift < T:
            y[:, shift:].addcmul_(x[:, :T - shift], w[:, i])
        if state is not None:  # rows t < shift read the previous inputs state[..., t + i]
            r = min(shift, T)
            y[:, :r].addcmul_(state[:, :, i:i + r].transpose(1, 2).to(x.dtype), w[:, i])
    return y, (_last_inputs(x, state, W) if output_final_state else None)


@compiled
def _short_conv_fused(x, w, state):
    """The same multiply-adds written functionally, for torch.compile to fuse into one kernel."""
    W = w.shape[1]
    prev = x.new_zeros(x.shape[0], W - 1, x.shape[2]) if state is None else state.transpose(1, 2).to(x.dtype)
    ext = torch.cat([prev, x], 1)
    T = x.shape[1]
    y = ext[:, W - 1:] * w[:, W - 1]
    for i in range(W - 1):
        y = y + ext[:, i:i + T] * w[:, i]
    return y


def _last_inputs(x, state, W):
    """The last W-1 inputs [B, D, W-1] (the conv state after x), in x's dtype."""
    B, T, D = x.shape
    if T >= W - 1:
        return x[:, T - (W - 1):].transpose(1, 2).contiguous()
    prev = x.new_zeros(B, D, W - 1) if state is None else state.to(x.dtype)
    return torch.cat([prev, x.transpose(1, 2)], -1)[..., T:].contiguous()


def _short_conv_autograd(x, weight, state, output_final_state):
    B, T, D = x.shape
    W = weight.shape[1]
    autocast = torch.is_autocast_enabled(x.device.type)
    dt = x.dtype if autocast else reference._compute_dtype(x)
    xt = x.to(dt).transpose(1, 2)  # [B, D, T]
    if state is None:  # zero left padding inside the conv; it also pads W-1 columns on the right: drop them
        y = F.conv1d(xt, weight.to(dt).unsqueeze(1), padding=W - 1, groups=D)[..., :T]
    else:
        y = F.conv1d(torch.cat([state.to(dt), xt], -1), weight.to(dt).unsqueeze(1), groups=D)
    new_state = _last_inputs(x, state, W) if output_final_state else None
    return y.transpose(1, 2).to(x.dtype), new_state


# ----------------------------------------------------------------------------------------------- window + sinks
def merge_attention(o_a, lse_a, o_b, lse_b):
    """Softmax over the union of two disjoint key sets from the two partial results (lse may be -inf)."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    wa = torch.where(torch.isfinite(lse_a), torch.exp(lse_a - safe), torch.zeros_like(lse_a))
    wb = torch.where(torch.isfinite(lse_b), torch.exp(lse_b - safe), torch.zeros_like(lse_b))
    return o_a.float() * wa.unsqueeze(-1) + o_b.float() * wb.unsqueeze(-1), lse


def sink_part(q, sink_k, sink_v, window, scale, q_pos):
    """Softmax over the sink keys j (positions 0..s-1) that are outside the window: j <= t - window.

    q [B,T,Hq,D], sink_k/v [B,s,Hkv,D], q_pos [T] absolute positions. -> (out fp32, lse fp32)."""
    B, T, Hq, D = q.shape
    s, Hkv = sink_k.shape[1], sink_k.shape[2]
    G = Hq // Hkv
    scores = torch.einsum("bthgd,bshd->bthgs", q.float().reshape(B, T, Hkv, G, D), sink_k.float()) * scale
    j = torch.arange(s, device=q.device)
    allowed = j.unsqueeze(0) <= (q_pos.unsqueeze(1) - window)  # [T, s]
    scores = scores.masked_fill(~allowed[None, :, None, None, :], -math.inf)
    lse = torch.logsumexp(scores, -1)
    p = torch.exp(scores - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)).unsqueeze(-1))
    out = torch.einsum("bthgs,bshd->bthgd", p, sink_v.float())
    return out.reshape(B, T, Hq, -1), lse.reshape(B, T, Hq)


def add_sinks(q, o_w, lse_w, sink_k, sink_v, window, scale, q_pos):
    """Merge the sink keys outside the window (j < s, j <= t - window) into a window result, no autograd.

    Memory-light form of sink_part + merge_attention for the prefill: the only full-size tensors it
    writes are one [B,T,Hq,V] output in the input dtype (fp32 is used only for the [.., s] scores).
    q [B,T,Hq,D], o_w [B,T,Hq,V], lse_w [B,T,Hq] (finite: window >= 1), sink_k/v [B,s,Hkv,D].
    -> (out [B,T,Hq,V] in v's dtype, lse [B,T,Hq] fp32)."""
    B, T, Hq, D = q.shape
    s, Hkv, V = sink_k.shape[1], sink_k.shape[2], sink_v.shape[-1]
    G = Hq // Hkv
    scores = torch.einsum("bthgd,bshd->bthgs", q.reshape(B, T, Hkv, G, D), sink_k.to(q.dtype)).float() * scale
    allowed = torch.arange(s, device=q.device).unsqueeze(0) <= (q_pos.unsqueeze(1) - window)  # [T, s]
    scores = scores.masked_fill(~allowed[None, :, None, None, :], -math.inf)
    lse_w = lse_w.reshape(B, T, Hkv, G).float()
    lse = torch.logaddexp(lse_w, torch.logsumexp(scores, -1))  # finite because lse_w is
    p = torch.exp(scores - lse.unsqueeze(-1))  # sink weights, already normalised over the union
    out = torch.einsum("bthgs,bshd->bthgd", p.to(sink_v.dtype), sink_v)
    out.addcmul_(o_w.reshape(B, T, Hkv, G, V).to(out.dtype), torch.exp(lse_w - lse).unsqueeze(-1).to(out.dtype))
    return out.reshape(B, T, Hq, V), lse.reshape(B, T, Hq)


def window_part_blocked(q, k, v, window, scale, block=WINDOW_BLOCK):
    """Sliding-window softmax (keys t-window < j <= t), GQA aware, with autograd; q/k/v share positions.

    Queries go in blocks of `block`; each block sees the window-1 keys before it plus its own block
    (an unfold view), so memory is O(T x (window + block)). -> (out fp32 [B,T,Hq,V], lse fp32 [B,T,Hq])."""
    B, T, Hq, D = q.shape
    Hkv, V = k.shape[2], v.shape[-1]
    G = Hq // Hkv
    L = window - 1
    n = -(-T // block)
    Tp = n * block
    qb = F.pad(q, (0, 0, 0, 0, 0, Tp - T)).reshape(B, n, block, Hkv, G, D)
    kp = F.pad(k, (0, 0, 0, 0, L, Tp - T)).unfold(1, L + block, block)  # [B, n, Hkv, D, L+block]
    vp = F.pad(v, (0, 0, 0, 0, L, Tp - T)).unfold(1, L + block, block)  # [B, n, Hkv, V, L+block]
    scores = torch.einsum("bnqhgd,bnhdc->bnhgqc", qb, kp).float() * scale
    r = torch.arange(block, device=q.device).unsqueeze(1)
    c = torch.arange(L + block, device=q.device).unsqueeze(0)
    start = torch.arange(n, device=q.device).view(n, 1, 1) * block - L  # absolute position of column 0
    delta = r + L - c  # t - j
    allowed = (delta >= 0) & (delta <= L) & (start + c >= 0)  # [n, block, L+block]
    scores = scores.masked_fill(~allowed[None, :, None, None], -math.inf)
    lse = torch.logsumexp(scores, -1)  # every real query sees itself: finite
    p = torch.exp(scores - lse.unsqueeze(-1))
    out = torch.einsum("bnhgqc,bnhvc->bnqhgv", p.to(v.dtype), vp).float()
    out = out.reshape(B, Tp, Hq, V)[:, :T]
    lse = lse.permute(0, 1, 4, 2, 3).reshape(B, Tp, Hq)[:, :T]
    return out, lse


def _round_up(x, m):
    return -(-x // m) * m


@functools.lru_cache(maxsize=8)
def _blocked_layout(n, block, G, Tq, L, base, lo, q_pos0, window, s, Lw, dtype, device):
    """Cached (additive mask [1, n, block*G, s+Lw], key index [n*(s+Lw)], query index [n*block]) of
    window_attention_blocked. Row r*G + g of block b is query i = b*block + r (absolute position q_pos0 + i);
    column j < s is sink key j; column s + c is key idx = base + b*block - (Lw - block) + c (absolute
    position q_pos0 + idx - base), a window key when lo <= idx < L."""
    dev = torch.device(device)
    i = torch.arange(n * block, device=dev).view(n, block, 1)
    t = q_pos0 + i
    idx = (torch.arange(n, device=dev).view(n, 1, 1) * block + base - (Lw - block) + torch.arange(Lw, device=dev))
    real = (idx >= lo) & (idx < L)
    pos = q_pos0 + idx - base
    allowed = real & (pos <= t) & (pos > t - window)
    pad_row = i >= Tq  # padding queries (dropped): any real key, so that no row is empty
    allowed = allowed | (pad_row & real)
    kidx = idx.clamp(lo, L - 1).view(n, Lw)  # masked columns read some real key (finite values)
    if s:
        sink = torch.arange(s, device=dev).view(1, 1, s) <= t - window
        allowed = torch.cat([sink & ~pad_row, allowed], -1)
        kidx = torch.cat([torch.arange(s, device=dev).expand(n, s), kidx], -1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(~allowed, -math.inf)
    mask = mask.repeat_interleave(G, dim=1).unsqueeze(0)  # rows (r, g)
    return mask, kidx.reshape(-1), torch.arange(n * block, device=dev).clamp_(max=Tq - 1)


def window_attention_blocked(q, k, v, window, scale, sinks=0, base=0, lo=0, q_pos0=0, block=WINDOW_BLOCK):
    """Sliding-window softmax plus sink keys in ONE fused attention call (SDPA), GQA aware, autograd or not.

    q [B,Tq,Hq,D] at absolute positions q_pos0 + i; k/v [B,L,Hkv,D]: entries 0..sinks-1 are the sink keys
    (positions 0..sinks-1), entries lo..L-1 keys at consecutive positions with k[:, base + i] query i's own
    key. Query t sees the keys t - window < j <= t and the sinks j <= t - window (the others are inside the
    window already). Queries go in blocks of `block`; each block attends to the sinks plus the run of Lw
    keys its window can reach, under a cached additive mask; the G query heads of a KV head are G rows of
    its block, so keys are never expanded. Without autograd the runs are gathered by one index_select per
    tensor; with autograd by pad + unfold (deterministic backward: no atomic adds). -> out [B,Tq,Hq,V]."""
    B, Tq, Hq, D = q.shape
    L, Hkv, V = k.shape[1], k.shape[2], v.shape[-1]
    G = Hq // Hkv
    n = -(-Tq // block)
    Lw = _round_up(window - 1 + block + sinks, 16) - sinks  # s + Lw a multiple of 16 (kernel alignment)
    # positions enter only relative to each other, and through the sink rule j <= t - window, which admits
    # every sink from q_pos0 = s - 1 + window on: later chunks of a prefill share one cached layout
    pos_key = min(q_pos0, max(sinks - 1 + window, 0))
    mask, kidx, qidx = _blocked_layout(n, block, G, Tq, L, base, lo, pos_key, window, sinks, Lw, v.dtype,
                                       str(q.device))
    q, k = q.to(v.dtype), k.to(v.dtype)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if grad:
        qb = F.pad(q, (0, 0, 0, 0, 0, n * block - Tq)) if n * block != Tq else q
        qb = qb.reshape(B, n, block, Hkv, G, D).permute(0, 3, 1, 2, 4, 5).reshape(B * Hkv, n, block * G, D)
        kb, vb = (_runs_unfold(x, sinks, base - lo, lo, n, block, Lw) for x in (k, v))
    else:
        qb = q.reshape(B, Tq, Hkv, G, D).transpose(1, 2).index_select(2, qidx).view(B * Hkv, n, block * G, D)
        kb, vb = (x.transpose(1, 2).index_select(2, kidx).view(B * Hkv, n, sinks + Lw, x.shape[-1]) for x in (k, v))
    o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)
    # SDPA's CUDA kernels may return a transposed layout: unflatten (always a view), then one copy
    o = o.unflatten(0, (B, Hkv)).unflatten(3, (block, G)).permute(0, 2, 3, 1, 4, 5)  # [B, n, block, Hkv, G, V]
    o = o.reshape(B, n * block, Hq, V)
    return o if n * block == Tq else o[:, :Tq]  # (a full-range slice still costs a zero-fill + copy in backward)


def _runs_unfold(x, s, base, lo, n, block, Lw):
    """[B*Hkv, n, s+Lw, D]: per block the sinks x[:, :s] and the run of Lw keys of x[:, lo:] starting at
    base + b*block - (Lw - block) (zero padding outside), by pad + unfold + one cat."""
    B, _, Hkv, D = x.shape
    y = x[:, lo:] if lo else x  # (full-range slices are avoided: each costs a zero-fill + copy in backward)
    P = max(0, Lw - block - base)  # left padding so that block 0's run starts at `off`
    off = base + P - (Lw - block)
    R = max(0, (n - 1) * block + off + Lw - (y.shape[1] + P))
    y = F.pad(y, (0, 0, 0, 0, P, R)) if P or R else y
    runs = (y[:, off:] if off else y).unfold(1, Lw, block)  # [B, >= n, Hkv, D, Lw]
    runs = runs[:, :n] if runs.shape[1] > n else runs
    runs = runs.permute(0, 2, 1, 4, 3)  # [B, Hkv, n, Lw, D]
    if s:
        sink = x[:, :s].permute(0, 2, 1, 3).unsqueeze(2).expand(B, Hkv, n, s, D)
        runs = torch.cat([sink, runs], 3)
    return runs.reshape(B * Hkv, n, s + Lw, D)


def window_sink_softmax(q, k, v, sinks, window, scale):
    """window_sink_attention's output alone (no lse), q/k/v at the same positions: one fused attention
    call for window + sinks, forward and backward (the layer's parallel pass). -> out in q's dtype."""
    reference._grouped(q, k)
    T = q.shape[1]
    if window < 1 or window >= T or q.dtype == torch.float64 or k.shape[1] != T:
        return window_sink_attention(q, k, v, sinks, window, scale)[0]
    return window_attention_blocked(q, k, v, window, scale, sinks=min(sinks, T)).to(q.dtype)


def window_part_fla(q, k, v, window, scale):
    """The same on FLA's parallel_attn forward kernel (no autograd; out in v's dtype); window >= T: causal."""
    T = q.shape[1]
    w = None if window >= T else window
    o, lse2 = kernels.parallel_attn_fwd(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g_cumsum=None,
                                        sink_bias=None, scale=scale, window_size=w)
    return o, lse2 * LN2  # FLA keeps the log-sum-exp in base 2


def window_sink_attention(q, k, v, sinks, window, scale, q_offset=0):
    reference._grouped(q, k)
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
