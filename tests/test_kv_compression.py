"""KV-cache compression (kvpress presses) as golinear models: the adapter, the exact budget, the question split,
generation, the spec and the plan. Real kvpress presses on the real SmolLM2 backbone."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("kvpress")
import torch  # noqa: E402

from golinear.bench.run import specs as S  # noqa: E402
from golinear.models.kv_compression.generate import chunks  # noqa: E402
from golinear.models.kv_compression.kvpress_adapter import apply_press, legacy_kwargs  # noqa: E402
from golinear.models.kv_compression.presses import PRESSES, build_press, ratio_for  # noqa: E402
from golinear.models.spec import ModelSpec  # noqa: E402
from golinear.tasks.ruler.api import SUITES, TASKS, build_samples  # noqa: E402
from golinear.tasks.ruler.split import question_start  # noqa: E402


@pytest.fixture(scope="module")
def smollm():
    from golinear.models.load import load_model
    model, tok, _ = load_model()
    return model.eval(), tok


def prompt_ids(tok, n_words=300):
    text = "The grass is green and the sky is blue. " * (n_words // 9)
    return tok(text + "\nWhat colour is the grass? The grass is")["input_ids"]


def prefill(model, ids, press=None):
    from transformers import DynamicCache
    cache = DynamicCache()
    with torch.no_grad(), (apply_press(press, model) if press else torch.no_grad()):
        model.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return cache


def test_legacy_kwargs_add_the_names_kvpress_reads():
    cache, pos = object(), torch.arange(5, 9)[None]
    out = legacy_kwargs({"cache": cache, "position_ids": pos, "hidden_states": 1})
    assert out["past_key_values"] is cache and torch.equal(out["cache_position"], pos[0])
    assert out["hidden_states"] == 1


def test_kvpress_alone_fails_on_this_transformers_which_the_adapter_fixes(smollm):
    """What breaks: kvpress's own context manager reads kwargs['past_key_values'], which transformers 5 renamed."""
    import kvpress
    from transformers import DynamicCache
    model, tok = smollm
    ids = torch.tensor([prompt_ids(tok, 60)])
    with pytest.raises(KeyError, match="past_key_values"), torch.no_grad(), \
            kvpress.KnormPress(compression_ratio=0.5)(model):
        model.model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
    cache = prefill(model, ids[0].tolist(), build_press("knorm", 16))
    assert all(layer.keys.shape[2] == 16 for layer in cache.layers)


@pytest.mark.parametrize("length", [17, 100, 1000, 4096, 32768])
@pytest.mark.parametrize("keep", [1, 8, 64, 256, 1016])
def test_ratio_keeps_exactly_the_budget(length, keep):
    from kvpress.utils import compute_n_kept
    ratio = ratio_for(length, keep)
    assert 0 <= ratio < 1
    assert (compute_n_kept(length, ratio) if ratio else length) == min(keep, length)


@pytest.mark.parametrize("press", sorted(PRESSES))
def test_every_press_keeps_the_budget_in_every_layer(smollm, press):
    model, tok = smollm
    cache = prefill(model, prompt_ids(tok), build_press(press, 40))
    assert [layer.keys.shape[2] for layer in cache.layers] == [40] * model.config.num_hidden_layers


def test_streaming_llm_keeps_the_sinks_and_the_last_tokens_of_the_full_cache(smollm):
    """The press prefills with full attention and evicts after each layer: its cache is the full cache's first 8
    and last keep - 8 entries (what golinear's window + sinks see at the last prompt token)."""
    model, tok = smollm
    ids = prompt_ids(tok)
    full, kept = prefill(model, ids), prefill(model, ids, build_press("streaming_llm", 48))
    idx = list(range(8)) + list(range(len(ids) - 40, len(ids)))
    for a, b in zip(full.layers, kept.layers):  # kvpress keeps them in score order: match rows by their keys
        want_k, want_v = a.keys[0][:, idx], a.values[0][:, idx]  # [heads, kept, dim]
        dist = torch.cdist(b.keys[0], want_k, compute_mode="donot_use_mm_for_euclid_dist")
        order = dist.argmin(-1)  # RoPE makes each position's key distinct
        assert torch.equal(order.sort(-1).values, torch.arange(len(idx)).expand_as(order))
        assert dist.amin(-1).max() < 1e-4
        torch.testing.assert_close(b.values[0], torch.gather(want_v, 1, order[..., None].expand_as(b.values[0])))


