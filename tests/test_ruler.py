"""RULER / S-NIAH tasks: length budget, needle placement, metrics, lm-eval wiring end to end, seeds.

Uses the real SmolLM2 tokenizer and the shared data folder; small sample counts and 1K-2K contexts
(one 4K case) keep it quick.
"""
from __future__ import annotations

import collections
import hashlib
import json
import re
from pathlib import Path

import pytest

import golinear.tasks.ruler as ruler
from golinear.models.backbones.backbone import load_tokenizer
from golinear.tasks.ruler import build_samples, score
from golinear.tasks.ruler.constants import DEPTHS, NOISE, TEMPLATES
from golinear.tasks.ruler.metrics import postprocess_pred, string_match_all, string_match_part
from golinear.tasks.ruler.resources import hotpotqa, resolve_data_dir, sent_tokenize, squad

ALL_TASKS = ruler.SUITES["sniah"] + ruler.SUITES["ruler"]
ESSAY_NIAH = ["golinear_sniah_2", "golinear_sniah_3", "golinear_ruler_mk", "golinear_ruler_mq",
              "golinear_ruler_mv"]
GEN_TOKENS = {"golinear_sniah_1": 128, "golinear_sniah_2": 128, "golinear_sniah_3": 128,
              "golinear_ruler_mk": 128, "golinear_ruler_mq": 128, "golinear_ruler_mv": 128,
              "golinear_ruler_cwe": 120, "golinear_ruler_fwe": 50, "golinear_ruler_hqa": 32,
              "golinear_ruler_sqa": 32, "golinear_ruler_vt": 30}


@pytest.fixture(scope="module", autouse=True)
def no_disk_cache():
    mp = pytest.MonkeyPatch()
    mp.setenv("GOLINEAR_RULER_CACHE", "0")  # every test generates for real
    yield
    mp.undo()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


_SAMPLES: dict = {}


def samples(tok, task, length=2048, n=3, seed=42):
    key = (task, length, n, seed)
    if key not in _SAMPLES:
        _SAMPLES[key] = build_samples(task, tok, max_seq_length=length, num_samples=n, seed=seed)
    return _SAMPLES[key]


def n_tokens(tok, text):
    return len(tok(text, add_special_tokens=False)["input_ids"])


# ----------------------------------------------------------------------------- oracle (reads the prompt only)
_QA_ANSWERS: dict = {}


def qa_answers():
    if not _QA_ANSWERS:
        for qas, _ in (squad(resolve_data_dir()), hotpotqa(resolve_data_dir())):
            for qa in qas:
                _QA_ANSWERS.setdefault(qa["query"], qa["outputs"])
    return _QA_ANSWERS


def oracle(prompt: str) -> str:
    """What a perfect reader would answer, parsed out of the prompt (QA: the key looked up by question)."""
    m = re.search(r"The special magic \w+ for (.+) mentioned in the provided text (?:is|are)$", prompt)
    if m:
        values = []
        for key in re.split(r", and |, ", m.group(1)):
            values += re.findall(r"One of the special magic \w+ for " + re.escape(key) + r" is: (\S+)\.", prompt)
        return " " + ", ".join(values)
    m = re.search(r"assigned the value (\d+), they are: $", prompt)
    if m:
        main = prompt[prompt.rindex("Memorize and track"):]
        names = [re.search(rf"VAR (\w+) = {m.group(1)}\b", main).group(1)]
        while (nxt := re.search(rf"VAR (\w+) = VAR {names[-1]}\b", main)) is not None:
            names.append(nxt.group(1))
        return " ".join(names)
    if prompt.endswith("the top 10 words that appear most often in the list are:".capitalize()) or \
            prompt.endswith("The top 10 words that appear most often in the list are:"):
        main = prompt[prompt.rindex("Below is a numbered list of words."):]
        listing = main.split("\n")[1]
        words = re.findall(r"\d+\. (.+?)(?= \d+\. |$)", listing)
        top = [w for w, _ in collections.Counter(words).most_common(10)]
        return " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(top))
    if prompt.endswith("the three most frequently appeared words are:"):
        coded = prompt.split("Find the three most frequently appeared coded words. ")[1].split("\nQuestion:")[0]
        counts = collections.Counter(w for w in coded.split(" ") if w != "...")
        return " " + ", ".join(w for w, _ in counts.most_common(3))
    m = re.search(r"\nQuestion: (.*) Answer:$", prompt)
    if m:
        return " " + qa_answers()[m.group(1)][0]
    raise AssertionError(f"oracle cannot read prompt ending {prompt[-120:]!r}")


