"""Reference ops: chunked forms vs recurrences vs explicit definitions, gradients, state hand-over,
short conv vs conv1d, window/sink attention vs a brute-force masked softmax."""
import math

import pytest
import torch
import torch.nn.functional as F

from golinear.models.attention.ops import reference as R
from _tiny import perturb_new_params

T_VALUES = [1, 15, 63, 64, 65, 130]


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def close(a, b, tol=1e-5):
    err = rel_err(a, b)
    assert err <= tol, f"relative error {err:.3g} > {tol:.1g}"


def gen(seed):
    return torch.Generator().manual_seed(seed)


def make_gla(T, B=2, H=2, K=12, V=10, seed=0, gate="mild", dtype=torch.float32):
    g = gen(seed)
    q, k = torch.randn(B, T, H, K, generator=g), torch.randn(B, T, H, K, generator=g)
    v = torch.randn(B, T, H, V, generator=g)
    x = torch.randn(B, T, H, K, generator=g)
    if gate == "mild":
        log_a = F.logsigmoid(x + 2)
    elif gate == "strong":  # sub-chunks decaying past exp(-GLA_MAX_EXP): the elementwise fallback
        log_a = F.logsigmoid(3 * x - 3)
    else:  # "reset": some exact zeros (log_a = -inf) and huge decays mixed in
        log_a = F.logsigmoid(x + 2)
        u = torch.rand(B, T, H, K, generator=g)
        log_a = torch.where(u < 0.04, torch.full_like(log_a, -math.inf), log_a)
        log_a = torch.where((u > 0.04) & (u < 0.08), torch.full_like(log_a, -300.0), log_a)
    S0 = torch.randn(B, H, K, V, generator=g)
    return [t.to(dtype) for t in (q, k, v, log_a, S0)]


def make_gdn(T, B=2, H=2, K=12, V=10, seed=0, dtype=torch.float32):
    g = gen(seed)
    q = torch.randn(B, T, H, K, generator=g)
    k = F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1)
    v = torch.randn(B, T, H, V, generator=g)
    log_a = F.logsigmoid(torch.randn(B, T, H, generator=g) + 2)
    beta = torch.rand(B, T, H, generator=g)
    S0 = torch.randn(B, H, K, V, generator=g)
    return [t.to(dtype) for t in (q, k, v, log_a, beta, S0)]


def make_lin(T, B=2, H=2, K=12, V=10, seed=0, dtype=torch.float32):
    g = gen(seed)
    pq, pk = torch.rand(B, T, H, K, generator=g), torch.rand(B, T, H, K, generator=g)
    v = torch.randn(B, T, H, V, generator=g)
    S0, Z0 = torch.rand(B, H, K, V, generator=g), torch.rand(B, H, K, generator=g)
    return [t.to(dtype) for t in (pq, pk, v, S0, Z0)]


# ------------------------------------------------------------------------------------------ GLA
@pytest.mark.parametrize("T", T_VALUES)
@pytest.mark.parametrize("with_state", [False, True])
def test_gla_chunk_matches_recurrent(T, with_state):
    q, k, v, log_a, S0 = make_gla(T, seed=T)
    S0 = S0 if with_state else None
    o_ref, s_ref = R.gla_recurrent(q, k, v, log_a, 0.3, S0, True)
    for cs in (64, 16, 20, 128):
        o, s = R.gla_chunk(q, k, v, log_a, 0.3, S0, True, chunk_size=cs)
        close(o, o_ref)
        close(s, s_ref)


@pytest.mark.parametrize("gate", ["strong", "reset"])
def test_gla_chunk_fast_decay_and_resets(gate):
    q, k, v, log_a, S0 = make_gla(130, K=20, seed=1, gate=gate)
    o_ref, s_ref = R.gla_recurrent(q, k, v, log_a, 0.5, S0, True)
    for cs in (64, 32):
        o, s = R.gla_chunk(q, k, v, log_a, 0.5, S0, True, chunk_size=cs)
        close(o, o_ref)
        close(s, s_ref)
    q, log_a = q.clone().requires_grad_(), log_a.clone().requires_grad_()
    o, s = R.gla_chunk(q, k, v, log_a, 0.5, S0, True)
    (o.square().sum() + s.sum()).backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(log_a.grad).all()