def test_a_budget_above_the_prompt_is_full_attention_greedy(smollm):
    from golinear.models.kv_compression.generate import generate
    model, tok = smollm
    ids = prompt_ids(tok, 60)
    ref = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    ours = generate(model, ids, 9, "snapkv", 10_000, 8)
    assert ours[:len(ref)] == ref and len(ref) >= 4


def test_question_agnostic_leaves_room_for_the_question():
    from golinear.models.kv_compression.generate import split_budget
    assert split_budget(1000, 30, 256, False) == (970, 226)
    assert split_budget(1000, 30, 256, True) == (999, 255)
    with pytest.raises(ValueError, match="cannot hold the question's 300 tokens"):
        split_budget(1000, 300, 256, False)


@pytest.mark.parametrize("task", SUITES["sniah"] + SUITES["ruler"])
def test_each_task_splits_its_prompt_before_the_question(smollm, task, monkeypatch):
    """The context/question split from the task's own template: the context holds every reference answer that
    the haystack carries, the question part holds no haystack and starts on the template's question line."""
    monkeypatch.setenv("GOLINEAR_RULER_CACHE", "0")
    _, tok = smollm
    length = 2048 if TASKS[task].family == "qa" else 1024  # a QA document set does not fit in 1K
    row = build_samples(task, tok, max_seq_length=length, num_samples=1)[0]
    at = question_start(task, row["prompt"])
    context, question = row["prompt"][:at], row["prompt"][at:]
    assert question.startswith("\n") and len(question) < 600, question[:200]
    assert row["answer_prefix"] in question
    if TASKS[task].family == "niah":
        assert all(str(v) in context for v in row["outputs"])
        assert all(str(v) not in question for v in row["outputs"])


def test_spec_rules():
    spec = ModelSpec.from_string("press=snapkv,kv_budget=256")
    assert not spec.is_full_attention and spec.budget == 256
    assert "kvpress=" in spec.store_key() and "press=snapkv" in spec.store_key()
    assert ModelSpec.from_string(spec.to_string()) == spec
    with pytest.raises(ValueError, match="unknown press 'h2o'; allowed"):
        ModelSpec.from_string("press=h2o")
    with pytest.raises(ValueError, match="kv_budget=64 needs press="):
        ModelSpec.from_string("kv_budget=64")
    with pytest.raises(ValueError, match="does not combine with a linearized model"):
        ModelSpec.from_string("gdn-default,press=knorm")
    fam = S.parse_model_spec("press=tova")
    b = fam.with_budget(512, 8)
    assert (b.kv_budget, b.label, b.family) == (512, "tova (kvpress) @512", "tova (kvpress)")
    assert S.parse_model_spec("press=snapkv,question_aware=true,kv_budget=64").label == \
        "snapkv (kvpress, question-aware) @64"


def test_backend_refuses_a_press_without_a_budget_and_scoring():
    from golinear.bench.backends.lm_backend import check_model_args
    with pytest.raises(ValueError, match="needs kv_budget"):
        check_model_args("golinear-press", {"press": "knorm"})
    with pytest.raises(ValueError, match="takes no press="):
        check_model_args("golinear-hf", {"press": "knorm", "kv_budget": 8})


def test_plan_puts_presses_on_the_budget_sweep_and_not_on_scoring_tasks():
    from golinear.bench.run.plan import plan_cells, resolve_suites
    models = S.parse_models("press=snapkv;gdn-default")
    entries = resolve_suites("sniah,cr", tasks="S-NIAH-1,PIQA")
    cells = plan_cells(models, entries, budgets=[128, 256])
    labels = {(c.model.label, c.entry.task) for c in cells}
    assert {("snapkv (kvpress) @128", "golinear_sniah_1"), ("snapkv (kvpress) @256", "golinear_sniah_1")} <= labels
    assert not any(c.model.press and not c.entry.long for c in cells)


