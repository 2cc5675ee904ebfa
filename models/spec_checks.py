"""The checks of a model configuration that need files but no weights: the backbone's config.json (a few KB)
for the linearize options, a checkpoint's files. They run before any model loads (issue #18); the values
themselves are checked in models.spec."""
from __future__ import annotations

import json
from pathlib import Path

from models.spec import CONFIG, WEIGHTS, read_checkpoint_config


def backbone_config(base: str):
    """The backbone's transformers config (no weights), or a one-line ValueError naming `base`."""
    import transformers
    from models.backbone import DEFAULT_BACKBONE, check_architecture, resolve
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


def check_linearize(options: dict, base: str) -> None:
    """Every LinearizeConfig check (models.linearize.validate) against the backbone's config, before loading."""
    from models.linearize import LinearizeConfig, validate
    validate(LinearizeConfig.from_dict(options), backbone_config(base))


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
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"checkpoint weights {str(weights)!r} have a damaged header") from None
    end = max((v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__"), default=0)
    size = weights.stat().st_size
    if size < 8 + n + end:
        raise ValueError(f"checkpoint weights {str(weights)!r} are truncated ({size} bytes, the header "
                         f"describes {8 + n + end})")
    return config
