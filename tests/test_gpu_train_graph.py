"""The CUDA-graph training step (`golinear train --cuda-graph`, models/training/graph_step.py) on the GPU: the same
parameters and logged losses as the eager loop, exact-enough resume (re-captured after a restart), and
(printed, `-s`) tokens/s of the default recipe at SmolLM2-135M sizes, eager against graphed. Marked `gpu`;
skipped without CUDA or flash-linear-attention.  Run: python -m pytest -v -s tests/test_gpu_train_graph.py
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import transformers

from golinear.models.training import data as data_mod
from golinear.models.training import train as train_mod
from golinear.models.training import train_utils

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs flash-linear-attention"),
]


def _model(layers=2, vocab=300, hidden=576, inter=256, seed=0):
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                                   num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=vocab,
                                   tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = linearize(transformers.LlamaForCausalLM(cfg), LinearizeConfig(mechanism="gdn", window=56, sinks=8,
                                                                          short_conv=True))
    return model.cuda()


def _seqs(vocab, seq_len, n=64):
    stream = np.random.default_rng(0).integers(0, vocab, n * seq_len).astype(np.uint16)
    return data_mod.PackedSequences(stream, seq_len, seed=0)


def _run(tmp_path, name, graph, **kw):
    model = _model()
    cfg = dict(seq_len=512, batch_size=1, steps=12, lr=2e-3, save_every=10**6, log_every=2, eval_sequences=1,
               cuda_graph=graph)
    cfg.update(kw)
    trainer = train_mod.Trainer(model, _seqs(300, 512), train_mod.TrainConfig(**cfg), tmp_path / name)
    return trainer, model


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp32"])
def test_graph_replays_the_eager_step_exactly(bf16):
    """The captured step against the same step run eagerly with the same math (capturable AdamW, tensor lr,
    autocast without its cache): identical parameters and losses after 12 steps, up to the last bits."""
    import copy

    from golinear.models.training import graph_step

    def run(model, graphed):
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=2e-3)
        graph_step.make_capturable(opt, "cuda")
        g = torch.Generator().manual_seed(0)
        data = [torch.randint(0, 300, (1, 512), generator=g).cuda() for _ in range(12)]
        step, losses = None, []
        for ids in data:
            if graphed:
                step = step or graph_step.GraphedTrainStep(model, opt, params, 1.0, bf16, ids)
                loss, _ = step(ids)
            else:
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
                    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
                opt.step()
                opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return dict(model.named_parameters()), losses

    base = _model()
    (pe, le), (pg, lg) = run(copy.deepcopy(base), False), run(copy.deepcopy(base), True)
    assert lg == pytest.approx(le, rel=1e-6, abs=0)
    for n, p in pe.items():
        if p.requires_grad:
            torch.testing.assert_close(pg[n], p, rtol=1e-6, atol=1e-7, msg=n)
    assert any(not torch.equal(p, base.get_parameter(n)) for n, p in pe.items() if p.requires_grad)  # it moved


def test_graphed_training_matches_eager(tmp_path):
    """The trainer, graphed against eager, logs the same losses, learning rates and gradient norms. (Their
    parameters are not compared: the eager trainer's AdamW (not capturable) rounds differently from the
    capturable one the graph needs, and Adam turns that into differences of up to ~lr on weights whose
    gradients are near zero; the graph's own exactness is the test above.)"""
    eager, _ = _run(tmp_path, "eager", False)
    graphed, _ = _run(tmp_path, "graphed", True)
    eager.train()
    assert graphed.train()["cuda_graph"], graphed.graph_error  # captured, not the eager fallback
    le, lg = (train_utils.read_log(tmp_path / d / train_mod.LOG_FILE) for d in ("eager", "graphed"))
    assert [r["step"] for r in le] == [r["step"] for r in lg] == list(range(2, 13, 2))
    for a, b in zip(le, lg):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3) and b["lr"] == pytest.approx(a["lr"], rel=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-2)
    # it trains at all: the parameters moved (uniform random tokens leave the loss near ln(300) for 12 steps)
    init, _ = _run(tmp_path, "init", True)
    assert any(not torch.equal(graphed.named[n], p) for n, p in init.named.items())


def test_graphed_resume(tmp_path):
    whole, _ = _run(tmp_path, "whole", True)
    assert whole.train()["cuda_graph"]
    first, _ = _run(tmp_path, "resumed", True, save_every=4, stop_after=6)
    assert not first.train()["finished"]
    second, _ = _run(tmp_path, "resumed", True, save_every=4)
    assert second.try_resume() and second.step == 6
    summary = second.train()
    assert summary["finished"] and summary["cuda_graph"]
    for n, p in whole.named.items():
        torch.testing.assert_close(second.named[n], p, rtol=2e-3, atol=2e-5, msg=n)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graphed"])
def test_report_train_speed(tmp_path, graph):
    """Prints steady tokens/s of the default recipe's trainer at SmolLM2-135M sizes (random weights, T=4096)."""
    model = _model(layers=30, vocab=49152, inter=1536)
    cfg = train_mod.TrainConfig(seq_len=4096, batch_size=1, steps=23, save_every=10**6, log_every=10, eval_sequences=1,
                                cuda_graph=graph)
    summary = train_mod.Trainer(model, _seqs(49152, 4096, n=8), cfg, tmp_path / "speed").train()
    print(f"\ntrainer cuda_graph={graph}: steady {summary['steady_tokens_per_s']:,.0f} tokens/s "
          f"(whole run {summary['tokens_per_s']:,.0f} incl. warm-up/capture)")
    assert summary["finished"] and summary["cuda_graph"] == graph
