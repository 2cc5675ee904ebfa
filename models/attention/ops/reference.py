"""Pure-PyTorch reference ops for the linearized attention mechanisms.

Layout follows FLA: q/k/v are ``[B, T, H, D]``, recurrent states ``[B, H, K, V]``. Math runs in fp32
(fp64 inputs stay fp64, which the tests use for gradient checks); outputs come back in the input dtype,
states in the compute dtype. Every mechanism has a recurrent form (decoding, and the ground truth in
tests) and a chunked form (the parallel pass: a python loop over chunks only, matrix ops inside a chunk).
All ops are differentiable with plain autograd.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

GLA_SUBCHUNK = 16  # secondary chunk for GLA's per-key decay (see gla_chunk)
GLA_MAX_EXP = 40.0  # largest exponent used in GLA's factorized scores (e^40 ~ 2e17, far from fp32 overflow)

from golinear.models.attention.ops.ref_common import (causal_mask, check_chunk_size, check_qkv, check_state,  # noqa: F401
                                   compute_dtype, from_chunks, to_chunks)
# the softmax side of the reference backend lives beside it; this module is the backend's one namespace
from golinear.models.attention.ops.reference_window import (grouped, masked_softmax, window_sink_attention,  # noqa: F401
                                         window_sink_decode, window_sink_softmax)


# ----------------------------------------------------------------------------------------------- GLA
def gla_recurrent(q, k, v, log_a, scale, initial_state=None, output_final_state=False):
    """Step-by-step GLA: S_t = diag(exp(log_a_t)) S_{t-1} + k_t v_t^T, o_t = scale * q_t^T S_t."""
    check_qkv(q, k, v)
    if log_a.shape != q.shape:
        raise ValueError(f"log_a must be [B, T, H, K] like q {tuple(q.shape)}, got {tuple(log_a.shape)}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_state(initial_state, (B, H, K, V))
    dt = compute_dtype(q)
    out_dtype = q.dtype
    q, k, v, log_a = (x.to(dt) for x in (q, k, v, log_a))
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(dt)
    outs = []
    for t in range(T):
        S = torch.exp(log_a[:, t]).unsqueeze(-1) * S + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    o = torch.stack(outs, 1) * scale if T else q.new_zeros(B, 0, H, V)
    return o.to(out_dtype), (S if output_final_state else None)


def exclusive_suffix_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """sum_{m > s} x_m along dim, summing only same-sign terms (no cancellation, -inf safe)."""
    x = x.transpose(dim, -1)
    rev = torch.cat([x[..., 1:], torch.zeros_like(x[..., :1])], dim=-1).flip(-1).cumsum(-1).flip(-1)
    return rev.transpose(dim, -1)


def pairwise_segment_sum(x: torch.Tensor) -> torch.Tensor:
    """x [..., L, K] -> D [..., L(t), L(s), K] with D[t, s] = sum_{s < m <= t} x_m (0 for s >= t):
    exact relative decays from same-sign sums, -inf safe."""
    L = x.shape[-2]
    later = torch.ones(L, L, dtype=torch.bool, device=x.device).tril(-1)  # [m, s]: m > s
    seg = torch.where(later[:, :, None], x.unsqueeze(-2), torch.zeros((), dtype=x.dtype, device=x.device))
    return seg.cumsum(-3)


def gla_chunk(q, k, v, log_a, scale, initial_state=None, output_final_state=False, chunk_size=64):
    """Chunked GLA with per-key decay, exact in fp32 (log_a may be -inf: a state reset).

    The intra-chunk scores need exp(b_t - b_s) per key (b = cumulative log decay), which cannot be
    factorized as exp(b_t) * exp(-b_s) over a whole chunk without overflow. The chunk is split into
    sub-chunks of 16: query rows of sub-chunk i use the reference r_i = b at the start of sub-chunk i,
    so the query factor exp(b_t - r_i) <= 1 and key factors of earlier sub-chunks exp(r_i - b_s) <= 1;
    keys of sub-chunk i itself get exp(r_i - b_s) >= 1, exact while the sub-chunk's decay stays above
    -GLA_MAX_EXP per key. Sub-chunks decaying faster than that are recomputed elementwise. Every
    exponent is built from sums of same-sign terms (no cancellation of large cumulative sums).
    """
    check_qkv(q, k, v)
    check_chunk_size(chunk_size)
    if log_a.shape != q.shape:
        raise ValueError(f"log_a must be [B, T, H, K] like q {tuple(q.shape)}, got {tuple(log_a.shape)}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_state(initial_state, (B, H, K, V))
    dt = compute_dtype(q)
    out_dtype = q.dtype
    S0 = q.new_zeros(B, H, K, V, dtype=dt) if initial_state is None else initial_state.to(dt)
    if T == 0:
        return q.new_zeros(B, 0, H, V), (S0 if output_final_state else None)
    C = chunk_size
    c = math.gcd(C, GLA_SUBCHUNK)
    n = C // c
    dev = q.device
    qc, kc, vc, gc = (to_chunks(x.to(dt), C) for x in (q, k, v, log_a))  # [B,H,N,C,*]
    N = qc.shape[2]
    qs, ks, gs = (x.view(B, H, N, n, c, K) for x in (qc, kc, gc))
    zero = torch.zeros((), dtype=dt, device=dev)

    bl = gs.cumsum(-2)  # decay from sub-chunk start to t (inclusive)  [B,H,N,n,c,K]
    tot = bl[..., -1, :]  # whole sub-chunk  [B,H,N,n,K]
    sfx = exclusive_suffix_sum(gs, -2)  # decay after s to sub-chunk end  [B,H,N,n,c,K]
    # Scores of query sub-chunk i against keys s of sub-chunk j <= i, relative to r_i = b at the start
    # of sub-chunk i: exp(r_i - b_s) = exp(sfx_s) * F[i, j] with F[i, j] = exp(sum of the sub-chunks
    # strictly between j and i) for j < i, F[i, i] = exp(-tot_i) (clamped; see `bad`), F = 0 for j > i.
    ar = torch.arange(n, device=dev)
    between_mask = (ar[None, None, :] > ar[None, :, None]) & (ar[None, None, :] < ar[:, None, None])
    between = torch.where(between_mask[..., None], tot[..., None, None, :, :], zero).sum(-2)  # [..,n,n,K]
    own = torch.eye(n, dtype=torch.bool, device=dev)
    F_exp = torch.where(own[..., None], (-tot).clamp_max(GLA_MAX_EXP).unsqueeze(-3), between)
    F_exp = F_exp.masked_fill((ar[None, :] > ar[:, None])[..., None], -math.inf)
    k_sfx = ks * torch.exp(sfx)  # [B,H,N,n,c,K]
    k_f = k_sfx.unsqueeze(3) * torch.exp(F_exp).unsqueeze(-2)  # [B,H,N,n(i),n(j),c,K]
    q_f = qs * torch.exp(bl)  # [B,H,N,n,c,K]
    A = q_f @ k_f.view(B, H, N, n, C, K).transpose(-1, -2)  # [B,H,N,n,c,C]
    bad = (-tot > GLA_MAX_EXP).any(-1)  # [B,H,N,n]
    if bool(bad.any()):
        idx = bad.nonzero(as_tuple=True)
        D = pairwise_segment_sum(gs[idx])  # [M, c(t), c(s), K]
        blocks = (qs[idx].unsqueeze(-2) * ks[idx].unsqueeze(-3) * torch.exp(D)).sum(-1)  # [M, c, c]
        blocks = torch.zeros(B, H, N, n, c, c, dtype=dt, device=dev).index_put(idx, blocks)
        use = bad[..., None, None, None] & own[:, None, :, None]  # [B,H,N,n,1,n,1]
        A = torch.where(use, blocks.unsqueeze(-2), A.view(B, H, N, n, c, n, c))
    A = A.reshape(B, H, N, C, C) * causal_mask(C, dev).to(dt)
    o = A @ vc

    # inter-chunk: states entering each chunk
    before = ar[None, :] < ar[:, None]  # [i, j]: j < i
    tot_before = torch.where(before[..., None], tot[..., None, :, :], zero).sum(-2)  # [B,H,N,n,K]
    tot_after = torch.where(before.T[..., None], tot[..., None, :, :], zero).sum(-2)
    b_in = (bl + tot_before.unsqueeze(-2)).reshape(B, H, N, C, K)  # decay from chunk start to t
    to_end = (sfx + tot_after.unsqueeze(-2)).reshape(B, H, N, C, K)  # decay after s to chunk end
    U = (kc * torch.exp(to_end)).transpose(-1, -2) @ vc  # [B,H,N,K,V]
    decay = torch.exp(tot.sum(3)).unsqueeze(-1)  # [B,H,N,K,1]
    S, states_in = S0, []
    for i in range(N):
        states_in.append(S)
        S = decay[:, :, i] * S + U[:, :, i]
    o = o + (qc * torch.exp(b_in)) @ torch.stack(states_in, 2)
    o = from_chunks(o * scale, T)
    return o.to(out_dtype), (S if output_final_state else None)


# ----------------------------------------------------------------------------------------------- GDN
def check_gates(name, x, q):
    if tuple(x.shape) != tuple(q.shape[:3]):
        raise ValueError(f"{name} must be [B, T, H] = {tuple(q.shape[:3])}, got {tuple(x.shape)}")


def gdn_recurrent(q, k, v, log_a, beta, scale, initial_state=None, output_final_state=False):
    """Step-by-step gated delta rule (FLA convention):
    S <- S * exp(g_t); u = beta_t (v_t - S^T k_t); S <- S + k_t u^T; o_t = scale * q_t^T S."""
    check_qkv(q, k, v)
    check_gates("log_a", log_a, q)
    check_gates("beta", beta, q)
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_state(initial_state, (B, H, K, V))
    dt = compute_dtype(q)
    out_dtype = q.dtype
    q, k, v, log_a, beta = (x.to(dt) for x in (q, k, v, log_a, beta))
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(dt)
    outs = []
    for t in range(T):
        S = S * torch.exp(log_a[:, t])[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t].unsqueeze(-1) * u.unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    o = torch.stack(outs, 1) * scale if T else q.new_zeros(B, 0, H, V)
    return o.to(out_dtype), (S if output_final_state else None)


def _unit_lower_inverse(A: torch.Tensor) -> torch.Tensor:
    """(I + A)^-1 for strictly lower-triangular A [..., C, C] from batched matmuls only (on par with a
    batched triangular solve on CPU): blocks of <= 16 by the product (I-A)(I+A^2)(I+A^4)..., larger
    ones by halving, [[X, 0], [Y, Z]]^-1 = [[X^-1, 0], [-Z^-1 Y X^-1, Z^-1]]."""
    C = A.shape[-1]
    if C <= 16:
        N = -A
        X = torch.eye(C, dtype=A.dtype, device=A.device) + N
        P, reach = N, 2
        while reach < C:
            P = P @ P
            X = X + X @ P
            reach *= 2
        return X
    h = C // 2
    if C % 2 == 0:
        inv = _unit_lower_inverse(torch.stack([A[..., :h, :h], A[..., h:, h:]], dim=-3))
        X, Z = inv[..., 0, :, :], inv[..., 1, :, :]
    else:
        X, Z = _unit_lower_inverse(A[..., :h, :h]), _unit_lower_inverse(A[..., h:, h:])
    Y = -(Z @ A[..., h:, :h]) @ X
    top = torch.cat([X, torch.zeros_like(A[..., :h, h:])], dim=-1)
    return torch.cat([top, torch.cat([Y, Z], dim=-1)], dim=-2)


def gdn_chunk(q, k, v, log_a, beta, scale, initial_state=None, output_final_state=False, chunk_size=64):
    """Chunked gated delta rule via the WY/UT transform.

    With b = cumsum(g) in the chunk and S0 the entering state, the per-step corrections u_t satisfy
    (I + A) u = beta*v - (beta*exp(b)*k) S0 with A[t, j] = beta_t exp(b_t - b_j) k_t.k_j (j < t), so
    u = U0 - W S0 with [U0, W] = (I + A)^-1 [beta*v, beta*exp(b)*k]. Then S_end = exp(b_C) S0 + K_dec^T u
    (K_dec = k * exp(b_C - b)) and o = scale * (exp(b) q S0 + (q k^T * decay) u). Only the S0 -> u ->
    S_end step loops over chunks (two small matmuls each).
    Relative decays are sums of same-sign terms (no cancellation of large cumulative sums).
    """
    check_qkv(q, k, v)
    check_chunk_size(chunk_size)
    check_gates("log_a", log_a, q)
    check_gates("beta", beta, q)
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_state(initial_state, (B, H, K, V))
    dt = compute_dtype(q)
    out_dtype = q.dtype
    S0 = q.new_zeros(B, H, K, V, dtype=dt) if initial_state is None else initial_state.to(dt)
    if T == 0:
        return q.new_zeros(B, 0, H, V), (S0 if output_final_state else None)
    C = chunk_size
    dev = q.device
    qc, kc, vc = (to_chunks(x.to(dt), C) for x in (q, k, v))  # [B,H,N,C,*]
    gc, bc = (to_chunks(x.to(dt).unsqueeze(-1), C).squeeze(-1) for x in (log_a, beta))  # [B,H,N,C]
    N = qc.shape[2]
    b = gc.cumsum(-1)  # decay from chunk start to t
    to_end = exclusive_suffix_sum(gc, -1)  # decay after t to chunk end
    later = causal_mask(C, dev, strict=True)  # [t, j]: t > j
    seg = torch.where(later, gc.unsqueeze(-1), torch.zeros((), dtype=dt, device=dev)).cumsum(-2)
    decay = torch.exp(seg).masked_fill(~causal_mask(C, dev), 0)  # [..,C,C]: exp(b_t - b_j), j <= t

    A = (bc.unsqueeze(-1) * (kc @ kc.transpose(-1, -2)) * decay).masked_fill(~later, 0)
    rhs = torch.cat([bc.unsqueeze(-1) * vc, (bc * torch.exp(b)).unsqueeze(-1) * kc], dim=-1)
    U0, W = (_unit_lower_inverse(A) @ rhs).split([V, K], dim=-1)

    k_dec_t = (kc * torch.exp(to_end).unsqueeze(-1)).transpose(-1, -2)  # [B,H,N,K,C]
    chunk_decay = torch.exp(b[..., -1]).unsqueeze(-1).unsqueeze(-1)  # [B,H,N,1,1]
    S, states_in, us = S0, [], []
    for i in range(N):
        states_in.append(S)
        u_i = U0[:, :, i] - W[:, :, i] @ S
        us.append(u_i)
        S = chunk_decay[:, :, i] * S + k_dec_t[:, :, i] @ u_i
    S_in, u = torch.stack(states_in, 2), torch.stack(us, 2)  # [B,H,N,K,V], [B,H,N,C,V]
    o = (qc * torch.exp(b).unsqueeze(-1)) @ S_in + ((qc @ kc.transpose(-1, -2)) * decay) @ u
    o = from_chunks(o * scale, T)
    return o.to(out_dtype), (S if output_final_state else None)


# ----------------------------------------------------------------------------------------------- linear attention
def _linear_attn_state(phi_q, phi_k, v, initial_state):
    check_qkv(phi_q, phi_k, v, "phi_q", "phi_k")
    B, T, H, K = phi_q.shape
    V = v.shape[-1]
    dt = compute_dtype(phi_q)
    if initial_state is None:
        return phi_q.new_zeros(B, H, K, V, dtype=dt), phi_q.new_zeros(B, H, K, dtype=dt)
    if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
        raise ValueError("initial_state for linear attention must be a pair (S [B,H,K,V], Z [B,H,K])")
    S, Z = initial_state
    check_state(S, (B, H, K, V), "initial_state S")
    check_state(Z, (B, H, K), "initial_state Z")
    return S.to(dt), Z.to(dt)


def linear_attn_recurrent(phi_q, phi_k, v, initial_state=None, output_final_state=False):
    """Step-by-step unnormalized linear attention: num_t = phi_q_t^T S_t, den_t = phi_q_t^T Z_t with
    S_t = S_{t-1} + phi_k_t v_t^T, Z_t = Z_{t-1} + phi_k_t. Returns (num, den, (S, Z) or None)."""
    S, Z = _linear_attn_state(phi_q, phi_k, v, initial_state)
    B, T, H, K = phi_q.shape
    dt = S.dtype
    out_dtype = phi_q.dtype
    pq, pk, v = (x.to(dt) for x in (phi_q, phi_k, v))
    nums, dens = [], []
    for t in range(T):
        S = S + pk[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
        Z = Z + pk[:, t]
        nums.append(torch.einsum("bhk,bhkv->bhv", pq[:, t], S))
        dens.append((pq[:, t] * Z).sum(-1))
    if T:
        num, den = torch.stack(nums, 1), torch.stack(dens, 1)
    else:
        num, den = pq.new_zeros(B, 0, H, v.shape[-1]), pq.new_zeros(B, 0, H)
    return num.to(out_dtype), den.to(out_dtype), ((S, Z) if output_final_state else None)


def linear_attn_chunk(phi_q, phi_k, v, initial_state=None, output_final_state=False, chunk_size=64):
    """Chunked linear attention. The normalizer rides along as an extra all-ones value column, so
    [S | Z] is one state and num/den come out of the same matmuls."""
    check_chunk_size(chunk_size)
    S0, Z0 = _linear_attn_state(phi_q, phi_k, v, initial_state)
    B, T, H, K = phi_q.shape
    V = v.shape[-1]
    dt = S0.dtype
    out_dtype = phi_q.dtype
    if T == 0:
        return (phi_q.new_zeros(B, 0, H, V), phi_q.new_zeros(B, 0, H),
                ((S0, Z0) if output_final_state else None))
    v1 = torch.cat([v.to(dt), v.new_ones(B, T, H, 1, dtype=dt)], dim=-1)
    qc, kc, vc = (to_chunks(x.to(dt), chunk_size) for x in (phi_q, phi_k, v1))
    N = qc.shape[2]
    KV = kc.transpose(-1, -2) @ vc  # [B,H,N,K,V+1]
    S, states_in = torch.cat([S0, Z0.unsqueeze(-1)], dim=-1), []
    for i in range(N):
        states_in.append(S)
        S = S + KV[:, :, i]
    A = (qc @ kc.transpose(-1, -2)) * causal_mask(chunk_size, qc.device).to(dt)
    out = from_chunks(qc @ torch.stack(states_in, 2) + A @ vc, T)
    num, den = out[..., :V], out[..., V]
    state = (S[..., :V], S[..., V]) if output_final_state else None
    return num.to(out_dtype), den.to(out_dtype), state


# ----------------------------------------------------------------------------------------------- short conv
def short_conv(x, weight, state=None, output_final_state=False):
    """Causal depthwise convolution, no bias/activation: y_t = sum_i weight[:, i] * x_{t-(W-1)+i}.

    x [B, T, D], weight [D, W], state = the previous W-1 inputs [B, D, W-1] (zeros when None).
    Returns (y [B, T, D], new_state [B, D, W-1] or None); new_state is the last W-1 inputs seen."""
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"short_conv needs x [B, T, D] and weight [D, W]; got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}")
    B, T, D = x.shape
    W = weight.shape[1]
    if W < 1:
        raise ValueError(f"short_conv kernel width must be >= 1, got weight {tuple(weight.shape)}")
    dt = compute_dtype(x)
    xt = x.to(dt).transpose(1, 2)  # [B, D, T]
    if state is None:
        state = xt.new_zeros(B, D, W - 1)
    else:
        check_state(state, (B, D, W - 1), "state")
        state = state.to(dt)
    full = torch.cat([state, xt], dim=-1)  # [B, D, W-1+T]
    y = F.conv1d(full, weight.to(dt).unsqueeze(1), groups=D).transpose(1, 2)
    new_state = full[..., full.shape[-1] - (W - 1):].to(x.dtype) if output_final_state else None
    return y.to(x.dtype), new_state


# the underscore names this namespace has exported (tests and scripts use them)
_compute_dtype = compute_dtype
_check_qkv = check_qkv
_check_state = check_state
_check_chunk_size = check_chunk_size
_to_chunks = to_chunks
_from_chunks = from_chunks
_causal_mask = causal_mask
_grouped = grouped
_masked_softmax = masked_softmax
_exclusive_suffix_sum = exclusive_suffix_sum
_pairwise_segment_sum = pairwise_segment_sum