# ----------------------------------------------------------------------------- length budget
@pytest.mark.parametrize("task", ALL_TASKS)
def test_prompts_fit_budget_at_2k(tok, task):
    rows = samples(tok, task)
    assert len(rows) == 3
    for row in rows:
        assert row["prompt"] == row["input"] + row["answer_prefix"]
        assert row["max_gen_toks"] == GEN_TOKENS[task]
        used = n_tokens(tok, row["prompt"]) + row["max_gen_toks"]
        assert used == row["length"] <= 2048
    # the length search fills the budget (a sample may drop one haystack step, as in RULER)
    assert max(r["length"] for r in rows) >= 0.95 * 2048


@pytest.mark.parametrize("task", ruler.SUITES["sniah"])
def test_sniah_fits_budget_at_1k(tok, task):
    rows = samples(tok, task, 1024)
    assert all(n_tokens(tok, r["prompt"]) + 128 <= 1024 for r in rows)
    assert max(r["length"] for r in rows) >= 0.95 * 1024


def test_4k_essay_and_words(tok):
    for task in ("golinear_sniah_2", "golinear_ruler_cwe"):
        rows = samples(tok, task, 4096, 2)
        assert all(n_tokens(tok, r["prompt"]) + r["max_gen_toks"] <= 4096 for r in rows)
        assert max(r["length"] for r in rows) >= 0.95 * 4096
    check_essay_needles(samples(tok, "golinear_sniah_2", 4096, 2))
    check_cwe_counts(samples(tok, "golinear_ruler_cwe", 4096, 2), 30, 3)


# ----------------------------------------------------------------------------- needles where the recipe puts them
def essay_words():
    folder = resolve_data_dir() / "paul_graham_essays"
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.txt")))
    return re.sub(r"\s+", " ", text).split(" ")


def check_essay_needles(rows):
    words = essay_words()
    for row in rows:
        sents = sent_tokenize(" ".join(words[:row["haystack_size"]]).strip())
        depths = row["depths"]
        assert all(d in DEPTHS for d in depths) and len(set(depths)) == len(depths) == len(row["needles"])
        assert depths == sorted(depths)
        positions = [int(len(sents) * d / 100) for d in depths]
        assert row["positions"] == positions
        bounds = [0] + positions + [len(sents)]
        pieces = []
        for i in range(1, len(bounds)):
            pieces.append(" ".join(sents[bounds[i - 1]:bounds[i]]))
            if i - 1 < len(row["needles"]):
                pieces.append(row["needles"][i - 1])
        assert "\n" + " ".join(pieces) + "\n" in row["input"]
        for value in row["outputs"]:
            assert sum(value in n for n in row["needles"]) == 1


@pytest.mark.parametrize("task", ESSAY_NIAH)
def test_essay_needles_at_recipe_depths(tok, task):
    rows = samples(tok, task)
    check_essay_needles(rows)
    expected_needles = {"golinear_ruler_mk": 4, "golinear_ruler_mq": 4, "golinear_ruler_mv": 4}.get(task, 1)
    expected_answers = {"golinear_ruler_mq": 4, "golinear_ruler_mv": 4}.get(task, 1)
    for row in rows:
        assert len(row["needles"]) == expected_needles and len(row["outputs"]) == expected_answers
        assert all(re.fullmatch(r"One of the special magic (numbers|uuids) for \S+ is: \S+\.", n)
                   for n in row["needles"])
    if task == "golinear_sniah_3":
        assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", r["outputs"][0])
                   for r in rows)


def test_noise_needle_lines(tok):
    for row in samples(tok, "golinear_sniah_1"):
        lines = row["input"].split("\n")
        body = lines[1:-1]
        assert lines[0].startswith("A special magic number is hidden within the following text.")
        assert len(body) == row["haystack_size"] + 1
        assert [i for i, s in enumerate(body) if s != NOISE] == row["positions"]
        needle = body[row["positions"][0]]
        key = re.search(r"for (\S+) mentioned", lines[-1]).group(1)
        assert needle == f"One of the special magic numbers for {key} is: {row['outputs'][0]}."
        assert re.fullmatch(r"\d{7}", row["outputs"][0])