@pytest.mark.slow
def test_golinear_run_stores_a_press_cell_keyed_by_the_kvpress_version(tmp_path):
    """End to end: `golinear run` with a press on the budget sweep, through lm-eval, into the store."""
    import json
    from golinear.bench.cli import main
    store = tmp_path / "store"
    assert main(["run", "--models", "press=streaming_llm", "--suites", "sniah", "--tasks", "S-NIAH-1",
                 "--budgets", "512", "--context-length", "1024", "--num-samples", "1", "--store", str(store)]) == 0
    cells = [json.loads(p.read_text()) for p in store.glob("cells/*/*.json")]
    press = [c for c in cells if c["model"]["args"].get("press")]
    assert len(cells) == 2 and len(press) == 1
    assert press[0]["key"]["model"].endswith("kvpress=0.5.5") and press[0]["model"]["budget"] == 512
    assert press[0]["model"]["family"] == "streaming_llm (kvpress)"
    assert 0 <= press[0]["metrics"]["score,none"]["value"] <= 100


def test_chunks_cover_the_prompt_and_none_is_short():
    assert chunks(1000, 300) == [(0, 400), (400, 700), (700, 1000)]
    assert chunks(1000, 0) == [(0, 1000)] and chunks(100, 300) == [(0, 100)]


def test_chunked_prefill_never_holds_more_than_the_budget_and_a_chunk(smollm):
    """prefill_chunk: the press compresses after every chunk, so the cache peaks at budget + chunk entries."""
    from transformers import DynamicCache

    from golinear.models.kv_compression.generate import generate
    model, tok = smollm
    ids = prompt_ids(tok)
    peak, cache = [], DynamicCache()
    with torch.no_grad(), apply_press(build_press("snapkv", 32), model, every_forward=True):
        for c0, c1 in chunks(len(ids), 80):
            model.model(input_ids=torch.tensor([ids[c0:c1]]), past_key_values=cache, use_cache=True,
                        position_ids=torch.arange(c0, c1)[None])
            peak.append(cache.layers[0].keys.shape[2])
    assert len(peak) > 2 and peak == [32] * len(peak)  # compressed after each chunk (at most 32 + 80 inside)
    out = generate(model, ids, 9, "snapkv", 64, 4, prefill_chunk=80)
    assert len(out) == 4
    for chunk in (1, 64):  # SnapKV needs more queries in a chunk than its 64-query window
        with pytest.raises(ValueError, match=f"prefill_chunk={chunk}: expected 0 .no chunks. or more than 64"):
            S.parse_model_spec(f"press=snapkv,prefill_chunk={chunk}")
    assert S.parse_model_spec("press=snapkv,prefill_chunk=65").prefill_chunk == 65
    assert S.parse_model_spec("press=snapkv,prefill_chunk=512").family == "snapkv (kvpress, chunked prefill 512)"


@pytest.mark.parametrize("press,budget,chunk", [
    ("snapkv", 256, 0), ("streaming_llm", 128, 0), ("snapkv", 256, 300), ("keydiff", 128, 0), ("lagkv", 128, 0),
    ("compactor", 128, 0), ("adakv_snapkv", 128, 0), ("criticalkv_expected_attention", 128, 0), ("kvzip", 128, 0)])
