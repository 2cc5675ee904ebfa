"""retain_score=fitted (models/retention/scorer.py): the features do not see RoPE, the layer's slots are the
definition's with the scorer's scores, prefill and decode agree, checkpoints carry the scorer file, the store keys
its contents, and bad scorer files or options are refused with one line naming them (CPU, fp32)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from golinear.models.checkpoint.weights import apply_checkpoint, save_checkpoint
from golinear.models.attention.linearize import LinearizeConfig, linearize
from golinear.models.retention.ops import retention_recurrent
from golinear.models.retention.scorer import arrival_scores, load_scorer, pair_magnitudes, save_scorer, scorer_for_model
from golinear.models.spec import ModelSpec, checkpoint_identity
from test_retention import RECIPE, rel_err, tiny_layer, tiny_model

SHAPE = (3, 2, 8)  # tiny_model's (and test_batched_generate's) layers, KV heads, head_dim / 2


def write_scorer(path, seed=0, shape=SHAPE, meta=None):
    g = torch.Generator().manual_seed(seed)
    return save_scorer(path, torch.randn(*shape, generator=g), torch.randn(*shape[:2], generator=g),
                       meta if meta is not None else {"fit": "test"})


@pytest.fixture
def scorer(tmp_path):
    return str(write_scorer(tmp_path / "scorer.safetensors"))


def _rope(k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Llama's rotate-half RoPE on [T, D] keys."""
    half = k.shape[-1] // 2
    inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64) / half))
    ang = pos.view(-1, 1).double() * inv
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    rot = torch.cat([-k[:, half:], k[:, :half]], -1)
    return k * cos + rot * sin


