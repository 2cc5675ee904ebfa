"""GPU checks of the launch-overhead work (tests/test_overhead.py counts the kernels on CPU): the fused
window+sink attention (one SDPA call), the short conv's autograd path, a whole linearized model on CUDA
against the CPU reference, GOLINEAR_COMPILE=1 against eager. Marked `gpu`; skipped without CUDA or flash-linear-attention. The step's
speed: tests/test_gpu_train_graph.py (the trainer, eager vs CUDA graph).
Run: python -m pytest -v tests/test_gpu_overhead.py
"""
from __future__ import annotations

import importlib.util

import pytest
import torch
import transformers
from _gpu import DTYPES, TOL, errors_vs_reference, rel
from _tiny import perturb_new_params

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs flash-linear-attention"),
]


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("T", [1, 15, 63, 65, 1000, 4096])
@pytest.mark.parametrize("grad", [False, True], ids=["gather", "unfold-autograd"])
def test_window_sink_softmax(T, dtype, grad):
    from golinear.models.attention.ops import fla_backend, reference
    dt = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(2)
    B, Hq, Hkv, D, s, w = 2, 9, 3, 64, 8, 56
    q, k, v = (torch.randn(B, T, h, D, device="cuda", generator=g).to(dt).requires_grad_(grad) for h in (Hq, Hkv, Hkv))
    (out,), errs = errors_vs_reference(lambda *x: (fla_backend.window_sink_softmax(*x, s, w, D ** -0.5),),
                                       lambda *x: reference.window_sink_attention(*x, s, w, D ** -0.5),
                                       (q, k, v), grad, g)
    tol_o, tol_g = TOL[dt]
    print(f"window_sink_softmax T={T} {dtype} grad={grad}: {errs}")
    assert out.dtype == dt and all(e <= (tol_g if n.startswith("d") else tol_o) for n, e in errs.items()), errs


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "autograd"])
def test_window_reaching_every_key(dtype, grad):
    """window >= T (a full-attention control: window 8192 at 4,096 tokens): SDPA's causal kernel, GQA through
    enable_gqa, against the reference's window + sink softmax."""
    from golinear.models.attention.ops import fla_backend, reference
    dt = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(3)
    B, T, Hq, Hkv, D, s, w = 2, 1000, 9, 3, 64, 0, 8192
    q, k, v = (torch.randn(B, T, h, D, device="cuda", generator=g).to(dt).requires_grad_(grad) for h in (Hq, Hkv, Hkv))
    (out,), errs = errors_vs_reference(lambda *x: (fla_backend.window_sink_softmax(*x, s, w, D ** -0.5),),
                                       lambda *x: reference.window_sink_attention(*x, s, w, D ** -0.5),
                                       (q, k, v), grad, g)
    tol_o, tol_g = TOL[dt]
    assert out.dtype == dt and all(e <= (tol_g if n.startswith("d") else tol_o) for n, e in errs.items()), errs


@pytest.mark.parametrize("p0", [0, 3, 8192])
def test_window_attention_blocked_chunk_form(p0):
    """The fast decoder's prefill form (queries from p0; keys = sinks | previous window | chunk), bf16."""
    from golinear.models.attention.ops import reference, window
    B, Tc, Hq, Hkv, D, s, w = 2, 1000, 32, 8, 128, 8, 56
    g = torch.Generator(device="cuda").manual_seed(0)
    T = p0 + Tc
    q, k, v = (torch.randn(B, T, h, D, device="cuda", generator=g, dtype=torch.bfloat16) for h in (Hq, Hkv, Hkv))
    n_prev = min(p0, w)
    keys, vals = (torch.cat([x[:, :s], x[:, p0 - n_prev:]], 1) for x in (k, v))
    with torch.no_grad():
        got = window.window_attention_blocked(q[:, p0:], keys, vals, w, D ** -0.5, sinks=s, base=s + n_prev,
                                              lo=s, q_pos0=p0)
        want, _ = reference.window_sink_attention(q[:, p0:].float(), k.float(), v.float(), s, w, D ** -0.5,
                                                  q_offset=p0)
    assert rel(got, want) < TOL[torch.bfloat16][0]