def test_static_decoder_gives_the_dynamic_caches_tokens(smollm, press, budget, chunk):
    """Press rows decode on the full-static decoder (each row its own kept entries, new tokens at the row's slot
    and rotated by its position; a head-adaptive press's heads each their own, the rest a hole); the DynamicCache
    path (kvpress's attention patch hiding the evicted keys) is the definition: the same greedy tokens, batched
    rows of different lengths and question lengths included (the questions read in one batched pass)."""
    from golinear.models.kv_compression.presses import head_adaptive
    from golinear.models.kv_compression.generate import generate
    from golinear.models.kv_compression.static_decode import PressDecoder
    model, tok = smollm
    prompts = [(prompt_ids(tok, n), q) for n, q in ((300, 9), (420, 12))]
    want = [generate(model, ids, q, press, budget, 12, prefill_chunk=chunk) for ids, q in prompts]
    dec = PressDecoder(model, max_len=budget + 16)
    first = dec.prefill(prompts, press, budget, prefill_chunk=chunk)
    got = torch.cat([first, dec.decode(11)], 1).tolist()
    assert got == want
    if not head_adaptive(press):
        assert dec.positions == [budget + 11] * 2  # each row: the budget's entries, then one per new token
        assert all("holes" not in st for st in dec.states)
        return
    assert all(p > budget + 11 for p in dec.positions)  # the fullest head sets where the question starts
    questions = torch.tensor([q for _, q in prompts])
    for st in dec.states:  # per layer and row: the heads hold the context's share of the budget in all, the rest of
        kept = st["holes"][..., 0].sum(-1)  # each head up to the question's first slot a hole, then the question
        assert kept.tolist() == ((budget - questions) * st["k"].shape[1]).tolist()
        assert (st["holes"][..., 1] == (torch.tensor(dec.positions) - questions - 11).view(2, 1)).all()


@pytest.mark.parametrize("press", ["snapkv", "adakv_snapkv", "criticalkv_snapkv"])
def test_rows_of_one_length_go_into_the_static_buffers_together_and_decode_as_alone(smollm, press):
    """Rows of one context length are one run of the batched prefill and one copy into the static buffers
    (static_decode._runs_of): each still decodes the tokens it decodes alone."""
    from golinear.models.kv_compression.generate import generate
    from golinear.models.kv_compression.static_decode import PressDecoder
    model, tok = smollm
    a = prompt_ids(tok, 300)
    other = tok("The grass is yellow and the sky is purple. " * 40 + "\nWhat colour is the grass? The grass is")
    b = other["input_ids"][-len(a):]  # the same length, another answer
    prompts = [(a, 9), (b, 9), (prompt_ids(tok, 420), 12), (a[:-30] + b[-30:], 9)]
    want = [generate(model, ids, q, press, 128, 8) for ids, q in prompts]
    dec = PressDecoder(model, max_len=128 + 12)
    assert torch.cat([dec.prefill(prompts, press, 128), dec.decode(7)], 1).tolist() == want


@pytest.mark.parametrize("press", ["snapkv", "adakv_snapkv"])
def test_a_filled_press_batch_decodes_its_rows_as_before(smollm, press):
    """A short batch filled with copies of its last row (their compressed context reused, not compressed again): the
    real rows' tokens are the unfilled batch's, each copy decodes as the row it copies."""
    from golinear.models.kv_compression.static_decode import PressDecoder
    model, tok = smollm
    prompts = [(prompt_ids(tok, n), q) for n, q in ((300, 9), (420, 12))]
    out = []
    for fill in (0, 2):
        dec = PressDecoder(model, max_len=128 + 8)
        out.append(torch.cat([dec.prefill(prompts, press, 128, fill=fill), dec.decode(5)], 1).tolist())
    assert len(out[1]) == 4 and out[1][:2] == out[0] and out[1][2:] == [out[0][1]] * 2


@pytest.mark.parametrize("press", ["adakv_snapkv", "adakv_expected_attention", "criticalkv_snapkv",
                                   "criticalkv_expected_attention", "kvzip"])
def test_head_adaptive_presses_keep_the_uniform_total_per_layer_unevenly(smollm, press):
    from golinear.models.kv_compression.generate import compressed_prefill
    from golinear.models.kv_compression.kvpress_adapter import take_head_masks
    model, tok = smollm
    ids = prompt_ids(tok)
    cache = compressed_prefill(model, torch.tensor([ids]), press, 40)
    masks = take_head_masks(model)
    H = model.config.num_key_value_heads
    uneven = 0
    for layer, (b, h, s) in zip(cache.layers, masks):
        assert layer.keys.shape[2] == len(ids)  # kvpress keeps every entry and masks the evicted ones
        evicted = torch.bincount(h, minlength=H)
        assert int(evicted.sum()) == H * (len(ids) - 40)  # the uniform budget's total per layer
        uneven += len(set(evicted.tolist())) > 1
    assert uneven > 0 and take_head_masks(model) is None  # taken off the modules