def test_pair_magnitudes_do_not_see_rope():
    k = torch.randn(10, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rotated = _rope(k, torch.arange(10) * 37)
    torch.testing.assert_close(pair_magnitudes(rotated), pair_magnitudes(k).float())
    assert not torch.allclose(pair_magnitudes(k.roll(1, -1)), pair_magnitudes(k))


def test_arrival_scores_are_the_linear_rule_per_kv_head():
    g = torch.Generator().manual_seed(6)
    w, b, k = torch.randn(3, 4, generator=g), torch.randn(3, generator=g), torch.randn(2, 5, 3, 8, generator=g)
    want = torch.stack([(pair_magnitudes(k[:, :, h]) * w[h]).sum(-1) + b[h] for h in range(3)], -1)
    torch.testing.assert_close(arrival_scores(k, w, b), want)


def test_layer_with_a_fitted_scorer_is_the_definition():
    """LinearizedAttention(retain_score=fitted) = retention_recurrent with the scorer's scores as "given", and its
    slots differ from proj_residual's on the same inputs."""
    w, b = torch.randn(2, 3, generator=torch.Generator().manual_seed(1)) * 3, torch.zeros(2)
    layer, y_layer, (q, k, v, lin), _ = tiny_layer(window=4, sinks=2, retain=3, retain_score="fitted", scorer=(w, b))
    with torch.no_grad():
        args = (q, k, v, lin, layer.scaling, layer.lin.scale, 2, 4, 3)
        y, info = retention_recurrent(*args, score="given", scores=arrival_scores(k, w, b))
        _, other = retention_recurrent(*args, score="proj_residual")
    assert rel_err(y_layer, y) <= 1e-5
    assert info["retained"] != other["retained"]


@pytest.mark.parametrize("prompt", [3, 20])
def test_decode_cache_equals_the_full_forward(scorer, prompt):
    """Prefill through the fixed-size LinearCache, then one token a step = the full forward (fp32). Teacher-forced
    random tokens: a greedy tiny model repeats one token, and a repeated token's keys differ by RoPE alone, which
    the scorer does not see, so its scores tie up to rounding and the two paths may break the tie differently."""
    from golinear.models.cache.hf_cache import LinearCache
    model = tiny_model(**RECIPE, retain=3, retain_score="fitted", scorer=scorer)
    ids = torch.randint(0, 97, (2, 36), generator=torch.Generator().manual_seed(prompt))
    with torch.no_grad():
        full = model(ids).logits
        cache = LinearCache.for_model(model)
        first = model(ids[:, :prompt], past_key_values=cache, use_cache=True).logits
        steps = [model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits for t in range(prompt, 36)]
    assert rel_err(torch.cat([first] + steps, 1), full) <= 1e-5


def test_batched_decoder_equals_each_prompt_alone(scorer):
    """RetentionDecoder (one right-padded prefill, per-row steps) = HF generate of each prompt alone."""
    from golinear.models.decoding.batch_generate import decoder_for, generate_batch
    from test_batched_generate import alone, prompts
    from test_batched_generate import tiny_model as batch_model
    model = batch_model("gdn", window=4, sinks=2, short_conv=True, retain=3, retain_score="fitted", scorer=scorer)
    ps = prompts([7, 6, 19, 3])
    assert generate_batch(decoder_for(model, max_len=64), ps, 12) == [alone(model, p, 12) for p in ps]


def test_checkpoint_carries_the_scorer_file(scorer, tmp_path):
    """The checkpoint folder holds a copy of the scorer, named relative to it: a copied folder loads without the
    original file and computes the same logits; another scorer's contents key other store cells."""
    model = tiny_model(**RECIPE, retain=3, retain_score="fitted", scorer=scorer)
    save_checkpoint(model, tmp_path / "ck")
    lin = json.loads((tmp_path / "ck" / "config.json").read_text())["linearize"]
    assert (lin["retain_score"], lin["scorer"]) == ("fitted", "scorer.safetensors")
    other = apply_checkpoint(tiny_model(), tmp_path / "ck", cache={"retain_score": "proj_residual"})  # its file left
    assert {layer.self_attn.retain_score for layer in other.model.layers} == {"proj_residual"}
    shutil.copytree(tmp_path / "ck", tmp_path / "moved")
    ident = checkpoint_identity(tmp_path / "moved")
    (tmp_path / "scorer.safetensors").unlink()
    fresh = apply_checkpoint(tiny_model(), tmp_path / "moved")
    ids = torch.randint(0, 97, (1, 30))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    write_scorer(tmp_path / "moved" / "scorer.safetensors", seed=1)
    assert checkpoint_identity(tmp_path / "moved") != ident


def test_training_free_scorer_on_a_checkpoint_and_its_store_key(scorer, tmp_path):
    """A checkpoint without slots takes a fitted scorer as cache options; the store key names the scorer file by
    name and content, so a refitted file is another model."""
    save_checkpoint(tiny_model(**RECIPE), tmp_path / "plain")
    text = f"{tmp_path / 'plain'},window=2,retain=2,retain_score=fitted,scorer={scorer}"
    spec = ModelSpec.from_string(text)
    assert spec.checkpoint_linearize()["scorer"] == scorer
    key = spec.store_key()
    assert "scorer=scorer.safetensors" in key and "scorer_file=" in key
    write_scorer(scorer, seed=2)
    assert ModelSpec.from_string(text).store_key() != key
    model = apply_checkpoint(tiny_model(), tmp_path / "plain", cache={"window": 2, "retain": 2,
                                                                      "retain_score": "fitted", "scorer": scorer})
    assert all(layer.self_attn.retain_score == "fitted" for layer in model.model.layers)


@pytest.mark.parametrize("options,message", [
    (dict(retain_score="fitted"), r"^retain_score=fitted needs scorer=<a scorer file>"),
    (dict(retain_score="proj_residual", scorer="S"), r"^scorer='.*' is read only with retain_score=fitted, "
                                                       r"got 'proj_residual'$"),
])
def test_options_without_their_pair_are_refused(scorer, options, message):
    options = {k: (scorer if v == "S" else v) for k, v in options.items()}
    with pytest.raises(ValueError, match=message):
        linearize(tiny_model(), LinearizeConfig(**RECIPE, retain=2, **options))
    with pytest.raises(ValueError, match=r"^scorer='.*' needs retain > 0"):
        ModelSpec(mechanism="gdn", window=4, scorer=scorer)


def test_bad_scorer_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^retention scorer file '.*nowhere.safetensors' does not exist$"):
        ModelSpec(mechanism="gdn", window=4, retain=2, retain_score="fitted", scorer=tmp_path / "nowhere.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"^retention scorer file '.*junk.safetensors' is unreadable"):
        load_scorer(tmp_path / "junk.safetensors")
    save_checkpoint(tiny_model(**RECIPE), tmp_path / "ck")  # a safetensors file of other tensors
    with pytest.raises(ValueError, match=r"^'.*new_params.safetensors' is not a retention scorer file"):
        load_scorer(tmp_path / "ck" / "new_params.safetensors")


def test_a_scorer_for_another_backbone_is_refused(tmp_path):
    config = tiny_model().config
    wide = write_scorer(tmp_path / "wide.safetensors", shape=(3, 2, 32))
    with pytest.raises(ValueError, match=r"has weight \(3, 2, 32\); this backbone needs \[layers, KV heads, "
                                         r"head_dim/2\] = \[3, 2, 8\]$"):
        linearize(tiny_model(), LinearizeConfig(**RECIPE, retain=2, retain_score="fitted", scorer=str(wide)))
    other = write_scorer(tmp_path / "other.safetensors", meta={"base_fingerprint": "0123456789abcdef"})
    with pytest.raises(ValueError, match=r"was fitted on base weights 0123456789abcdef, but this model's are "):
        scorer_for_model(other, config, "fedcba9876543210")
    with pytest.raises(ValueError, match=r"was fitted on base weights 0123456789abcdef"):  # float32: its own print
        linearize(tiny_model(), LinearizeConfig(**RECIPE, retain=2, retain_score="fitted", scorer=str(other)))
    assert scorer_for_model(other, config, None)[0].shape == (3, 2, 8)  # base unknown: the shape alone is checked


def test_the_committed_scorer_fits_smollm2():
    """checkpoints/smollm2-135m/scorers/value.safetensors: SmolLM2's shape, fitted to mark inserted values on its
    own frozen weights (the fingerprint checkpoints name)."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "checkpoints" / "smollm2-135m" / "scorers" / "value.safetensors"
    weight, bias, meta = load_scorer(path)
    assert tuple(weight.shape) == (30, 3, 32) and tuple(bias.shape) == (30, 3)
    assert meta["fit"]["target"] == "value" and meta["base"] == "smollm2-135m"
    reference = json.loads((path.parents[1] / "gdn-w504-s8-sc" / "config.json").read_text())["base_fingerprint"]
    assert meta["base_fingerprint"] == reference


def test_labels_and_families_name_the_scorer_by_its_file_name(scorer, tmp_path):
    """Table rows must not depend on where the scorer file sat (an H200's working tree or this one)."""
    from golinear.bench.boards.families import family_of
    from golinear.bench.run.specs import label_of
    save_checkpoint(tiny_model(**RECIPE), tmp_path / "plain")
    label = label_of(f"{tmp_path / 'plain'},window=2,retain=2,retain_score=fitted,scorer={scorer}")
    assert label == "plain,window=2,retain=2,retain_score=fitted,scorer=scorer.safetensors"
    from golinear.bench.boards.measured import by_file_name
    assert by_file_name("gdn-w248-s8-sc,retain=124,scorer=checkpoints/x/numbers.safetensors") == \
        "gdn-w248-s8-sc,retain=124,scorer=numbers.safetensors"  # a cell stored with the path in its label
    assert by_file_name("snapkv (kvpress, question-aware) @256") == "snapkv (kvpress, question-aware) @256"
    # a named preset or shipped folder (not a path): the scorer by its file name too
    assert label_of(f"gdn-w248-s8-sc,window=124,retain=124,retain_score=fitted,scorer={scorer}") == \
        "gdn-w248-s8-sc,window=124,retain=124,retain_score=fitted,scorer=scorer.safetensors"
    lin = {"mechanism": "gdn", "window": 2, "sinks": 2, "retain": 2, "retain_score": "fitted"}
    here, there = ({"label": "x", "backbone": "b", "info": {"trained": True, "linearize": {**lin, "scorer": p}}}
                   for p in (scorer, "/elsewhere/scorer.safetensors"))
    assert family_of(here) == family_of(there)
    named = {family_of({**here, "info": {"trained": True, "linearize": {**lin, "scorer": f}}})[1]
             for f in ("/a/value.safetensors", "/b/numbers.safetensors", "/c/ck/scorer.safetensors")}
    assert sorted(n.split("retained (")[1].split(")")[0] for n in named) == ["fitted", "fitted numbers", "fitted value"]


def test_a_cell_key_refuses_a_checkpoint_or_scorer_that_is_gone(scorer, tmp_path):
    """A key computed after the folder (or scorer file) vanished mid-run would file the cell under another model."""
    import shutil

    from golinear.bench.run.specs import parse_model_spec
    save_checkpoint(tiny_model(**RECIPE), tmp_path / "plain")
    spec = parse_model_spec(f"{tmp_path / 'plain'},window=2,retain=2,retain_score=fitted,scorer={scorer}")
    assert "checkpoint_files=" in spec.store_key() and "scorer_file=" in spec.store_key()
    moved = tmp_path / "moved.safetensors"
    shutil.move(scorer, moved)
    with pytest.raises(FileNotFoundError, match="scorer file .* does not exist"):
        spec.store_key()
    shutil.move(moved, scorer)
    shutil.rmtree(tmp_path / "plain")
    with pytest.raises(FileNotFoundError, match="has no checkpoint files"):
        spec.store_key()
