"""scripts/study/recipes.txt, the study's list of `golinear train` runs: every line passes check_recipes.py (the
train parser, TrainConfig.validate, the linearize checks), names are unique, and every committed checkpoint of a
recipe's name was trained with exactly that recipe (its model options and its schedule), so the tables that cite a
recipe cite its checkpoint."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from golinear.bench.cli import build_parser
from golinear.models.attention.linearize import LinearizeConfig
from golinear.models.spec import read_checkpoint_config
from golinear.models.training.train_cli import linearize_options, train_config_from_args

ROOT = Path(__file__).resolve().parent.parent
CKPT = ROOT / "checkpoints" / "smollm2-135m"
_spec = importlib.util.spec_from_file_location("check_recipes", ROOT / "scripts" / "study" / "check_recipes.py")
check_recipes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_recipes)
LINES = check_recipes.recipes()
RECIPES = dict(LINES)
SCHEDULE = ("seed", "lr", "lora_lr", "seq_len", "steps")


def test_names_are_unique():
    assert len(LINES) == len(RECIPES)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_is_a_valid_run_and_matches_its_checkpoint(name):
    check_recipes.check(name, RECIPES[name])
    args = build_parser("train").parse_args(["train", "--base", "smollm2-135m", *RECIPES[name]])
    folder = CKPT / name
    if not (folder / "config.json").exists():
        pytest.skip(f"{name}: not trained yet (docs/study.md)")
    linearize = LinearizeConfig.from_dict(linearize_options(args)).to_dict()
    saved = read_checkpoint_config(folder)["linearize"]  # a scorer copy's name resolved in the folder
    if "scorer" in linearize:  # the checkpoint's copy is the recipe's scorer file, byte for byte
        assert Path(saved.pop("scorer")).read_bytes() == Path(linearize.pop("scorer")).read_bytes()
    assert saved == linearize
    train = train_config_from_args(args)
    record = json.loads((folder / "train_config.json").read_text())["train"]
    assert {k: record[k] for k in SCHEDULE} == {k: getattr(train, k) for k in SCHEDULE}