def test_head_adaptive_presses_refuse_a_chunked_prefill():
    with pytest.raises(ValueError, match="press=adakv_snapkv with prefill_chunk=512: a head-adaptive press keeps"):
        S.parse_model_spec("press=adakv_snapkv,kv_budget=256,prefill_chunk=512")


def test_compactor_refuses_a_chunked_prefill_before_any_model_loads():
    """kvpress's CompactorPress asserts that keys and queries are the same tokens: a second chunk fails mid-run."""
    with pytest.raises(ValueError, match="press=compactor with prefill_chunk=4096: kvpress's CompactorPress scores"):
        S.parse_model_spec("press=compactor,kv_budget=1024,prefill_chunk=4096")


def test_unavailable_presses_are_named_with_the_reason():
    for name, why in (("kvzap", "trained per backbone"), ("fastkvzip", "none exists for SmolLM2-135M")):
        with pytest.raises(ValueError, match=f"press '{name}' is not available: .*{why}"):
            S.parse_model_spec(f"press={name},kv_budget=256")


@pytest.mark.slow
def test_press_backend_static_and_dynamic_generation_answer_alike(monkeypatch):
    """`golinear-press` decodes batches on the static decoder (the default) and, as `generation=dynamic`, one prompt
    at a time on the DynamicCache: the same answers to the same S-NIAH requests, stop strings and EOS included."""
    from lm_eval.api.instance import Instance

    from golinear.bench.backends.press_backend import PressLM
    monkeypatch.setenv("GOLINEAR_RULER_CACHE", "0")
    static = PressLM(press="snapkv", kv_budget=256, device="cpu", batch_size=2)
    dynamic = PressLM(press="snapkv", kv_budget=256, device="cpu", generation="dynamic")
    rows = build_samples("golinear_sniah_2", static.tokenizer, max_seq_length=1024, num_samples=2)
    reqs = [Instance("generate_until", {}, (r["prompt"], {"until": ["\n"], "max_gen_toks": 24, "do_sample": False}),
                     i, metadata=("golinear_sniah_2", i, 1)) for i, r in enumerate(rows)]
    a, b = static.generate_until(reqs), dynamic.generate_until(reqs)
    assert a == b and all(isinstance(t, str) for t in a), (a, b)


def test_prompts_split_together_as_one_at_a_time(monkeypatch):
    """The press backend tokenises a batch's prompts in one call: each row's ids and question length are those of its
    prompt tokenised alone with its offsets (the question: the tokens ending after its first character)."""
    from golinear.bench.backends.press_backend import PressLM
    from golinear.tasks.ruler.split import question_start
    monkeypatch.setenv("GOLINEAR_RULER_CACHE", "0")
    lm = PressLM(press="snapkv", kv_budget=256, device="cpu", batch_size=2)
    pairs = [(task, r["prompt"]) for task in ("golinear_sniah_1", "golinear_sniah_3")
             for r in build_samples(task, lm.tokenizer, max_seq_length=1024, num_samples=2)]
    bos = lm.tokenizer.decode(lm.prefix_token_id)
    for (task, prompt), (ids, q) in zip(pairs, lm.split_all(pairs)):
        enc = lm.tokenizer(prompt, return_offsets_mapping=True, **lm._encode_kwargs(prompt, bos))
        at = question_start(task, prompt)
        assert ids == enc["input_ids"] and q == sum(1 for _, end in enc["offset_mapping"] if end > at) > 0