def test_gla_recurrent_matches_explicit_definition():
    q, k, v, log_a, S0 = make_gla(9, dtype=torch.float64, seed=3)
    scale = 0.7
    o, s = R.gla_recurrent(q, k, v, log_a, scale, S0, True)
    a = log_a.exp()
    B, T, H, K = q.shape
    for t in range(T):
        total = torch.einsum("bhk,bhk,bhkv->bhv", q[:, t], a[:, : t + 1].prod(1), S0)
        for j in range(t + 1):
            decay = a[:, j + 1: t + 1].prod(1)  # prod_{j < i <= t} a_i (empty product = 1)
            total = total + torch.einsum("bhk,bhk,bhk,bhv->bhv", q[:, t], decay, k[:, j], v[:, j])
        close(o[:, t], scale * total, 1e-12)
    S = S0 * a.prod(1).unsqueeze(-1) + sum(
        (a[:, j + 1:].prod(1) * k[:, j]).unsqueeze(-1) * v[:, j].unsqueeze(-2) for j in range(T))
    close(s, S, 1e-12)


# ------------------------------------------------------------------------------------------ GDN
@pytest.mark.parametrize("T", T_VALUES)
@pytest.mark.parametrize("with_state", [False, True])
def test_gdn_chunk_matches_recurrent(T, with_state):
    q, k, v, log_a, beta, S0 = make_gdn(T, seed=T)
    S0 = S0 if with_state else None
    o_ref, s_ref = R.gdn_recurrent(q, k, v, log_a, beta, 0.3, S0, True)
    for cs in (64, 16, 20, 128):
        o, s = R.gdn_chunk(q, k, v, log_a, beta, 0.3, S0, True, chunk_size=cs)
        close(o, o_ref)
        close(s, s_ref)


def test_gdn_recurrent_matches_explicit_products():
    """S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, written as explicit matrix
    products: S_t = P_{t,0} S_0 + sum_j P_{t,j} beta_j k_j v_j^T with P_{t,j} = prod_{j<i<=t} G_i."""
    q, k, v, log_a, beta, S0 = make_gdn(7, K=5, V=4, dtype=torch.float64, seed=4)
    scale = 0.9
    o, s = R.gdn_recurrent(q, k, v, log_a, beta, scale, S0, True)
    B, T, H, K = q.shape
    eye = torch.eye(K, dtype=torch.float64)
    Gm = log_a.exp()[..., None, None] * (eye - beta[..., None, None] * k.unsqueeze(-1) * k.unsqueeze(-2))

    def P(t, j):  # G_t G_{t-1} ... G_{j+1}
        out = eye.expand(B, H, K, K)
        for i in range(j + 1, t + 1):
            out = Gm[:, i] @ out
        return out

    for t in range(T):
        S_t = P(t, -1) @ S0 + sum(P(t, j) @ (beta[:, j, :, None, None] * k[:, j].unsqueeze(-1)
                                             * v[:, j].unsqueeze(-2)) for j in range(t + 1))
        close(o[:, t], scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S_t), 1e-12)
    close(s, S_t, 1e-12)


# ------------------------------------------------------------------------------------------ linear attention
@pytest.mark.parametrize("T", T_VALUES)
@pytest.mark.parametrize("with_state", [False, True])
def test_linear_attn_chunk_matches_recurrent(T, with_state):
    pq, pk, v, S0, Z0 = make_lin(T, seed=T)
    st = (S0, Z0) if with_state else None
    n_ref, d_ref, (S_ref, Z_ref) = R.linear_attn_recurrent(pq, pk, v, st, True)
    for cs in (64, 16, 20, 128):
        n, d, (S, Z) = R.linear_attn_chunk(pq, pk, v, st, True, chunk_size=cs)
        for a, b in ((n, n_ref), (d, d_ref), (S, S_ref), (Z, Z_ref)):
            close(a, b)


