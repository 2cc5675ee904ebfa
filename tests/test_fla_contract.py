"""What models.attention.ops.fla_backend hands to FLA's kernels, checked on the CPU (no triton needed).

FLA's entry points are replaced by recorders that check every tensor argument (contiguous; q/k/v one float dtype,
gates fp32, states fp32) and then compute the op with models.attention.ops.reference, and every op is routed to fla_backend
(as on CUDA). A real linearized model runs its forward and one decode step at eval-like shapes (batch 4, GQA,
bf16), strict and with window + sinks. chunk_gla must also get inputs for which FLA picks chunk size 64: the H200
faulted in lm-eval on chunk 32 (fla_backend.GLA_MIN_T). Two more tests check that this padding changes no value
(a model's logits; gla_chunk's output, final state and gradients).
"""
from __future__ import annotations

import math

import pytest
import torch
import transformers

from golinear.models.attention import ops
from golinear.models.cache.hf_cache import LinearCache
from golinear.models.attention.linearize import LinearizeConfig, linearize
from golinear.models.attention.ops import fla_backend, reference
from _tiny import perturb_new_params

QKV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the q/k/v dtypes FLA's kernels take
MECHANISMS = ("gla", "kgla", "gdn", "hedgehog")
RECIPES = {"strict": dict(), "w8-s2-sc": dict(window=8, sinks=2, short_conv=True)}
FLA_KERNEL = {"gla": "chunk_gla", "kgla": "chunk_gla", "gdn": "gdn_chunk_apply", "hedgehog": "chunk_linear_attn"}
FLA_STEP = {"gla": "fused_recurrent_gla", "kgla": "fused_recurrent_gla", "gdn": "fused_recurrent_gated_delta_rule",
            "hedgehog": "fused_recurrent_linear_attn"}


def fla_gla_chunk_size(T: int) -> int:
    """FLA 0.6.0's choice in ChunkGLAFunction.forward: min(64, max(16, triton.next_power_of_2(T)))."""
    return min(64, max(16, 1 << (T - 1).bit_length()))


def check(calls, name, qkv, gates=None, beta=None, state=None):
    """One kernel call's tensors: contiguous, q/k/v one dtype FLA takes, gates and state fp32."""
    named = dict(zip("qkv", qkv), g=gates, beta=beta, state=state)
    for key, t in named.items():
        assert t is None or t.is_contiguous(), f"{name}: {key} {tuple(t.shape)} strides {t.stride()} not contiguous"
    dtypes = {t.dtype for t in qkv}
    assert len(dtypes) == 1 and dtypes <= set(QKV_DTYPES), f"{name}: q/k/v dtypes {dtypes}"
    assert gates is None or gates.dtype == torch.float32, f"{name}: gate dtype {gates.dtype}, FLA wants fp32"
    assert beta is None or beta.is_floating_point(), f"{name}: beta dtype {beta.dtype}"
    assert state is None or state.dtype == torch.float32, f"{name}: state dtype {state.dtype}, FLA asserts fp32"
    calls.append((name, tuple(qkv[0].shape)))


def recorders(calls):
    """FLA entry point name -> a stand-in with FLA's signature that checks its arguments, then runs the reference."""

    def chunk_gla(q, k, v, g, scale, initial_state=None, output_final_state=False, **_):
        check(calls, "chunk_gla", (q, k, v), g, state=initial_state)
        assert fla_gla_chunk_size(q.shape[1]) == 64, f"chunk_gla T={q.shape[1]}: FLA would run chunk size " \
                                                     f"{fla_gla_chunk_size(q.shape[1])}"
        return reference.gla_chunk(q, k, v, g, scale, initial_state, output_final_state)

    def fused_recurrent_gla(q, k, v, gk, scale, initial_state=None, output_final_state=False, **_):
        check(calls, "fused_recurrent_gla", (q, k, v), gk, state=initial_state)
        return reference.gla_recurrent(q, k, v, gk, scale, initial_state, output_final_state)

    def gdn_chunk_apply(q, k, v, g, beta, scale, h0, final, *_):
        check(calls, "gdn_chunk_apply", (q, k, v), g, beta, h0)
        return reference.gdn_chunk(q, k, v, g, beta, scale, h0, final)

    def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state=None, output_final_state=False):
        check(calls, "fused_recurrent_gated_delta_rule", (q, k, v), g, beta, initial_state)
        return reference.gdn_recurrent(q, k, v, g, beta, scale, initial_state, output_final_state)

    def linear_attn(name):
        def fn(q, k, v, scale, initial_state=None, output_final_state=False, normalize=False):
            check(calls, name, (q, k, v), state=initial_state)
            assert scale == 1.0 and not normalize
            S0 = None if initial_state is None else (initial_state, initial_state.new_zeros(initial_state.shape[:3]))
            num, _, final = reference.linear_attn_recurrent(q, k, v, S0, output_final_state)
            return num, (final[0] if final is not None else None)
        return fn

    def parallel_attn_fwd(q, k, v, g_cumsum, sink_bias, scale, window_size):
        check(calls, "parallel_attn_fwd", (q, k, v))
        o, lse = reference.window_sink_attention(q, k, v, 0, window_size or q.shape[1], scale)
        return o, lse / math.log(2.0)  # FLA's lse is in base 2

    return dict(chunk_gla=chunk_gla, fused_recurrent_gla=fused_recurrent_gla, gdn_chunk_apply=gdn_chunk_apply,
                fused_recurrent_gated_delta_rule=fused_recurrent_gated_delta_rule,
                chunk_linear_attn=linear_attn("chunk_linear_attn"),
                fused_recurrent_linear_attn=linear_attn("fused_recurrent_linear_attn"),
                parallel_attn_fwd=parallel_attn_fwd)


