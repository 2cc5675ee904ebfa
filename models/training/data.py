"""Training text: read a corpus, split off a held-out slice, tokenize, pack into fixed-length sequences.

Sources:
  - the books corpus in the data dir (`corpus_classic_books/*.jsonl.gz`, one book a line), the default;
  - any Hugging Face dataset (`--dataset NAME`, streamed), when the Hub (or a local builder such as
    `json` with `--dataset-files`) is reachable.
Held-out slice (never trained on), deterministic and independent of file order:
  - books: the `heldout_docs` books whose sha256(id) is smallest;
  - HF datasets: documents whose sha256(text) falls in the lowest `heldout_fraction` of the hash range.
Packing: documents (training order shuffled with the seed) are tokenized with the backbone's tokenizer,
joined with EOS and cut into `seq_len` chunks; the chunks are visited in a seeded permutation (a fresh one
per epoch), so the data position of a run is just the global sequence index (exact resume).
A prepared token file (`.npz`: train stream, held-out stream, metadata) lets a machine without the corpus
(the GPU box) train on exactly the same tokens.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch

from golinear.models.util.atomic import atomic_path

BOOKS_FOLDER = "corpus_classic_books"


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """--data-dir, else $GOLINEAR_DATA, else <repo>/../shared/data (models.util.data_dir)."""
    from golinear.models.util.data_dir import existing_data_dir
    return existing_data_dir(data_dir, needs="the books corpus")


def book_files(data_dir: str | os.PathLike | None = None) -> list[Path]:
    folder = resolve_data_dir(data_dir) / BOOKS_FOLDER
    files = sorted(folder.glob("*.jsonl.gz")) + sorted(folder.glob("*.jsonl"))
    if not files:
        from golinear.models.util.data_dir import missing_data
        raise missing_data(folder.parent, f"{BOOKS_FOLDER}/*.jsonl.gz", "the books corpus")
    return files


def read_jsonl_docs(files: Iterable[Path], id_field: str = "id", text_field: str = "text") -> Iterator[tuple[str, str]]:
    for path in files:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rec = json.loads(line)
                        yield str(rec[id_field]), rec[text_field]
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        raise ValueError(f"{str(path)!r} line {n}: not a JSON object with {id_field!r} and "
                                         f"{text_field!r} ({type(e).__name__}: {e})") from None


def _hash_unit(text: str) -> float:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16) / float(16 ** 12)


def heldout_ids(ids: Iterable[str], heldout_docs: int) -> list[str]:
    """The `heldout_docs` ids with the smallest sha256 (sorted by that hash)."""
    ranked = sorted(set(ids), key=lambda i: hashlib.sha256(i.encode("utf-8")).hexdigest())
    if heldout_docs < 1 or heldout_docs >= len(ranked):
        raise ValueError(f"heldout_docs={heldout_docs} impossible for a corpus of {len(ranked)} documents; "
                         f"allowed: 1..{len(ranked) - 1}")
    return ranked[:heldout_docs]


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of the vocabulary (token -> id): stable across tokenizers-library versions."""
    blob = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


DOC_SEPARATORS = ("<|endoftext|>", "<|end_of_text|>", "</s>")


def _eos_id(tokenizer) -> int:
    """The document separator: a pretraining end-of-text token when the vocabulary has one, else eos."""
    vocab = tokenizer.get_vocab()
    for name in DOC_SEPARATORS:
        if name in vocab:
            return int(vocab[name])
    for tid in (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id):
        if tid is not None:
            return int(tid)
    raise ValueError("the tokenizer has no eos/bos/pad token to separate documents")


def tokenize_docs(texts: Iterable[str], tokenizer, max_tokens: int | None = None, batch_docs: int = 8) -> np.ndarray:
    """One stream: tokens of each document followed by EOS, stopping once `max_tokens` are collected."""
    eos = _eos_id(tokenizer)
    dtype = np.uint16 if len(tokenizer) <= 65535 else np.uint32
    if max_tokens == 0:
        return np.zeros(0, dtype=dtype)
    parts, total, batch = [], 0, []

    def flush():
        nonlocal total
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            parts.append(np.asarray(ids + [eos], dtype=dtype))
            total += len(ids) + 1
        batch.clear()

    for text in texts:
        batch.append(text)
        if len(batch) >= batch_docs:
            flush()
            if max_tokens is not None and total >= max_tokens:
                break
    if batch and (max_tokens is None or total < max_tokens):
        flush()
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return stream[:max_tokens] if max_tokens is not None else stream