def test_linear_attn_recurrent_matches_explicit_definition():
    pq, pk, v, S0, Z0 = make_lin(11, dtype=torch.float64, seed=5)
    num, den, (S, Z) = R.linear_attn_recurrent(pq, pk, v, (S0, Z0), True)
    for t in range(pq.shape[1]):
        S_t = S0 + torch.einsum("bjhk,bjhv->bhkv", pk[:, : t + 1], v[:, : t + 1])
        Z_t = Z0 + pk[:, : t + 1].sum(1)
        close(num[:, t], torch.einsum("bhk,bhkv->bhv", pq[:, t], S_t), 1e-12)
        close(den[:, t], (pq[:, t] * Z_t).sum(-1), 1e-12)
    close(S, S_t, 1e-12)
    close(Z, Z_t, 1e-12)


# ------------------------------------------------------------------------------------------ gradients
def _grads(fn, inputs):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    outs = fn(*inputs)
    g = gen(99)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    loss.backward()
    return [x.grad for x in inputs]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_chunk_gradients_match_recurrent(dtype, tol):
    T = 70
    q, k, v, log_a, S0 = make_gla(T, dtype=dtype, seed=6, gate="strong" if dtype == torch.float64 else "mild")
    for a, b in zip(_grads(lambda *x: R.gla_chunk(*x[:4], 0.4, x[4], True, chunk_size=32), [q, k, v, log_a, S0]),
                    _grads(lambda *x: R.gla_recurrent(*x[:4], 0.4, x[4], True), [q, k, v, log_a, S0])):
        close(a, b, tol)
    q, k, v, log_a, beta, S0 = make_gdn(T, dtype=dtype, seed=7)
    for a, b in zip(_grads(lambda *x: R.gdn_chunk(*x[:5], 0.4, x[5], True, chunk_size=32),
                           [q, k, v, log_a, beta, S0]),
                    _grads(lambda *x: R.gdn_recurrent(*x[:5], 0.4, x[5], True), [q, k, v, log_a, beta, S0])):
        close(a, b, tol)
    pq, pk, v, S0, Z0 = make_lin(T, dtype=dtype, seed=8)

    def flat(fn):
        return lambda pq, pk, v, S0, Z0: (lambda n, d, s: (n, d, s[0], s[1]))(*fn(pq, pk, v, (S0, Z0), True))

    for a, b in zip(_grads(flat(lambda *x: R.linear_attn_chunk(*x, chunk_size=32)), [pq, pk, v, S0, Z0]),
                    _grads(flat(R.linear_attn_recurrent), [pq, pk, v, S0, Z0])):
        close(a, b, tol)


# ------------------------------------------------------------------------------------------ state hand-over
@pytest.mark.parametrize("split", [1, 40, 64])
def test_split_sequence_with_state_equals_one_call(split):
    T = 100
    q, k, v, log_a, S0 = make_gla(T, seed=9)
    for fn in (R.gla_chunk, R.gla_recurrent):
        o, s = fn(q, k, v, log_a, 0.3, S0, True)
        o1, s1 = fn(q[:, :split], k[:, :split], v[:, :split], log_a[:, :split], 0.3, S0, True)
        o2, s2 = fn(q[:, split:], k[:, split:], v[:, split:], log_a[:, split:], 0.3, s1, True)
        close(torch.cat([o1, o2], 1), o)
        close(s2, s)
    q, k, v, log_a, beta, S0 = make_gdn(T, seed=9)
    for fn in (R.gdn_chunk, R.gdn_recurrent):
        o, s = fn(q, k, v, log_a, beta, 0.3, S0, True)
        o1, s1 = fn(q[:, :split], k[:, :split], v[:, :split], log_a[:, :split], beta[:, :split], 0.3, S0, True)
        o2, s2 = fn(q[:, split:], k[:, split:], v[:, split:], log_a[:, split:], beta[:, split:], 0.3, s1, True)
        close(torch.cat([o1, o2], 1), o)
        close(s2, s)
    pq, pk, v, S0, Z0 = make_lin(T, seed=9)
    for fn in (R.linear_attn_chunk, R.linear_attn_recurrent):
        n, d, (S, Z) = fn(pq, pk, v, (S0, Z0), True)
        n1, d1, st = fn(pq[:, :split], pk[:, :split], v[:, :split], (S0, Z0), True)
        n2, d2, (S2, Z2) = fn(pq[:, split:], pk[:, split:], v[:, split:], st, True)
        close(torch.cat([n1, n2], 1), n)
        close(torch.cat([d1, d2], 1), d)
        close(S2, S)
        close(Z2, Z)