def test_vt_chain_lines(tok):
    for row in samples(tok, "golinear_ruler_vt"):
        main = row["input"][row["input"].rindex("Memorize and track"):]
        body = main.split("\n\n", 1)[1].split("\nQuestion:")[0].split("\n")
        chain = [s for s in body if s != NOISE]
        assert [i for i, s in enumerate(body) if s != NOISE] == row["positions"]
        names = row["outputs"]
        value = re.search(r"assigned the value (\d+)", row["answer_prefix"]).group(1)
        assert chain[0] == f"VAR {names[0]} = {value}"
        assert chain[1:] == [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(4)]
        assert len(body) - 5 == row["haystack_size"]
        # the one-shot demonstration (RULER keeps it; lm-eval's port of CWE drops its own) precedes it
        assert row["input"].count("Memorize and track the chain(s)") == 2


def check_cwe_counts(rows, common, uncommon):
    for row in rows:
        main = row["input"][row["input"].rindex("Below is a numbered list of words."):]
        words = re.findall(r"\d+\. (.+?)(?= \d+\. |$)", main.split("\n")[1])
        counts = collections.Counter(words)
        assert all(counts[w] == common for w in row["outputs"]) and len(row["outputs"]) == 10
        assert all(c == uncommon for w, c in counts.items() if w not in row["outputs"])
        assert row["input"].count("Below is a numbered list of words.") == 2  # one demonstration


def test_cwe_and_fwe_answers_are_the_frequent_words(tok):
    check_cwe_counts(samples(tok, "golinear_ruler_cwe"), 6, 1)  # RULER's < 4096 setting
    for row in samples(tok, "golinear_ruler_fwe"):
        coded = row["input"].split("coded words. ")[1].split("\nQuestion:")[0].split(" ")
        ranked = [w for w, _ in collections.Counter(coded).most_common(4)]
        assert ranked[0] == "..." and ranked[1:] == row["outputs"]


@pytest.mark.parametrize("task", ["golinear_ruler_sqa", "golinear_ruler_hqa"])
def test_qa_gold_documents(tok, task):
    for row in samples(tok, task):
        docs = re.split(r"\n\n(?=Document \d+:\n)", row["input"].split("The following are given documents.\n\n")[1]
                        .split("\n\nAnswer the question based")[0])
        assert len(docs) == row["haystack_size"]
        assert [docs[i] for i in row["positions"]] == row["needles"]
        assert all(d.startswith(f"Document {i + 1}:\n") for i, d in enumerate(docs))
        if task == "golinear_ruler_sqa":  # SQuAD answers are spans of the gold paragraph
            assert any(a in row["needles"][0] for a in row["outputs"])
        else:  # HotpotQA: all ten paragraphs of the question are among the documents
            assert len(row["needles"]) == 10


def test_hqa_has_only_100_questions(tok):
    rows = build_samples("golinear_ruler_hqa", tok, max_seq_length=4096, num_samples=500)
    assert len(rows) == 100


# ----------------------------------------------------------------------------- metrics
def test_metrics_match_ruler_formulas():
    preds = ["The numbers are 123 and 456.", "only 123", "nothing"]
    refs = [["123", "456"], ["123", "456"], ["789"]]
    assert string_match_all(preds, refs) == round((1 + 0.5 + 0) / 3 * 100, 2) == 50.0
    assert string_match_part(preds, refs) == round((1 + 1 + 0) / 3 * 100, 2) == 66.67
    # any annotator answer is enough for QA (lm-eval's port would give 33.33 here)
    assert string_match_part(["in the 10th"], [["10th century", "the first half of the 10th century", "10th"]]) == 100.0
    assert string_match_all(["ABC-def"], [["abc-DEF"]]) == 100.0  # case-insensitive
    assert string_match_all(["a", "b", "c"], [["a"], ["x"], ["x"]]) == 33.33  # rounded like RULER
    assert postprocess_pred("  \x00 7374122\x1f\n ") == "7374122"
    assert score("golinear_sniah_1", [" 7374122.\x00"], [["7374122"]]) == 100.0
    assert score("S-NIAH-1", ["7374122"], [["7374122", "999"]]) == 50.0  # all
    assert score("SQA", ["7374122"], [["7374122", "999"]]) == 100.0  # part
    assert score("qa_2", ["no idea"], [["yes"]]) == 0.0
    with pytest.raises(ValueError):
        score("golinear_sniah_1", ["a"], [])


