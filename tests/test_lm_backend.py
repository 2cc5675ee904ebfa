"""The lm-eval backends on the real SmolLM2: batch size does not change scores; lm-eval's own API
works with them; bad model input fails before any evaluation."""
from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import lm_eval  # noqa: E402
import torch  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402

import golinear.bench.backends.lm_backend as B  # noqa: E402
import golinear.tasks.standard as ts  # noqa: E402

LINEAR = dict(mechanism="gdn", window=8, sinks=2, short_conv=True)  # small window: the state path is used
TASKS = ["golinear_piqa"]  # two choices of different lengths per doc -> real right padding in a batch
LIMIT = 2  # 4 requests: one batch of 4 vs four batches of 1 (the reference ops are slow on CPU)


@pytest.fixture(scope="module")
def manager():
    return ts.task_manager()


@pytest.fixture(scope="module", params=["golinear-hf", "linearized"])
def backend_runs(request, manager):
    """One LM per backend, evaluated at batch size 1 and 4 on the same documents."""
    args = LINEAR if request.param == "linearized" else {}
    lm = B.make_lm(request.param, **args, batch_size=1)
    runs = {}
    for bs in (1, 4):
        lm.batch_size_per_gpu = bs
        runs[bs] = lm_eval.simple_evaluate(model=lm, tasks=TASKS, task_manager=manager, limit=LIMIT,
                                           log_samples=True, bootstrap_iters=0)
    return request.param, lm, runs


def _scores(res, task):
    return [[r[0] for r in s["resps"]] for s in res["samples"][task]]  # [(logprob, is_greedy)] per choice


@pytest.mark.slow
def test_scores_do_not_depend_on_batch_size(backend_runs):
    name, lm, runs = backend_runs
    for task in TASKS:
        one, four = _scores(runs[1], task), _scores(runs[4], task)
        assert len(one) == LIMIT and len(one) == len(four)
        for doc1, doc4 in zip(one, four):
            for (lp1, greedy1), (lp4, greedy4) in zip(doc1, doc4):
                assert lp1 == pytest.approx(lp4, rel=1e-5, abs=1e-4), (name, task)
                assert greedy1 == greedy4
        for metric in ("acc,none", "acc_norm,none"):
            assert runs[1]["results"][task][metric] == runs[4]["results"][task][metric]
    assert runs[4]["config"]["golinear_backend"] == name


@pytest.mark.slow
def test_batching_really_pads(backend_runs):
    """The comparison above is only meaningful if a batch held sequences of different lengths."""
    _, lm, runs = backend_runs
    lengths = {len(lm.tok_encode(c + x)) for s in runs[4]["samples"]["golinear_piqa"]
               for c, x in s["arguments"]}
    assert len(lengths) > 1


@pytest.mark.slow
def test_provenance_is_kept(backend_runs):
    name, lm, runs = backend_runs
    info = runs[1]["config"]["golinear_info"]
    assert info["base"] == "smollm2-135m" and info["base_fingerprint"] and info["init_seed"] == 0
    if name == "linearized":
        assert info["linearize"]["mechanism"] == "gdn" and info["new_parameters"] > 0
        assert info["cache_budget"] == 10
    else:
        assert info["linearize"] is None and info["new_parameters"] == 0
    json.dumps(info, default=str)


@pytest.mark.slow
def test_lm_eval_python_api_by_name(backend_runs, manager):
    """`simple_evaluate(model="linearized", model_args="...")` builds the same model (seeded init)."""
    name, lm, runs = backend_runs
    args = ",".join(f"{k}={v}" for k, v in (LINEAR if name == "linearized" else {}).items())
    res = lm_eval.simple_evaluate(model=name, model_args=(args + ",batch_size=2").lstrip(","),
                                  tasks=["golinear_piqa"], task_manager=manager, limit=1, log_samples=True,
                                  bootstrap_iters=0)
    assert res["config"]["golinear_backend"] == name
    for a, b in zip(_scores(res, "golinear_piqa"), _scores(runs[1], "golinear_piqa")[:1]):
        assert [x[0] for x in a] == pytest.approx([x[0] for x in b], rel=1e-5, abs=1e-4)


