"""The short convolution of the CUDA backend (models.attention.ops.fla_backend.short_conv), in plain PyTorch (the prefill's
inference path uses FLA's conv kernel instead: fla_backend.conv_fresh, one pass instead of W). (Not named
short_conv.py: importing a submodule `models.attention.ops.short_conv` would replace the dispatching op of that name.)

Same signature and conventions as `models.attention.ops.reference.short_conv` (x [B, T, D], weight [D, W], state
[B, D, W-1] of the last inputs). Without autograd: shifted multiply-adds in x's dtype (one fused kernel under
GOLINEAR_COMPILE=1); with autograd: one depthwise conv1d.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from golinear.models.attention.ops import reference
from golinear.models.attention.ops.compile import compile_enabled, compiled


def short_conv(x, weight, state=None, output_final_state=False):
    """Without autograd: W shifted multiply-adds in x's dtype on the [B, T, D] layout (no fp32 copies,
    transposes or padded copy of x); with autograd: one depthwise conv1d (cuDNN), in fp32 like the
    reference, or in the autocast dtype under autocast (where conv1d would be cast down anyway)."""
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[-1] or weight.shape[1] < 1:
        return reference.short_conv(x, weight, state, output_final_state)  # raises the reference's error
    if state is not None:
        reference.check_state(state, (x.shape[0], x.shape[-1], weight.shape[1] - 1), "state")
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                    (state is not None and state.requires_grad)):
        return _short_conv_autograd(x, weight, state, output_final_state)
    B, T, D = x.shape
    W = weight.shape[1]
    w = weight.to(x.dtype)
    if compile_enabled():  # one fused kernel (GOLINEAR_COMPILE=1)
        return _short_conv_fused(x, w, state), (last_inputs(x, state, W) if output_final_state else None)
    y = x * w[:, W - 1]
    for i in range(W - 1):
        shift = W - 1 - i  # tap i reads input t - shift
        if shift < T:
            y[:, shift:].addcmul_(x[:, :T - shift], w[:, i])
        if state is not None:  # rows t < shift read the previous inputs state[..., t + i]
            r = min(shift, T)
            y[:, :r].addcmul_(state[:, :, i:i + r].transpose(1, 2).to(x.dtype), w[:, i])
    return y, (last_inputs(x, state, W) if output_final_state else None)


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


def last_inputs(x, state, W):
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
    dt = x.dtype if autocast else reference.compute_dtype(x)
    xt = x.to(dt).transpose(1, 2)  # [B, D, T]
    if state is None:  # zero left padding inside the conv; it also pads W-1 columns on the right: drop them
        y = F.conv1d(xt, weight.to(dt).unsqueeze(1), padding=W - 1, groups=D)[..., :T]
    else:
        y = F.conv1d(torch.cat([state.to(dt), xt], -1), weight.to(dt).unsqueeze(1), groups=D)
    new_state = last_inputs(x, state, W) if output_final_state else None
    return y.transpose(1, 2).to(x.dtype), new_state
