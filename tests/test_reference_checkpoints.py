"""Every shipped SmolLM2 reference checkpoint is complete, loads onto the real backbone on CPU, scores better
than a uniform guess and better than its own fresh initialisation on held-out book text (so its trained
parameters, not defaults, were loaded); the one-call loader agrees with apply_checkpoint."""
import copy
import json
import math
import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CKPT_ROOT = ROOT / "checkpoints" / "smollm2-135m"
FOLDERS = sorted(p for p in CKPT_ROOT.iterdir() if (p / "new_params.safetensors").exists())
# Seed replicas (<recipe>-seedN) share their recipe's code path: the forward-pass test runs on one seed per recipe
# (CI time: ~10 s a folder); every replica still gets the file, record and parameter checks below.
SEED_REPLICAS = [p for p in FOLDERS if re.search(r"-seed\d+$", p.name)]
RECIPES = [p for p in FOLDERS if p not in SEED_REPLICAS]
# the study's recipes: strict GLA, kGLA, GDN, Hedgehog; GDN + 64 window; + 56 window + 8 sinks; + short conv;
# + LoRA instead; the final recipe at a 128-token budget
EXPECTED = {"gla", "kgla", "gdn", "hedgehog", "gdn-w64", "gdn-w56-s8", "gdn-w56-s8-sc", "gdn-w56-s8-lora",
            "gdn-w120-s8-sc"}
TOKENS = 384
# Strict GDN as written (no window, frozen q/k/v) is still about as bad as a uniform guess on held-out text
# after 10M tokens (measured here: 11.01, fresh 11.25, log(vocab) = 10.80; held-out CE 9.95 in its
# train_config.json): its output is too small for the frozen o_proj (docs/study.md). For it the test asks only
# that training helped (beats the init).
NEAR_UNIFORM = {"gdn"}


def test_every_reference_recipe_is_shipped():
    assert EXPECTED <= {p.name for p in FOLDERS}


@pytest.fixture(scope="module")
def base_and_text():
    from golinear.models.training import data as data_mod
    from golinear.models.backbones.backbone import load_backbone
    model, tok = load_backbone("smollm2-135m")
    try:
        files = data_mod.book_files()
    except FileNotFoundError as e:
        pytest.skip(f"books corpus not available: {e}")
    docs = dict(data_mod.read_jsonl_docs(files))
    held = data_mod.heldout_ids(docs, 8)[0]  # a book no checkpoint was trained on
    ids = data_mod.tokenize_docs([docs[held]], tok, max_tokens=TOKENS)
    return model.eval(), torch.as_tensor(ids, dtype=torch.long).unsqueeze(0)


def _loss(model, ids) -> float:
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


def _check_files_and_record(folder):
    from golinear.models.checkpoint.weights import read_config
    for f in ("new_params.safetensors", "config.json", "train_log.jsonl", "train_config.json", "loss.png"):
        assert (folder / f).exists(), f"{folder.name}/{f}"
    config = read_config(folder)
    assert config["training"]["summary"]["finished"] and config["training"]["summary"]["tokens"] > 0
    record = json.loads((folder / "train_config.json").read_text())["results"]
    assert record["heldout_loss_trained"] < record["heldout_loss_init"]
    return config


@pytest.mark.parametrize("folder", SEED_REPLICAS, ids=[p.name for p in SEED_REPLICAS])
def test_seed_replica_is_complete_and_differs_from_its_recipe(folder):
    """A replica is a finished run of its recipe's exact options with other trained values."""
    from safetensors.torch import load_file
    _check_files_and_record(folder)
    recipe = CKPT_ROOT / re.sub(r"-seed\d+$", "", folder.name)
    saved = [json.loads((f / "config.json").read_text())["linearize"] for f in (recipe, folder)]
    assert saved[0] == saved[1]  # as saved: a scorer is named relative to its folder (read_config resolves it)
    if saved[1].get("scorer"):  # retain_score=fitted: both hold a copy of the same scorer file
        assert (recipe / saved[0]["scorer"]).read_bytes() == (folder / saved[1]["scorer"]).read_bytes()
    mine, theirs = load_file(folder / "new_params.safetensors"), load_file(recipe / "new_params.safetensors")
    assert mine.keys() == theirs.keys() and any(not torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize("folder", RECIPES, ids=[p.name for p in RECIPES])
def test_loads_on_cpu_and_beats_its_initialisation(folder, base_and_text):
    from golinear.models.checkpoint.weights import apply_checkpoint
    from golinear.models.attention.linearize import LinearizeConfig, count_new_parameters, linearize
    base, ids = base_and_text
    config = _check_files_and_record(folder)
    trained = apply_checkpoint(copy.deepcopy(base), folder)
    assert count_new_parameters(trained) == config["new_parameters"] > 0
    fresh = copy.deepcopy(base)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # the training's init seed (train_config.json "seeds")
        linearize(fresh, LinearizeConfig.from_dict(config["linearize"]), base_name=config.get("base"))
    loss_trained, loss_fresh = _loss(trained, ids), _loss(fresh, ids)
    assert math.isfinite(loss_trained)
    if folder.name not in NEAR_UNIFORM:
        assert loss_trained < math.log(base.config.vocab_size), (folder.name, loss_trained)
    assert loss_trained < loss_fresh, (folder.name, loss_trained, loss_fresh)


def test_one_call_loader_agrees(base_and_text):
    from golinear.models.checkpoint.weights import apply_checkpoint, read_config
    from golinear.models.load import load_model
    base, ids = base_and_text
    folder = CKPT_ROOT / "gdn-w56-s8-sc"
    model, _, info = load_model(checkpoint=str(folder))
    assert info["trained"] and info["linearize"] == read_config(folder)["linearize"]
    expected = _loss(apply_checkpoint(copy.deepcopy(base), folder), ids)
    assert _loss(model, ids) == pytest.approx(expected, abs=1e-4)