def test_oracle_scores_100_on_the_python_api(tok):
    for task in ALL_TASKS:
        rows = samples(tok, task)
        preds = [oracle(r["prompt"]) for r in rows]
        assert score(task, preds, [r["outputs"] for r in rows]) == 100.0, task
        assert score(task, ["@@@"] * len(rows), [r["outputs"] for r in rows]) == 0.0, task


# ----------------------------------------------------------------------------- lm-eval end to end
def _lm_classes():
    from lm_eval.api.model import LM

    class Recorder(LM):
        def __init__(self, answer):
            super().__init__()
            self.answer, self.requests = answer, []

        def loglikelihood(self, requests):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError

        def generate_until(self, requests):
            self.requests += [r.args for r in requests]
            return [self.answer(ctx) for ctx, _ in (r.args for r in requests)]

    return Recorder


def test_lm_eval_copy_model_scores_100_garbage_scores_0(tok):
    import lm_eval
    from lm_eval.tasks import TaskManager
    recorder = _lm_classes()
    include = str(Path(ruler.__file__).parent)
    tm = TaskManager(include_path=include, include_defaults=False,
                     metadata={"max_seq_lengths": [2048], "num_samples": 3, "seed": 42, "base": "smollm2-135m"})
    copier = recorder(oracle)
    res = lm_eval.simple_evaluate(model=copier, tasks=["golinear_sniah", "golinear_ruler_ext"], task_manager=tm,
                                  bootstrap_iters=0, log_samples=True)
    for task in ALL_TASKS:
        metric = "string_match_part" if task in ("golinear_ruler_hqa", "golinear_ruler_sqa") else "string_match_all"
        assert res["results"][task][f"{metric},none"] == 100.0, task
        assert res["results"][task]["score,none"] == 100.0
        assert res["n-samples"][task]["effective"] == 3
        for s in res["samples"][task]:
            ctx, gen_kwargs = s["arguments"][0]
            assert ctx == s["doc"]["input"] + s["doc"]["answer_prefix"]  # exactly RULER's prompt
            assert gen_kwargs["max_gen_toks"] == GEN_TOKENS[task] and gen_kwargs["until"] == []
            assert gen_kwargs["do_sample"] is False
            assert n_tokens(tok, ctx) + GEN_TOKENS[task] <= 2048
    assert res["results"]["golinear_sniah"]["score,none"] == 100.0
    assert res["results"]["golinear_ruler_ext"]["score,none"] == 100.0
    # the same prompts as the python API (same tokenizer, length, seed)
    api_prompts = [r["prompt"] for r in samples(tok, "golinear_sniah_2")]
    assert [s["arguments"][0][0] for s in res["samples"]["golinear_sniah_2"]] == api_prompts

    res = lm_eval.simple_evaluate(model=recorder(lambda ctx: " @@@ no answer @@@"),
                                  tasks=["golinear_sniah", "golinear_ruler_ext"], task_manager=tm,
                                  bootstrap_iters=0)
    for task in ALL_TASKS:
        assert res["results"][task]["score,none"] == 0.0, task
    assert res["results"]["golinear_ruler_ext"]["score,none"] == 0.0


# ----------------------------------------------------------------------------- seeds, options, errors
def test_reproducible_from_seed(tok):
    for task in ("golinear_sniah_2", "golinear_ruler_vt"):
        a = build_samples(task, tok, max_seq_length=1024, num_samples=3, seed=7)
        b = build_samples(task, tok, max_seq_length=1024, num_samples=3, seed=7)
        c = build_samples(task, tok, max_seq_length=1024, num_samples=3, seed=8)
        assert [r["prompt"] for r in a] == [r["prompt"] for r in b]
        assert [r["prompt"] for r in a] != [r["prompt"] for r in c]
        assert [r["outputs"] for r in a] != [r["outputs"] for r in c]


@pytest.mark.parametrize("task,digest", [
    ("golinear_sniah_1", "417870f45482b928"), ("golinear_sniah_2", "7d96b19204804f4f"),
    ("golinear_sniah_3", "abb8375268e29123"), ("golinear_ruler_mk", "b921721c55bb09d2")])
