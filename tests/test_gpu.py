"""GPU tests: the FLA backend against the PyTorch reference, forward and backward, fp32 and bf16.

Marked `gpu`; skipped without CUDA or without flash-linear-attention. Run on the H200 with
`scripts/gpu/tests.sh`. Errors are relative L2 norms ||x - ref|| / ||ref||, the reference run in
fp32 on the same (upcast) inputs. Tolerances (FLA's kernels use tf32 dots for fp32 inputs):
  fp32: outputs/states 5e-3, gradients 1e-2;   bf16: outputs/states 1.5e-2, gradients 3e-2.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from _gpu import DTYPES, TOL, errors_vs_reference, rel
from _tiny import perturb_new_params

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs flash-linear-attention"),
]

LENGTHS = [1, 15, 63, 65, 1000, 4096]


def _inputs(mech, B, T, H, D, dtype, seed=0):
    """Leaf tensors (in `dtype`, requiring grad) shaped like what LinearizedAttention passes."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    if mech == "gla":
        x = dict(q=r(B, T, H, D), k=r(B, T, H, D) * D ** -0.5, v=r(B, T, H, D),
                 log_a=F.logsigmoid(r(B, T, H, D) + 2) / 16)
        state = r(B, H, D, D) * 0.1
    elif mech == "gdn":
        x = dict(q=F.normalize(r(B, T, H, D), dim=-1), k=F.normalize(r(B, T, H, D), dim=-1), v=r(B, T, H, D),
                 log_a=F.logsigmoid(r(B, T, H) + 3), beta=torch.sigmoid(r(B, T, H)))
        state = r(B, H, D, D) * 0.1
    else:  # hedgehog features: softmax halves, feature dim 2 x 64
        x = dict(phi_q=torch.softmax(r(B, T, H, 128), -1), phi_k=torch.softmax(r(B, T, H, 128), -1), v=r(B, T, H, D))
        state = (r(B, H, 128, D).abs() * 0.1, r(B, H, 128).abs())
    x = {k: v.to(dtype).requires_grad_() for k, v in x.items()}
    if isinstance(state, tuple):
        state = tuple(s.requires_grad_() for s in state)
    else:
        state = state.requires_grad_()
    return x, state


def _call(ops_mod, mech, form, x, state, scale):
    f = getattr(ops_mod, {"gla": "gla", "gdn": "gdn", "hedgehog": "linear_attn"}[mech] + "_" + form)
    if mech == "gla":
        o, s = f(x["q"], x["k"], x["v"], x["log_a"], scale, initial_state=state, output_final_state=True)
        return [o], list(s) if isinstance(s, tuple) else [s]
    if mech == "gdn":
        o, s = f(x["q"], x["k"], x["v"], x["log_a"], x["beta"], scale, initial_state=state, output_final_state=True)
        return [o], [s]
    num, den, s = f(x["phi_q"], x["phi_k"], x["v"], initial_state=state, output_final_state=True)
    return [num, den], list(s)


def _upcast(x, state):
    x32 = {k: v.detach().float().requires_grad_() for k, v in x.items()}
    if isinstance(state, tuple):
        s32 = tuple(s.detach().float().requires_grad_() for s in state)
    else:
        s32 = state.detach().float().requires_grad_()
    return x32, s32


def _leaves(x, state):
    return list(x.values()) + (list(state) if isinstance(state, tuple) else [state])


