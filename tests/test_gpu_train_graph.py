"""The CUDA-graph training step (`golinear train --cuda-graph`, models/graph_step.py) on the GPU: the same
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

from models import data as data_mod
from models import train as train_mod

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs flash-linear-attention"),
]


def _model(layers=2, vocab=300, hidden=576, inter=256, seed=0):
    from models.linearize import LinearizeConfig, linearize
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
    cfg = dict(seq_len=512, batch_size=1, steps=12, lr=2e-3, save_every=0, log_every=2, eval_sequences=1,
               cuda_graph=graph)
    cfg.update(kw)
    trainer = train_mod.Trainer(model, _seqs(300, 512), train_mod.TrainConfig(**cfg), tmp_path / name)
    return trainer, model


def test_graphed_training_matches_eager(tmp_path):
    eager, _ = _run(tmp_path, "eager", False)
    graphed, _ = _run(tmp_path, "graphed", True)
    eager.train()
    assert graphed.train()["cuda_graph"], graphed.graph_error  # captured, not the eager fallback
    for n, p in eager.named.items():
        torch.testing.assert_close(graphed.named[n], p, rtol=2e-3, atol=2e-5, msg=n)
    le, lg = (train_mod.read_log(tmp_path / d / train_mod.LOG_FILE) for d in ("eager", "graphed"))
    assert [r["step"] for r in le] == [r["step"] for r in lg] == list(range(2, 13, 2))
    for a, b in zip(le, lg):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3) and b["lr"] == pytest.approx(a["lr"], rel=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-2)
    assert le[-1]["loss"] < le[0]["loss"]  # it trains at all


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
    cfg = train_mod.TrainConfig(seq_len=4096, batch_size=1, steps=23, save_every=0, log_every=10, eval_sequences=1,
                                cuda_graph=graph)
    summary = train_mod.Trainer(model, _seqs(49152, 4096, n=8), cfg, tmp_path / "speed").train()
    print(f"\ntrainer cuda_graph={graph}: steady {summary['steady_tokens_per_s']:,.0f} tokens/s "
          f"(whole run {summary['tokens_per_s']:,.0f} incl. warm-up/capture)")
    assert summary["finished"] and summary["cuda_graph"] == graph
