"""Model cards: the Hub's YAML header, the recipe, tokens, seeds and held-out loss from the checkpoint's own files,
and exactly the store's scores of the weights now in the folder (`golinear cards`)."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from golinear.bench.cli import main as golinear
from golinear.bench.results.store import Store
from golinear.models.spec import checkpoint_identity

SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"


def cell(store, key: str, task: str, value: float, n: int, config=None, metric="acc"):
    store.put({"key": {"model": key, "task": task, "config": config or {"limit": None, "num_fewshot": 0}},
               "model": {"label": key, "backbone": "smollm2-135m"}, "task": task, "suite": "cr", "metric": metric,
               "display": task.removeprefix("golinear_"), "n": n,
               "metrics": {f"{metric},none": {"value": value, "stderr": 0.01}}})


def test_cards_carry_the_header_the_training_and_only_these_weights_scores(tmp_path, capsys):
    ckpt = tmp_path / "ckpts" / "gdn-default"
    shutil.copytree(SHIPPED, ckpt)
    (ckpt / "README.md").unlink(missing_ok=True)
    files = checkpoint_identity(ckpt)
    store = Store(tmp_path / "store")
    own = f"base=smollm2-135m,checkpoint=gdn-default,checkpoint_files={files}"
    cell(store, own, "golinear_piqa", 0.6469, 1838)
    cell(store, own, "golinear_arc_easy", 0.5, 20, config={"limit": 20, "num_fewshot": 0})
    cell(store, "base=smollm2-135m,checkpoint=gdn-default,checkpoint_files=0123456789", "golinear_hellaswag", 0.9, 7)
    cell(store, own + ",retain=28,window=28", "golinear_winogrande", 0.8, 9)  # other cache options: another model
    assert golinear(["cards", "--checkpoints", str(tmp_path / "ckpts"), "--store", str(store.root)]) == 0
    assert "1 of 1 model card(s) changed" in capsys.readouterr().out
    card = (ckpt / "README.md").read_text()
    header = yaml.safe_load(card.split("---\n")[1])
    assert header["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and header["library_name"] == "golinear"
    assert {"gated-deltanet", "sliding-window-attention", "short-convolution"} <= set(header["tags"])
    assert header["datasets"] == ["mlschmitt/classic-books-markdown"]
    assert "tokens trained: 10,240,000 in 2,500 steps" in card and "seeds: initialisation 0, data order 0" in card
    assert "| 3.470 | 3.908 | 3.567 |" in card  # held-out loss: full attention, init, trained
    assert "| piqa | acc (%) | 64.69 | 1.00 | 1838 | full set |" in card
    assert "| arc_easy | acc (%) | 50.00 | 1.00 | 20 | first 20 |" in card
    assert "hellaswag" not in card and "winogrande" not in card  # old weights' and another model's cells
    assert golinear(["cards", "--checkpoints", str(ckpt), "--store", str(store.root)]) == 0
    assert "0 of 1 model card(s) changed" in capsys.readouterr().out  # nothing new: the card is left alone


def test_cards_bad_folders_are_one_line_errors(tmp_path, capsys):
    assert golinear(["cards", "--checkpoints", str(tmp_path / "nope"), "--store", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "store" / "cells").mkdir(parents=True)
    assert golinear(["cards", "--checkpoints", str(tmp_path), "--store", str(tmp_path / "store")]) == 2
    assert "no checkpoint folders" in capsys.readouterr().err


HOSTILE = "=ev`il<img src=x onerror=alert(1)>|x"


def test_a_hostile_checkpoint_name_is_text_in_its_card(tmp_path):
    """A folder named with a backtick, an HTML tag, a `|` and a leading `=`: the card's heading shows it as text (no
    tag, no table cell, no broken code span), and its lm-eval line keeps it inside one code span."""
    import re

    from golinear.models.checkpoint.model_card import card_text
    ckpt = tmp_path / HOSTILE
    shutil.copytree(SHIPPED, ckpt)
    text = card_text(ckpt)
    heading = next(line for line in text.splitlines() if line.startswith("# "))
    assert "<img" not in heading and "&lt;img" in heading and "\\`" in heading and "\\|" in heading
    raw = [line for line in text.splitlines() if "<img" in line]  # only in the code block and the code span
    assert len(raw) == 2 and raw[0].startswith("model, tokenizer, info = load_model(") and "``" in raw[1]
    span = re.search(r"(`+)golinear lm-eval (.*?)\1", text)
    assert span and f"/{HOSTILE} --tasks golinear_piqa" in span.group(2) and len(span.group(1)) == 2


def test_csv_cells_that_would_run_as_formulas_are_text():
    """A leaderboard CSV opened in a spreadsheet: a label starting with = + - @ is prefixed with an apostrophe;
    numbers, negative numbers and the "-" of a missing value stay as they are."""
    import pandas as pd

    from golinear.bench.boards.leaderboard import to_csv
    table = pd.DataFrame({"model": [HOSTILE, "+1+cmd", "@SUM(A1)", "-2+3", "gdn", "-"], "acc": [0.5, -0.25, 1, 2, 3, 4]})
    rows = to_csv(table).splitlines()[1:]
    assert [r.rsplit(",", 1)[0] for r in rows] == ["'" + HOSTILE, "'+1+cmd", "'@SUM(A1)", "'-2+3", "gdn", "-"]
    assert rows[1].endswith(",-0.2500")


def test_the_store_a_card_names_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    """An absolute --store (the default is one) below the working directory is named as a relative path: a card is
    handed to users, so it names no folder of the machine that wrote it."""
    ckpt = tmp_path / "ckpts" / "gdn-default"
    shutil.copytree(SHIPPED, ckpt)
    store = Store(tmp_path / "leaderboards" / "store")
    cell(store, "full", "golinear_piqa", 0.5, 10)
    monkeypatch.chdir(tmp_path)
    assert golinear(["cards", "--checkpoints", str(ckpt), "--store", str(store.root.resolve())]) == 0
    card = (ckpt / "README.md").read_text()
    assert "(from `leaderboards/store`)" in card and str(tmp_path) not in card