def _compare(mech, form, dtype, B, T, H, D, backward=True):
    from golinear.models.attention.ops import fla_backend, reference
    x, state = _inputs(mech, B, T, H, D, dtype)
    x32, s32 = _upcast(x, state)
    scale = D ** -0.5
    outs, states = _call(fla_backend, mech, form, x, state, scale)
    r_outs, r_states = _call(reference, mech, "chunk" if T > 64 else "recurrent", x32, s32, scale)
    tol_o, tol_g = TOL[dtype]
    errors = {}
    for i, (a, b) in enumerate(zip(outs + states, r_outs + r_states)):
        errors[f"out{i}"] = rel(a, b)
    if backward:
        g = torch.Generator(device="cuda").manual_seed(1)
        cots = [torch.randn(t.shape, device="cuda", generator=g) for t in r_outs + r_states]
        loss = sum((a.float() * c).sum() for a, c in zip(outs + states, cots))
        r_loss = sum((a * c).sum() for a, c in zip(r_outs + r_states, cots))
        grads = torch.autograd.grad(loss, _leaves(x, state))
        r_grads = torch.autograd.grad(r_loss, _leaves(x32, s32))
        for name, a, b in zip(list(x) + ["h0"] * 2, grads, r_grads):
            errors[f"d{name}"] = rel(a, b)
    bad = {k: v for k, v in errors.items() if v > (tol_g if k.startswith("d") else tol_o)}
    print(f"{mech} {form} {dtype} T={T}: " + " ".join(f"{k}={v:.1e}" for k, v in errors.items()))
    assert not bad, f"{mech} {form} {dtype} T={T}: over tolerance {bad} (all: {errors})"


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("mech", ["gla", "gdn", "hedgehog"])
def test_chunk_forward_backward(mech, T, dtype):
    _compare(mech, "chunk", DTYPES[dtype], B=2, T=T, H=4, D=64)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("T", [1, 15, 63])
@pytest.mark.parametrize("mech", ["gla", "gdn", "hedgehog"])
def test_recurrent_forward(mech, T, dtype):
    with torch.no_grad():
        _compare(mech, "recurrent", DTYPES[dtype], B=2, T=T, H=4, D=64, backward=False)


@pytest.mark.parametrize("D,H", [(64, 9), (128, 8)], ids=["smollm2-d64", "8b-d128"])
def test_gdn_training_shapes_backward(D, H):
    """The shapes we train with (bf16, T=4096): FLA's chunk backward run past FLA's Hopper/triton guard."""
    _compare("gdn", "chunk", torch.bfloat16, B=1, T=4096, H=H, D=D)


def test_gdn_guard_bypass_is_scoped():
    """On Hopper with triton < 3.7.1 FLA's own op refuses backward; ours runs and restores the flag."""
    from golinear.models.attention.ops import fla_backend
    fla_backend.load_fla()
    chunk_o = fla_backend.kernels.chunk_o
    if not (chunk_o.IS_NVIDIA_HOPPER and chunk_o.TRITON_ABOVE_3_4_0 and not chunk_o.TRITON_ABOVE_3_7_1):
        pytest.skip("FLA's Hopper/triton guard is not active on this GPU / triton")
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    x, _ = _inputs("gdn", 1, 64, 2, 64, torch.bfloat16)
    o, _ = chunk_gated_delta_rule(q=x["q"], k=x["k"], v=x["v"], g=x["log_a"].float(), beta=x["beta"])
    with pytest.raises(RuntimeError, match="640"):
        o.sum().backward()
    o, _ = fla_backend.gdn_chunk(x["q"], x["k"], x["v"], x["log_a"], x["beta"], 64 ** -0.5)
    o.float().sum().backward()
    assert chunk_o.TRITON_ABOVE_3_4_0, "guard flag not restored"


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("grad", [False, True], ids=["fla-kernel", "blocked-autograd"])
def test_window_sink_attention(T, dtype, grad):
    from golinear.models.attention.ops import fla_backend, reference
    dt = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(2)
    B, Hq, Hkv, D, s, w = 2, 8, 2, 64, 8, 56
    q, k, v = (torch.randn(B, T, h, D, device="cuda", generator=g).to(dt).requires_grad_(grad)
               for h in (Hq, Hkv, Hkv))
    _, errs = errors_vs_reference(lambda *x: fla_backend.window_sink_attention(*x, s, w, D ** -0.5),
                                  lambda *x: reference.window_sink_attention(*x, s, w, D ** -0.5),
                                  (q, k, v), grad, g, names=("out", "lse"))
    tol_o, tol_g = TOL[dt]
    print(f"window T={T} {dtype} grad={grad}: {errs}")
    assert all(v <= (tol_g if k.startswith("d") else tol_o) for k, v in errs.items()), errs


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_short_conv_fast_path(dtype):
    """fla_backend.short_conv without grad (shifted multiply-adds in the input dtype) vs the reference."""
    from golinear.models.attention.ops import fla_backend, reference
    dt = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2, 1000, 4096, device="cuda", generator=g).to(dt)
    w = torch.randn(4096, 4, device="cuda", generator=g) * 0.5
    state = torch.randn(2, 4096, 3, device="cuda", generator=g).to(dt)
    with torch.no_grad():
        y, s = fla_backend.short_conv(x, w, state, output_final_state=True)
        ry, rs = reference.short_conv(x.float(), w, state.float(), output_final_state=True)
    err = rel(y, ry)
    print(f"short conv {dtype}: rel err {err:.1e}")
    assert err < TOL[dt][0] and rel(s, rs) < TOL[dt][0]


