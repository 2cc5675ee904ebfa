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

GLA_SUBCHUNK = 16  # secondary chunk for GLA's per-key decay (bounds every exponent by 0, see gla_chunk)
ATTN_QUERY_BLOCK = 256  # queries per block in window_sink_attention (bounds memory to ~block x keys)


# ----------------------------------------------------------------------------------------------- helpers
def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_qkv(q, k, v, name_q="q", name_k="k"):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{name_q}/{name_k}/v must be [B, T, H, D]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape != k.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"shape mismatch: {name_q} {tuple(q.shape)}, {name_k} {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} (need {name_q} == {name_k} and equal [B, T, H])")


def _check_state(state, shape, name="initial_state"):
    if state is not None and tuple(state.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(state.shape)}, expected {tuple(shape)}")


def _check_chunk_size(chunk_size):
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def _to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[B, T, H, ...] -> [B, H, N, C, ...], zero-padding T up to a multiple of C."""
    B, T, H = x.shape[:3]
    n = -(-T // chunk_size)
    pad = n * chunk_size - T
    if pad:
        x = torch.cat([x, x.new_zeros((B, pad) + tuple(x.shape[2:]))], dim=1)
    x = x.reshape((B, n, chunk_size, H) + tuple(x.shape[3:]))
    return x.transpose(2, 3).transpose(1, 2)


def _from_chunks(x: torch.Tensor, T: int) -> torch.Tensor:
    """[B, H, N, C, ...] -> [B, T, H, ...] (drops the padding)."""
    B, H, N, C = x.shape[:4]
    x = x.transpose(1, 2).transpose(2, 3).reshape((B, N * C, H) + tuple(x.shape[4:]))
    return x[:, :T]


def _causal_mask(C: int, device, strict: bool = False) -> torch.Tensor:
    return torch.ones(C, C, dtype=torch.bool, device=device).tril(-1 if strict else 0)


# ----------------------------------------------------------------------------------------------- GLA
def gla_recurrent(q, k, v, log_a, scale, initial_state=None, output_final_state=False):
    """Step-by-step GLA: S_t = diag(exp(log_a_t)) S_{t-1} + k_t v_t^T, o_t = scale * q_t^T S_t."""
    _check_qkv(q, k, v)
    if log_a.shape != q.shape:
        raise ValueError(f"log_a must be [B, T, H, K] like q {tuple(q.shape)}, got {tuple(log_a.shape)}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    _check_state(initial_state, (B, H, K, V))
    dt = _compute_dtype(q)
    out_dtype = q.dtype
    q, k, v, log_a = (x.to(dt) for x in (q, k, v, log_a))
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(dt)
    outs = []
    for t in range(T):
        S = torch.exp(log_a[:, t]).unsqueeze(-1) * S + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    o = torch.stack(outs, 1) * scale if T else q.new_zeros(B, 0, H, V)
    return o.to(out_dtype), (S if output_final_state else None)


def gla_chunk(q, k, v, log_a, scale, initial_state=None, output_final_state=False, chunk_size=64):
    """Chunked GLA with per-key decay, exact in fp32.

    Within a chunk b = cumsum(log_a). The intra-chunk scores need exp(b_t - b_s) (s <= t) per key, which
    cannot be factorized as exp(b_t) * exp(-b_s) without overflow. We split the chunk into sub-chunks:
    for query sub-chunk i and earlier key sub-chunks, factorize around r_i = b at the end of sub-chunk
    i-1, so both factors exp(b_t - r_i) and exp(r_i - b_s) are <= 1; inside a diagonal sub-chunk the
    decay is formed elementwise ([c, c, K]). No exponent is ever positive, so nothing overflows.
    """
    _check_qkv(q, k, v)
    _check_chunk_size(chunk_size)
    if log_a.shape != q.shape:
        raise ValueError(f"log_a must be [B, T, H, K] like q {tuple(q.shape)}, got {tuple(log_a.shape)}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    _check_state(initial_state, (B, H, K, V))
    dt = _compute_dtype(q)
    out_dtype = q.dtype
    S0 = q.new_zeros(B, H, K, V, dtype=dt) if initial_state is None else initial_state.to(dt)
    if T == 0:
        return q.new_zeros(B, 0, H, V), (S0 if output_final_state else None)
    C = chunk_size
    c = math.gcd(C, GLA_SUBCHUNK)
    n = C // c
    qc, kc, vc, gc = (_to_chunks(x.to(dt), C) for x in (q, k, v, log_a))  # [B,H,N,C,*]
    N = qc.shape[2]
    b = gc.cumsum(-2)  # [B,H,N,C,K], decreasing along C
    b_last = b[..., -1:, :]  # [B,H,N,1,K]

    # intra-chunk scores A[t, s], s <= t
    qs, ks, bs = (x.reshape(B, H, N, n, c, K) for x in (qc, kc, b))
    ref = torch.cat([torch.zeros_like(bs[:, :, :, :1, -1]), bs[:, :, :, :-1, -1]], dim=3)  # [B,H,N,n,K]
    q_f = qs * torch.exp(bs - ref.unsqueeze(-2))  # [B,H,N,n,c,K]
    key_sub = torch.arange(C, device=q.device) // c  # sub-chunk of each key position
    earlier = key_sub.unsqueeze(0) < torch.arange(n, device=q.device).unsqueeze(1)  # [n, C]
    k_exp = (ref.unsqueeze(-2) - b.unsqueeze(3)).masked_fill(~earlier[..., None], -math.inf)
    k_f = kc.unsqueeze(3) * torch.exp(k_exp)  # [B,H,N,n,C,K], zero for keys not before sub-chunk i
    A_off = q_f @ k_f.transpose(-1, -2)  # [B,H,N,n,c,C]
    diff = (bs.unsqueeze(-2) - bs.unsqueeze(-3))  # [B,H,N,n,c(t),c(s),K]
    diff = diff.masked_fill(~_causal_mask(c, q.device)[..., None], -math.inf)
    A_diag = (qs.unsqueeze(-2) * ks.unsqueeze(-3) * torch.exp(diff)).sum(-1)  # [B,H,N,n,c,c]
    eye_n = torch.eye(n, dtype=dt, device=q.device)
    A_diag = (A_diag.unsqueeze(-2) * eye_n[:, None, :, None]).reshape(B, H, N, n, c, C)
    A = (A_off + A_diag).reshape(B, H, N, C, C)
    o = A @ vc

    # inter-chunk: states entering each chunk
    k_dec = kc * torch.exp(b_last - b)
    U = k_dec.transpose(-1, -2) @ vc  # [B,H,N,K,V]
    decay = torch.exp(b_last.squeeze(-2)).unsqueeze(-1)  # [B,H,N,K,1]
    S, states_in = S0, []
    for i in range(N):
        states_in.append(S)
        S = decay[:, :, i] * S + U[:, :, i]
    o = o + (qc * torch.exp(b)) @ torch.stack(states_in, 2)
    o = _from_chunks(o * scale, T)
    return o.to(out_dtype), (S if output_final_state else None)


# ----------------------------------------------------------------------------------------------- GDN
def _check_gates(name, x, q):
    if tuple(x.shape) != tuple(q.shape[:3]):
        raise ValueError(f"{name} must be [B, T, H] = {tuple(q.shape[:3])}, got {tuple(x.shape)}")


def gdn_recurrent(q, k, v, log_a, beta, scale, initial_state=None, output_final_state=False):
    """Step-by-step gated delta rule (FLA convention):
    S <- S * exp(g_t); u = beta_t (v_t - S^T k_t); S <- S + k_t u^T; o_t = scale * q_t^T S."""
    _check_qkv(q, k, v)
    _check_gates("log_a", log_a, q)
    _check_gates("beta", beta, q)
    B, T, H, K = q.shape
    V = v.shape[-1]
    _check_state(initial_state, (B, H, K, V))
    dt = _compute_dtype(q)
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


def gdn_chunk(q, k, v, log_a, beta, scale, initial_state=None, output_final_state=False, chunk_size=64):
    """Chunked gated delta rule via the WY/UT transform.

    With b = cumsum(g) in the chunk and S0 the entering state, the per-step corrections u_t satisfy
    (I + A) u = beta*v - (beta*exp(b)*k) S0 with A[t, j] = beta_t exp(b_t - b_j) k_t.k_j (j < t), so
    u = U0 - W S0 with [U0, W] = (I + A)^-1 [beta*v, beta*exp(b)*k] (one triangular solve per chunk).
    Then S_end = M S0 + R with M = exp(b_C) I - K_dec^T W, R = K_dec^T U0, and
    o = scale * (exp(b) q S0 + (q k^T * decay) u). Only the S0 -> S_end propagation loops over chunks.
    """
    _check_qkv(q, k, v)
    _check_chunk_size(chunk_size)
    _check_gates("log_a", log_a, q)
    _check_gates("beta", beta, q)
    B, T, H, K = q.shape
    V = v.shape[-1]
    _check_state(initial_state, (B, H, K, V))
    dt = _compute_dtype(q)
    out_dtype = q.dtype
    S0 = q.new_zeros(B, H, K, V, dtype=dt) if initial_state is None else initial_state.to(dt)
    if T == 0:
        return q.new_zeros(B, 0, H, V), (S0 if output_final_state else None)
    C = chunk_size
    qc, kc, vc = (_to_chunks(x.to(dt), C) for x in (q, k, v))  # [B,H,N,C,*]
    gc, bc = (_to_chunks(x.to(dt).unsqueeze(-1), C).squeeze(-1) for x in (log_a, beta))  # [B,H,N,C]
    N = qc.shape[2]
    b = gc.cumsum(-1)
    b_last = b[..., -1:]  # [B,H,N,1]
    causal = _causal_mask(C, q.device)
    decay = torch.exp((b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(~causal, -math.inf))  # [..,C,C]

    A = (bc.unsqueeze(-1) * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)
    eye = torch.eye(C, dtype=dt, device=q.device)
    rhs = torch.cat([bc.unsqueeze(-1) * vc, (bc * torch.exp(b)).unsqueeze(-1) * kc], dim=-1)
    sol = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    U0, W = sol.split([V, K], dim=-1)

    k_dec_t = (kc * torch.exp(b_last - b).unsqueeze(-1)).transpose(-1, -2)  # [B,H,N,K,C]
    R = k_dec_t @ U0  # [B,H,N,K,V]
    M = torch.exp(b_last).unsqueeze(-1) * torch.eye(K, dtype=dt, device=q.device) - k_dec_t @ W
    S, states_in = S0, []
    for i in range(N):
        states_in.append(S)
        S = M[:, :, i] @ S + R[:, :, i]
    S_in = torch.stack(states_in, 2)  # [B,H,N,K,V]
    u = U0 - W @ S_in
    o = (qc * torch.exp(b).unsqueeze(-1)) @ S_in + ((qc @ kc.transpose(-1, -2)) * decay) @ u
    o = _from_chunks(o * scale, T)
    return o.to(out_dtype), (S if output_final_state else None)


# ----------------------------------------------------------------------------------------------- linear attention
def _linear_attn_state(phi_q, phi_k, v, initial_state):
    _check_qkv(phi_q, phi_k, v, "phi_q", "phi_k")
    B, T, H, K = phi_q.shape
    V = v.shape[-1]
    dt = _compute_dtype(phi_q)
    if initial_state is None:
        return phi_q.new_zeros(B, H, K, V, dtype=dt), phi_q.new_zeros(B, H, K, dtype=dt)
    if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
        raise ValueError("initial_state for linear attention must be a pair (S [B,H,K,V], Z [B,H,K])")
    S, Z = initial_state
    _check_state(S, (B, H, K, V), "initial_state S")
    _check_state(Z, (B, H, K), "initial_state Z")
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
    """Chunked linear attention; with no decay the entering states are an exclusive cumsum over chunks."""
    _check_chunk_size(chunk_size)
    S0, Z0 = _linear_attn_state(phi_q, phi_k, v, initial_state)
    B, T, H, K = phi_q.shape
    dt = S0.dtype
    out_dtype = phi_q.dtype
    if T == 0:
        return (phi_q.new_zeros(B, 0, H, v.shape[-1]), phi_q.new_zeros(B, 0, H),
                ((S0, Z0) if output_final_state else None))
    qc, kc, vc = (_to_chunks(x.to(dt), chunk_size) for x in (phi_q, phi_k, v))
    KV = kc.transpose(-1, -2) @ vc  # [B,H,N,K,V]
    Ksum = kc.sum(-2)  # [B,H,N,K]
    S_in = torch.cat([S0.unsqueeze(2), KV[:, :, :-1]], 2).cumsum(2)
    Z_in = torch.cat([Z0.unsqueeze(2), Ksum[:, :, :-1]], 2).cumsum(2)
    A = (qc @ kc.transpose(-1, -2)).tril()
    num = qc @ S_in + A @ vc
    den = (qc * Z_in.unsqueeze(-2)).sum(-1) + A.sum(-1)
    num = _from_chunks(num, T)
    den = _from_chunks(den.unsqueeze(-1), T).squeeze(-1)
    state = (S_in[:, :, -1] + KV[:, :, -1], Z_in[:, :, -1] + Ksum[:, :, -1]) if output_final_state else None
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
    dt = _compute_dtype(x)
    xt = x.to(dt).transpose(1, 2)  # [B, D, T]
    if state is None:
        state = xt.new_zeros(B, D, W - 1)
    else:
        _check_state(state, (B, D, W - 1), "state")
        state = state.to(dt)
    full = torch.cat([state, xt], dim=-1)  # [B, D, W-1+T]
    y = F.conv1d(full, weight.to(dt).unsqueeze(1), groups=D).transpose(1, 2)
    new_state = full[..., full.shape[-1] - (W - 1):].to(x.dtype) if output_final_state else None
    return y.to(x.dtype), new_state


# ----------------------------------------------------------------------------------------------- window + sinks
def _grouped(q, k):
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"attention needs q [B, Tq, Hq, D] and k/v [B, Tk, Hkv, D]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}")
    Hq, Hkv = q.shape[2], k.shape[2]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    return Hq // Hkv


def _masked_softmax_attention(q, k, v, allowed, scale):
    """q [B,Tq,Hkv,G,D], k/v [B,L,Hkv,D], allowed [Tq,L] -> out [B,Tq,Hkv,G,D], lse [B,Tq,Hkv,G].
    Rows with no allowed key give out 0 and lse -inf (without NaN gradients)."""
    s = torch.einsum("bqhgd,bkhd->bqhgk", q, k) * scale
    s = s.masked_fill(~allowed[None, :, None, None, :], -math.inf)
    m = s.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    empty = denom == 0
    denom_safe = torch.where(empty, torch.ones_like(denom), denom)
    out = torch.einsum("bqhgk,bkhd->bqhgd", p / denom_safe, v)
    lse = torch.where(empty, torch.full_like(denom, -math.inf), m + torch.log(denom_safe)).squeeze(-1)
    return out, lse


def window_sink_attention(q, k, v, sinks, window, scale, q_offset=0):
    """Softmax attention over I = {j < sinks} U {t - window < j <= t} (and j <= t), GQA aware.

    q [B, Tq, Hq, D] at absolute positions q_offset + i; k, v [B, Tk, Hkv, D] at positions 0..Tk-1.
    Returns (out [B, Tq, Hq, D] in q's dtype, lse [B, Tq, Hq] in the compute dtype, fp32). Queries are processed in
    blocks that only gather the sink keys and the keys inside the block's window span, so memory is
    O(block x (sinks + window + block)) rather than O(Tq x Tk)."""
    G = _grouped(q, k)
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v {tuple(v.shape)} must match k {tuple(k.shape)} in [B, Tk, Hkv]")
    if sinks < 0 or window < 0 or q_offset < 0:
        raise ValueError(f"sinks, window and q_offset must be >= 0; got {sinks}, {window}, {q_offset}")
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    dt = _compute_dtype(q)
    qg = q.to(dt).reshape(B, Tq, Hkv, G, D)
    kd, vd = k.to(dt), v.to(dt)
    outs, lses = [], []
    for a in range(0, Tq, ATTN_QUERY_BLOCK):
        e = min(a + ATTN_QUERY_BLOCK, Tq)
        t0, t1 = q_offset + a, q_offset + e  # absolute query positions [t0, t1)
        hi = min(t1, Tk)  # keys beyond the last query are never visible
        sink_end = min(sinks, hi)
        win_start = min(max(0, t0 - window + 1), hi)
        if win_start <= sink_end:
            kpos = torch.arange(0, hi, device=q.device)
        else:
            kpos = torch.cat([torch.arange(0, sink_end, device=q.device),
                              torch.arange(win_start, hi, device=q.device)])
        tpos = torch.arange(t0, t1, device=q.device).unsqueeze(1)
        allowed = (kpos <= tpos) & ((kpos < sinks) | (kpos > tpos - window))
        out, lse = _masked_softmax_attention(qg[:, a:e], kd[:, kpos], vd[:, kpos], allowed, scale)
        outs.append(out)
        lses.append(lse)
    if Tq:
        out, lse = torch.cat(outs, 1), torch.cat(lses, 1)
    else:
        out, lse = qg.new_zeros(B, 0, Hkv, G, v.shape[-1]), qg.new_zeros(B, 0, Hkv, G)
    return out.reshape(B, Tq, Hq, v.shape[-1]).to(q.dtype), lse.reshape(B, Tq, Hq)


def window_sink_decode(q, k_cache, v_cache, scale):
    """Decoding step: every query row attends to all cached keys (the caller passes exactly the sink +
    window keys it may see, the current token included). q [B, Tq, Hq, D], caches [B, L, Hkv, D].
    Returns (out [B, Tq, Hq, D], lse [B, Tq, Hq]); with L == 0 the output is 0 and lse -inf."""
    G = _grouped(q, k_cache)
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"v_cache {tuple(v_cache.shape)} must match k_cache {tuple(k_cache.shape)}")
    B, Tq, Hq, D = q.shape
    Hkv, L = k_cache.shape[2], k_cache.shape[1]
    dt = _compute_dtype(q)
    allowed = torch.ones(Tq, L, dtype=torch.bool, device=q.device)
    out, lse = _masked_softmax_attention(q.to(dt).reshape(B, Tq, Hkv, G, D), k_cache.to(dt),
                                         v_cache.to(dt), allowed, scale)
    return out.reshape(B, Tq, Hq, v_cache.shape[-1]).to(q.dtype), lse.reshape(B, Tq, Hq)
