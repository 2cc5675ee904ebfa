"""The opt-in output norm (out_norm; docs/study.md "Strict GDN at 135M"): absent by default (same
parameters, keys and op outputs as before), one norm on every path (parallel, LinearCache decoding, chunked
prefill + static decode), saved in checkpoints, calibrated to the attention output's size, refused where
it has no meaning."""
import json

import pytest
import torch
import transformers

from _tiny import write_books, write_tiny_backbone
from golinear.models.attention import ops
from golinear.models.cache.hf_cache import LinearCache
from golinear.models.checkpoint.weights import apply_checkpoint, save_checkpoint
from golinear.models.decoding.fast_decode import FastDecoder
from golinear.models.attention.linearize import LinearizeConfig, linearize, new_parameters
from golinear.models.training.out_norm_calibration import calibrate_out_norm
from golinear.models.spec import ModelSpec
from golinear.models.spec.linearize_checks import full_attention_layers

VOCAB = 97


def tiny(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(config).eval()


def with_norm(mech, **opts):
    model = tiny()
    linearize(model, LinearizeConfig(mechanism=mech, out_norm=True, **opts))
    with torch.no_grad():  # off the neutral init, so every new parameter (the norm weight too) matters
        for p in new_parameters(model).values():
            p.add_(0.1 * torch.randn_like(p))
    return model


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("mech", ["gla", "kgla", "gdn"])
def test_default_is_unchanged(mech):
    """Without out_norm: no norm parameter, no key, the same init of every other parameter, and run() returns
    the op's own output bit for bit."""
    plain, normed = tiny(), tiny()
    torch.manual_seed(1)
    linearize(plain, LinearizeConfig(mechanism=mech))
    torch.manual_seed(1)
    linearize(normed, LinearizeConfig(mechanism=mech, out_norm=True))
    names = set(new_parameters(plain))
    assert not any("out_norm" in n for n in plain.state_dict())
    assert set(new_parameters(normed)) - names == {f"model.layers.{i}.self_attn.lin.out_norm.weight" for i in range(3)}
    assert all(torch.equal(p, new_parameters(normed)[n]) for n, p in new_parameters(plain).items())
    assert "out_norm" not in LinearizeConfig(mechanism=mech).to_dict()
    spec = ModelSpec.from_string(f"{mech}-default")
    assert "out_norm" not in spec.store_key() and "out_norm" not in spec.to_model_args()
    assert "out_norm" not in spec.linearize_options()
    layer = plain.model.layers[0].self_attn
    x = torch.randn(1, 9, 64)
    pe = plain.model.rotary_emb(x, torch.arange(9)[None])
    with torch.no_grad():
        q, k, v, _ = layer.project(x, pe)
        lin = layer.linear_inputs(x, q, k, v)
        got, _ = layer.run(lin, lin["q"], None, chunked=True)
        args = (lin["q"], lin["k"], lin["v"], lin["log_a"]) + ((lin["beta"],) if mech == "gdn" else ())
        want, _ = (ops.gdn_chunk if mech == "gdn" else ops.gla_chunk)(*args, layer.lin.scale,
                                                                       initial_state=None, output_final_state=True)
    assert torch.equal(got, want)


@pytest.mark.parametrize("mech", ["gla", "gdn"])
def test_the_norm_is_applied_per_head(mech):
    """run() returns y * rsqrt(mean_d y^2 + 1e-6) * weight[h, d] of the op's output y."""
    model = with_norm(mech)
    layer = model.model.layers[1].self_attn
    weight = torch.tensor([0.5, 1.0, 2.0, 3.0]).view(4, 1) * torch.linspace(0.5, 1.5, 16)
    with torch.no_grad():
        layer.lin.out_norm.weight.copy_(weight)
    x = torch.randn(2, 7, 64)
    pe = model.model.rotary_emb(x, torch.arange(7)[None])
    with torch.no_grad():
        q, k, v, _ = layer.project(x, pe)
        lin = layer.linear_inputs(x, q, k, v)
        o, _ = layer.run(lin, lin["q"], None, chunked=True)
        norm, layer.lin.out_norm = layer.lin.out_norm, None
        y, _ = layer.run(lin, lin["q"], None, chunked=True)
        layer.lin.out_norm = norm
    torch.testing.assert_close(o, y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * weight)


@pytest.mark.parametrize("mech", ["gla", "gdn"])
@pytest.mark.parametrize("opts", [dict(), dict(window=3, sinks=2, short_conv=True)], ids=["strict", "window"])
def test_parallel_equals_token_by_token(mech, opts):
    model = with_norm(mech, **opts)
    ids = torch.randint(0, VOCAB, (2, 14))
    cache = LinearCache.for_model(model)
    with torch.no_grad():
        steps = [model(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits for i in range(14)]
        parallel = model(ids).logits
    assert rel(torch.cat(steps, 1), parallel) <= 1e-5


@pytest.mark.parametrize("mech", ["gla", "gdn"])
@pytest.mark.parametrize("opts", [dict(), dict(window=3, sinks=2, short_conv=True)], ids=["strict", "window"])
def test_chunked_prefill_and_static_decode_equal_parallel(mech, opts):
    """FastDecoder: right-padded rows of different lengths prefilled in chunks of 4 (models.decoding.prefill), then
    decoded on the static cache; each row's logits equal the parallel forward of that row alone."""
    model = with_norm(mech, **opts)
    lens, T = [3, 9, 13], 13
    ids = torch.randint(1, VOCAB, (3, T))
    fd = FastDecoder(model, prefill_chunk=4, max_len=32, use_graph=False)
    seqs = [ids[b, :n].tolist() for b, n in enumerate(lens)]
    nxt = fd.prefill(ids, lens)
    with torch.no_grad():
        for step in range(3):
            for b, seq in enumerate(seqs):
                want = model(torch.tensor([seq])).logits[0, -1]
                assert rel(fd.last_logits[b, 0], want) <= 1e-5, (step, b)
                seq.append(int(nxt[b, 0]))
            nxt = fd.decode(1)


def test_checkpoint_keeps_the_weight(tmp_path):
    model = with_norm("gdn", window=3, sinks=2)
    save_checkpoint(model, tmp_path / "ck")
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["linearize"]["out_norm"] is True
    fresh = tiny()
    apply_checkpoint(fresh, tmp_path / "ck")
    name = "model.layers.2.self_attn.lin.out_norm.weight"
    assert torch.equal(new_parameters(fresh)[name], new_parameters(model)[name])
    ids = torch.randint(0, VOCAB, (1, 10))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    plain = tiny()
    linearize(plain, LinearizeConfig(mechanism="gdn"))
    save_checkpoint(plain, tmp_path / "plain")
    assert "out_norm" not in json.loads((tmp_path / "plain" / "config.json").read_text())["linearize"]


def _head_rms_of_full_attention(model, ids):
    """Per layer, the per-head rms of the backbone's own attention output (the o_proj input), before linearizing."""
    rms, handles = {}, []
    for i, layer in enumerate(model.model.layers):
        H = model.config.num_attention_heads
        hook = lambda m, args, i=i: rms.__setitem__(i, args[0].unflatten(-1, (H, -1)).pow(2).mean((0, 1, 3)).sqrt())
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(hook))
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    return rms


@pytest.mark.parametrize("mech", ["gdn", "gla"])
def test_calibration_matches_the_attention_output_size(mech):
    """Each head's weight = the rms of the backbone's own attention output for that head on the batch (the
    teacher-forced pass sees the full-attention model's hidden states); full-attention layers are left alone."""
    ids = torch.randint(0, VOCAB, (2, 24))
    want = _head_rms_of_full_attention(tiny(), ids)
    model = tiny()
    linearize(model, LinearizeConfig(mechanism=mech, out_norm=True, full_layers=[1]))
    record = calibrate_out_norm(model, ids)
    assert record["tokens"] == 48 and record["layers"] == [0, 2]
    for i in record["layers"]:  # the norm's output per token and head has rms = weight (up to its eps)
        weight = model.model.layers[i].self_attn.lin.out_norm.weight
        torch.testing.assert_close(weight, want[i].view(-1, 1).expand_as(weight), rtol=1e-5, atol=0)
    assert record["rms_per_layer_mean"] == pytest.approx([float(want[i].mean()) for i in record["layers"]], rel=1e-4)


@pytest.mark.parametrize("text,message", [
    ("hedgehog,out_norm=true", "out_norm=true needs mechanism in ['gla', 'kgla', 'gdn']; got mechanism=hedgehog"),
    ("swa-sink,out_norm=true", "out_norm=true needs mechanism in ['gla', 'kgla', 'gdn']; got mechanism=none"),
    ("gdn-default,retain=4,out_norm=true", "out_norm=true is not implemented with retention slots (retain=4)"),
])
def test_refused_where_it_has_no_meaning(text, message):
    with pytest.raises(ValueError) as err:
        ModelSpec.from_string(text)
    assert str(err.value) == message
    opts = ModelSpec.from_string(text.replace(",out_norm=true", "")).linearize_options()
    with pytest.raises(ValueError) as err:  # the model side: the same message
        full_attention_layers(LinearizeConfig.from_dict({**opts, "out_norm": True}), tiny().config)
    assert str(err.value) == message


def test_spec_and_train_flag_round_trip():
    import argparse
    from golinear.models.training.train_cli import add_arguments, linearize_options, run_name
    spec = ModelSpec.from_string("gdn,out_norm=true")
    assert spec.out_norm and spec.to_string() == "mechanism=gdn,out_norm=true"
    assert ModelSpec.from_string(spec.to_string()) == spec and "out_norm=true" in spec.store_key()
    assert ModelSpec.from_model_args(spec.to_model_args()).out_norm
    assert ModelSpec.from_checkpoint_config(spec.to_checkpoint_config()) == spec
    p = argparse.ArgumentParser()
    add_arguments(p)
    opts = linearize_options(p.parse_args(["--out-norm", "--window", "0", "--sinks", "0", "--no-short-conv"]))
    assert opts["out_norm"] is True and run_name(opts) == "gdn-onorm"
    assert "out_norm" not in linearize_options(p.parse_args([]))


def test_golinear_train_calibrates_and_records(tmp_path):
    from golinear.bench.cli import main as golinear
    base = write_tiny_backbone(tmp_path / "base")
    write_books(tmp_path / "data")
    run = tmp_path / "run"
    train = ["train", "--base", str(base), "--data-dir", str(tmp_path / "data"), "--seq-len", "32", "--eval-sequences",
             "1", "--heldout-docs", "2", "--steps", "3", "--window", "0", "--sinks", "0", "--no-short-conv",
             "--out-norm", "--out", str(run)]
    assert golinear(train + ["--stop-after", "1"]) == 0  # stopped, then resumed: the same record
    stopped = json.loads((run / "train_config.json").read_text())["out_norm_calibration"]
    assert golinear(train) == 0
    record = json.loads((run / "train_config.json").read_text())
    calibration = record["out_norm_calibration"]
    assert calibration == stopped and record["summary"]["finished"]
    assert record["linearize"]["out_norm"] is True and calibration["tokens"] == 32
    assert len(calibration["rms_per_layer_mean"]) == len(calibration["layers"]) == 2
    assert all(0 < r < 1 for r in calibration["rms_per_layer_mean"])  # not the data-free 1
    assert json.loads((run / "config.json").read_text())["linearize"]["out_norm"] is True