@pytest.mark.parametrize("mech", ["gla", "gdn"])
def test_mixed_input_dtypes(mech):
    """Under autocast q/k can arrive in fp32 with v in bf16: computed in v's dtype, output in q's."""
    from golinear.models.attention.ops import fla_backend
    x, state = _inputs(mech, 2, 70, 4, 64, torch.bfloat16)
    x = {k: v.detach() for k, v in x.items()}
    x["q"], x["k"] = x["q"].float(), x["k"].float()
    outs, _ = _call(fla_backend, mech, "chunk", x, state.detach(), 64 ** -0.5)
    ref, _ = _call(fla_backend, mech, "chunk", {k: v.to(torch.bfloat16) if k in "qk" else v for k, v in x.items()},
                   state.detach(), 64 ** -0.5)
    assert outs[0].dtype == torch.float32
    assert rel(outs[0], ref[0]) < 1e-6


def test_dispatch_routes_cuda_to_fla(monkeypatch):
    from golinear.models.attention import ops
    x = torch.zeros(1, device="cuda")
    assert ops.backend_name(x) == "fla"
    assert ops.backend_name(torch.zeros(1)) == "reference"
    monkeypatch.setenv("GOLINEAR_OPS", "reference")
    assert ops.backend_name(x) == "reference"


def _small_cuda_model(mech):
    """A 2-layer random Llama on CUDA, linearized with `mech` (None: full attention) as the default recipe, its new
    parameters moved off their identity/zero initialisation so that every path carries signal."""
    import transformers
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=300)
    model = transformers.LlamaForCausalLM(cfg).eval()
    if mech:
        linearize(model, LinearizeConfig(mechanism=mech, window=56, sinks=8, short_conv=True))
        perturb_new_params(model, 0.05)
    return model.cuda()


@pytest.mark.parametrize("mech", ["gdn", "gla", "hedgehog"])
def test_fast_decoder_matches_forward_on_cuda(mech):
    """Static cache + CUDA graph decoding gives the logits of the model's own parallel forward."""
    from golinear.models.decoding.fast_decode import FastDecoder
    model = _small_cuda_model(mech)
    fd = FastDecoder(model, prefill_chunk=128)
    # one decoder, three prompts: >= sinks + window (the steady step), shorter (the general step, with masks
    # and sink writes; 40 + 8 tokens stay below 64), then long again: each switch re-captures the graph
    for T, steady in ((300, True), (40, False), (300, True)):
        ids = torch.randint(0, 300, (2, T), device="cuda")
        toks = [fd.prefill(ids)]
        logits = [fd.last_logits.clone()]
        for _ in range(8):
            toks.append(fd.decode(1))
            logits.append(fd.last_logits.clone())
        assert fd.graph is not None and fd.graph_steady is steady, "decode was not captured (or the wrong step)"
        with torch.no_grad():
            ref = model(torch.cat([ids] + toks[:-1], 1)).logits.float()[:, T - 1:]
        err = rel(torch.cat(logits, 1), ref)
        print(f"fast decoder {mech} T={T}: logits rel err {err:.1e}")
        assert err < 5e-3, (T, err)


