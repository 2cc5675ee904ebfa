"""conv_on (models.spec.CONV_ON): "linear" feeds the short conv to the linear path only, the window + sinks reading
the frozen projections' q/k/v (an ablation, docs/study.md "Why the gap"); "both" (the default) stays as it was.
CPU, fp32, tiny Llamas with the new parameters moved off their identity / neutral initialisation."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from golinear.models.training import cli_args
from golinear.models.attention import ops
from golinear.models.decoding.batch_generate import WholePromptDecoder, decoder_for, generate_batch
from golinear.models.checkpoint.weights import apply_checkpoint, save_checkpoint
from golinear.models.decoding.fast_decode import FastDecoder
from golinear.models.attention.layers import LinearizedAttention
from golinear.models.attention.linearize import LinearizeConfig, linearize
from golinear.models.attention.ops import fused_decode
from golinear.models.spec import ModelSpec
from golinear.models.training.train_cli import linearize_options, run_name
from test_batched_generate import alone, prompts, tiny_model
from _tiny import token_by_token_and_parallel

RECIPE = dict(window=4, sinks=2, short_conv=True)  # steady from sinks + window = 6 tokens


def layer_input(model, T=13, B=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, model.config.hidden_size, generator=g)
    return x, model.model.rotary_emb(x, torch.arange(T)[None].expand(B, -1))


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("mech", ["gla", "kgla", "gdn", "hedgehog"])
def test_softmax_path_reads_the_frozen_qkv(mech):
    """conv_on=linear: the layer's output is the linear path on the convolved q/k/v combined with the window + sinks
    on the unconvolved ones (composed here from the layer's parts), not the conv-on-both output."""
    model = tiny_model(mech, conv_on="linear", **RECIPE)
    layer = model.model.layers[0].self_attn
    x, pe = layer_input(model)
    with torch.no_grad():
        got = layer._parallel(x, pe)
        convolved, frozen = layer.project(x, pe)[:3], layer.project(x, pe, use_conv=False)[:3]
        assert rel(convolved[1], frozen[1]) > 1e-2  # the conv is not the identity
        lin_out, _, first = layer._linear_parallel(layer.linear_inputs(x, *convolved), x.shape[1])
        swa = {name: ops.window_sink_softmax(*qkv, sinks=2, window=4, scale=layer.scaling)
               for name, qkv in (("frozen", frozen), ("convolved", convolved))}
        want = layer.combine(lin_out, swa["frozen"], x.dtype, first)
        both = layer.combine(lin_out, swa["convolved"], x.dtype, first)
    assert first == 6 and rel(got, want) <= 1e-6
    assert rel(got, both) > 1e-3
    if mech != "hedgehog":  # rows before sinks + window read a zero state: the softmax path alone, frozen q/k/v
        assert rel(got[:, :first], swa["frozen"][:, :first]) <= 1e-6


def test_linear_path_sees_the_conv_and_the_softmax_path_does_not():
    """Moving the conv back to the identity changes a conv_on=linear model only where the linear path contributes
    (rows >= sinks + window); the same move changes a conv_on=both model from the first row."""
    outs = {}
    for conv_on in ("linear", "both"):
        model = tiny_model("gdn", conv_on=conv_on, **RECIPE)
        layer = model.model.layers[0].self_attn
        x, pe = layer_input(model)
        with torch.no_grad():
            before = layer._parallel(x, pe)
            for w in (layer.conv.q, layer.conv.k, layer.conv.v):  # the identity (ShortConvs' initialisation)
                w.copy_(layer.conv._identity(*w.shape))
            outs[conv_on] = (before, layer._parallel(x, pe))
    before, after = outs["linear"]
    assert rel(before[:, :6], after[:, :6]) <= 1e-6 and rel(before[:, 6:], after[:, 6:]) > 1e-3
    before, after = outs["both"]
    assert rel(before[:, :6], after[:, :6]) > 1e-3


@pytest.mark.parametrize("mech,cfg", [("gdn", RECIPE), ("gla", dict(window=3, sinks=0, short_conv=True)),
                                      ("hedgehog", RECIPE), ("kgla", dict(window=0, sinks=3, short_conv=True))])
def test_generate_equals_parallel_forward(mech, cfg):
    """HF generate (prefill + the layer's step, LinearCache) gives the parallel forward's logits."""
    model = tiny_model(mech, conv_on="linear", **cfg)
    prompt = torch.randint(1, 97, (1, 6))
    out = model.generate(prompt, max_new_tokens=14, do_sample=False, return_dict_in_generate=True,
                         output_logits=True, pad_token_id=0)
    with torch.no_grad():
        parallel = model(out.sequences).logits[:, prompt.shape[1] - 1:-1]
    assert rel(torch.stack(out.logits, 1), parallel) <= 1e-4


def test_token_by_token_from_first_token():
    """Every position one token at a time (batch 2), through the sink and window transitions."""
    model = tiny_model("gdn", conv_on="linear", **RECIPE)
    ids = torch.randint(1, 97, (2, 20))
    steps, parallel = token_by_token_and_parallel(model, ids)
    assert rel(steps, parallel) <= 1e-4


@pytest.mark.parametrize("lengths", [[7, 3, 19, 11], [1, 4]], ids=["mixed", "all-short"])
def test_batched_generation_equals_each_prompt_alone(lengths, monkeypatch):
    """decoder_for picks WholePromptDecoder (the chunked prefill refuses conv_on=linear); its batched decode gives
    each prompt's HF generate tokens, also where the fused step would serve (GOLINEAR_FUSED_DECODE=1)."""
    model = tiny_model("gdn", conv_on="linear", **RECIPE)
    ps, n = prompts(lengths), 10
    want = [alone(model, p, n) for p in ps]
    decoder = decoder_for(model, max_len=64)
    assert isinstance(decoder, WholePromptDecoder)
    assert generate_batch(decoder, ps, n) == want
    monkeypatch.setenv("GOLINEAR_FUSED_DECODE", "1")
    layer, x = model.model.layers[0].self_attn, torch.zeros(2, 1, 64)
    with fused_decode.decode_scope():
        assert not fused_decode.applies(layer, x, steady=True)  # the fused step convolves both paths' q/k/v
    assert generate_batch(decoder_for(model, max_len=64), ps, n) == want


def test_fast_paths_refuse_conv_on_linear():
    model = tiny_model("gdn", conv_on="linear", **RECIPE)
    with pytest.raises(ValueError, match="FastDecoder's chunked prefill implements conv_on='both' only"):
        FastDecoder(model)
    with pytest.raises(ValueError, match="implements conv_on='both' only, got conv_on='linear'"):
        model.model.layers[0].self_attn.prefill(torch.zeros(1, 3, 64), None, chunk=object(), carry={})
    assert type(decoder_for(tiny_model("gdn", **RECIPE))) is FastDecoder  # the default keeps the fast path


def test_default_is_unchanged():
    """conv_on=both is the default and computes what it did: one projection feeds both paths (the very tensors),
    the logits equal a model built without conv_on, and the option is left out of the saved config."""
    ids = torch.randint(1, 97, (2, 12))
    plain, both = tiny_model("gdn", **RECIPE), tiny_model("gdn", conv_on="both", **RECIPE)
    layer = plain.model.layers[0].self_attn
    assert layer.conv_on == "both"
    x, pe = layer_input(plain)
    q, k, v, _ = layer.project(x, pe)
    assert all(a is b for a, b in zip(layer.softmax_qkv(x, pe, q, k, v), (q, k, v)))
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, both(ids).logits)
    assert "conv_on" not in plain.config.golinear["linearize"] and "conv_on" not in both.config.golinear["linearize"]
    assert LinearizeConfig(**RECIPE).to_dict() == LinearizeConfig(conv_on="both", **RECIPE).to_dict()


