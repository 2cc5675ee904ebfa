"""Convert a pretrained decoder into a linearized model: swap attention modules, freeze the backbone.

`linearize(model, LinearizeConfig(...))` replaces `self_attn` of every layer not kept as full attention
by `LinearizedAttention`, adds short convs / LoRA when asked, and makes only the new parameters
trainable. The model keeps its class (plus a generation mixin that builds `LinearCache`), so
`model.generate`, `save_pretrained`-free checkpoints (models.checkpoint.weights) and lm-eval's HFLM work.
"""
from __future__ import annotations

import dataclasses

import torch

from golinear.models.backbones.cache_arg import cache_kwarg
from golinear.models.backbones.backbone import check_architecture, fingerprint
from golinear.models.cache.hf_cache import LinearCache
from golinear.models.attention.layers import LinearizedAttention
from golinear.models.retention.scorer import scorer_for_model
from golinear.models.attention.projection import decoder_layers
from golinear.models.spec import CONV_ON, RETAIN_SCORES, linearize_values, without_unused_retention
from golinear.models.spec.linearize_checks import full_attention_layers  # every check of the options: there


@dataclasses.dataclass
class LinearizeConfig:
    mechanism: str = "gdn"          # gla | kgla | gdn | hedgehog | none (window/sinks only, no state)
    window: int = 0                 # sliding-window tokens on the disjoint softmax path
    sinks: int = 0                  # first tokens kept exactly; cache budget = sinks + window
    short_conv: bool = False        # causal depthwise convs (kernel conv_size) on q, k, v
    conv_size: int = 4
    lora: bool = False              # LoRA on Wq, Wk, Wv through PEFT
    lora_rank: int = 8
    lora_alpha: int = 16
    full_layers: list[int] | None = None  # explicit full-attention layers (hybrid)
    keep_full: float = 0.0          # or: this fraction of layers kept as full attention ...
    select: str = "uniform"         # ... chosen uniformly over depth or by layer_scores (hardest kept)
    layer_scores: list[float] | None = None
    gate_rank: int = 16             # GLA gate low rank
    feature_dim: int = 64           # Hedgehog feature dim per half
    retain: int = 0                 # retention slots per KV head (GDN with a window): docs/retention.md
    retain_score: str = RETAIN_SCORES[0]  # what earns a slot when a token leaves the window
    out_norm: bool = False          # per-head output RMSNorm after the op (gla/kgla/gdn); its weight starts at 1
    conv_on: str = CONV_ON[0]       # the short conv feeds both paths, or the linear path only (models.spec.CONV_ON)
    scorer: str | None = None       # retain_score=fitted: the scorer file (models.retention.scorer)

    @property
    def cache_budget(self) -> int:
        return self.sinks + self.window + self.retain

    def to_dict(self) -> dict:
        """The fields (without the retention keys when retain is 0, out_norm when off and conv_on when "both":
        records made before these options existed match)."""
        return without_unused_retention(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict) -> "LinearizeConfig":
        """Options checked and normalised by models.spec (one allowed set and message per value)."""
        return cls(**linearize_values(d))


DEFAULT_RECIPE = LinearizeConfig(mechanism="gdn", window=56, sinks=8, short_conv=True)


class LinearGenerationMixin:
    """Makes `generate` build a LinearCache instead of a DynamicCache."""

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        (name, _), = cache_kwarg(self, None).items()  # the installed transformers' name for the cache
        if model_kwargs.get(name) is None and generation_config.use_cache is not False:
            model_kwargs[name] = LinearCache.for_model(self)
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)