@pytest.mark.parametrize("mech", ["gdn", "hedgehog", None])
def test_batched_generation_on_cuda(mech):
    """Variable-length batch, CUDA graph: the logits of every row's first steps match the model's own forward on
    that row alone (fp32), and the batched tokens equal each prompt generated alone by the same decoder."""
    from golinear.models.decoding.batch_generate import generate_batch
    from golinear.models.decoding.fast_decode import FastDecoder
    model = _small_cuda_model(mech)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (300, 40, 129, 7)]  # around s + w = 64
    fd = FastDecoder(model, prefill_chunk=128, max_len=512)
    got = generate_batch(fd, prompts, 12, check_every=4)
    assert fd.graph is not None
    alone = [generate_batch(FastDecoder(model, prefill_chunk=128, max_len=512), [p], 12)[0] for p in prompts]
    for p, toks in zip(prompts, got):
        with torch.no_grad():
            ref = model(torch.tensor([p + toks], device="cuda")).logits.float()[0, len(p) - 1:-1]
        top2 = ref.topk(2, -1).values
        differ = ref.argmax(-1).cpu() != torch.tensor(toks)
        assert not differ.any() or (top2[:, 0] - top2[:, 1]).cpu()[differ].max() < 1e-2, (mech, len(p), differ)
    same = sum(a == b for a, b in zip(got, alone))
    print(f"batched generation {mech}: {same}/{len(prompts)} rows identical to alone")
    assert same == len(prompts), (got, alone)


