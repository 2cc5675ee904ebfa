"""A checkpoint folder's files as the model schema reads them (re-exported by models.spec): its
config.json, a completeness check of its weights, and the short hashes that key store cells by what a model
computes from. No torch at import time."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

WEIGHTS, CONFIG = "new_params.safetensors", "config.json"  # a checkpoint's two files (models.checkpoint.weights)
SCORER = "scorer.safetensors"  # and, with retain_score=fitted, its copy of the scorer file (config.json names it)


def read_checkpoint_config(folder) -> dict:
    """A checkpoint's config.json as a dict; names the file when it is missing or broken."""
    folder = Path(folder)
    if not (folder / CONFIG).exists() or not (folder / WEIGHTS).exists():
        raise FileNotFoundError(f"not a golinear checkpoint: {folder} (needs {CONFIG} and {WEIGHTS})")
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (ValueError, RecursionError) as e:
        raise ValueError(f"checkpoint config {str(folder / CONFIG)!r} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"checkpoint config {str(folder / CONFIG)!r} is not a JSON object")
    lin = config.get("linearize")
    if isinstance(lin, dict) and isinstance(lin.get("scorer"), str):  # saved relative to the folder: it travels
        lin["scorer"] = str((folder / lin["scorer"]).resolve())
    return config


def check_checkpoint_files(folder: str | Path) -> dict:
    """A checkpoint's config.json parses and its safetensors file is complete; returns the config.

    safetensors' header states every tensor's byte range: a file shorter than that (a truncated copy)
    or with a garbled header is refused here, naming the file, instead of as a traceback at load time."""
    from safetensors import SafetensorError, safe_open
    folder = Path(folder)
    config = read_checkpoint_config(folder)  # names the file if its JSON is broken
    if not isinstance(config.get("linearize"), dict):
        raise ValueError(f"checkpoint config {str(folder / CONFIG)!r} has no 'linearize' options")
    weights = folder / WEIGHTS
    try:
        with safe_open(str(weights), framework="pt") as f:
            f.keys()
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"checkpoint weights {str(weights)!r} are unreadable ({e})") from None
    with open(weights, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        try:
            meta = json.loads(fh.read(n))
        except (ValueError, RecursionError):
            raise ValueError(f"checkpoint weights {str(weights)!r} have a damaged header") from None
    end = max((v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__"), default=0)
    size = weights.stat().st_size
    if size < 8 + n + end:
        raise ValueError(f"checkpoint weights {str(weights)!r} are truncated ({size} bytes, the header "
                         f"describes {8 + n + end})")
    return config


def read_layer_scores(path) -> list[float] | None:
    """`golinear diagnose`'s layer_scores JSON (for select=hardness), or None without a path."""
    if not path:
        return None
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--layer-scores file {str(path)!r} does not exist")
    try:
        scores = json.loads(path.read_text())["layer_scores"]
    except (ValueError, RecursionError, KeyError, TypeError) as e:
        raise ValueError(f"--layer-scores file {str(path)!r} is not a `golinear diagnose` layer_scores JSON "
                         f"({type(e).__name__}: {e})") from None
    if not (isinstance(scores, list) and all(isinstance(x, (int, float)) for x in scores)):
        raise ValueError(f"--layer-scores file {str(path)!r}: 'layer_scores' must be a list of numbers")
    return scores


CONTENT_HASH_LIMIT = 64 << 20  # checkpoints (new parameters only) are hashed by content; big backbones by stat


def local_files_identity(value, names: tuple[str, ...] | None = None) -> str | None:
    """For a local folder: a short hash of its files (content up to 64 MB each, else size and mtime); only
    the files in `names` when given.

    It changes when the files change, and (for checkpoints) survives copying the folder elsewhere."""
    if not value:
        return None
    p = Path(str(value)).expanduser()
    if not p.is_dir():
        return None
    h = hashlib.sha256()
    for q in sorted(p.iterdir()):
        if not q.is_file() or q.name.startswith(".") or (names is not None and q.name not in names):
            continue
        st = q.stat()
        h.update(q.name.encode())
        if st.st_size <= CONTENT_HASH_LIMIT:
            h.update(q.read_bytes())
        else:
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:10]


def checkpoint_identity(folder) -> str | None:
    """A checkpoint's identity in store keys: the hash of the two files `apply_checkpoint` loads. The run's
    log, plot and train_config.json beside them change nothing the model computes, so a log line appended
    or a copy of the folder without them (the two files alone, on another machine) keys the same cells; a retrained
    checkpoint (new weights or config) keys new ones."""
    ident = local_files_identity(folder, (CONFIG, WEIGHTS, SCORER))
    outside = ident and _scorer_elsewhere(folder)  # a scorer config.json names outside the folder: it keys too
    return f"{ident}+{file_identity(outside) or 'missing'}" if outside else ident


def _scorer_elsewhere(folder) -> str | None:
    try:
        scorer = read_checkpoint_config(folder).get("linearize", {}).get("scorer")
    except (OSError, ValueError, AttributeError):  # a broken config is named where it is loaded
        return None
    inside = (Path(str(folder)).expanduser() / SCORER).resolve()
    return scorer if isinstance(scorer, str) and Path(scorer).resolve() != inside else None


def file_identity(path) -> str | None:
    """A short hash of one file's contents (a retention scorer's), None when there is no such file."""
    p = Path(str(path)).expanduser()
    return hashlib.sha256(p.read_bytes()).hexdigest()[:10] if p.is_file() else None
