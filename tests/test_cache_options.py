"""A checkpoint evaluated under other cache options (models.spec.CACHE_KEYS: window, sinks, retain, retain_score),
training-free: the same trained parameters, another set of tokens for the softmax (this puts retention slots
into a default-recipe checkpoint). Tiny Llama backbone on the CPU."""
from __future__ import annotations

import pytest
import torch

from golinear.bench.backends import lm_backend as B
from golinear.bench.run.specs import label_of, parse_model_spec
from golinear.models.checkpoint.weights import save_checkpoint
from golinear.models.attention.linearize import new_parameters
from golinear.models.load import load_model
from golinear.models.attention.projection import decoder_layers
from tests._tiny import write_tiny_backbone


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cache")
    base = write_tiny_backbone(tmp / "tiny")
    model, _, _ = load_model(base=str(base), mechanism="gdn", window=6, sinks=2, short_conv=True)
    with torch.no_grad():  # off the neutral initialisation, so the linear path matters
        for p in new_parameters(model).values():
            p.add_(0.05 * torch.randn_like(p))
    return save_checkpoint(model, tmp / "gdn-w6-s2-sc")


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def test_spec_string_and_budget(ckpt):
    plain = parse_model_spec(str(ckpt))
    spec = parse_model_spec(f"{ckpt},window=3,retain=3,retain_score=proj_residual")
    assert spec.checkpoint == str(ckpt.resolve()) and (spec.window, spec.retain) == (3, 3)
    assert plain.budget == 8 and spec.budget == 2 + 3 + 3  # the checkpoint's sinks, the given window and slots
    assert spec.key != plain.key and "retain=3" in spec.key and "checkpoint=gdn-w6-s2-sc" in spec.key
    assert label_of(f"{ckpt},window=3,retain=3") == "gdn-w6-s2-sc,window=3,retain=3"
    lin = spec.checkpoint_linearize()
    assert (lin["mechanism"], lin["window"], lin["sinks"], lin["retain"], lin["short_conv"]) == ("gdn", 3, 2, 3, True)


def test_other_options_and_impossible_combinations_are_refused(ckpt):
    with pytest.raises(ValueError, match=r"only the cache options .* drop \['short_conv'\]"):
        B.check_model_args("linearized", {"checkpoint": str(ckpt), "short_conv": True})
    with pytest.raises(ValueError, match=r"drop \['lora'\]"):
        B.check_model_args("linearized", {"checkpoint": str(ckpt), "lora": True})
    with pytest.raises(ValueError, match="retain_score='proj_residual' needs retain > 0"):
        B.check_model_args("linearized", {"checkpoint": str(ckpt), "retain_score": "proj_residual"})
    with pytest.raises(ValueError, match="already names its mechanism"):
        load_model(checkpoint=str(ckpt), mechanism="gla")


def test_the_same_parameters_under_another_cache(ckpt):
    ids = torch.randint(0, 200, (2, 40))
    ref, _, _ = load_model(checkpoint=str(ckpt))
    same, _, info_same = load_model(checkpoint=str(ckpt), window=6)  # the checkpoint's own value: the same model
    torch.testing.assert_close(_logits(same, ids), _logits(ref, ids), rtol=0, atol=0)
    model, _, info = load_model(checkpoint=str(ckpt), window=3, retain=3, retain_score="proj_residual")
    attn = [layer.self_attn for layer in decoder_layers(model)]
    assert all((a.window, a.sinks, a.retain, a.retain_score) == (3, 2, 3, "proj_residual") for a in attn)
    assert info["cache_options"] == {"window": 3, "retain": 3, "retain_score": "proj_residual"}
    assert info["cache_budget"] == 8 and info["linearize"]["retain"] == 3 and info_same["cache_budget"] == 8
    want, got = new_parameters(ref), new_parameters(model)
    assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want)
    assert not torch.allclose(_logits(model, ids), _logits(ref, ids))  # the softmax sees other tokens


def test_lm_eval_backend_loads_it(ckpt):
    lm = B.make_lm("linearized", checkpoint=str(ckpt), window=4, sinks=1)
    assert lm.golinear_info["cache_options"] == {"window": 4, "sinks": 1}
    assert lm.golinear_info["cache_budget"] == 5


def test_a_budget_sweep_moves_a_checkpoints_window(ckpt):
    spec = parse_model_spec(str(ckpt)).with_budget(16, sinks=2)
    assert spec.budget == 16 and spec.checkpoint_linearize()["window"] == 14 and spec.label == "gdn-w6-s2-sc @16"
    slots = parse_model_spec(f"{ckpt},window=3,retain=3").with_budget(16, sinks=2)  # the slots are kept
    assert (slots.window, slots.retain, slots.budget) == (11, 3, 16)
