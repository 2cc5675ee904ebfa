"""The settings of a `golinear train` run that change its result, kept in its folder (`train_settings.json`), so
a re-run into the folder continues or reuses that run only under the same settings: a resume with another
sequence length, step count, mechanism or learning rate (which would mix two runs into one checkpoint), and a
finished folder re-run with another setting (which would say "nothing to do"), are refused naming each differing
setting; `--force` starts over. Options that only change how the run is carried out (saving, logging, time
limits, CUDA graphs, the note) are not settings."""
from __future__ import annotations

import json
from pathlib import Path

SETTINGS_FILE = "train_settings.json"
TRAIN_KEYS = ("steps", "seq_len", "batch_size", "seed", "lr", "lora_lr", "weight_decay", "warmup_steps",
              "min_lr_ratio", "grad_clip", "eval_sequences")
DATA_KEYS = ("dataset", "dataset_config", "dataset_split", "dataset_files", "text_field", "heldout_docs",
             "heldout_fraction", "tokens")


def settings(args, cfg, linearize: dict) -> dict:
    """Every setting that changes what a run computes: backbone, linearize options, schedule, data and held-out."""
    data = {k: getattr(args, k, None) for k in DATA_KEYS}  # the books corpus itself: checked by SHA256SUMS
    if data["tokens"] is not None:
        data["tokens"] = str(Path(data["tokens"]).resolve())
    loss = {k: getattr(cfg, k) for k in ("distill", "transfer_steps") if getattr(cfg, k, 0)}  # absent: cross-entropy
    return {"base": args.base, "linearize": linearize, **{k: getattr(cfg, k) for k in TRAIN_KEYS}, **loss, **data}


def recorded(out: Path, record: dict | None) -> dict | None:
    """The settings a folder's run was started with: its settings file, else (a folder written before it) the
    ones its train_config.json names; None when neither is there."""
    path = out / SETTINGS_FILE
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except ValueError as e:
            raise ValueError(f"{str(path)!r} is not readable JSON ({e}); use --force to start the run over") from None
    if record:
        train = record.get("train") or {}
        return {"base": record.get("base"), "linearize": record.get("linearize"),
                **{k: train[k] for k in TRAIN_KEYS if k in train}}
    return None


def differences(want: dict, have: dict) -> list[str]:
    """'name old -> new' for each setting both know and that differs (linearize options one by one)."""
    out = []
    for k in want:
        if k not in have:
            continue
        if k == "linearize" and isinstance(have[k], dict) and isinstance(want[k], dict):
            for o in sorted(set(want[k]) | set(have[k])):
                if json.dumps(want[k].get(o), sort_keys=True) != json.dumps(have[k].get(o), sort_keys=True):
                    out.append(f"{o} {have[k].get(o)!r} -> {want[k].get(o)!r}")
        elif json.dumps(want[k], sort_keys=True) != json.dumps(have[k], sort_keys=True):
            out.append(f"{k} {have[k]!r} -> {want[k]!r}")
    return out


def refuse_other_settings(out: Path, want: dict, have: dict | None, what: str) -> None:
    diff = differences(want, have or {})
    if diff:
        raise ValueError(f"run folder {str(out)!r} holds {what} with other settings ({'; '.join(diff)}); re-run with "
                         "its settings, choose another --out, or --force to start over")
