"""The press rows' batched prefill (models.kv_compression.batched_prefill): contexts of different lengths through one
forward, each compressed on its own, keep what each keeps alone. Real kvpress presses on the real SmolLM2 backbone."""
from __future__ import annotations

import pytest

pytest.importorskip("kvpress")
import torch  # noqa: E402

from golinear.models.kv_compression import batched_prefill as BP  # noqa: E402
from golinear.models.kv_compression.generate import compressed_prefill  # noqa: E402
from golinear.models.kv_compression.kvpress_adapter import take_head_masks  # noqa: E402
from golinear.models.kv_compression.presses import HEAD_ADAPTIVE, PRESSES, ExactBudget, build_press  # noqa: E402


@pytest.fixture(scope="module")
def smollm():
    """In float64: a batched matmul rounds differently from a batch of one (about 1e-6 of a key in float32), which
    flips a near-tie of Compactor's leverage scores; in float64 no tie is that close, so the rows must match."""
    from golinear.models.load import load_model
    model, tok, _ = load_model()
    return model.double().eval(), tok


def contexts(tok):
    text = "The grass is green and the sky is blue. The river runs past the old mill to the sea. "
    ids = tok(text * 12)["input_ids"]
    # different lengths (right padding) and contents; three rows of one length (150) and budget (compressed by one call)
    return [ids[:150], ids[7:260], ids[:201], ids[30:180], ids[60:210]]


def masks_as_set(masks, layer):
    return None if masks is None or masks[layer] is None else {tuple(int(t) for t in e) for e in zip(*masks[layer])}


