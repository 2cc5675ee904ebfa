"""The models/ core: parallel forward == token-by-token decoding, the window/sink/linear split is exact,
the backbone stays frozen, checkpoints round-trip, bad input is refused."""
import itertools

import pytest
import torch
import transformers

from golinear.models.cache.hf_cache import LinearCache
from golinear.models.checkpoint.weights import load_checkpoint, save_checkpoint, apply_checkpoint
from golinear.models.attention.layers import LinearizedAttention
from golinear.models.attention.linearize import LinearizeConfig, count_for_config, linearize, new_parameters
from golinear.models.spec.linearize_checks import full_attention_layers
from _tiny import token_by_token_and_parallel

MECHS = ["gla", "kgla", "gdn", "hedgehog", "none"]
OPTIONS = {  # name -> (window, sinks, short_conv, lora, full_layers)
    "plain": (0, 0, False, False, None),
    "window": (5, 0, False, False, None),
    "sinks": (0, 3, False, False, None),
    "window+sinks": (5, 3, False, False, None),
    "conv": (5, 3, True, False, None),
    "lora": (4, 2, False, True, None),
    "hybrid": (4, 2, True, True, [1]),
}


def tiny(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256)
    if arch == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()
    if arch == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=None, **common)).eval()
    if arch == "qwen2":  # q/k/v projections with bias
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **common)).eval()


def linearized(arch, mech, option, seed=0):
    window, sinks, conv, lora, full = OPTIONS[option]
    model = tiny(arch, seed)
    linearize(model, LinearizeConfig(mechanism=mech, window=window, sinks=sinks, short_conv=conv, lora=lora,
                                     full_layers=full))
    with torch.no_grad():  # move new params off their init (identity conv, zero LoRA B) so they matter
        for p in new_parameters(model).values():
            p.add_(0.1 * torch.randn_like(p))
    return model


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


CASES = [(a, m, o) for a, m, o in itertools.product(["llama", "qwen3"], MECHS, OPTIONS)
         if not (m == "none" and OPTIONS[o][0] + OPTIONS[o][1] == 0)]


@pytest.mark.parametrize("arch,mech,option", CASES)
def test_parallel_equals_generate_cache(arch, mech, option):
    model = linearized(arch, mech, option)
    prompt = torch.randint(0, 97, (1, 6))
    out = model.generate(prompt, max_new_tokens=14, do_sample=False, return_dict_in_generate=True,
                         output_logits=True, pad_token_id=0)
    assert isinstance(out.past_key_values, LinearCache)
    with torch.no_grad():
        parallel = model(out.sequences).logits[:, prompt.shape[1] - 1:-1]
    assert rel(torch.stack(out.logits, 1), parallel) <= 1e-4


@pytest.mark.parametrize("arch,mech", [(a, m) for a in ["llama", "qwen3"] for m in MECHS if m != "none"]
                         + [("mistral", "gdn"), ("qwen2", "gdn"), ("qwen2", "hedgehog")])
def test_token_by_token_from_first_token(arch, mech):
    """Every position decoded one token at a time (batch 2), including the sink/window transitions."""
    model = linearized(arch, mech, "conv")
    ids = torch.randint(0, 97, (2, 20))
    steps, parallel = token_by_token_and_parallel(model, ids)
    assert rel(steps, parallel) <= 1e-4


def brute_force_layer(layer: LinearizedAttention, x, pos_emb):
    """Independent definition: softmax over I exactly, linear recurrence over exactly the tokens outside I."""
    q, k, v, _ = layer.project(x, pos_emb)
    T, s, w = x.shape[1], layer.sinks, layer.window
    lin = layer.linear_inputs(x, q, k, v) if layer.lin is not None else None
    kr, vr = k.repeat_interleave(layer.groups, 2), v.repeat_interleave(layer.groups, 2)
    rows = []
    for t in range(T):
        I = [j for j in range(t + 1) if j < s or j > t - w]
        outside = [j for j in range(t + 1) if j not in I]
        swa = None
        if I:
            scores = torch.einsum("bhd,bjhd->bhj", q[:, t].float(), kr[:, I].float()) * layer.scaling
            swa = torch.einsum("bhj,bjhd->bhd", scores.softmax(-1), vr[:, I].float())
        lin_out = None
        if lin is not None:
            qt = layer._query(lin)[:, t:t + 1]
            if outside:
                sub = {key: val[:, outside] for key, val in lin.items()}
                sub_q = qt.expand(-1, len(outside), *qt.shape[2:])
                out, _ = layer._run(sub, sub_q, None, chunked=False)
                lin_out = tuple(o[:, -1] for o in out) if isinstance(out, tuple) else out[:, -1]
            else:
                lin_out = layer._zero_output(qt, {**lin, "v": lin["v"][:, :1]})
                lin_out = tuple(o[:, 0] for o in lin_out) if isinstance(lin_out, tuple) else lin_out[:, 0]
        if layer.mechanism == "hedgehog":
            num, den = lin_out
            if swa is None:
                rows.append(num / den.unsqueeze(-1))
            else:
                mass = layer.lin.window_logmass.exp().view(1, -1, 1)
                rows.append((swa * mass + num) / (mass + den.unsqueeze(-1)))
        else:
            rows.append(sum(o.float() for o in (lin_out, swa) if o is not None))
    return torch.stack(rows, 1)


