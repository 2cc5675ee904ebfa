"""LinearizeConfig's checks against a backbone's config, in one place: `linearize` runs them on the loaded model,
`golinear run` / `train` / `diagnose` on the backbone's config.json before any weights load
(models.spec.backbone_checks). Each value and the rules between values are models.spec.values'; this adds what needs
the backbone (window and sinks within its positions, full-attention layers within its layers) and picks the layers
kept as full attention."""
from __future__ import annotations

from types import SimpleNamespace

from golinear.models.spec.schema import FIELD_DEFAULTS
from golinear.models.spec.values import LINEARIZE_KEYS, check_option_pairs, linearize_values


def full_attention_layers(options, config) -> list[int]:
    """Every check of linearize options (a LinearizeConfig, a ModelSpec with the same fields, or a dict of them as
    config.json holds them, missing ones at their defaults) against the backbone's transformers config; the sorted
    indices of the layers kept as full attention."""
    n = config.num_hidden_layers
    if not isinstance(options, dict):
        options = {k: getattr(options, k) for k in LINEARIZE_KEYS}
    given = linearize_values({"mechanism": "gdn", **options})  # each value against its allowed set
    cfg = SimpleNamespace(**{**{k: FIELD_DEFAULTS[k] for k in LINEARIZE_KEYS}, **given})
    max_len = getattr(config, "max_position_embeddings", None) or 1 << 20
    for name in ("window", "sinks"):
        if getattr(cfg, name) > max_len:
            raise ValueError(f"{name}={getattr(cfg, name)} exceeds the model's max_position_embeddings={max_len}")
    budget = cfg.sinks + cfg.window + cfg.retain
    if budget > max_len:
        raise ValueError(f"cache budget sinks+window+retain={budget} exceeds max_position_embeddings={max_len}")
    check_option_pairs(given)
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
