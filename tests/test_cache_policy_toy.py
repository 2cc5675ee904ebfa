"""A cache policy added in this file alone (models.cache.policies' public registry): "keep the keys of largest norm".

It runs, with no other module touched, through the layer's whole-prompt pass (the slots after the prompt hold the
largest-norm keys, and the output is the retention definition's with those scores), HF-generate decoding, the
right-padded one-pass prefill and batched decoding (models.decoding.batch_generate), and lm-eval's generate_until through
bench.backends.lm_backend (batched = one prompt at a time). fp32 on the CPU, tiny random Llama models."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from golinear.models.decoding.batch_generate import decoder_for, generate_batch  # noqa: E402
from golinear.models.retention.ops import retention_recurrent  # noqa: E402
from golinear.models.cache.policies import (make_policy, policy_class, policy_names, register_policy, retention_scores,  # noqa: E402
                             unregister_policy)
from golinear.models.cache.policies.base import CachePolicy  # noqa: E402
from golinear.models.cache.policies.retention_slots import RetentionSlots  # noqa: E402
from golinear.models.retention.generate import RetentionDecoder  # noqa: E402
from golinear.models.spec import RETAIN_SCORES, ModelSpec  # noqa: E402
from test_batched_generate import alone, prompts, tiny_model  # noqa: E402
from test_retention import assert_close, tiny_layer  # noqa: E402


@dataclasses.dataclass(eq=False, repr=False)
class KeyNorm(RetentionSlots):
    """Keep the keys of largest norm: a key's score is its L2 norm, fixed when it arrives."""

    def score(self, keys):
        return keys.float().norm(dim=-1)


@pytest.fixture(autouse=True, scope="module")
def key_norm_registered():
    """Registered for this file's tests only (other files compare the list of allowed scores)."""
    register_policy("key_norm", KeyNorm)  # the one registry line
    yield
    unregister_policy("key_norm")


RECIPE = dict(window=4, sinks=2, short_conv=True, retain=3, retain_score="key_norm")


def test_the_registry_lists_it_beside_the_built_in_policies():
    assert policy_class("key_norm") is KeyNorm and KeyNorm.name == "key_norm"
    assert policy_names()[:4] == ("window_sinks", "delta_error", "proj_residual", "fitted")
    assert retention_scores()[:3] == RETAIN_SCORES and "key_norm" in retention_scores()
    assert isinstance(make_policy(3, "key_norm"), KeyNorm) and make_policy(3, "key_norm").slots == 3
    assert type(make_policy(0, "key_norm")).__name__ == "WindowSinks"  # no slots: the default policy
    assert ModelSpec.from_string("mechanism=gdn,window=4,retain=3,retain_score=key_norm").retain_score == "key_norm"
    with pytest.raises(ValueError, match="already registered"):
        register_policy("delta_error", KeyNorm)
    with pytest.raises(TypeError, match="CachePolicy subclass"):
        register_policy("not_a_policy", dict)
    with pytest.raises(ValueError, match=r"unknown retention score 'key_nrom'; allowed: \['delta_error'"):
        ModelSpec.from_string("mechanism=gdn,window=4,retain=3,retain_score=key_nrom")
    assert issubclass(KeyNorm, CachePolicy)
    with pytest.raises(ValueError, match="was not added with register_policy"):
        unregister_policy("delta_error")


def test_prefill_keeps_the_largest_norm_keys_and_is_the_definition():
    """The layer's whole-prompt pass = retention_recurrent with the key norms as given scores; after the prompt each
    KV head's slots hold the 3 largest-norm keys among the tokens that left the window (positions 2..21 of 26)."""
    from golinear.models.cache.decode_state import DecodeState
    layer, y_layer, (q, k, v, lin), (x, pe) = tiny_layer(window=4, sinks=2, retain=3, retain_score="key_norm")
    assert isinstance(layer.cache_policy, KeyNorm)
    with torch.no_grad():
        norms = k.float().norm(dim=-1)  # [B, T, Hkv]
        y, info = retention_recurrent(q, k, v, lin, layer.scaling, layer.lin.scale, 2, 4, 3, score="given",
                                      scores=norms)
        state = DecodeState()
        layer.prefill(x, pe, state)
    assert_close(y_layer, y, 1e-5)
    ret_pos = state.retention.ret_pos  # [B, Hkv, 3]
    for b in range(2):
        for h in range(2):
            left = torch.arange(2, 26 - 4)
            best = left[norms[b, left, h].topk(3).indices].sort().values
            assert ret_pos[b, h].sort().values.tolist() == best.tolist() == sorted(info["retained"][b][h])


def test_batched_decoding_equals_each_prompt_alone():
    """decoder_for picks RetentionDecoder for the toy policy; a batch of prompts of different lengths (one shorter
    than sinks + window) gives, token for token, HF generate of each prompt alone."""
    model = tiny_model("gdn", **RECIPE)
    ps, n = prompts([7, 19, 3, 11]), 10
    decoder = decoder_for(model, max_len=64)
    assert isinstance(decoder, RetentionDecoder)
    assert generate_batch(decoder, ps, n) == [alone(model, p, n) for p in ps]
    other = tiny_model("gdn", **{**RECIPE, "retain_score": "delta_error"})  # the policy changes what is kept
    assert generate_batch(decoder_for(other, max_len=64), ps, n) != generate_batch(decoder, ps, n)


@pytest.mark.slow
def test_lm_eval_generate_until_batched_equals_one_at_a_time(tmp_path):
    """bench.backends.lm_backend with retain_score=key_norm in its model args: lm-eval's generate_until batched (the
    default for retention slots) gives what each prompt generated alone gives."""
    from lm_eval.api.instance import Instance

    import golinear.bench.backends.lm_backend as B
    from tests._tiny import write_tiny_backbone

    tiny = write_tiny_backbone(tmp_path / "tiny")
    args = dict(base=str(tiny), mechanism="gdn", window=4, sinks=1, retain=2, retain_score="key_norm")
    assert B.check_model_args("linearized", args)["generation"] == "batched"
    texts = ["the cat", "the cat sat on a mat and the dog ran to the red house", "birds sang over green hills under"]
    reqs = [Instance("generate_until", {}, (t, {"until": ["."], "max_gen_toks": 6, "do_sample": False}), i)
            for i, t in enumerate(texts)]
    lms = {mode: B.make_lm("linearized", **args, generation=mode, batch_size=3) for mode in ("sequential", "batched")}
    assert all(isinstance(a.cache_policy, KeyNorm) for a in lms["batched"].model.modules() if hasattr(a, "retain"))
    outs = {mode: lm.generate_until(reqs, disable_tqdm=True) for mode, lm in lms.items()}
    assert outs["batched"] == outs["sequential"] and len(outs["batched"]) == 3


def test_a_policy_added_then_removed_leaves_the_registry_as_it_was():
    class Other(KeyNorm):
        pass
    register_policy("key_norm_2", Other)
    assert policy_class("key_norm_2") is Other and Other.name == "key_norm_2" and KeyNorm.name == "key_norm"
    unregister_policy("key_norm_2")
    assert "key_norm_2" not in retention_scores()