@pytest.mark.parametrize("mech", MECHS)
@pytest.mark.parametrize("window,sinks", [(0, 0), (4, 0), (0, 3), (4, 3), (1, 1)])
def test_window_sink_split_is_exact(mech, window, sinks):
    if mech == "none" and window + sinks == 0:
        pytest.skip("mechanism none needs a window or sinks")
    model = tiny("llama")
    linearize(model, LinearizeConfig(mechanism=mech, window=window, sinks=sinks))
    layer = model.model.layers[0].self_attn
    x = torch.randn(2, 13, 64)
    pos = torch.arange(13)[None].expand(2, -1)
    pos_emb = model.model.rotary_emb(x, pos)
    with torch.no_grad():
        got = layer._parallel(x, pos_emb, None)
        want = brute_force_layer(layer, x, pos_emb)
    assert rel(got.float(), want) <= 1e-5


def test_window_covering_sequence_equals_full_attention():
    """With no linear tokens (window >= T) the linearized model is exactly the frozen full-attention model."""
    base = tiny("qwen3")
    ids = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        ref = base(ids).logits
    for mech in ["gdn", "none"]:
        model = linearize(tiny("qwen3"), LinearizeConfig(mechanism=mech, window=16))
        with torch.no_grad():
            assert rel(model(ids).logits, ref) <= 1e-5


def test_backbone_frozen_through_optimizer_step():
    model = linearized("llama", "gdn", "hybrid")
    new = new_parameters(model)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if n not in new}
    assert all(p.requires_grad for p in new.values())
    assert not any(p.requires_grad for n, p in model.named_parameters() if n not in new)
    before = {n: p.detach().clone() for n, p in new.items()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 97, (2, 12))
    model(ids, labels=ids).loss.backward()
    opt.step()
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n
    assert any(not torch.equal(p, before[n]) for n, p in new.items())
    assert any("lora_" in n for n in new) and any(".conv." in n for n in new)


def test_checkpoint_round_trip_and_wrong_base(tmp_path, monkeypatch):
    model = linearized("llama", "hedgehog", "lora")
    save_checkpoint(model, tmp_path / "ck")
    fresh = tiny("llama")
    apply_checkpoint(fresh, tmp_path / "ck")
    ids = torch.randint(0, 97, (1, 10))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    other = tiny("llama", seed=1)
    with pytest.raises(ValueError, match="fingerprint"):
        apply_checkpoint(other, tmp_path / "ck")
    with pytest.raises(FileNotFoundError, match="not a golinear checkpoint"):
        apply_checkpoint(tiny("llama"), tmp_path / "nothing")


@pytest.mark.parametrize("cfg,match", [
    (dict(mechanism="mamba"), "unknown mechanism 'mamba'"),
    (dict(window=-1), "window=-1: expected a non-negative integer"),
    (dict(sinks=10_000), "sinks=10000 exceeds"),
    (dict(window=200, sinks=100), "cache budget"),
    (dict(full_layers=[0, 3]), r"indices \[3\] out of range; allowed: 0..2"),
    (dict(full_layers=[0, 1, 2]), "nothing to linearize"),
    (dict(keep_full=1.5), "keep_full"),
    (dict(keep_full=0.5, select="hardness"), "layer_scores"),
    (dict(select="random"), "unknown layer selection"),
    (dict(mechanism="none"), "needs a window"),
])
def test_bad_options(cfg, match):
    with pytest.raises(ValueError, match=match):
        linearize(tiny("llama"), LinearizeConfig(**cfg))


