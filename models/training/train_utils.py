"""Helpers of `golinear train` (models.training.train): RNG state, seeding, atomic run-folder writes, the training
log, the loss plot and the held-out loss."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

from golinear.models.util.atomic import atomic_path, atomic_write


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)



def atomic_write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2, default=str) + "\n")


@torch.no_grad()
def heldout_loss(model, sequences: torch.Tensor, device, bf16: bool) -> float:
    """Token-weighted mean next-token cross-entropy over the held-out sequences."""
    total, count = 0.0, 0
    for seq in sequences:
        ids = seq.unsqueeze(0).to(device)
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        n = ids.shape[1] - 1
        total += float(loss) * n
        count += n
    return total / count


def read_json(path: Path) -> dict:
    """A JSON object from the run folder, or a one-line error naming the file."""
    try:
        data = json.loads(path.read_text())
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{str(path)!r} is not valid JSON ({e}); delete it or use --force") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} is not a JSON object; delete it or use --force")
    return data


def read_log(path: Path) -> list[dict]:
    """The training log; a last line cut short by a kill is dropped (every other line must parse)."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except (ValueError, RecursionError):
            if i == len(lines) - 1:
                break
            raise ValueError(f"training log {str(path)!r}: line {i + 1} is not JSON") from None
    return out


def plot_loss(log: list[dict], png: Path, title: str = "", heldout: dict | None = None) -> None:
    """Training loss against tokens seen, with the held-out losses as horizontal lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if log:
        tokens = [r["tokens"] / 1e6 for r in log]
        ax.plot(tokens, [r["loss"] for r in log], lw=1.0, label="train loss")
    for (name, value), color in zip((heldout or {}).items(), ("k", "tab:red", "tab:green")):
        if value is not None:
            ax.axhline(value, ls="--", lw=1.0, color=color, label=f"{name}: {value:.3f}")
    ax.set_xlabel("training tokens (M)")
    ax.set_ylabel("cross-entropy")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