def test_final_state_is_none_unless_requested_and_dtypes():
    q, k, v, log_a, S0 = make_gla(20, dtype=torch.bfloat16)
    o, s = R.gla_chunk(q, k, v, log_a, 0.3)
    assert s is None and o.dtype == torch.bfloat16 and o.shape == v.shape
    o, s = R.gla_chunk(q, k, v, log_a, 0.3, S0, True)
    assert s.dtype == torch.float32
    q, k, v, log_a, beta, S0 = make_gdn(20, dtype=torch.bfloat16)
    o, s = R.gdn_chunk(q, k, v, log_a, beta, 0.3, S0, True)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    o_r, s_r = R.gdn_recurrent(q, k, v, log_a, beta, 0.3, S0, True)
    close(o, o_r, 2e-2)  # both in fp32 inside, rounded to bf16 at the end
    close(s, s_r, 1e-5)


def test_bad_shapes_raise_value_error():
    q, k, v, log_a, S0 = make_gla(10)
    with pytest.raises(ValueError, match="log_a"):
        R.gla_chunk(q, k, v, log_a[..., :3], 0.3)
    with pytest.raises(ValueError, match="initial_state"):
        R.gla_chunk(q, k, v, log_a, 0.3, S0[:, :1])
    with pytest.raises(ValueError, match="chunk_size"):
        R.gla_chunk(q, k, v, log_a, 0.3, chunk_size=0)
    with pytest.raises(ValueError, match="beta"):
        R.gdn_chunk(q, k, v, log_a[..., 0], log_a, 0.3)
    with pytest.raises(ValueError, match="multiple"):
        R.window_sink_attention(q[:, :, :2], k[:, :, :1].expand(-1, -1, 3, -1), k[:, :, :1].expand(-1, -1, 3, -1),
                                4, 4, 1.0)


# ------------------------------------------------------------------------------------------ short conv
def test_short_conv_matches_conv1d_and_splits():
    g = gen(10)
    B, T, D, W = 2, 23, 6, 4
    x, w = torch.randn(B, T, D, generator=g), torch.randn(D, W, generator=g)
    y, st = R.short_conv(x, w, output_final_state=True)
    ref = F.conv1d(F.pad(x.transpose(1, 2), (W - 1, 0)), w.unsqueeze(1), groups=D).transpose(1, 2)
    close(y, ref, 1e-6)
    close(st, x[:, -(W - 1):].transpose(1, 2), 0)
    # explicit definition at one position
    t = 10
    close(y[:, t], sum(w[:, i] * x[:, t - (W - 1) + i] for i in range(W)), 1e-6)
    for split in (1, 2, 3, 11):  # includes pieces shorter than W - 1
        y1, s1 = R.short_conv(x[:, :split], w, None, True)
        pieces, s = [y1], s1
        for a in range(split, T, 2):  # the rest two tokens at a time, then a single-token tail
            y2, s = R.short_conv(x[:, a:a + 2], w, s, True)
            pieces.append(y2)
        close(torch.cat(pieces, 1), y, 1e-6)
        close(s, st, 0)
    y_none, s_none = R.short_conv(x, w)
    assert s_none is None
    close(y_none, y, 0)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    R.short_conv(xg, wg)[0].square().sum().backward()
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.conv1d(F.pad(xr.transpose(1, 2), (W - 1, 0)), wr.unsqueeze(1), groups=D).square().sum().backward()
    close(xg.grad, xr.grad, 1e-6)
    close(wg.grad, wr.grad, 1e-6)