@pytest.fixture
def fla_calls(monkeypatch):
    """Every op routed to fla_backend with FLA's entry points replaced by recorders; yields the calls made."""
    calls = []
    monkeypatch.setattr(ops, "backend_for", lambda x: fla_backend)
    for name, fn in recorders(calls).items():
        monkeypatch.setitem(fla_backend.kernels.__dict__, name, fn)
    return calls


def small_model(mech, recipe, dtype):
    """A 2-layer random Llama with GQA (4 query heads, 2 KV heads), linearized, its new parameters moved off
    their initialisation so every path carries signal."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=97)
    model = linearize(transformers.LlamaForCausalLM(cfg).eval(), LinearizeConfig(mechanism=mech, **RECIPES[recipe]))
    perturb_new_params(model, 0.1)
    return model.to(dtype)


@pytest.mark.parametrize("T", [37, 20])
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("mech", MECHANISMS)
def test_kernel_arguments_in_eval_forward_and_decode(mech, recipe, T, fla_calls):
    """The lm-eval forward (bf16, batch 4, no grad) and one decode step hand FLA only arguments it takes."""
    model = small_model(mech, recipe, torch.bfloat16)
    ids = torch.randint(0, 97, (4, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
        cache = LinearCache.for_model(model)
        model(ids, cache=cache, use_cache=True)
        model(ids[:, -1:], cache=cache, use_cache=True)
    names = {name for name, _ in fla_calls}
    assert {FLA_KERNEL[mech], FLA_STEP[mech]} <= names, names


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("mech", ["gla", "kgla"])
def test_gla_padding_changes_no_logit(mech, recipe, fla_calls, monkeypatch):
    """fp32: the forward through fla_backend (short inputs padded to GLA_MIN_T) equals the reference backend's."""
    model = small_model(mech, recipe, torch.float32)
    ids = torch.randint(0, 97, (4, 37), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = model(ids).logits
    assert fla_calls and all(shape[1] >= fla_backend.GLA_MIN_T for _, shape in fla_calls)  # padded before FLA
    monkeypatch.setattr(ops, "backend_for", lambda x: reference)
    with torch.no_grad():
        want = model(ids).logits
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("T", [1, 5, 27, 63, 64, 100])
def test_gla_chunk_padding_is_exact_with_state_and_grad(T, fla_calls):
    """gla_chunk with an initial state: output, final state and every gradient equal the unpadded reference."""
    g = torch.Generator().manual_seed(T)
    B, H, D = 2, 3, 8
    leaves = [torch.randn(B, T, H, D, generator=g) for _ in range(3)]
    leaves.append(torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, generator=g) + 2) / 16)
    leaves.append(torch.randn(B, H, D, D, generator=g) * 0.1)
    a = [t.clone().requires_grad_() for t in leaves]
    b = [t.clone().requires_grad_() for t in leaves]
    o, S = fla_backend.gla_chunk(*a[:4], D ** -0.5, initial_state=a[4], output_final_state=True)
    ro, rS = reference.gla_chunk(*b[:4], D ** -0.5, initial_state=b[4], output_final_state=True)
    assert o.shape == ro.shape
    torch.testing.assert_close(o, ro, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(S, rS, rtol=1e-5, atol=1e-6)
    cot = torch.randn(o.shape, generator=g), torch.randn(S.shape, generator=g)
    grads = torch.autograd.grad((o * cot[0]).sum() + (S * cot[1]).sum(), a)
    r_grads = torch.autograd.grad((ro * cot[0]).sum() + (rS * cot[1]).sum(), b)
    for name, x, y in zip(["dq", "dk", "dv", "dlog_a", "dh0"], grads, r_grads):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    assert [shape[1] for _, shape in fla_calls] == [max(T, fla_backend.GLA_MIN_T)]