def linearize(model, cfg: LinearizeConfig, base_name: str | None = None, stored_fingerprint: str | None = None):
    """Linearize `model` in place and return it. Only the new parameters require grad afterwards.

    stored_fingerprint: the backbone's float32 fingerprint (models.backbones.backbone.stored_fingerprint) when the caller
    knows it; a fitted retention scorer is checked against it (or the model's own, when float32).

    With out_norm the norm's weight starts at 1 here (no data); `golinear train` calibrates it to the attention
    output's per-head rms on its first batch before step 0 (models.training.out_norm_calibration)."""
    check_architecture(model.config)
    full = full_attention_layers(cfg, model.config)
    if any(isinstance(layer.self_attn, LinearizedAttention) for layer in decoder_layers(model)):
        raise ValueError("model is already linearized")
    base_fp = None if model.device.type == "meta" else fingerprint(model)
    if stored_fingerprint is None and base_fp and next(model.parameters()).dtype == torch.float32:
        stored_fingerprint = base_fp
    scorer = scorer_for_model(cfg.scorer, model.config, stored_fingerprint) if cfg.scorer else None
    model.requires_grad_(False)
    for idx, layer in enumerate(decoder_layers(model)):
        if idx in full:
            continue
        layer.self_attn = LinearizedAttention(layer.self_attn, model.config, idx, cfg.mechanism, cfg.window,
                                              cfg.sinks, cfg.short_conv, cfg.conv_size, cfg.gate_rank,
                                              cfg.feature_dim, cfg.retain, cfg.retain_score, cfg.out_norm,
                                              cfg.conv_on, None if scorer is None else (scorer[0][idx], scorer[1][idx]))
        for name in ("lin", "conv"):  # new parameters stay fp32 (they are tiny); frozen ones keep their dtype
            sub = getattr(layer.self_attn, name)
            if sub is not None:
                sub.to(dtype=torch.float32)
    if cfg.lora:
        _add_lora(model, cfg, full)
    for p in new_parameters(model).values():  # (PEFT's injection freezes everything but its adapters)
        p.requires_grad_(True)
    cls = type(model)
    if not issubclass(cls, LinearGenerationMixin):
        model.__class__ = type(f"Linearized{cls.__name__}", (LinearGenerationMixin, cls), {})
    model.config.golinear = {"linearize": cfg.to_dict(), "full_layers": full, "base": base_name,
                             "base_fingerprint": base_fp}
    return model


def _add_lora(model, cfg: LinearizeConfig, full: list[int]):
    from peft import LoraConfig, inject_adapter_in_model
    lin_layers = [i for i in range(model.config.num_hidden_layers) if i not in full]
    pattern = r".*\.layers\.(" + "|".join(map(str, lin_layers)) + r")\.self_attn\.(q_proj|k_proj|v_proj)"
    inject_adapter_in_model(LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                       target_modules=pattern), model)
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()


def new_parameters(model) -> dict[str, torch.nn.Parameter]:
    """The parameters linearization added (the only trainable ones)."""
    return {n: p for n, p in model.named_parameters() if _is_new(n)}


def _is_new(name: str) -> bool:
    return ".self_attn.lin." in name or ".self_attn.conv." in name or "lora_" in name


def match_new_parameters_to_backbone(model) -> None:
    """Give the new parameters the frozen backbone's dtype, for inference without autocast.

    linearize() keeps them in fp32 for training (under autocast); a model loaded in bf16 to evaluate would
    otherwise mix bf16 activations with fp32 gate and feature-map weights (a dtype error in the first matmul).
    """
    dtype = model.get_input_embeddings().weight.dtype
    with torch.no_grad():
        for p in new_parameters(model).values():
            p.data = p.data.to(dtype)


def count_new_parameters(model) -> int:
    return sum(p.numel() for p in new_parameters(model).values())


def count_for_config(name: str, cfg: LinearizeConfig) -> int:
    """New-parameter count for a named configuration (built on the meta device: no memory)."""
    from golinear.models.backbones.backbone import random_backbone
    return count_new_parameters(linearize(random_backbone(name, device="meta"), cfg))


def decode_state_bytes(model, batch: int = 1, dtype_bytes: int = 4, context: int = 0) -> int:
    """Per-sequence decode memory (bytes) of the cache after `context` tokens, computed from shapes."""
    c = model.config
    info = model.config.golinear
    cfg = LinearizeConfig.from_dict(info["linearize"])
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    H, Hkv = c.num_attention_heads, c.num_key_value_heads
    per_layer = 2 * Hkv * hd * min(context, cfg.cache_budget) * dtype_bytes  # sink + window KV
    if cfg.mechanism in ("gla", "kgla", "gdn"):
        per_layer += H * hd * hd * 4  # fp32 state
    elif cfg.mechanism == "hedgehog":
        f = 2 * cfg.feature_dim
        per_layer += (H * f * hd + H * f) * 4
    if cfg.mechanism != "none":  # window tokens' pending linear inputs
        per_layer += min(context, cfg.window) * H * hd * 3 * 4
    if cfg.retain:  # retention slots (their KV is in the budget above): a score per KV head, the linear inputs
        held = min(max(context - cfg.sinks - cfg.window, 0), cfg.retain)  # they fold with per query head
        per_layer += held * (Hkv * dtype_bytes + H * (2 * hd + 2) * 4)
    if cfg.short_conv:
        per_layer += (H + 2 * Hkv) * hd * (cfg.conv_size - 1) * dtype_bytes
    full_layer = 2 * Hkv * hd * context * dtype_bytes
    n_full = len(info["full_layers"])
    return batch * ((c.num_hidden_layers - n_full) * per_layer + n_full * full_layer)