# ----------------------------------------------------------------------------------------------- fast prefill
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("with_state", [False, True], ids=["zeros", "state"])
def test_prefill_conv_kernel(dtype, with_state):
    """fla_backend.conv_fresh (FLA's causal conv forward) on a channel slice of [q|k|v] vs the reference conv."""
    from golinear.models.attention.ops import fla_backend, reference
    dt = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(4)
    qkv = torch.randn(2, 1000, 960, device="cuda", generator=g).to(dt)
    w = (torch.randn(960, 4, device="cuda", generator=g) * 0.5).to(dt)
    state = torch.randn(2, 960, 3, device="cuda", generator=g).to(dt) if with_state else None
    for a, b in ((0, 768), (768, 960)):  # [q|k] and v, read in place from the wider tensor
        st = None if state is None else state[:, a:b]
        with torch.no_grad():
            y = fla_backend.conv_fresh(qkv[..., a:b], w[a:b], st)
        ry, _ = reference.short_conv(qkv[..., a:b].float(), w[a:b].float(), None if st is None else st.float())
        err = rel(y, ry)
        print(f"conv_fresh {dtype} channels {a}:{b} state={with_state}: rel err {err:.1e}")
        assert y.is_contiguous() and y.dtype == dt and err < TOL[dt][0], err


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_prefill_rope_kernel(dtype):
    """fla_backend.rope (FLA's rotary kernel) vs apply_rotary_pos_emb's formula, HF's own cos/sin tables at
    positions 100..1099 (a later prefill chunk); twice, so that the first (autotuning) call is checked too."""
    import transformers
    from golinear.models.attention.ops import fla_backend
    from golinear.models.attention.projection import _rope_formula
    dt = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(5)
    cfg = transformers.LlamaConfig(hidden_size=768, num_attention_heads=12, num_key_value_heads=3, head_dim=64,
                                   rope_theta=100000.0)
    x = torch.randn(2, 1000, 12, 64, device="cuda", generator=g).to(dt)
    rot = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg).cuda()
    cos, sin = rot(x, torch.arange(100, 1100, device="cuda").unsqueeze(0))
    want = _rope_formula(x.float(), cos.float(), sin.float(), torch.float32)
    for _ in range(2):
        with torch.no_grad():
            got = fla_backend.rope(x, cos[0], sin[0])
        err = rel(got, want)
        print(f"rope {dtype}: rel err {err:.1e}")
        assert got.dtype == dt and err < TOL[dt][0], err


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_prefill_l2norm_kernel(dtype):
    from golinear.models.attention.mechanisms import l2norm
    from golinear.models.attention.ops import fla_backend
    dt = DTYPES[dtype]
    x = torch.randn(2, 1000, 12, 64, device="cuda", generator=torch.Generator(device="cuda").manual_seed(6)).to(dt)
    with torch.no_grad():
        got = fla_backend.l2norm(x)
    err = rel(got, l2norm(x.float()))
    print(f"l2norm {dtype}: rel err {err:.1e}")
    assert got.dtype == dt and err < TOL[dt][0], err


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_fast_prefill_matches_plain_prefill(dtype, monkeypatch):
    """A chunked variable-length prefill through FLA's conv/rotary/l2norm kernels (ops.fast_inference) gives the
    logits and decode state of the plain path (GOLINEAR_FAST_PREFILL=0), and the kernels did run."""
    from golinear.models.attention import ops
    from golinear.models.decoding.fast_decode import FastDecoder
    from golinear.models.attention.ops import fla_backend
    dt = DTYPES[dtype]
    model = _small_cuda_model("gdn").to(dt)
    calls = []
    for name in ("conv_fresh", "rope", "l2norm"):
        kernel = getattr(fla_backend, name)
        monkeypatch.setattr(fla_backend, name, lambda *a, _k=kernel, _n=name: calls.append(_n) or _k(*a))
    ids = torch.randint(0, 300, (4, 300), device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    lens = [300, 129, 40, 7]

    def run(flag):
        monkeypatch.setenv("GOLINEAR_FAST_PREFILL", flag)
        fd = FastDecoder(model, prefill_chunk=128, use_graph=False)
        fd.prefill(ids, lens)
        return fd.last_logits.clone(), [t.float() for st in fd.states for t in st.tensors()]

    with torch.no_grad(), ops.prefill_scope():
        monkeypatch.setenv("GOLINEAR_FAST_PREFILL", "1")
        assert ops.fast_inference(ids.to(dt))
    with torch.no_grad():
        assert not ops.fast_inference(ids.to(dt)), "outside the prefill the plain path runs"
    fast = run("1")
    assert {"conv_fresh", "rope", "l2norm"} <= set(calls), calls
    calls.clear()
    plain = run("0")
    assert not calls, calls
    errs = [rel(fast[0], plain[0])] + [rel(a, b) for a, b in zip(fast[1], plain[1]) if b.norm() > 0]
    print(f"fast vs plain prefill {dtype}: logits {errs[0]:.1e}, state max {max(errs[1:]):.1e}")
    assert max(errs) < TOL[dt][0], errs


# ----------------------------------------------------------------------------------------------- fused decode step
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_gdn_step_inplace_matches_reference(dtype):
    """FLA's recurrent GDN kernel with h0 = ht (the state written over itself) == the reference step, at the
    8B decode shape (batch 8, 32 heads of 128)."""
    dtype = DTYPES[dtype]
    from golinear.models.attention.ops import fla_backend, reference
    g = torch.Generator(device="cuda").manual_seed(0)
    B, H, D = 8, 32, 128
    q, k = (F.normalize(torch.randn(B, 1, H, D, device="cuda", generator=g), dim=-1).to(dtype) for _ in range(2))
    v = torch.randn(B, 1, H, D, device="cuda", generator=g).to(dtype)
    log_a = -torch.rand(B, 1, H, device="cuda", generator=g)
    beta = torch.rand(B, 1, H, device="cuda", generator=g).to(dtype)
    S0 = torch.randn(B, H, D, D, device="cuda", generator=g) * 0.1
    state = S0.clone()
    o = fla_backend.gdn_step_inplace(q, k, v, log_a, beta, D ** -0.5, state)
    ref_o, ref_S = reference.gdn_recurrent(q.float(), k.float(), v.float(), log_a, beta.float(), D ** -0.5, S0, True)
    eo, es = rel(o, ref_o), rel(state, ref_S)
    print(f"gdn_step_inplace {dtype}: o {eo:.1e}, state {es:.1e}")
    assert o.dtype == dtype and eo < TOL[dtype][0] and es < TOL[dtype][0]


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_fused_decode_step_matches_the_step_on_cuda(dtype, monkeypatch):
    """GOLINEAR_FUSED_DECODE (default on CUDA) against the definition (=0): logits and decode state after 8 steady
    steps in a CUDA graph, rows at different positions, head dim 128."""
    dtype = DTYPES[dtype]
    import transformers
    from golinear.models.decoding.fast_decode import FastDecoder
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=1, head_dim=128, vocab_size=300)
    model = linearize(transformers.LlamaForCausalLM(cfg).eval(),
                      LinearizeConfig(mechanism="gdn", window=56, sinks=8, short_conv=True))
    perturb_new_params(model, 0.05)
    model = model.to("cuda", dtype)
    ids = torch.randint(0, 300, (3, 300), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    runs = {}
    for mode in ("0", "auto"):
        monkeypatch.setenv("GOLINEAR_FUSED_DECODE", mode)
        fd = FastDecoder(model, prefill_chunk=128)
        fd.prefill(ids, lengths=[300, 171, 90])
        logits = []
        for _ in range(8):
            fd.decode(1)
            logits.append(fd.last_logits.clone())
        assert fd.graph is not None and fd.graph_steady
        runs[mode] = torch.cat(logits, 1), [t.float() for st in fd.states for t in st.tensors()]
    (want, want_st), (got, got_st) = runs["0"], runs["auto"]
    errs = [rel(got, want)] + [rel(a, b) for a, b in zip(got_st, want_st, strict=True)]
    print(f"fused decode step {dtype}: logits {errs[0]:.1e}, worst state {max(errs[1:]):.1e}")
    assert max(errs) < TOL[dtype][0], errs


# ----------------------------------------------------------------------------------------------- GLA in lm-eval
@pytest.mark.parametrize("T", [37, 20], ids=["chunk64", "chunk32-padded"])
@pytest.mark.parametrize("mech", ["gla", "kgla"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gla_family_eval_forward_matches_reference(mech, T, dtype):
    """lm-eval's call on a GLA-family model (batch 64, no grad; SmolLM2's 9/3 heads of 64) on FLA's kernels gives
    the logits of the fp32 CPU reference backend on the same weights (rounded to bf16 for both dtypes). At T=20 FLA
    would pick chunk size 32, where fp32 inputs fault on the H200 ("misaligned address", the backends' default
    dtype; bf16 runs) and every GLA checkpoint's lm-eval run died (fla_backend.GLA_MIN_T pads it).
    One layer: the bf16 logits of two differ from fp32 by ~1.2e-2 on the CPU already (one: ~8e-3)."""
    import copy

    import transformers
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=1, num_attention_heads=9,
                                   num_key_value_heads=3, head_dim=64, vocab_size=300)
    model = linearize(transformers.LlamaForCausalLM(cfg).eval(), LinearizeConfig(mechanism=mech))
    perturb_new_params(model, 0.05)
    model = model.to(torch.bfloat16)
    ref_model = copy.deepcopy(model).float()  # stays on the CPU: the reference backend, in fp32
    model = model.to(DTYPES[dtype])
    ids = torch.randint(0, 300, (64, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model.cuda()(ids.cuda(), use_cache=False).logits.float().cpu()
        want = ref_model(ids, use_cache=False).logits
    err = rel(got, want)
    print(f"{mech} eval forward B=64 T={T} {dtype}: logits rel err {err:.1e}")
    assert err < TOL[DTYPES[dtype]][0], err