def test_short_conv_initial_state_is_previous_inputs():
    g = gen(11)
    x, w = torch.randn(1, 9, 3, generator=g), torch.randn(3, 3, generator=g)
    y_whole, _ = R.short_conv(x, w)
    y_tail, _ = R.short_conv(x[:, 5:], w, state=x[:, 3:5].transpose(1, 2))
    close(y_tail, y_whole[:, 5:], 1e-6)
    with pytest.raises(ValueError):
        R.short_conv(x, w, state=torch.zeros(1, 3, 5))


# ------------------------------------------------------------------------------------------ window + sinks
def brute_window_attention(q, k, v, sinks, window, scale, q_offset=0):
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    kk = k.repeat_interleave(Hq // Hkv, dim=2)
    vv = v.repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    t = torch.arange(Tq)[:, None] + q_offset
    j = torch.arange(Tk)[None, :]
    allowed = (j <= t) & ((j < sinks) | (j > t - window))
    s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, vv), lse.transpose(1, 2)


WINDOW_CASES = [  # (Tq, Tk, q_offset, sinks, window, Hq, Hkv)
    (150, 150, 0, 4, 10, 4, 2),  # sparse path, several query blocks
    (150, 150, 0, 0, 7, 3, 3),  # no sinks
    (150, 150, 0, 5, 0, 2, 1),  # sinks only
    (40, 40, 0, 8, 56, 6, 2),  # window covers everything: dense path
    (30, 200, 170, 3, 20, 4, 1),  # queries at an offset (chunked prefill)
    (1, 90, 89, 2, 5, 2, 2),  # a single query at the end
    (130, 130, 0, 200, 3, 2, 2),  # sinks longer than the sequence
]


@pytest.mark.parametrize("case", WINDOW_CASES)
def test_window_sink_attention_matches_brute_force(case):
    Tq, Tk, off, sinks, window, Hq, Hkv = case
    g = gen(12)
    q = torch.randn(2, Tq, Hq, 8, generator=g)
    k, v = torch.randn(2, Tk, Hkv, 8, generator=g), torch.randn(2, Tk, Hkv, 8, generator=g)
    out, lse = R.window_sink_attention(q, k, v, sinks, window, 0.35, q_offset=off)
    out_ref, lse_ref = brute_window_attention(q, k, v, sinks, window, 0.35, off)
    close(out, out_ref, 1e-6)
    close(lse, lse_ref, 1e-6)


def test_window_sink_attention_in_memory_bounded_groups(monkeypatch):
    from golinear.models.attention.ops import reference_window
    monkeypatch.setattr(reference_window, "ATTN_MAX_SCORES", 1)  # one query block per group
    for Tq, Tk, off, sinks, window in [(100, 100, 0, 2, 200), (100, 100, 0, 2, 5), (50, 120, 70, 1, 80)]:
        g = gen(16)
        q = torch.randn(1, Tq, 4, 8, generator=g)
        k, v = torch.randn(1, Tk, 2, 8, generator=g), torch.randn(1, Tk, 2, 8, generator=g)
        out, lse = R.window_sink_attention(q, k, v, sinks, window, 0.35, q_offset=off)
        out_ref, lse_ref = brute_window_attention(q, k, v, sinks, window, 0.35, off)
        close(out, out_ref, 1e-6)
        close(lse, lse_ref, 1e-6)


