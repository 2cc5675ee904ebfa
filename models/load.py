"""`load_model`: the one entry point from a spec to (model, tokenizer, info).

It sits above models.attention.linearize (a fresh conversion) and models.checkpoint.weights (a saved one, which itself builds
on linearize), so neither of those two has to import the other's caller.
"""
from __future__ import annotations

import math

import torch

from golinear.models.backbones.backbone import DEFAULT_BACKBONE, load_backbone, stored_fingerprint
from golinear.models.checkpoint.weights import load_checkpoint
from golinear.models.attention.linearize import LinearizeConfig, count_new_parameters, linearize, match_new_parameters_to_backbone
from golinear.models.spec import MECHANISMS


def load_model(base: str | None = None, checkpoint: str | None = None, mechanism: str | None = None,
               dtype: str = "float32", device: str = "cpu", seed: int = 0, **options):
    """(model, tokenizer, info): full attention (no mechanism, no checkpoint), a fresh linearization
    (new parameters initialised from `seed`), or a saved checkpoint (models.checkpoint.weights) on its own base
    (`base`, when given, must be the one it was trained on). `options` are LinearizeConfig fields; with a
    checkpoint only its cache options (models.spec.CACHE_KEYS), which replace the checkpoint's own."""
    if checkpoint is not None:
        if mechanism is not None:
            raise ValueError(f"checkpoint {str(checkpoint)!r} already names its mechanism; drop mechanism={mechanism}")
        return load_checkpoint(checkpoint, base=base, dtype=dtype, device=device, cache=options or None)
    base = base or DEFAULT_BACKBONE
    model, tok = load_backbone(base, dtype=dtype, device="cpu")
    info = {"base": base, "base_fingerprint": stored_fingerprint(model, base), "checkpoint": None,
            "checkpoint_fingerprint": None, "linearize": None, "new_parameters": 0,
            "cache_budget": math.inf, "trained": False}
    if mechanism is None:
        if options:
            raise ValueError(f"options {sorted(options)} need a mechanism (allowed: {list(MECHANISMS)})")
        return model.to(device), tok, info
    cfg = LinearizeConfig.from_dict({"mechanism": mechanism, **options})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        linearize(model, cfg, base_name=base, stored_fingerprint=info["base_fingerprint"])
    info.update(linearize=cfg.to_dict(), new_parameters=count_new_parameters(model),
                cache_budget=cfg.cache_budget, init_seed=seed)
    match_new_parameters_to_backbone(model)
    return model.to(device), tok, info