@pytest.mark.parametrize("press", [*PRESSES, *HEAD_ADAPTIVE])
def test_each_row_keeps_what_it_keeps_alone(smollm, press, monkeypatch):
    """Every press golinear runs through a hook: the batch's rows keep the same entries (keys, values, a head-adaptive
    press's evictions) as each context prefilled and compressed alone (compressed_prefill, the definition). The three
    rows of one length and budget are one call of the press (Compactor and CriticalKV too: batch_faithful.py)."""
    model, tok = smollm
    rows = contexts(tok)
    keeps = [40, 64, 33, 40, 40]
    calls, compress = [], ExactBudget.compress  # the rows of each call of the press

    def counted(self, module, hidden_states, keys, *rest):
        calls.append(keys.shape[0])
        return compress(self, module, hidden_states, keys, *rest)
    monkeypatch.setattr(ExactBudget, "compress", counted)
    got = BP.compress_contexts(model, rows, press, keeps, max_tokens=4 * 260)  # two groups: the grouping too
    assert max(calls) == 3, calls
    for ids, keep, (cache, masks) in zip(rows, keeps, got):
        want = compressed_prefill(model, torch.tensor([ids]), press, keep)
        want_masks = take_head_masks(model)
        assert (masks is None) == (want_masks is None), press
        for i, layer in enumerate(want.layers):
            assert cache.layers[i].keys.shape == layer.keys.shape, (press, i)
            torch.testing.assert_close(cache.layers[i].keys, layer.keys, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(cache.layers[i].values, layer.values, rtol=1e-9, atol=1e-9)
            assert masks_as_set(masks, i) == masks_as_set(want_masks, i), (press, i)
    assert take_head_masks(model) is None  # nothing left on the modules for the next prompt


def test_kvzip_rows_keep_what_they_keep_alone():
    """KVzip shares the contexts' forward, then scores each row on its slice of the cache: the same evictions as each
    context alone (in float32: kvpress's KVzip builds its masks in float32; the keys agree to rounding)."""
    from golinear.models.load import load_model
    model, tok, _ = load_model()
    rows = contexts(tok)[:3]
    got = BP.compress_contexts(model.eval(), rows, "kvzip", [40, 64, 33])
    for ids, keep, (cache, masks) in zip(rows, [40, 64, 33], got):
        want = compressed_prefill(model, torch.tensor([ids]), "kvzip", keep)
        want_masks = take_head_masks(model)
        for i, layer in enumerate(want.layers):
            torch.testing.assert_close(cache.layers[i].keys, layer.keys, rtol=1e-4, atol=1e-4)
            assert masks_as_set(masks, i) == masks_as_set(want_masks, i), i
    assert take_head_masks(model) is None


def test_kvzip_passes_of_many_rows_evict_what_each_row_alone_does(monkeypatch):
    """KVzip's reconstruction passes for the whole batch (models.kv_compression.kvzip_rows) against kvpress's
    KVzipPress on each context alone, with 64-token chunks: rows of 1 to 4 chunks, so a later pass runs fewer rows, and
    a row that fits its keep (nothing evicted). In float32: kvpress's KVzip cannot run in float64 (its mask is a
    float32 tensor filled with the dtype's minimum)."""
    from golinear.models.kv_compression import kvzip
    from golinear.models.load import load_model
    monkeypatch.setattr(kvzip, "CHUNK", 64)
    model, tok, _ = load_model()
    model.eval()
    rows = [*contexts(tok)[:3], contexts(tok)[0][:60], contexts(tok)[1][:90]]
    keeps = [40, 64, 33, 20, 200]
    got = BP.compress_contexts(model, rows, "kvzip", keeps)
    assert got[4][1] is None
    for ids, keep, (cache, masks) in zip(rows, keeps, got):
        want = compressed_prefill(model, torch.tensor([ids]), "kvzip", keep)
        want_masks = take_head_masks(model)
        assert (masks is None) == (want_masks is None)
        for i, layer in enumerate(want.layers):
            torch.testing.assert_close(cache.layers[i].keys, layer.keys, rtol=1e-4, atol=1e-4)
            assert masks_as_set(masks, i) == masks_as_set(want_masks, i), (len(ids), i)
    assert take_head_masks(model) is None


def test_the_press_hook_is_only_compress():
    """batched_prefill calls a press's `compress` where kvpress's hook would: that holds while no press golinear
    batches (nor the scorer it wraps) overrides BasePress.forward_hook, which reads the cache, compresses, writes."""
    import kvpress
    for name in (*PRESSES, *HEAD_ADAPTIVE):
        press = build_press(name, 8).press
        for p in (press, getattr(press, "press", None)):
            if p is not None:
                assert type(p).forward_hook is kvpress.BasePress.forward_hook, (name, type(p).__name__)


def test_a_chunked_prefill_is_not_batched():
    assert BP.batches("snapkv", 0) and BP.batches("adakv_expected_attention", 0) and BP.batches("kvzip", 0)
    assert not BP.batches("snapkv", 512)
    with pytest.raises(ValueError, match="unknown press 'nope'"):
        BP.batches("nope", 0)


def test_bad_input_is_refused(smollm):
    model, _ = smollm
    with pytest.raises(ValueError, match="one keep per context"):
        BP.compress_contexts(model, [[1, 2, 3], []], "snapkv", [2, 2])


def small_llama(vocab: int, heads: int, dtype, device="cuda") -> torch.nn.Module:
    """A small random Llama (3 layers, 2 KV heads, head dim 32), seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32 * heads, intermediate_size=256, num_hidden_layers=3,
                      num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=1024)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).to(device, dtype).eval()


@pytest.mark.parametrize("heads", [4, 6])
def test_the_gpu_tests_small_llama_builds(heads):
    """The GPU tests' model is built on the CPU too, so a configuration transformers refuses fails here first."""
    model = small_llama(64, heads, torch.float32, device="cpu")
    assert model.config.num_attention_heads == heads and model.config.head_dim == 32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("press", ["snapkv", "expected_attention", "compactor", "adakv_snapkv", "keydiff"])
def test_gpu_each_row_keeps_what_it_keeps_alone(press):
    """On CUDA (float64, a small random Llama: no near-tie is close enough to flip): the batch's rows keep what each
    keeps alone; Compactor's seeded draws come from the CUDA generator here."""
    model = small_llama(512, 4, torch.float64)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (300, 180, 257)]
    keeps = [64, 40, 100]
    got = BP.compress_contexts(model, rows, press, keeps)
    for ids, keep, (cache, masks) in zip(rows, keeps, got):
        want = compressed_prefill(model, torch.tensor([ids], device="cuda"), press, keep)
        want_masks = take_head_masks(model)
        for i, layer in enumerate(want.layers):
            torch.testing.assert_close(cache.layers[i].keys, layer.keys, rtol=1e-9, atol=1e-9)
            assert masks_as_set(masks, i) == masks_as_set(want_masks, i), (press, i)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_kvzip_passes_of_many_rows_evict_what_each_row_alone_does(monkeypatch):
    """On CUDA, in float64 (a small random Llama's attention is near uniform, so its KVzip scores hold near-ties that
    float32 kernels of other shapes flip; kvpress's KVzip builds its mask in the default dtype, float64 here), with the
    default backbone's vocabulary (its tokenizer writes KVzip's instruction): the batch's passes evict what kvpress's
    KVzipPress evicts for each context alone, rows of 1 to 3 chunks."""
    from golinear.models.kv_compression import kvzip
    monkeypatch.setattr(kvzip, "CHUNK", 128)
    model = small_llama(49152, 6, torch.float64)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 49152, (n,), generator=g).tolist() for n in (300, 100, 257)]
    keeps = [64, 40, 100]
    torch.set_default_dtype(torch.float64)
    try:
        got = BP.compress_contexts(model, rows, "kvzip", keeps)
        for ids, keep, (cache, masks) in zip(rows, keeps, got):
            compressed_prefill(model, torch.tensor([ids], device="cuda"), "kvzip", keep)
            want_masks = take_head_masks(model)
            for i in range(len(masks)):
                assert masks_as_set(masks, i) == masks_as_set(want_masks, i), (len(ids), i)
    finally:
        torch.set_default_dtype(torch.float32)
