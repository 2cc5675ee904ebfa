"""conv_on (models.spec.CONV_ON): which path the short conv feeds, a small part the layer composes.

"both" (the default, the paper's recipe) feeds one convolved q/k/v to both paths. "linear" feeds the convolved
q/k/v to the linear path and its conv state only, while the window + sinks (and the decode ring's and sinks' K/V)
read the frozen projections' q/k/v, projected once more without the conv (an ablation: docs/study.md "Why the
gap"). The chunked prefill and the fused decode step implement "both" only (models.decoding.prefill refuses "linear",
models.attention.ops.fused_decode.applies leaves such a layer to the plain step); the retention path projects once for both.
"""
from __future__ import annotations

from golinear.models.attention.projection import project_qkv


class ConvOnBoth:
    """One convolved q/k/v for the softmax and the linear path."""
    linear_only = False

    def softmax_qkv(self, layer, x, pe, q, k, v):
        return q, k, v


class ConvOnLinear:
    """The softmax path reads the frozen projections' q/k/v (norm + RoPE, no conv)."""
    linear_only = True

    def softmax_qkv(self, layer, x, pe, q, k, v):
        if not layer.has_softmax_path:
            return q, k, v
        return project_qkv(layer, x, pe)[1:4]


def conv_feed(conv_on: str, short_conv: bool):
    """The part for a layer's `conv_on` (without a short conv there is nothing to choose: both)."""
    return ConvOnLinear() if short_conv and conv_on == "linear" else ConvOnBoth()