@dataclass
class TokenData:
    """Train and held-out token streams plus where they came from."""
    train: np.ndarray
    heldout: np.ndarray
    meta: dict = field(default_factory=dict)

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        with atomic_path(path) as tmp:
            np.savez_compressed(tmp, train=self.train, heldout=self.heldout,
                                meta=np.frombuffer(json.dumps(self.meta).encode("utf-8"), dtype=np.uint8))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TokenData":
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"token file {str(path)!r} does not exist (make one with `golinear train "
                                    f"--prepare-only --tokens FILE`)")
        try:
            with np.load(path) as z:
                meta = json.loads(bytes(z["meta"]).decode("utf-8"))
                return cls(train=z["train"], heldout=z["heldout"], meta=meta)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise ValueError(f"token file {str(path)!r} is damaged or not a golinear token file "
                             f"({type(e).__name__}: {e})") from None


def prepare_books(tokenizer, data_dir=None, train_tokens: int | None = None, heldout_docs: int = 8,
                  heldout_tokens: int | None = None, seed: int = 0, files: list[Path] | None = None) -> TokenData:
    """Tokenize the books corpus: held-out books apart, the rest in a seeded shuffled order."""
    files = files or book_files(data_dir)
    docs = dict(read_jsonl_docs(files))
    held = heldout_ids(docs, heldout_docs)
    held_set = set(held)
    train_ids = sorted(i for i in docs if i not in held_set)
    random.Random(seed).shuffle(train_ids)
    train = tokenize_docs((docs[i] for i in train_ids), tokenizer, max_tokens=train_tokens)
    heldout = tokenize_docs((docs[i] for i in held), tokenizer, max_tokens=heldout_tokens)
    meta = dict(source="books", files=[p.name for p in files], heldout_rule=f"{heldout_docs} smallest sha256(id)",
                heldout_ids=held, n_docs=len(docs), seed=seed)
    return TokenData(train, heldout, _finish_meta(meta, tokenizer, train, heldout))


def prepare_hf(tokenizer, dataset: str, config: str | None = None, split: str = "train", text_field: str = "text",
               data_files: list[str] | None = None, train_tokens: int | None = None,
               heldout_fraction: float = 0.01, heldout_tokens: int | None = 2_000_000, seed: int = 0) -> TokenData:
    """Stream a Hugging Face dataset; a document is held out when sha256(text) < heldout_fraction."""
    import datasets  # lazy: only this source needs it

    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction={heldout_fraction}; allowed: 0 < fraction < 1")
    stream = datasets.load_dataset(dataset, config, split=split, streaming=True, data_files=data_files)
    stream = stream.shuffle(seed=seed, buffer_size=1000)

    def texts(held: bool):
        for rec in stream:
            text = rec[text_field]
            if (_hash_unit(text) < heldout_fraction) == held:
                yield text

    train = tokenize_docs(texts(False), tokenizer, max_tokens=train_tokens)
    heldout = tokenize_docs(texts(True), tokenizer, max_tokens=heldout_tokens)
    meta = dict(source="hf", dataset=dataset, config=config, split=split, text_field=text_field,
                data_files=data_files, heldout_rule=f"sha256(text) < {heldout_fraction}", seed=seed)
    return TokenData(train, heldout, _finish_meta(meta, tokenizer, train, heldout))


def _finish_meta(meta: dict, tokenizer, train, heldout) -> dict:
    if len(heldout) == 0:
        raise ValueError("the held-out slice is empty; choose more held-out documents")
    meta.update(tokenizer=getattr(tokenizer, "name_or_path", ""), tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
                eos_id=_eos_id(tokenizer), train_tokens=int(len(train)), heldout_tokens=int(len(heldout)))
    return meta


class PackedSequences:
    """Fixed-length training sequences from a token stream, visited in a seeded permutation per epoch."""

    def __init__(self, stream: np.ndarray, seq_len: int, seed: int = 0):
        if seq_len < 2:
            raise ValueError(f"seq_len={seq_len}; allowed: >= 2")
        self.num = len(stream) // seq_len
        if self.num < 1:
            raise ValueError(f"only {len(stream)} tokens: not one sequence of {seq_len}; use more data or shorter "
                             f"sequences")
        self.chunks = stream[: self.num * seq_len].reshape(self.num, seq_len)
        self.seq_len, self.seed = seq_len, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.num)
        return self._perms[epoch]

    def epochs_for(self, n_sequences: int) -> float:
        return n_sequences / self.num

    def __getitem__(self, index: int) -> torch.Tensor:
        """The global sequence `index` (any non-negative int; wraps into later epochs)."""
        epoch, pos = divmod(int(index), self.num)
        return torch.from_numpy(self.chunks[self._perm(epoch)[pos]].astype(np.int64))

    def batch(self, start: int, size: int) -> torch.Tensor:
        return torch.stack([self[start + i] for i in range(size)])


def heldout_sequences(stream: np.ndarray, seq_len: int, count: int) -> torch.Tensor:
    """The first `count` contiguous `seq_len` chunks of the held-out stream (fewer if it is short)."""
    n = min(count, len(stream) // seq_len)
    if n < 1:
        raise ValueError(f"held-out stream has {len(stream)} tokens: not one sequence of {seq_len}")
    return torch.from_numpy(stream[: n * seq_len].reshape(n, seq_len).astype(np.int64))
