"""Shared by the GPU test files: tolerances, the relative error, and a fused op checked against the reference."""
from __future__ import annotations

import torch

TOL = {torch.float32: (5e-3, 1e-2), torch.bfloat16: (1.5e-2, 3e-2)}  # (outputs/states, gradients)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def rel(x, ref):
    x, ref = x.double(), ref.double()
    assert torch.isfinite(x).all(), "non-finite values"
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def errors_vs_reference(fn, ref_fn, inputs, grad, generator, names=("out",)):
    """(fn's outputs, relative errors): fn(*inputs) against ref_fn on fp32 copies, output by output (`names`),
    and with grad the q/k/v gradients of the first output under one random cotangent."""
    with torch.set_grad_enabled(grad):
        got = fn(*inputs)
    ref_inputs = [t.detach().float().requires_grad_(grad) for t in inputs]
    with torch.set_grad_enabled(grad):
        want = ref_fn(*ref_inputs)
    errs = {n: rel(a, b) for n, a, b in zip(names, got, want)}
    if grad:
        cot = torch.randn(want[0].shape, device=want[0].device, generator=generator)
        gr = torch.autograd.grad((got[0].float() * cot).sum(), inputs)
        r_gr = torch.autograd.grad((want[0] * cot).sum(), ref_inputs)
        errs.update({f"d{n}": rel(a, b) for n, a, b in zip("qkv", gr, r_gr)})
    return got, errs