def test_samples_are_the_ones_golinear_has_always_built(tok, task, digest):
    """Building faster (the haystack split once a size, a sample counted once for its fit and its record) changes
    no sample: the rows' digest is the one these tasks had before, so stored scores stay comparable."""
    rows = build_samples(task, tok, max_seq_length=1024, num_samples=6)
    assert hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16] == digest


def test_metadata_options_reach_the_builder():
    from golinear.tasks.ruler import hooks
    ds = hooks.golinear_sniah_1(max_seq_lengths=[1024], num_samples=2, pretrained="smollm2-135m",
                                version=1.0, batch_size=1)["test"]
    assert len(ds) == 2 and all(x <= 1024 for x in ds["length"]) and ds[0]["max_length"] == 1024
    with pytest.raises(ValueError, match="one length per run"):
        hooks.build_dataset("golinear_sniah_1", max_seq_lengths=[1024, 2048])
    with pytest.raises(ValueError, match="max_seq_length"):
        hooks.build_dataset("golinear_sniah_1", max_seq_length=512)


def test_tokenizer_choice_from_metadata(tmp_path):
    import json
    from golinear.models.checkpoint import weights as checkpoint
    from golinear.tasks.ruler.hooks import tokenizer_from_metadata
    assert tokenizer_from_metadata({"pretrained": "a/b", "base": "c"}) == "a/b"
    assert tokenizer_from_metadata({"base": "qwen-x", "window": 64}) == "qwen-x"
    assert tokenizer_from_metadata({"version": 1.0}) == "smollm2-135m"
    (tmp_path / checkpoint.CONFIG).write_text(json.dumps({"base": "org/base-model"}))
    (tmp_path / checkpoint.WEIGHTS).write_bytes(b"")
    assert tokenizer_from_metadata({"checkpoint": str(tmp_path)}) == "org/base-model"


