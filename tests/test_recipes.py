"""scripts/study/recipes.txt, the study's list of `golinear train` runs: every line passes check_recipes.py (the
train parser, TrainConfig.validate, the linearize checks), names are unique, and every committed checkpoint of a
recipe's name was trained with exactly that recipe (its model options and its schedule), so the tables that cite a
recipe cite its checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from golinear.bench.cli import build_parser
from golinear.models.attention.linearize import LinearizeConfig
from golinear.models.spec import read_checkpoint_config
from golinear.models.training.train_cli import linearize_options, train_config_from_args

from _scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
CKPT = ROOT / "checkpoints" / "smollm2-135m"
check_recipes = load_script("study/check_recipes.py")
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


def test_the_lora_control_has_about_the_recipes_trainable_parameters():
    """control-lora-r5's rank is the one whose LoRA parameter count is closest to the default recipe's new parameters
    (the count scripts/study/recipes.txt states), and it trains no linearized layer: every query sees every earlier
    token of a training sequence."""
    from golinear.models.attention.linearize import count_new_parameters, linearize
    from golinear.models.backbones.backbone import random_backbone

    def count(options):
        model = random_backbone("smollm2-135m", device="meta")
        args = build_parser("train").parse_args(["train", "--base", "smollm2-135m", *options])
        linearize(model, LinearizeConfig.from_dict(linearize_options(args)))
        return count_new_parameters(model)
    recipe = count(RECIPES["gdn-w56-s8-sc"])
    control = RECIPES["control-lora-r5"]
    rank = int(control[control.index("--lora-rank") + 1])
    by_rank = {r: count([*control[:control.index("--lora-rank")], "--lora-rank", str(r)]) for r in range(1, 12)}
    assert min(by_rank, key=lambda r: abs(by_rank[r] - recipe)) == rank
    assert (recipe, by_rank[rank]) == (426_780, 403_200)
    window = int(control[control.index("--window") + 1])
    assert window >= train_config_from_args(build_parser("train").parse_args(["train", *control])).seq_len
