"""What a retention scorer was fitted to (needle value type, value format, seed), and the one label rule that uses it:
a row whose scorer was fitted to the value type of the needles it is tested on says so in its label.

Why: a scorer fitted to keep 7-digit numbers and tested on 7-digit needles is tuned to the test's format; its rows
must not read like those of a scorer tested on a format it never saw. Every renderer that names such a row (claims,
retention.md / .csv / .png, the S-NIAH-by-value-type table) takes its label from `fitted_label`.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from golinear.models.retention.scorer import load_scorer

CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints" / "smollm2-135m"
SCORERS = CHECKPOINTS / "scorers"
CHECKPOINT_SCORER = "scorer.safetensors"  # a checkpoint trained with retain_score=fitted keeps its copy under this name
# Files written before the fit recorded its seed and format: `scripts/retention_scorer_probe.py fit` drew the values
# with random.Random(0), 7-digit numbers from randrange(10**6, 10**7) or one of its 24 English words.
LEGACY_SEED = 0
LEGACY_FORMATS = {"numbers": "7-digit numbers, randrange(10**6, 10**7)",
                  "words": "one of 24 English words (retention_scorer_probe.WORDS)"}


def scorer_fit(meta: dict) -> dict:
    """{value_type, value_format, seed} a scorer file's metadata says it was fitted to; value_type None for a
    scorer not fitted to inserted values (the attention-mass targets, random weights)."""
    if "value_type" in meta:
        return {k: meta.get(k) for k in ("value_type", "value_format", "seed")}
    fit = meta.get("fit") if isinstance(meta.get("fit"), dict) else {}
    if fit.get("target") not in ("value", "retrieval"):
        return {"value_type": None, "value_format": None, "seed": None}
    kind = fit.get("values", "words")
    return {"value_type": kind, "value_format": LEGACY_FORMATS.get(kind), "seed": LEGACY_SEED}


@functools.lru_cache(maxsize=None)
def file_fit(path: str) -> dict:
    return scorer_fit(load_scorer(path)[2])


def scorer_path(target: str, checkpoints: Path = CHECKPOINTS) -> Path | None:
    """The scorer file a row's run uses: `scorer=NAME` (a file in checkpoints/<base>/scorers/), else a checkpoint
    folder's own copy when it was trained with one; None when the row uses no scorer."""
    parts = [p.strip() for p in target.split(",") if p.strip()]
    named = [p.split("=", 1)[1] for p in parts if p.startswith("scorer=")]
    if named:
        p = Path(named[0]).expanduser()
        return p if p.is_absolute() or p.parent != Path(".") else Path(checkpoints) / "scorers" / p
    if parts and "=" not in parts[0]:
        folder = Path(parts[0]).expanduser()
        folder = folder if folder.is_dir() else Path(checkpoints) / parts[0]
        config = folder / "config.json"
        if (folder / CHECKPOINT_SCORER).is_file() and config.is_file():
            if json.loads(config.read_text()).get("linearize", {}).get("retain_score") == "fitted":
                return folder / CHECKPOINT_SCORER
    return None


def fitted_value_type(target: str, checkpoints: Path = CHECKPOINTS) -> str | None:
    """The needle value type the scorer of a row's run was fitted to (None: no scorer, or not fitted to values)."""
    path = scorer_path(target, checkpoints)
    return file_fit(str(path))["value_type"] if path is not None and path.is_file() else None


def fitted_label(label: str, fitted_type: str | None, test_types) -> str:
    """The label rule: `label`, plus a note when the scorer was fitted to a value type the row is tested on."""
    if fitted_type is None or fitted_type not in set(test_types):
        return label
    return f"{label} [fitted to the test's value type: {fitted_type}]"


def needle_value_types(tasks) -> set[str]:
    """The needle value types of RULER / S-NIAH tasks (lm-eval or display names); tasks without needles add none."""
    from golinear.tasks.ruler.api import resolve_task
    return {t for t in (resolve_task(name).value_type for name in tasks) if t}



def row_label(name: str, model: str, tasks) -> str:
    """`name` of a row whose runs are `model` (a spec label: checkpoint folder and cache options), shown on `tasks`
    (RULER / S-NIAH task or display names; others, e.g. CR, have no needles), under the label rule."""
    from golinear.tasks.ruler.api import TASKS
    known = set(TASKS) | {t.display for t in TASKS.values()}
    return fitted_label(name, fitted_value_type(model or ""), needle_value_types([t for t in tasks if t in known]))