def test_unknown_option_and_architecture():
    with pytest.raises(ValueError, match="unknown linearize options"):
        LinearizeConfig.from_dict({"mechanism": "gdn", "windw": 3})
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'"):
        linearize(gpt2, LinearizeConfig())


def test_hybrid_layer_selection():
    cfg = transformers.LlamaConfig(num_hidden_layers=10)
    assert full_attention_layers(LinearizeConfig(keep_full=0.2), cfg) == [2, 7]
    scores = [0.1, 0.9, 0.2, 0.8, 0, 0, 0, 0, 0, 0.5]
    assert full_attention_layers(LinearizeConfig(keep_full=0.3, select="hardness", layer_scores=scores), cfg) == [1, 3, 9]
    model = linearize(tiny("llama"), LinearizeConfig(full_layers=[0, 2]))
    kinds = [type(layer.self_attn).__name__ for layer in model.model.layers]
    assert kinds == ["LlamaAttention", "LinearizedAttention", "LlamaAttention"]


def test_parameter_counts_match_formula():
    """Counts on the paper's backbones, against closed forms (Llama-3.1-8B: 32 layers, d=4096, 32/8 heads x 128)."""
    L, d, H, Hkv, D = 32, 4096, 32, 8, 128
    expected = {"gla": L * (d * 16 + 16 * H * D + H * D), "kgla": L * (d * 16 + 16 * H * D + H * D + d * H),
                "gdn": L * (2 * d * H + 2 * H), "hedgehog": L * (H + Hkv) * (D * 64 + 64)}
    for mech, n in expected.items():
        assert count_for_config("llama-3.1-8b", LinearizeConfig(mechanism=mech)) == n
    conv = count_for_config("llama-3.1-8b", LinearizeConfig(mechanism="gdn", short_conv=True))
    assert conv - expected["gdn"] == L * (H + 2 * Hkv) * D * 4


def test_cache_does_not_grow_beyond_budget():
    model = linearize(tiny("llama"), LinearizeConfig(mechanism="gdn", window=4, sinks=2, short_conv=True))
    sizes = []
    for T in (8, 40):
        cache = LinearCache.for_model(model)
        with torch.no_grad():
            model(torch.randint(0, 97, (1, T)), past_key_values=cache, use_cache=True)
            for _ in range(3):
                model(torch.randint(0, 97, (1, 1)), past_key_values=cache, use_cache=True)
        sizes.append(cache.nbytes())
    assert sizes[0] == sizes[1]


@pytest.mark.slow
def test_real_smollm2_default_recipe(tmp_path):
    """The embedded backbone: default recipe decodes like its parallel pass, window >= T is full attention,
    the checkpoint reloads on SmolLM2 and is refused by a different base."""
    from golinear.models.load import load_model
    full, tok, info = load_model()
    assert info["base_fingerprint"] and full.config.num_hidden_layers == 30
    ids = tok("The Eiffel Tower is in Paris, the capital of France. " * 6, return_tensors="pt").input_ids[:, :72]
    with torch.no_grad():
        ref = full(ids).logits
    model, _, info = load_model(mechanism="gdn", window=56, sinks=8, short_conv=True)
    assert info["cache_budget"] == 64 and info["new_parameters"] == 30 * (2 * 576 * 9 + 18 + (9 + 6) * 64 * 4)
    with torch.no_grad():
        parallel = model(ids).logits
        cache = LinearCache.for_model(model)
        prefix = model(ids[:, :60], past_key_values=cache, use_cache=True).logits
        steps = [model(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits for i in range(60, 72)]
    assert rel(torch.cat([prefix] + steps, 1), parallel) <= 1e-4
    assert rel(parallel[:, :64], ref[:, :64]) <= 1e-5  # within the budget the recipe is the frozen model
    save_checkpoint(model, tmp_path / "ck")
    again, _, info2 = load_checkpoint(tmp_path / "ck")
    with torch.no_grad():
        assert torch.equal(again(ids).logits, parallel)
    assert info2["checkpoint_fingerprint"]
    with pytest.raises(ValueError, match="fingerprint"):
        apply_checkpoint(tiny("llama"), tmp_path / "ck")