def test_spec_string_round_trip():
    spec = ModelSpec.from_string("gdn-default,conv_on=linear")
    assert spec.conv_on == "linear" and ModelSpec.from_string(spec.to_string()) == spec
    assert "conv_on=linear" in spec.store_key() and "conv_on" not in ModelSpec.from_string("gdn-default").store_key()
    assert spec.linearize_options()["conv_on"] == "linear"
    args = spec.to_model_args()  # lm-eval's model_args (base named)
    assert args["conv_on"] == "linear" and ModelSpec.from_model_args(args).conv_on == "linear"


def test_train_cli_flag_and_run_name():
    p = argparse.ArgumentParser()
    cli_args.train(p)
    opts = linearize_options(p.parse_args(["--conv-on", "linear"]))
    assert opts["conv_on"] == "linear" and run_name(opts) == "gdn-w56-s8-sc-convlin"
    default = linearize_options(p.parse_args([]))
    assert "conv_on" not in default and run_name(default) == "gdn-w56-s8-sc"


def test_checkpoint_round_trip(tmp_path):
    model = tiny_model("gdn", conv_on="linear", **RECIPE)
    save_checkpoint(model, tmp_path / "ck")
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["linearize"]["conv_on"] == "linear"
    fresh = tiny_model(None)  # the same backbone (seed), not linearized
    apply_checkpoint(fresh, tmp_path / "ck")
    assert all(layer.self_attn.conv_on == "linear" for layer in fresh.model.layers)
    ids = torch.randint(1, 97, (1, 12))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    assert ModelSpec.from_string(str(tmp_path / "ck")).checkpoint_config()["linearize"]["conv_on"] == "linear"