@pytest.mark.slow
def test_batched_generation_equals_one_at_a_time(backend_runs):
    """lm-eval's generate_until on prompts of different lengths (left-padded by HFLM): the batched static-cache
    decoder gives, for each prompt, the text HF generate gives it alone (the old path), stop strings included."""
    name, lm, _ = backend_runs
    contexts = ["Once upon a time, in a small village by the sea, there lived an", "1, 2, 3, 4,",
                "The capital of France is Paris. The capital of Italy is"]
    reqs = [Instance("generate_until", {}, (c, {"until": ["\n", " and"], "max_gen_toks": 12, "do_sample": False}), i)
            for i, c in enumerate(contexts)]
    outs = {}
    lm.batch_size_per_gpu = 3
    for mode in ("sequential", "batched"):
        lm.generation = mode
        outs[mode] = lm.generate_until(reqs, disable_tqdm=True)
    lm.generation = B.GENERATION[name][0]
    assert outs["batched"] == outs["sequential"] and all(outs["batched"])


@pytest.mark.slow
def test_a_short_batch_is_filled_to_the_batch_size(backend_runs):
    """With fill_batches (the default on CUDA) a batch shorter than the batch size generates with copies of its last
    prompt up to that size, so every batch of a run has one decoder shape; the real rows' texts are unchanged."""
    name, lm, _ = backend_runs
    contexts = ["Once upon a time, in a small village by the sea, there lived an", "1, 2, 3, 4,",
                "The capital of France is Paris. The capital of Italy is"]
    reqs = [Instance("generate_until", {}, (c, {"until": ["\n"], "max_gen_toks": 10, "do_sample": False}), i)
            for i, c in enumerate(contexts)]
    lm.batch_size_per_gpu, lm.generation = 4, "batched"
    outs = {}
    try:
        for fill in (False, True):
            lm.fill_batches = fill
            lm._decoders.clear()
            outs[fill] = lm.generate_until(reqs, disable_tqdm=True)
            assert set(lm._decoders) == ({4} if fill else {3})
    finally:
        del lm.fill_batches
        lm.generation = B.GENERATION[name][0]
    assert outs[True] == outs[False] and all(outs[True])


@pytest.mark.slow
def test_prompt_longer_than_max_length_is_an_error(backend_runs):
    """No silent left cut: the error names the prompt's length and the limit."""
    name, lm, _ = backend_runs
    lm._max_length, old = 24, lm._max_length
    try:
        req = Instance("generate_until", {}, ("word " * 40, {"until": ["\n"], "max_gen_toks": 8}), 0)
        with pytest.raises(ValueError, match=r"prompt of \d+ tokens is longer than the 16 this model allows "
                                             r"\(max_length 24 - 8 tokens to generate\)"):
            lm.generate_until([req], disable_tqdm=True)
    finally:
        lm._max_length = old


# ------------------------------------------------------------------ the batched path's host-side helpers
def _padded_batch(side):
    rows = [[5, 6, 7, 8], [9], [3, 0, 4], [1, 2, 3, 4, 5, 6]]
    ids = torch.full((4, 6), 0)
    mask = torch.zeros((4, 6), dtype=torch.long)
    for b, r in enumerate(rows):
        cols = slice(6 - len(r), 6) if side == "left" else slice(0, len(r))
        ids[b, cols], mask[b, cols] = torch.tensor(r), 1
    return rows, ids, mask


@pytest.mark.parametrize("side", ["left", "right", "scattered"])
def test_unpadded_gives_each_rows_real_tokens(side):
    """unpadded equals a boolean index per row (the old way) for left, right and any other padding."""
    rows, ids, mask = _padded_batch("right" if side == "right" else "left")
    if side == "scattered":
        mask[0] = torch.tensor([1, 0, 1, 0, 1, 1])  # not a contiguous run: the general case
    assert B.unpadded(ids, mask) == [r[m.bool()].tolist() for r, m in zip(ids, mask)]
    if side != "scattered":
        assert B.unpadded(ids, mask) == rows
    assert B.unpadded(ids, None) == ids.tolist()