@pytest.mark.parametrize("autocast", [False, True])
def test_short_conv_autograd_path(autocast):
    from golinear.models.attention.ops import fla_backend, reference
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2, 1000, 960, device="cuda", generator=g).to(torch.bfloat16 if autocast else torch.float32)
    w = (torch.randn(960, 4, device="cuda", generator=g) * 0.5).requires_grad_()
    x.requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        y, _ = fla_backend.short_conv(x, w)
        ry, _ = reference.short_conv(x, w)
    cot = torch.randn(y.shape, device="cuda", generator=g)
    got = torch.autograd.grad((y.float() * cot).sum(), (x, w))
    want = torch.autograd.grad((ry.float() * cot).sum(), (x, w))
    tol = TOL[torch.bfloat16 if autocast else torch.float32]
    assert rel(y, ry) < tol[0] and all(rel(a, b) < tol[1] for a, b in zip(got, want))


def _tiny(mech="gdn", **opts):
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=576, intermediate_size=256, num_hidden_layers=2, num_attention_heads=9,
                                   num_key_value_heads=3, head_dim=64, vocab_size=300)
    model = linearize(transformers.LlamaForCausalLM(cfg), LinearizeConfig(mechanism=mech, **opts))
    perturb_new_params(model, 0.05)
    return model


def _step(model, ids, autocast):
    model.zero_grad(set_to_none=True)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    # copies: model.cuda() later moves the CPU grads in place, which would turn a reference into the result
    return loss.detach().float().cpu(), {n: p.grad.detach().to("cpu", torch.float32, copy=True)
                                         for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mech,opts", [("gdn", dict(window=56, sinks=8, short_conv=True)), ("hedgehog", {}),
                                       ("hedgehog", dict(window=56, sinks=8))])
def test_train_step_cuda_matches_cpu_reference(mech, opts):
    """The whole layer on CUDA (FLA + fused window/sinks + fused conv), bf16 autocast, vs the CPU reference."""
    model = _tiny(mech, **opts)
    ids = torch.randint(0, 300, (2, 700), generator=torch.Generator().manual_seed(1))
    loss_ref, grads_ref = _step(model, ids, autocast=False)
    loss, grads = _step(model.cuda(), ids.cuda(), autocast=True)
    errs = {n: rel(grads[n], grads_ref[n]) for n in grads_ref}
    print(f"{mech} {opts}: loss {loss.item():.4f} vs {loss_ref.item():.4f}; worst grad {max(errs.values()):.2e}")
    assert abs(loss.item() - loss_ref.item()) < 2e-2 * abs(loss_ref.item())
    assert grads.keys() == grads_ref.keys() and max(errs.values()) < 5e-2, errs


def test_compile_matches_eager_on_cuda(monkeypatch):
    """fp32: compiled == eager up to rounding. Both run FLA's Triton kernels, whose float32 dot products are TF32 on
    the GPU (10 mantissa bits): the compiled elementwise regions round differently in the last float32 bit, and
    where such a difference flips a TF32 rounding the gradient moves by ~2^-11 of its size (seen: 1.4e-3 relative
    after two layers' backward), so the gradients are held to the fp32-vs-reference tolerance of every other FLA
    test (_gpu.TOL), not to float32 rounding; a wrong fusion moves them by O(1). bf16 autocast: the compiled step
    is no further from the fp32 result than the eager bf16 step is (fusion keeps intermediates in fp32, so it may
    differ from eager bf16 by as much as eager bf16 differs from fp32)."""
    model = _tiny("gdn", window=56, sinks=8, short_conv=True).cuda()
    ids = torch.randint(0, 300, (1, 1000), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    runs = {}
    for compile_ in ("0", "1"):
        monkeypatch.setenv("GOLINEAR_COMPILE", compile_)
        for autocast in (False, True):
            runs[compile_, autocast] = _step(model, ids, autocast=autocast)
    (l32, g32), (l32c, g32c) = runs["0", False], runs["1", False]
    assert abs(l32.item() - l32c.item()) < 1e-5 * abs(l32.item())
    assert max(rel(g32c[n], g32[n]) for n in g32) < TOL[torch.float32][1]
    err = {c: max(rel(runs[c, True][1][n], g32[n]) for n in g32) for c in ("0", "1")}
    print(f"bf16 grads vs fp32: eager {err['0']:.2e}, compiled {err['1']:.2e}")
    assert err["1"] < max(1.5 * err["0"], 1e-2), err