def test_bad_inputs_are_named(tok, tmp_path):
    for bad in (512, 65536, "4k", 4096.5, None):
        with pytest.raises(ValueError, match="max_seq_length"):
            build_samples("golinear_sniah_1", tok, max_seq_length=bad, num_samples=1)
    with pytest.raises(ValueError, match="unknown RULER task"):
        build_samples("niah_single_9", tok)
    with pytest.raises(ValueError, match="num_samples"):
        build_samples("golinear_sniah_1", tok, max_seq_length=1024, num_samples=0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_samples("golinear_sniah_2", tok, max_seq_length=1024, num_samples=1, data_dir=tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="essays"):
        build_samples("golinear_sniah_2", tok, max_seq_length=1024, num_samples=1, data_dir=tmp_path)
    # ten HotpotQA paragraphs cannot fit in 1K (RULER itself loops forever here)
    with pytest.raises(ValueError, match="larger max_seq_length"):
        build_samples("golinear_ruler_hqa", tok, max_seq_length=1024, num_samples=1)


def test_task_table():
    assert ruler.SUITES["sniah"] == ["golinear_sniah_1", "golinear_sniah_2", "golinear_sniah_3"]
    assert [ruler.DISPLAY_NAMES[t] for t in ruler.SUITES["ruler"]] == ["MK", "MQ", "MV", "CWE", "FWE", "HQA",
                                                                       "SQA", "VT"]
    assert {ruler.resolve_task(t).ruler for t in ALL_TASKS} == {
        "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multiquery",
        "niah_multivalue", "cwe", "fwe", "qa_2", "qa_1", "vt"}
    assert {TEMPLATES[ruler.resolve_task(t).family]["tokens_to_generate"] for t in ALL_TASKS} == {128, 120, 50, 32, 30}
    assert ruler.data_files("golinear_sniah_1") == [] and len(ruler.data_files("golinear_sniah_2")) == 49


# ----------------------------------------------------------------------------- inputs of the generators
def test_key_words_equal_rulers_sorted_set():
    import random
    from golinear.tasks.ruler.resources import AdjNounWords, _wonderwords
    adjs, nouns = _wonderwords("adjectivelist.txt"), _wonderwords("nounlist.txt")
    pick = random.Random(0)
    sub_adjs = [a for a in adjs if not a.isalpha()] + pick.sample(adjs, 60) + ["high", "wide", "ad", "x"]
    sub_nouns = pick.sample(nouns, 150) + ["pitched-thing", "hoc"]
    lazy = AdjNounWords(sub_adjs, sub_nouns)
    full = sorted(set(f"{a}-{n}" for a in sub_adjs for n in sub_nouns))
    assert len(lazy) == len(full) and [lazy[i] for i in range(len(full))] == full


def test_sentence_splitter_is_english_punkt():
    # abbreviations from punkt_tab's English model keep "Mr." and "Dr." inside the sentence
    assert sent_tokenize("Mr. Smith met Dr. Brown in Washington. They talked.") == (
        "Mr. Smith met Dr. Brown in Washington.", "They talked.")


def test_disk_cache_round_trip(tok, tmp_path, monkeypatch):
    from golinear.tasks.ruler import cache
    monkeypatch.setenv("GOLINEAR_CACHE", str(tmp_path))
    monkeypatch.setenv("GOLINEAR_RULER_CACHE", "1")
    monkeypatch.setattr(cache, "_MEMO", {})
    first = cache.cached_samples("golinear_ruler_fwe", tok, 1024, 2, 42)
    files = list((tmp_path / "ruler").glob("*.jsonl"))
    assert len(files) == 1
    monkeypatch.setattr(cache, "_MEMO", {})
    assert cache.cached_samples("golinear_ruler_fwe", tok, 1024, 2, 42) == first
    assert cache.cached_samples("golinear_ruler_fwe", tok, 1024, 2, 43) != first


def test_an_edited_or_foreign_disk_cache_is_generated_again(tok, tmp_path, monkeypatch, capsys):
    """A cache file is signed with this machine's key where it is made: one whose samples were edited (a needle's
    answers emptied), one copied from another machine and one from before signatures are generated again."""
    from golinear.tasks.ruler import cache
    monkeypatch.setenv("GOLINEAR_CACHE", str(tmp_path))
    monkeypatch.setenv("GOLINEAR_RULER_CACHE", "1")
    monkeypatch.setattr(cache, "_MEMO", {})
    first = cache.cached_samples("golinear_sniah_1", tok, 1024, 2, 42)
    (path,) = (tmp_path / "ruler").glob("*.jsonl")
    head, body = path.read_text().split("\n", 1)
    rows = [json.loads(line) for line in body.splitlines()]
    assert rows == first and first[0]["outputs"]
    forged = [{**r, "outputs": ["nothing"]} for r in rows]
    other_key = json.dumps({**json.loads(head), "mac": "0" * 64})
    for text in (head + "\n" + "".join(json.dumps(r) + "\n" for r in forged), other_key + "\n" + body, body):
        path.write_text(text)
        monkeypatch.setattr(cache, "_MEMO", {})
        capsys.readouterr()
        assert cache.cached_samples("golinear_sniah_1", tok, 1024, 2, 42) == first
        assert "generating its samples again" in capsys.readouterr().err
        assert path.read_text().split("\n", 1)[1] == body  # written again, signed


def test_a_named_tokenizer_is_loaded_and_fingerprinted_once(tmp_path, monkeypatch):
    """Every S-NIAH/RULER cell builds its samples from the tokenizer's name: it is loaded and fingerprinted once per
    process (it was ~0.25 s a cell), with the fingerprint of a freshly loaded copy, so the cache key is unchanged."""
    from golinear.models.backbones import backbone
    from golinear.tasks.ruler import cache
    loads = []
    real = backbone.load_tokenizer
    monkeypatch.setattr(backbone, "load_tokenizer", lambda name: loads.append(name) or real(name))
    monkeypatch.setenv("GOLINEAR_CACHE", str(tmp_path))
    cache._named_tokenizer.cache_clear()
    cache._MEMO.clear()
    try:
        first = cache.cached_samples("golinear_sniah_1", "smollm2-135m", 1024, 2, 42)
        cache._MEMO.clear()  # the next cell of the run reads the disk cache under the same key
        again = cache.cached_samples("golinear_sniah_1", "smollm2-135m", 1024, 2, 42)
    finally:
        cache._named_tokenizer.cache_clear()
    assert loads == ["smollm2-135m"] and first == again
    assert cache.tokenizer_fingerprint(real("smollm2-135m")) == cache.tokenizer_fingerprint(
        cache._named_tokenizer("smollm2-135m"))
    cache._named_tokenizer.cache_clear()