def test_window_sink_attention_empty_rows_and_gradients():
    g = gen(13)
    q, k, v = (torch.randn(1, 20, 2, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out, lse = R.window_sink_attention(q, k, v, 0, 0, 1.0)
    assert (out == 0).all() and torch.isneginf(lse).all()
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    ref_inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = R.window_sink_attention(*inputs, 2, 3, 0.5)
    out_r, lse_r = brute_window_attention(*ref_inputs, 2, 3, 0.5)
    (out.square().sum() + lse.sum()).backward()
    (out_r.square().sum() + lse_r.sum()).backward()
    for a, b in zip(inputs, ref_inputs):
        close(a.grad, b.grad, 1e-10)


def test_window_sink_attention_sees_exactly_the_allowed_set():
    g = gen(14)
    T, sinks, window = 48, 3, 8
    q, k, v = (torch.randn(1, T, 2, 4, generator=g) for _ in range(3))
    out, _ = R.window_sink_attention(q, k, v, sinks, window, 0.5)
    t = 40
    allowed = set(range(sinks)) | set(range(t - window + 1, t + 1))
    for j in range(T):
        v2, k2 = v.clone(), k.clone()
        v2[:, j] += 10.0
        k2[:, j] -= 3.0
        out2, _ = R.window_sink_attention(q, k2, v2, sinks, window, 0.5)
        changed = not torch.allclose(out2[:, t], out[:, t], atol=1e-6)
        assert changed == (j in allowed), f"key {j}: changed={changed}, in I={j in allowed}"


@pytest.mark.parametrize("T", [1, 5, 64, 100])
def test_window_sink_decode_equals_last_row(T):
    g = gen(15)
    sinks, window = 4, 16
    q = torch.randn(2, T, 6, 8, generator=g)
    k, v = torch.randn(2, T, 2, 8, generator=g), torch.randn(2, T, 2, 8, generator=g)
    out, lse = R.window_sink_attention(q, k, v, sinks, window, 0.3)
    t = T - 1
    keep = sorted(set(range(min(sinks, T))) | set(range(max(0, t - window + 1), T)))
    out_d, lse_d = R.window_sink_decode(q[:, -1:], k[:, keep], v[:, keep], 0.3)
    close(out_d, out[:, -1:], 1e-6)
    close(lse_d, lse[:, -1:], 1e-6)
    out_e, lse_e = R.window_sink_decode(q[:, -1:], k[:, :0], v[:, :0], 0.3)
    assert (out_e == 0).all() and torch.isneginf(lse_e).all()


def test_fast_prefill_wiring_matches_plain_path(monkeypatch):
    """The no-grad CUDA prefill path (models.attention.projection._project_fast, the FLA l2norm) is wired like the plain
    path: with FLA's three kernels stood in for by their definitions (reference conv, RoPE formula, l2norm;
    tests/test_gpu.py checks the kernels themselves against these), a chunked variable-length prefill gives the
    same logits and decode state as with the fast path off."""
    import transformers
    from golinear.models.attention import mechanisms, ops
    from golinear.models.decoding.fast_decode import FastDecoder
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    from golinear.models.attention.ops import fla_backend
    from golinear.models.attention.projection import _rope_formula
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=97)
    model = linearize(transformers.LlamaForCausalLM(cfg).eval(),
                      LinearizeConfig(mechanism="gdn", window=8, sinks=2, short_conv=True))
    perturb_new_params(model, 0.1)
    ids = torch.randint(0, 97, (3, 80), generator=gen(1))
    lens = [80, 41, 5]

    def run():
        fd = FastDecoder(model, prefill_chunk=32)
        fd.prefill(ids, lens)
        return fd.last_logits.clone(), [t.clone() for st in fd.states for t in st.tensors()]

    plain = run()
    calls = []

    def conv_fresh(x, weight, state=None):
        calls.append("conv")
        return R.short_conv(x, weight, state)[0].contiguous()

    def rope(x, cos, sin):
        calls.append("rope")
        return _rope_formula(x, cos[None], sin[None], x.dtype)

    monkeypatch.setattr(ops, "fast_inference", lambda x: not torch.is_grad_enabled())
    monkeypatch.setattr(mechanisms, "fast_inference", lambda x: not torch.is_grad_enabled())
    monkeypatch.setattr(fla_backend, "conv_fresh", conv_fresh)
    monkeypatch.setattr(fla_backend, "rope", rope)
    monkeypatch.setattr(fla_backend, "l2norm", lambda x: calls.append("l2norm") or mechanisms.l2norm(x))
    fast = run()
    assert {"conv", "rope", "l2norm"} <= set(calls), calls
    close(fast[0], plain[0], 1e-5)
    assert len(fast[1]) == len(plain[1])
    for a, b in zip(fast[1], plain[1]):
        assert a.shape == b.shape and a.dtype == b.dtype
        if a.is_floating_point():
            close(a, b, 1e-5)
        else:
            assert torch.equal(a, b)
