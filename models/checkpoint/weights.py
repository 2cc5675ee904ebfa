"""Checkpoints hold only the new parameters: `new_params.safetensors` + `config.json` (+ `scorer.safetensors`,
a copy of the retention scorer file, with retain_score=fitted).

`config.json` names the base model and a fingerprint of its weights, so loading onto another base
fails with a clear error instead of silently producing garbage.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from golinear.models.util.atomic import atomic_path, atomic_write
from golinear.models.backbones.backbone import fingerprint, load_backbone, stored_fingerprint
from golinear.models.attention.linearize import (LinearizeConfig, count_new_parameters, linearize, match_new_parameters_to_backbone,
                              new_parameters)
from golinear.models.spec import (CONFIG, SCORER, WEIGHTS, ModelSpec, read_checkpoint_config,  # the one schema of config.json
                         with_cache_options)

FORMAT_VERSION = 1


def save_checkpoint(model, folder: str | os.PathLike, extra: dict | None = None,
                    tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Write the new parameters and the config atomically (a temp folder renamed into place).

    `tensors`: the new parameters already gathered (FSDP shards them; the trainer gathers on every rank)."""
    info = getattr(model.config, "golinear", None)
    if info is None:
        raise ValueError("model is not linearized: nothing to save")
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    names = set(new_parameters(model))
    if tensors is None:
        tensors = {n: p.detach().float().cpu().contiguous() for n, p in new_parameters(model).items()}
    elif set(tensors) != names:
        raise ValueError(f"tensors to save do not match the model's new parameters: missing "
                         f"{sorted(names - set(tensors))[:5]}, unexpected {sorted(set(tensors) - names)[:5]}")
    config = {"format": FORMAT_VERSION, **ModelSpec.from_checkpoint_config(info).to_checkpoint_config(),
              "base_fingerprint": info["base_fingerprint"], "new_parameters": count_new_parameters(model),
              **(extra or {})}
    folder.mkdir(exist_ok=True)  # a run folder also holds the training log: replace our two files only
    scorer = config["linearize"].get("scorer")
    if scorer:  # retain_score=fitted: the scorer file travels with the checkpoint, named relative to it
        if Path(scorer).resolve() != (folder / SCORER).resolve():
            with atomic_path(folder / SCORER) as tmp:
                shutil.copyfile(scorer, tmp)
        config["linearize"]["scorer"] = SCORER
    with atomic_path(folder / WEIGHTS) as tmp:
        save_file(tensors, str(tmp))
    atomic_write(folder / CONFIG, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder


read_config = read_checkpoint_config  # config.json as a dict, naming the file when it is missing or broken


def checkpoint_fingerprint(folder: str | os.PathLike) -> str:
    return hashlib.sha256((Path(folder) / WEIGHTS).read_bytes()).hexdigest()[:16]


def apply_checkpoint(model, folder: str | os.PathLike, base_fingerprint: str | None = None,
                     cache: dict | None = None):
    """Linearize `model` as the checkpoint says and load its parameters. Checks the base fingerprint.
    `cache`: cache options (models.spec.CACHE_KEYS) that replace the checkpoint's own (training-free)."""
    config = read_config(folder)
    if cache:
        config = {**config, "linearize": with_cache_options(config["linearize"], cache, f"checkpoint {str(folder)!r}")}
    fp = base_fingerprint or fingerprint(model)
    if config.get("base_fingerprint") and fp != config["base_fingerprint"]:
        raise ValueError(f"checkpoint {folder} was trained on base {config.get('base')!r} (weights fingerprint "
                         f"{config['base_fingerprint']}), but the given base model has fingerprint {fp}; load it "
                         f"onto the base it was trained on")
    spec = ModelSpec.from_checkpoint_config(config, folder)
    linearize(model, LinearizeConfig.from_dict(spec.linearize_options()), base_name=spec.base, stored_fingerprint=fp)
    tensors = load_file(str(Path(folder) / WEIGHTS))
    broken = {n: int((~torch.isfinite(t)).sum()) for n, t in sorted(tensors.items())
              if t.is_floating_point() and not bool(torch.isfinite(t).all())}
    if broken:
        names = ", ".join(f"{n} ({k} of {tensors[n].numel()})" for n, k in list(broken.items())[:3])
        raise ValueError(f"checkpoint {str(folder)!r} holds non-finite (NaN or infinite) parameters in "
                         f"{len(broken)} tensor(s): {names}; it cannot be evaluated (retrain it, or restore the file)")
    params = new_parameters(model)
    missing, unexpected = sorted(set(params) - set(tensors)), sorted(set(tensors) - set(params))
    if missing or unexpected:
        raise ValueError(f"checkpoint {folder} does not match its config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, p in params.items():
            if p.shape != tensors[name].shape:
                raise ValueError(f"checkpoint tensor {name} has shape {tuple(tensors[name].shape)}, "
                                 f"model expects {tuple(p.shape)}")
            p.copy_(tensors[name].to(p.device))
    return model


def load_checkpoint(folder: str | os.PathLike, base: str | None = None, dtype: str = "float32",
                    device: str = "cpu", cache: dict | None = None):
    """(model, tokenizer, info) for a saved checkpoint on its base (or `base`, which must match), optionally
    under other cache options (`cache`, models.spec.CACHE_KEYS; info["cache_options"] names them)."""
    base = base or ModelSpec.from_checkpoint_config(read_config(folder), folder).base_name
    model, tok = load_backbone(base, dtype=dtype, device="cpu")
    fp = stored_fingerprint(model, base)
    apply_checkpoint(model, folder, base_fingerprint=fp, cache=cache)
    cfg = LinearizeConfig.from_dict(model.config.golinear["linearize"])  # as applied: the cache options in place
    info = {"base": base, "base_fingerprint": fp, "checkpoint": str(folder),
            "checkpoint_fingerprint": checkpoint_fingerprint(folder), "linearize": cfg.to_dict(),
            "new_parameters": count_new_parameters(model), "cache_budget": cfg.cache_budget, "trained": True,
            **({"cache_options": dict(cache)} if cache else {})}
    match_new_parameters_to_backbone(model)
    return model.to(device), tok, info
