"""The validation suite's task (tasks/standard/books_lastword.py): LAMBADA's format and metrics on passages of the
held-out books, disjoint from the training tokens and from the held-out cross-entropy's sequences."""
from __future__ import annotations

from pathlib import Path

import pytest

from golinear.tasks.standard import books_lastword as BL

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "corpus_classic_books").is_dir(), reason="needs the books corpus")


def test_a_passage_ends_at_a_content_word_named_beyond_the_window():
    far = "The lantern swung above the door of the old mill. "
    filler = "Nobody came out, and the rain kept falling on the yard and the roofs and the road to the sea. " * 4
    text = far + filler + "At last he went in to find the lantern."
    got = BL.book_passages(text)
    assert len(got) == 1 and got[0].startswith("The lantern swung") and got[0].endswith("to find the lantern")
    context, target = got[0].rsplit(" ", 1)
    assert target in context.split()[: -BL.FAR] and BL.WORDS[0] <= len(got[0].split()) <= BL.WORDS[1]
    assert BL.book_passages(text.replace("find the lantern.", "find them.")) == []  # a function word: no item
    assert BL.book_passages(text.replace("find the lantern.", "find the candle.")) == []  # not in its context
    near = far + filler + "He saw the lantern. At last he went in to find the lantern."
    # named again within the window (the window holds it): no item ends there ("He saw the lantern" itself is one)
    assert not [p for p in BL.book_passages(near) if p.endswith("find the lantern")]


def test_the_config_is_lambada_openais_but_for_its_data():
    from lm_eval.tasks._yaml_loader import load_yaml

    from golinear.tasks.standard import local_data
    ours = load_yaml(ROOT / "tasks" / "standard" / "golinear_books_lastword.yaml", resolve_func=True)
    theirs = local_data.builtin_config("lambada/lambada_openai.yaml")
    data = {"task", "tag", "custom_dataset", "dataset_kwargs", "dataset_path", "dataset_name"}
    assert {k: v for k, v in ours.items() if k not in data} == {k: v for k, v in theirs.items() if k not in data}
    assert ours["custom_dataset"].__code__.co_filename == BL.load.__code__.co_filename  # (lm-eval imports it anew)


@needs_data
def test_passages_come_from_held_out_books_past_the_held_out_cross_entropy():
    """Every passage is text of the last four held-out books (never trained on); the held-out cross-entropy's
    default sequences (16 x 4,096 SmolLM2 tokens of the held-out stream) end before the first of them begins."""
    from golinear.models.backbones.backbone import load_tokenizer
    from golinear.models.training import data as D
    from golinear.models.training.train_config import TrainConfig
    docs = dict(D.read_jsonl_docs(D.book_files(DATA)))
    held = D.heldout_ids(docs, BL.HELDOUT_DOCS)
    ps = BL.passages(str(DATA))
    assert len(ps) == BL.SAMPLES == len(set(ps))
    sources = [" ".join(docs[b].split()) for b in held[BL.FIRST_BOOK:]]
    assert all(any(p in s for s in sources) for p in ps)
    cfg = TrainConfig()
    tok = load_tokenizer()
    before = sum(len(tok(docs[b])["input_ids"]) + 1 for b in held[:BL.FIRST_BOOK])  # + EOS between documents
    assert before > cfg.eval_sequences * cfg.seq_len


@needs_data
@pytest.mark.slow
def test_golinear_run_evaluates_the_validation_suite(tmp_path):
    """The suite through `golinear run` (lm-eval, the real backbone, a few passages): a cell with acc and perplexity."""
    import json

    from golinear.bench.cli import main
    store = tmp_path / "store"
    rc = main(["run", "--suites", "validation", "--models", "full", "--device", "cpu", "--limit", "8",
               "--store", str(store), "--data-dir", str(DATA)])
    assert rc == 0
    cells = [json.loads(p.read_text()) for p in store.glob("cells/*/*.json")]
    assert len(cells) == 1 and cells[0]["task"] == "golinear_books_lastword" and cells[0]["n"] == 8
    assert {"acc,none", "perplexity,none"} <= set(cells[0]["metrics"])


def test_the_suite_needs_a_data_folder(monkeypatch):
    from golinear.tasks.standard import check_data
    with pytest.raises(ValueError, match="golinear_books_lastword .the validation suite. reads the books corpus"):
        check_data(["golinear_books_lastword"], data_dir="hub")
