"""`golinear cards`: rewrite the model card (README.md) of every checkpoint folder from the result store.

Why: `golinear train` writes a card before anything is evaluated; the scores arrive later in the store. A cell
belongs to a card when its model key names the folder and the hash of the folder's current files, with no other
model options (the same weights under other cache options, e.g. retention slots added at evaluation, are another
model), so scores of retrained weights never reach a card.
"""
from __future__ import annotations

import os
from pathlib import Path

from golinear.bench.results.store import Store
from golinear.models.checkpoint.model_card import write_card
from golinear.models.spec import checkpoint_identity, store_key_parts

OWN_KEYS = {"base", "checkpoint", "checkpoint_files"}


def setting(config: dict) -> str:
    words = []
    if config.get("limit"):
        words.append(f"first {config['limit']}")
    if config.get("num_fewshot"):
        words.append(f"{config['num_fewshot']}-shot")
    if config.get("context_length"):
        words.append(f"context {config['context_length']}")
    return ", ".join(words) or "full set"


def scores_for(cells: list[dict], name: str, identity: str) -> list[dict]:
    """The card rows of one checkpoint: each cell's reported metric (and LAMBADA's perplexity) with its n."""
    out = []
    for c in cells:
        parts = store_key_parts(c["key"]["model"])  # escaped names read back as written
        if set(parts) - OWN_KEYS or parts.get("checkpoint") != name or parts.get("checkpoint_files") != identity:
            continue
        for metric, m in sorted(c.get("metrics", {}).items()):
            metric = metric.split(",")[0]
            if m.get("value") is None or metric not in (c.get("metric"), "perplexity"):
                continue
            out.append({"task": c.get("display") or c["task"], "metric": metric, "value": m["value"],
                        "stderr": m.get("stderr"), "n": c.get("n"), "setting": setting(c["key"].get("config", {}))})
    return out


def checkpoint_folders(root: Path) -> list[Path]:
    if (root / "config.json").is_file():
        return [root]
    return sorted(p for p in root.iterdir()
                  if (p / "config.json").is_file() and (p / "new_params.safetensors").is_file())


def shown_path(folder: Path) -> str:
    """The folder relative to the working directory when it lies below it (the repository's checkpoints/...)."""
    try:
        return Path(os.path.relpath(folder.resolve(), Path.cwd())).as_posix() if folder.resolve().is_relative_to(
            Path.cwd()) else str(folder)
    except ValueError:
        return str(folder)


def main(args) -> int:
    root, store = Path(args.checkpoints), Store(args.store)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoints folder {str(root)!r} does not exist")
    if not store.cells_dir.is_dir():
        raise FileNotFoundError(f"{str(store.root)!r} is not a result store (no cells/ folder)")
    folders = checkpoint_folders(root)
    if not folders:
        raise ValueError(f"no checkpoint folders (config.json + new_params.safetensors) in {str(root)!r}")
    cells, changed = store.cells(), 0
    for folder in folders:
        scores = scores_for(cells, folder.name, checkpoint_identity(folder))
        if write_card(folder, scores, store_name=f"`{shown_path(Path(args.store))}`", shown=shown_path(folder)):
            changed += 1
            print(f"  {folder / 'README.md'}: {len(scores)} scores")
    print(f"golinear cards: {changed} of {len(folders)} model card(s) changed under {root}")
    return 0
