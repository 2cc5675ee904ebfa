"""scripts/study/recipes.txt, the study's list of `golinear train` runs: every line is a valid run, names are unique,
and every committed checkpoint of a recipe's name was trained with exactly that recipe (its model options and its
schedule), so the tables that cite a recipe cite its checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import build_parser
from models.linearize import LinearizeConfig
from models.train_cli import linearize_options, train_config_from_args

ROOT = Path(__file__).resolve().parent.parent
CKPT = ROOT / "checkpoints" / "smollm2-135m"
LINES = [line.split("#")[0].split() for line in (ROOT / "scripts" / "study" / "recipes.txt").read_text().splitlines()]
RECIPES = {words[0]: words[1:] for words in LINES if words}
SCHEDULE = ("seed", "lr", "lora_lr", "seq_len", "steps")


def parse(options):
    return build_parser("train").parse_args(["train", "--out", "unused", *options])


def test_names_are_unique():
    names = [words[0] for words in LINES if words]
    assert len(names) == len(set(names)) == len(RECIPES)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_is_a_valid_run_and_matches_its_checkpoint(name):
    args = parse(RECIPES[name])
    linearize = LinearizeConfig.from_dict(linearize_options(args)).to_dict()
    train = train_config_from_args(args)
    folder = CKPT / name
    if not (folder / "config.json").exists():
        pytest.skip(f"{name}: not trained yet (docs/study.md, the GPU queue)")
    assert json.loads((folder / "config.json").read_text())["linearize"] == linearize
    record = json.loads((folder / "train_config.json").read_text())["train"]
    assert {k: record[k] for k in SCHEDULE} == {k: getattr(train, k) for k in SCHEDULE}
