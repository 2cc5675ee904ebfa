"""Batched variable-length generation (models/decoding/batch_generate.py on models/decoding/fast_decode.py), fp32 on the CPU:
a batch of prompts of different lengths gives, token for token, what each prompt gives generated alone by
HF's generate on the model's own forward (the old one-at-a-time path), for every mechanism and option."""
from __future__ import annotations

import pytest
import torch
import transformers

from golinear.models.decoding.batch_generate import generate_batch, pad_rows
from golinear.models.decoding.fast_decode import FastDecoder
from golinear.models.attention.linearize import LinearizeConfig, linearize
from _tiny import perturb_new_params

VOCAB = 97
LENGTHS = [2, 5, 13, 21]  # sinks + window is 5..15 below: some prompts shorter than the cache budget, some longer


def tiny_model(mech, seed=1, **cfg):
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB,
                                      max_position_embeddings=512)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # (HF would stop at, or with min_new_tokens forbid, token 2)
    if mech is not None:
        linearize(model, LinearizeConfig(mechanism=mech, **cfg))
        perturb_new_params(model, 0.1)  # move the new parameters (gates, convs, LoRA) off their neutral initialisation
    return model


def prompts(lengths=LENGTHS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def alone(model, prompt, n):
    """The old path: HF greedy generate of one unpadded prompt (LinearCache, the layer's own forward)."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


# name: (mechanism, LinearizeConfig options, prefill chunk: 0 = whole prompt, small = rows end in different chunks)
CASES = {
    "gdn-window-sinks-conv": ("gdn", dict(window=4, sinks=2, short_conv=True), 5),
    "gla-window-sinks-conv": ("gla", dict(window=3, sinks=2, short_conv=True), 0),
    "kgla-window": ("kgla", dict(window=5), 4),
    "hedgehog-window-sinks-conv": ("hedgehog", dict(window=4, sinks=2, short_conv=True), 6),
    "hedgehog-plain": ("hedgehog", dict(), 0),
    "gdn-conv-no-window": ("gdn", dict(short_conv=True), 4),
    "gdn-sinks-hybrid": ("gdn", dict(sinks=3, full_layers=[1]), 5),
    "none-window-sinks": ("none", dict(window=4, sinks=2), 3),
    "gla-lora-conv": ("gla", dict(window=6, sinks=2, short_conv=True, lora=True), 7),
    "gdn-budget-15": ("gdn", dict(window=12, sinks=3, short_conv=True), 5),  # the steady step starts mid-decode
}


@pytest.mark.parametrize("name", list(CASES))
def test_batched_equals_each_prompt_alone(name):
    mech, opts, chunk = CASES[name]
    model = tiny_model(mech, **opts)
    ps, n = prompts(), 8
    got = generate_batch(FastDecoder(model, prefill_chunk=chunk, max_len=64), ps, n)
    assert got == [alone(model, p, n) for p in ps]


def test_full_attention_through_the_batched_decoder():
    """full-static: the backbone itself (a KV buffer per layer, per-row positions) equals HF generate alone."""
    model = tiny_model(None)
    ps = prompts([7, 1, 12])
    assert generate_batch(FastDecoder(model, prefill_chunk=4, max_len=64), ps, 6) == [alone(model, p, 6) for p in ps]


def test_rows_stop_early_at_eos_and_stop_strings():
    """A row stops at its first EOS or at the token completing a stop string; the other rows are unaffected."""
    model = tiny_model("gdn", window=4, sinks=2, short_conv=True)
    ps, n = prompts(), 10
    ref = [alone(model, p, n) for p in ps]
    eos = ref[1][3]  # row 1 stops at step 3 (other rows may meet this token too: each stops at its first)
    decode = lambda toks: "".join(f"<{t}>" for t in toks)  # noqa: E731  (a token-per-tag "tokenizer")
    stop = [f"<{ref[2][4]}><{ref[2][5]}>"]  # row 2 stops when these two tokens follow each other
    got = generate_batch(FastDecoder(model, prefill_chunk=5, max_len=64), ps, n, eos={eos}, stop=stop, decode=decode)

    def cut(toks):
        for i in range(len(toks)):
            if toks[i] == eos or stop[0] in decode(toks[:i + 1]):
                return toks[:i + 1]
        return toks
    want = [cut(r) for r in ref]
    assert got == want
    assert len(got[1]) <= 4 and len(got[2]) <= 6 and any(len(g) == n for g in got)


def test_padding_never_reaches_a_state():
    """The static cache of a short row after a batched prefill equals its cache prefilled alone."""
    model = tiny_model("gdn", window=4, sinks=2, short_conv=True)
    ps = prompts([3, 16])
    batched = FastDecoder(model, prefill_chunk=5)
    ids = torch.zeros(2, 16, dtype=torch.long)
    for b, p in enumerate(ps):
        ids[b, :len(p)] = torch.tensor(p)
    batched.prefill(ids, [3, 16])
    single = FastDecoder(model, prefill_chunk=5)
    single.prefill(torch.tensor([ps[0]]))
    for got, want in zip(batched._buffers(), single._buffers()):
        if got.dim() == 0 or got.shape[0] != 2:
            continue  # scalars and per-batch index helpers
        torch.testing.assert_close(got[:1].float(), want.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lengths,match", [([3, 0], "each 1..4"), ([3], "one length per row")])
def test_bad_lengths(lengths, match):
    fd = FastDecoder(tiny_model("gdn", window=2))
    with pytest.raises(ValueError, match=match):
        fd.prefill(torch.zeros(2, 4, dtype=torch.long), lengths)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("multiple", [1, 8])
def test_pad_rows_places_each_row_as_the_tokenizer_pads(side, multiple):
    """pad_rows' ids and mask equal the tokenizer's padding (a tensor row by row), rows of different lengths and an
    empty row included; the width is the longest row rounded up to `multiple`."""
    rows = prompts([5, 1, 11]) + [[]] + [[2 ** 40, 0, 7]]  # ids beyond int32 and a literal 0 survive the copy
    ids, mask = pad_rows(rows, -3, side, multiple)
    width = -(-11 // multiple) * multiple
    assert ids.shape == mask.shape == (5, width) and ids.dtype == mask.dtype == torch.long
    for b, r in enumerate(rows):
        pad = [-3] * (width - len(r))
        assert ids[b].tolist() == (pad + r if side == "left" else r + pad)
        assert mask[b].tolist() == ([0] * len(pad) + [1] * len(r) if side == "left" else [1] * len(r) + [0] * len(pad))


def test_pad_rows_bad_side_is_one_line():
    with pytest.raises(ValueError, match=r"padding side 'middle'; allowed: \['left', 'right'\]"):
        pad_rows([[1]], 0, "middle")
