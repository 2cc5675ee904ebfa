"""Backbone architectures as data, no torch: the named configurations (random-weight speed, memory and scaling
runs, parameter counts) and the model types whose attention golinear can linearize. The CLI's help lists the
names from here; models.backbones.backbone and models.backbones.random_base build models from them."""
from __future__ import annotations

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

# Named configurations for parameter counts and speed-only runs on random weights.
NAMED_CONFIGS = {
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False),
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     tie_word_embeddings=False),
    "qwen3-32b": dict(model_type="qwen3", hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                      num_attention_heads=64, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                      max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=False),
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True),
}


def named_config(name: str):
    """A transformers config for one of NAMED_CONFIGS (random weights: speed and parameter counts)."""
    if name not in NAMED_CONFIGS:
        raise ValueError(f"unknown named configuration {name!r}; allowed: {sorted(NAMED_CONFIGS)}")
    import transformers
    kw = dict(NAMED_CONFIGS[name])
    return transformers.AutoConfig.for_model(kw.pop("model_type"), **kw)


def check_architecture(config) -> None:
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported architecture {model_type!r}; golinear supports attention of "
                         f"model types {list(SUPPORTED_MODEL_TYPES)}")