def test_with_continuations_is_each_row_then_its_new_tokens():
    """The padded context, then each row's new tokens padded on the right: what HFLM slices at the context width."""
    _, ids, _ = _padded_batch("left")
    outs = [[11, 12], [], [13, 14, 15], [16]]
    got = B.with_continuations(ids, outs, pad=-1)
    assert got.shape == (4, 9) and torch.equal(got[:, :6], ids)
    assert [r[6:] for r in got.tolist()] == [[11, 12, -1], [-1, -1, -1], [13, 14, 15], [16, -1, -1]]
    assert torch.equal(B.with_continuations(ids, [[]] * 4, pad=-1), ids)


# ------------------------------------------------------------------ bad input, before any evaluation
@pytest.mark.parametrize("backend, args, error, match", [
    ("transformer", {}, ValueError, "unknown model backend 'transformer'"),
    ("linearized", {"mechanism": "gdn", "windw": 8}, ValueError, r"unknown model arg\(s\) \['windw'\]"),
    ("golinear-hf", {"dtype": "float8"}, ValueError, "unknown dtype 'float8'"),
    ("golinear-hf", {"device": "tpu"}, ValueError, "device 'tpu'"),
    ("golinear-hf", {"device": "cuda:7" if torch.cuda.is_available() else "cuda"}, ValueError, "cuda"),
    ("linearized", {}, ValueError, "needs checkpoint=<folder> or mechanism"),
    ("golinear-hf", {"mechanism": "gdn"}, ValueError, "golinear-hf is full attention"),
    ("linearized", {"checkpoint": "/no/such/ckpt"}, FileNotFoundError, "/no/such/ckpt"),
    ("linearized", {"mechanism": "gdn", "full_layers": "1+x"}, ValueError, "full_layers"),
    ("linearized", {"mechanism": "gdn", "generation": "hf"}, ValueError, r"generation='hf' for 'linearized'; allowed"),
    ("golinear-hf", {"generation": "beam"}, ValueError, r"generation='beam' for 'golinear-hf'; allowed"),
])
def test_bad_model_input(backend, args, error, match):
    with pytest.raises(error, match=match):
        B.check_model_args(backend, args)
    with pytest.raises(error, match=match):
        B.make_lm(backend, **args)


@pytest.mark.slow
def test_retention_slots_generate_batched_as_one_at_a_time(tmp_path):
    """A model with retain > 0, given as a spec or as a checkpoint, defaults to generation=batched
    (models.retention.generate); lm-eval's generate_until on prompts of different lengths (one shorter than
    sinks + window) gives the same continuations batched and one at a time."""
    from golinear.models.checkpoint.weights import save_checkpoint
    from golinear.models.load import load_model
    from tests._tiny import write_tiny_backbone

    tiny = write_tiny_backbone(tmp_path / "tiny")
    model, _, _ = load_model(base=str(tiny), mechanism="gdn", window=4, sinks=1, retain=2)
    ckpt = str(save_checkpoint(model, tmp_path / "ckpt"))
    spec = dict(base=str(tiny), mechanism="gdn", window=4, sinks=1, retain=2)
    for args in (spec, {"checkpoint": ckpt}):
        assert B.check_model_args("linearized", args)["generation"] == "batched"
    texts = ["the cat", "the cat sat on a mat and the dog ran to the red house", "birds sang over green hills under"]
    reqs = [Instance("generate_until", {}, (t, {"until": ["."], "max_gen_toks": 6, "do_sample": False}), i)
            for i, t in enumerate(texts)]
    outs = {mode: B.make_lm("linearized", checkpoint=ckpt, generation=mode, batch_size=3).generate_until(
        reqs, disable_tqdm=True) for mode in ("sequential", "batched")}
    assert outs["batched"] == outs["sequential"] and len(outs["batched"]) == 3


@pytest.mark.slow
def test_unknown_mechanism_and_registry_name():
    with pytest.raises(ValueError, match="unknown mechanism 'gdm'"):
        B.make_lm("linearized", mechanism="gdm")
    with pytest.raises(ValueError, match="no model for this name"):
        lm_eval.simple_evaluate(model="linearised", model_args="mechanism=gdn", tasks=["golinear_piqa"],
                                task_manager=ts.task_manager(), limit=1)