@pytest.mark.parametrize("options,match", [
    (dict(mechanism="gdn", short_conv=True, conv_on="qk"), r"unknown conv_on 'qk'; allowed: \['both', 'linear'\]"),
    (dict(mechanism="gdn", window=4, conv_on="linear"), "conv_on='linear' needs short_conv=true"),
    (dict(mechanism="none", window=4, short_conv=True, conv_on="linear"), "conv_on='linear' needs a linear path"),
    (dict(mechanism="gdn", window=4, short_conv=True, retain=2, conv_on="linear"), "not implemented with retention"),
])
def test_bad_values_refused(options, match):
    with pytest.raises(ValueError, match=match):
        ModelSpec(**options)
    with pytest.raises(ValueError, match=match):
        linearize(tiny_model(None), LinearizeConfig(**options))
    with pytest.raises(ValueError, match=match):
        ModelSpec.from_string(",".join(f"{k}={v}" for k, v in options.items()))


def test_layer_refuses_without_conv():
    model = tiny_model(None)
    with pytest.raises(ValueError, match="conv_on='linear' needs short_conv=true"):
        LinearizedAttention(model.model.layers[0].self_attn, model.config, 0, "gdn", window=4, conv_on="linear")


def test_equals_the_gap_probes_frozen_swa_variant():
    """A conv_on=linear model computes what scripts/study/gap_probe.py's `+frozen-swa` variant of the same weights
    (the diagnosis that asked for this option: 18.67 -> 22.67 on 300 LAMBADA passages) evaluated."""
    from _scripts import load_script
    gap_probe = load_script("study/gap_probe.py")
    both, linear = tiny_model("gdn", **RECIPE), tiny_model("gdn", conv_on="linear", **RECIPE)
    assert all(torch.equal(a, b) for a, b in zip(both.state_dict().values(), linear.state_dict().values()))
    ids = torch.randint(1, 97, (2, 16))
    with torch.no_grad():
        plain = both(ids).logits
        for layer in both.model.layers:
            layer.self_attn._parallel = gap_probe._frozen_swa_parallel.__get__(layer.self_attn)
        probe = both(ids).logits
        got = linear(ids).logits
    assert rel(got, probe) <= 1e-6 and rel(got, plain) > 1e-3


@pytest.mark.gpu
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_graph_and_fused_decode_scope():
    """On CUDA (FLA kernels; WholePromptDecoder's decode captured in a CUDA graph, GOLINEAR_FUSED_DECODE=auto, so the
    fused step must stand aside): the batched tokens equal each prompt's HF generate, whose logits equal the
    parallel forward's."""
    model = tiny_model("gdn", conv_on="linear", **RECIPE).cuda()
    ps, n = prompts([7, 3, 19, 11, 70]), 12
    want = []
    for p in ps:
        out = model.generate(torch.tensor([p], device="cuda"), max_new_tokens=n, do_sample=False, pad_token_id=0,
                             return_dict_in_generate=True, output_logits=True)
        with torch.no_grad():
            parallel = model(out.sequences).logits[:, len(p) - 1:-1]
        assert rel(torch.stack(out.logits, 1), parallel) <= 1e-3
        want.append(out.sequences[0, len(p):].tolist())
    decoder = decoder_for(model, max_len=128)
    assert isinstance(decoder, WholePromptDecoder) and decoder.use_graph
    assert generate_batch(decoder, ps, n) == want


def test_golinear_train_records_and_reloads(tmp_path):
    """`golinear train --conv-on linear` end to end on a tiny backbone: the record and the checkpoint carry the
    option, and the checkpoint reloads (load_model) as conv_on=linear with its trained conv."""
    from _tiny import write_books, write_tiny_backbone
    from golinear.bench.cli import main as golinear
    from golinear.models.load import load_model
    base = write_tiny_backbone(tmp_path / "base")
    write_books(tmp_path / "data")
    run = tmp_path / "run"
    assert golinear(["train", "--base", str(base), "--data-dir", str(tmp_path / "data"), "--seq-len", "32",
                     "--eval-sequences", "1", "--heldout-docs", "2", "--steps", "2", "--window", "4", "--sinks", "2",
                     "--conv-on", "linear", "--out", str(run)]) == 0
    assert json.loads((run / "train_config.json").read_text())["linearize"]["conv_on"] == "linear"
    model, _, info = load_model(checkpoint=str(run))
    assert info["linearize"]["conv_on"] == "linear"
    attns = [layer.self_attn for layer in model.model.layers]
    assert all(a.conv_on == "linear" for a in attns)
    assert any(rel(a.conv.q.detach(), a.conv._identity(*a.conv.q.shape)) > 0 for a in attns)  # trained off the identity
