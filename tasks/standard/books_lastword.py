"""`golinear_books_lastword`: LAMBADA's task on golinear's held-out books, a validation set for choosing a recipe.

A training recipe is chosen off the test sets: on held-out cross-entropy and on this set, which no test set and no
training token shares. LAMBADA asks for a passage's last word, one that the passage's earlier sentences make
predictable; here a passage is 60-200 words of consecutive sentences of a held-out book (models.training.data: the 8
books with the smallest sha256(id), which `golinear train` never reads), ending with a sentence whose last word is a
content word of at least 3 letters that the passage names earlier, more than FAR words back and not since: the
word must be recalled from beyond the paper's 56-token window, which is what the linear state adds and where the
study finds LAMBADA's gap (LAMBADA's long-range dependence, by a rule instead of its human filter). The passages
come from the last 4 of those books in their held-out order: the held-out cross-entropy reads the first 16 x 4,096
tokens of the held-out stream, which end inside the fourth (tests/test_books_lastword.py checks it). Prompt, target and metrics are lm-eval's lambada_openai
(golinear_books_lastword.yaml); `SAMPLES` passages drawn with a fixed seed.
"""
from __future__ import annotations

import functools
import random
import re

SAMPLES = 500
HELDOUT_DOCS = 8  # models.training.data.prepare_books' default
FIRST_BOOK = 4  # passages from the held-out books after the first four (the held-out CE reads those)
WORDS = (60, 200)
FAR = 45  # words: about 60 tokens, beyond the paper's 56-token window
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'\u201d\u2019)]))\s+")  # the closing quote stays
# a target is a content word: not one of these (function words, and abbreviations a full stop follows)
COMMON = frozenset("""
the and was that his her him she they them their you your yours with for not but had have has this which were from
what when then than there these those been being would could should shall will into upon about all any some one
more most much many very such only also even ever never now here where while who whom whose why how our ours out
over under again once own same other each both few nor off too can did does done just may might must its itself
himself herself themselves myself yourself ourselves are said say says made make let got get went come came see saw
know knew think thought thing things yes well like little great time man men way day before after because though
mr mrs dr capt st sir miss mme
""".split())
_LAST_WORD = re.compile(r"(?<= )([A-Za-z]{3,})[.!?][\"'\u201d\u2019)]*$")


def load(golinear_data_dir: str | None = None, **_metadata):
    """The DatasetDict lm-eval reads: {"test": passages} ({"text": ...} rows, LAMBADA's layout)."""
    import datasets
    rows = [{"text": t} for t in passages(golinear_data_dir)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


@functools.lru_cache(maxsize=4)
def passages(data_dir: str | None = None, samples: int = SAMPLES, seed: int = 0) -> tuple[str, ...]:
    """`samples` passages (whitespace-normalised, ending with the target word), in a fixed order."""
    from golinear.models.training.data import book_files, heldout_ids, read_jsonl_docs
    docs = dict(read_jsonl_docs(book_files(data_dir)))
    books = heldout_ids(docs, HELDOUT_DOCS)[FIRST_BOOK:]
    found = sorted({p for book in books for p in book_passages(docs[book])})
    if len(found) < samples:
        raise ValueError(f"the held-out books hold {len(found)} passages, fewer than the {samples} asked for")
    return tuple(random.Random(seed).sample(found, samples))


def book_passages(text: str) -> list[str]:
    """Every passage of a book: for each sentence that can end one, the shortest run of sentences ending with it of
    WORDS[0] to WORDS[1] words whose context names its last word more than FAR words back and not within FAR
    words (the word must come from beyond the window), if there is one."""
    sentences = [" ".join(s.split()) for s in _SENTENCE_END.split(" ".join(text.split())) if s.strip()]
    out = []
    for i, last in enumerate(sentences):
        m = _LAST_WORD.search(last)
        if not m or m.group(1).lower() in COMMON:
            continue
        target, cut = m.group(1).lower(), len(m.group(0)) - len(m.group(1))  # cut: its punctuation and quotes
        run, words = [last], len(last.split())
        for j in range(i - 1, -1, -1):
            run.insert(0, sentences[j])
            words += len(sentences[j].split())
            if words > WORDS[1]:
                break
            context = " ".join(run)[:-cut].rsplit(" ", 1)[0].split()
            if target in {_bare(w) for w in context[-FAR:]}:
                break  # named within the window: not this sentence's item
            if words >= WORDS[0] and target in {_bare(w) for w in context[:-FAR]}:
                out.append(" ".join(run)[:-cut])
                break
    return out


def _bare(word: str) -> str:
    return word.strip(".,;:!?\"'()\u201c\u201d\u2018\u2019").lower()
