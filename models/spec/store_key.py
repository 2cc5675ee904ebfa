"""A model's key in the result store: one string per model, built by `store_key` alone.

Why one function: the key decides which stored cell a run reuses ("already in store"), so two models must never
share one. It names the spec's options, a checkpoint folder's and a scorer file's name beside a hash of their
files, and escapes every value, so a folder's name cannot spell another spec's options.
"""
from __future__ import annotations

import re
from pathlib import Path

from golinear.models.spec.checkpoint_files import checkpoint_identity, file_identity, local_files_identity
from golinear.models.spec.values import value_text

KEY_ESCAPES = {"%": "%25", ",": "%2C", "=": "%3D", ";": "%3B"}  # the key's own separators (and the escape itself)


def store_key(spec) -> str:
    """A model's identity in the result store: its keys (base always, by name; a checkpoint by its folder's name)
    plus a hash of the local files it names, so a retrained checkpoint or edited backbone is another model; a scorer
    file (retain_score=fitted) by its name and a hash of its contents; a press with kvpress's version.

    Every value is written with `,` `=` `;` `%` escaped (KEY_ESCAPES), so no value can spell other keys: a copy of
    gdn-w56-s8-sc in a folder named `gdn-w56-s8-sc,window=28` is not the shipped checkpoint run at window 28. Values
    without those characters are written as they are, so the keys of stored cells do not change."""
    def text(k, v) -> str:
        v = Path(v).name if k in ("checkpoint", "scorer") else value_text(v)
        return "".join(KEY_ESCAPES.get(c, c) for c in v)

    a = {**spec.given(), "base": spec.base_name}
    parts = [f"{k}={text(k, v)}" for k, v in sorted(a.items())]
    for k in ("base", "checkpoint"):
        ident = checkpoint_identity(a.get(k)) if k == "checkpoint" else local_files_identity(a.get(k))
        if k == "checkpoint" and a.get(k) and not ident:  # a key without the files would name another model
            raise FileNotFoundError(f"checkpoint folder {str(a[k])!r} has no checkpoint files (moved or deleted "
                                    "during the run?); its cells cannot be keyed")
        if ident:
            parts.append(f"{k}_files={ident}")
    if a.get("scorer"):
        if file_identity(a["scorer"]) is None:
            raise FileNotFoundError(f"retention scorer file {str(a['scorer'])!r} does not exist; its cells cannot be "
                                    "keyed")
        parts.append(f"scorer_file={file_identity(a['scorer'])}")
    if a.get("press"):  # a press's scores are kvpress's code: its version is part of the cell's identity
        from golinear.models.kv_compression.kvpress_adapter import kvpress_version
        parts.append(f"kvpress={kvpress_version()}")
    return ",".join(parts)


def store_key_parts(key: str) -> dict[str, str]:
    """A store key's parts by name, each value unescaped (store_key's inverse for the names and hashes)."""
    unescape = {code: c for c, code in KEY_ESCAPES.items()}
    pattern = re.compile("|".join(unescape))
    return {k: pattern.sub(lambda m: unescape[m[0]], v) for k, _, v in (p.partition("=") for p in key.split(","))}
