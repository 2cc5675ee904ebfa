"""Calibrate the opt-in output norm (out_norm) before training: each linearized layer's OutputNorm weight is set
to the per-head rms of its frozen softmax attention output (before o_proj) on one batch.

Why: a weight of 1 makes the normalised output far larger than the attention output the frozen o_proj expects,
and AdamW moves a scale by about lr per step (docs/study.md, "Strict GDN at 135M": 13.2 at init with 1, 11.5
calibrated). The batch runs teacher-forced: each linearized layer passes its softmax output on, so every layer
sees the full-attention model's hidden states (the probe's `onorm-cal`)."""
from __future__ import annotations

import torch

from golinear.models.attention.layers import LinearizedAttention
from golinear.models.attention.projection import decoder_layers


@torch.no_grad()
def calibrate_out_norm(model, ids: torch.Tensor, bf16: bool = False) -> dict:
    """Set every out_norm weight [H, D] to its head's rms (the same for each d) on `ids` [B, T]; returns the
    record for train_config.json."""
    layers = [layer.self_attn for layer in decoder_layers(model) if isinstance(layer.self_attn, LinearizedAttention)
              and getattr(layer.self_attn.lin, "out_norm", None) is not None]
    if not layers:
        raise ValueError("calibrate_out_norm: the model has no linearized layer with out_norm=true")
    rms = {}

    def teacher(attn, args, kwargs, output):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        y = attn.full_attention_heads(x, kwargs["position_embeddings"])
        rms[attn.layer_idx] = y.float().pow(2).mean(dim=(0, 1, 3)).sqrt()
        return attn.o_proj(y.reshape(*x.shape[:2], -1).to(x.dtype)), None

    handles = [attn.register_forward_hook(teacher, with_kwargs=True) for attn in layers]
    try:
        with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=bf16):
            model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    for attn in layers:
        weight = attn.lin.out_norm.weight
        weight.copy_(rms[attn.layer_idx].view(-1, 1).expand_as(weight).to(weight.dtype))
    return {"tokens": int(ids.numel()), "hidden_states": "full attention (teacher-forced)",
            "layers": [attn.layer_idx for attn in layers],
            "rms_per_layer_mean": [round(float(rms[attn.layer_idx].mean()), 6) for attn in layers]}
