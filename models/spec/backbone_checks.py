"""The checks of linearize options against the backbone: its config.json (a few KB), read before any weights load,
and the same checks when `linearize` converts a loaded model (the one place of LinearizeConfig's validation). Each
value and the rules between values are models.spec.values'; this adds what needs the backbone (window and sinks
within its positions, full-attention layers within its layers) and picks the layers kept as full attention."""
from __future__ import annotations

from pathlib import Path

from golinear.models.spec.schema import ModelSpec
from golinear.models.spec.values import CACHE_KEYS, LINEARIZE_KEYS, check_option_pairs, linearize_values


def backbone_config(base: str):
    """The backbone's transformers config (no weights), or a one-line ValueError naming `base`."""
    import transformers
    from golinear.models.backbones.backbone import DEFAULT_BACKBONE, check_architecture, resolve
    path = resolve(base)
    local = Path(path).expanduser()
    if local.exists() and not (local / "config.json").is_file():
        raise ValueError(f"base {base!r} is a folder without config.json; allowed: {DEFAULT_BACKBONE!r} "
                         "(embedded), a Hugging Face model folder or a hub id")
    if not local.exists() and (path.count("/") != 1 or path.startswith((".", "/", "~"))):
        raise ValueError(f"base {base!r} is neither a local folder nor a hub id (owner/name); the embedded "
                         f"default is {DEFAULT_BACKBONE!r}")
    try:
        config = transformers.AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"base {base!r}: cannot read its config ({first})") from None
    check_architecture(config)
    return config


def check_against_backbone(spec: ModelSpec) -> None:
    """A spec's checks against its backbone before loading: a fresh linearization's options, or a checkpoint's
    under other cache options; else the backbone's config alone (it exists, its architecture is supported)."""
    if spec.mechanism is not None and not spec.checkpoint:
        check_linearize(spec.linearize_options(), spec.base_name)
    elif spec.checkpoint and set(spec.given()) & set(CACHE_KEYS):  # a checkpoint under other cache options
        check_linearize(spec.checkpoint_linearize(), spec.base_name)
    else:
        backbone_config(spec.base_name)


def check_linearize(options: dict, base: str) -> None:
    """Every check of linearize options (LinearizeConfig's fields; missing ones at their defaults) against the
    backbone `base`'s config, before loading."""
    full_attention_layers(ModelSpec(**{"mechanism": "gdn", **linearize_values(options)}), backbone_config(base))


def full_attention_layers(cfg, config) -> list[int]:
    """Every check of linearize options (`cfg`: a LinearizeConfig, or a ModelSpec, with the same fields) against the
    backbone's transformers config; the sorted indices of the layers kept as full attention."""
    n = config.num_hidden_layers
    options = {k: getattr(cfg, k) for k in LINEARIZE_KEYS}
    linearize_values(options)  # each value against its allowed set
    max_len = getattr(config, "max_position_embeddings", None) or 1 << 20
    for name in ("window", "sinks"):
        if getattr(cfg, name) > max_len:
            raise ValueError(f"{name}={getattr(cfg, name)} exceeds the model's max_position_embeddings={max_len}")
    budget = cfg.sinks + cfg.window + cfg.retain
    if budget > max_len:
        raise ValueError(f"cache budget sinks+window+retain={budget} exceeds max_position_embeddings={max_len}")
    check_option_pairs(options)
    if cfg.full_layers is not None:
        if cfg.keep_full:
            raise ValueError("give either full_layers or keep_full, not both")
        bad = [i for i in cfg.full_layers if not isinstance(i, int) or not 0 <= i < n]
        if bad:
            raise ValueError(f"full-attention layer indices {bad} out of range; allowed: 0..{n - 1}")
        if len(set(cfg.full_layers)) == n:
            raise ValueError("every layer is kept as full attention: nothing to linearize")
        return sorted(set(cfg.full_layers))
    k = round(cfg.keep_full * n)
    if k == 0:
        return []
    if cfg.select == "uniform":
        return sorted({min(n - 1, int((i + 0.5) * n / k)) for i in range(k)})
    scores = cfg.layer_scores
    if scores is None or len(scores) != n:
        raise ValueError(f"select='hardness' needs layer_scores with one score per layer ({n}), "
                         f"got {None if scores is None else len(scores)}")
    return sorted(sorted(range(n), key=lambda i: (-scores[i], i))[:k])