def test_kvzip_batch_is_its_rows_one_after_another(smollm):
    """kvpress's KVzip scores one prompt at a time: a batch (a latency row) runs its passes together
    (models.kv_compression.kvzip_rows) and gets each row's cache and evictions alone, joined."""
    from golinear.models.kv_compression.kvpress_adapter import take_head_masks
    from golinear.models.kv_compression.kvzip_rows import kvzip_prefill
    model, tok = smollm
    a, b = prompt_ids(tok, 200), list(reversed(prompt_ids(tok, 200)))
    rows = []
    for ids in (a, b):
        cache = kvzip_prefill(model, torch.tensor([ids]), 30)
        rows.append((cache, take_head_masks(model)))
    joined = kvzip_prefill(model, torch.tensor([a, b]), 30)
    masks = take_head_masks(model)
    for i, layer in enumerate(joined.layers):
        torch.testing.assert_close(layer.keys, torch.cat([c.layers[i].keys for c, _ in rows]))
        want = {(r, int(h), int(s)) for r, (_, m) in enumerate(rows) for _, h, s in zip(*m[i])}
        assert {(int(r), int(h), int(s)) for r, h, s in zip(*masks[i])} == want


def test_only_presses_that_draw_random_numbers_are_seeded(monkeypatch):
    """DRAWS_RANDOM names every press whose kvpress classes draw random numbers (read off kvpress's own sources, so a
    new press or a new kvpress cannot slip past), and only those run under a forked, seeded generator: seeding costs
    ~1.6 ms a layer on CUDA."""
    import inspect

    import kvpress

    from golinear.models.kv_compression import presses as P

    def draws(cls) -> bool:  # the class's kvpress modules and the kvpress modules they import (a press it holds)
        import importlib
        names = {c.__module__ for c in cls.__mro__ if c.__module__.startswith("kvpress")}
        for name in list(names):
            names |= set(re.findall(r"^from (kvpress[\w.]*) import", inspect.getsource(importlib.import_module(name)),
                                    re.MULTILINE))
        return any(re.search(r"torch\.(rand|randn|randint|randperm|normal|bernoulli|multinomial)\(",
                             inspect.getsource(importlib.import_module(n))) for n in names)
    random_scorers = {name for name, (cls, _) in P.PRESSES.items() if draws(getattr(kvpress, cls))}
    assert random_scorers == P.DRAWS_RANDOM
    for name in (*P.PRESSES, *P.HEAD_ADAPTIVE):
        scorer = P.HEAD_ADAPTIVE[name][1] if name in P.HEAD_ADAPTIVE else name
        assert P.build_press(name, 8).seeded == (scorer in P.DRAWS_RANDOM), name


def test_a_head_adaptive_press_s_host_indices_move_in_one_copy_in_their_places():
    from golinear.models.kv_compression.static_decode import on_device
    masked = [(torch.tensor([0, 0]), torch.tensor([1, 2]), torch.tensor([5, 7])), None,
              (torch.zeros(3, dtype=torch.long), torch.tensor([0, 1, 2]), torch.tensor([[1, 2, 3]]).view(3))]
    assert on_device(masked, "cpu") is masked  # already there: nothing copied
    moved = on_device(masked, "meta")  # another device (values are not kept on meta: the places are checked)
    assert moved[1] is None and [len(m) for m in (moved[0], moved[2])] == [3, 3]
    assert all(t.device.type == "meta" and t.shape == s.shape for m, o in zip(moved, masked) if m is not None
               for t, s in zip(m, o))


def test_head_indices_already_on_the_device_stay_beside_those_moved_from_the_host():
    """AdaKV's and CriticalAdaKV's indices come from the device, KVzip's from the host: a batch may hold both."""
    from golinear.models.kv_compression.static_decode import on_device
    there = (torch.zeros(2, dtype=torch.long, device="meta"),) * 3
    masked = [there, (torch.tensor([0]), torch.tensor([1]), torch.tensor([4])), None]
    moved = on_device(masked, "meta")
    assert all(a is b for a, b in zip(moved[0], there)) and moved[2] is None  # not copied again
    assert all(t.device.type == "meta" and t.shape == (1,) for t in moved[1])