@pytest.mark.slow
def test_checkpoint_for_another_base_is_refused(tmp_path):
    from golinear.models.checkpoint.weights import save_checkpoint
    from golinear.models.load import load_model
    from tests._tiny import write_tiny_backbone

    tiny = write_tiny_backbone(tmp_path / "tiny")
    model, _, _ = load_model(base=str(tiny), mechanism="gdn", window=4, sinks=1)
    ckpt = save_checkpoint(model, tmp_path / "ckpt")
    lm = B.make_lm("linearized", checkpoint=str(ckpt))  # its own base: fine
    assert lm.golinear_info["checkpoint_fingerprint"] and lm.golinear_info["base"] == str(tiny)
    with pytest.raises(ValueError, match="fingerprint"):
        B.make_lm("linearized", checkpoint=str(ckpt), base="smollm2-135m")
    with pytest.raises(ValueError, match="already says how the model is linearized"):
        B.make_lm("linearized", checkpoint=str(ckpt), mechanism="gla")


@pytest.mark.slow
def test_batched_tokenization_equals_lm_evals_own(manager):
    """The up-front batched encoding gives the ids lm-eval's per-request tok_encode gives (real 5-shot
    MMLU requests plus edge cases: trailing spaces, a context starting with the BOS text), and
    loglikelihood returns the same scores with and without it."""
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import get_task_dict
    lm = B.make_lm("golinear-hf", batch_size=4)
    task = get_task_dict(["golinear_mmlu_anatomy"], manager)["golinear_mmlu_anatomy"]
    task.set_config(key="num_fewshot", value=5)
    task.build_all_requests(limit=3, rank=0, world_size=1)
    reqs = list(task.instances)
    bos = lm.tokenizer.decode(lm.prefix_token_id)
    pairs = [r.args for r in reqs] + [("Question: why?  ", "Because"), (bos + "Hello", " world"), ("", " alone")]
    encoded = lm._encode_batched(pairs)
    contexts = {r.args[0] for r in reqs}  # one per document: its 4 choices share it
    assert len(contexts) == 3 and len(encoded) == len(contexts) + len(reqs) + 4
    for text, ids in encoded.items():
        assert ids == HFLM.tok_encode(lm, text), text[:60]
    got = lm.loglikelihood(reqs, disable_tqdm=True)
    want = HFLM.loglikelihood(lm, reqs, disable_tqdm=True)  # lm-eval's own path, one request at a time
    assert lm._encoded == {} and got == want


def test_full_attention_generates_on_the_static_decoder_on_cuda(monkeypatch):
    """golinear-hf's default generation: the static-cache decoder (batched = full-static) on CUDA, HF generate off
    it; an explicit generation=hf stays the cross-check on CUDA. The device check is stood in for (no GPU here)."""
    assert B.check_model_args("golinear-hf", {"device": "cpu"})["generation"] == "hf"
    monkeypatch.setattr(B, "check_device", lambda device: "cuda:0")
    assert B.check_model_args("golinear-hf", {"device": "cuda"})["generation"] == "batched"
    assert B.check_model_args("golinear-hf", {"device": "cuda", "generation": "hf"})["generation"] == "hf"
    assert B.check_model_args("linearized", {"device": "cuda", "mechanism": "gdn"})["generation"] == "batched"


def test_reference_generation_picks_each_backends_definition():
    """`golinear run --generation reference`: HF generate for full attention, one prompt at a time for a linearized
    model, kvpress's DynamicCache for a press (the parity cross-check); fast leaves each backend its default."""
    from golinear.bench.run import specs as S
    from golinear.bench.run.execute import backend_and_args
    rows = {"full": ("golinear-hf", "hf"), "gdn-default": ("linearized", "sequential"),
            "press=snapkv,kv_budget=256": ("golinear-press", "dynamic")}
    for text, (backend, reference) in rows.items():
        spec = S.parse_model_spec(text)
        assert backend_and_args(spec)[0] == backend and "generation" not in backend_and_args(spec)[1]
        got_backend, args = backend_and_args(spec, "reference")
        assert (got_backend, args["generation"]) == (backend, reference)
        assert B.check_model_args(backend, args)["generation"] == reference  # each one a form the backend allows
    with pytest.raises(ValueError, match="--generation 'slow'; allowed: fast, reference"):
        backend_and_args(S.parse_model_spec("full"), "slow")
