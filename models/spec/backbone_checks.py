"""The checks of a model configuration against its backbone that need files but no weights: the backbone's
config.json (a few KB) for the linearize options. They run before any model loads; the values
themselves, and a checkpoint's files, are checked in models.spec."""
from __future__ import annotations

from pathlib import Path

from golinear.models.spec.linearize_checks import full_attention_layers
from golinear.models.spec.schema import ModelSpec
from golinear.models.spec.values import CACHE_KEYS


def backbone_config(base: str):
    """The backbone's transformers config (no weights), or a one-line ValueError naming `base`."""
    import transformers
    from golinear.models.backbones.backbone import DEFAULT_BACKBONE, check_architecture, resolve
    path = resolve(base)
    local = Path(path).expanduser()
    if local.exists() and not (local / "config.json").is_file():
        raise ValueError(f"base {base!r} is a folder without config.json; allowed: {DEFAULT_BACKBONE!r} "
                         "(embedded), a Hugging Face model folder or a hub id")
    if local.is_dir():
        check_weight_files(local, base)
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


PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")  # torch.save's formats: pickles


def check_weight_files(folder: Path, base: str) -> None:
    """A backbone folder whose weights are only a pickle (pytorch_model.bin) is refused before loading: golinear
    never unpickles a file it is handed (a pickle can run code; safetensors is data)."""
    if any(folder.glob("*.safetensors")):
        return
    pickled = sorted(p.name for pattern in PICKLED for p in folder.glob(pattern))
    if pickled:
        raise ValueError(f"base {base!r} holds its weights as {pickled[0]}, a pickle, and golinear never unpickles "
                         "(a pickle can run code); convert it to safetensors where you trust its source (transformers: "
                         "from_pretrained, then save_pretrained writes model.safetensors) and give that folder")


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
    full_attention_layers(options, backbone_config(base))
