"""Diagnostics: the metric math on hand-made tensors, the hooks on a tiny linearized Llama, the CLI."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from golinear.models.training import diagnostics as diag
from _tiny import tiny_llama, tiny_tokenizer, write_books, write_tiny_backbone


def _keys(*rows):
    return torch.tensor(rows, dtype=torch.float32).view(1, len(rows), 1, -1)  # [B=1, T, H=1, D]


def test_concentration_and_residual_by_hand():
    k = _keys([1, 0], [0, 1], [1, 0])
    C = diag.key_concentration(k)[0, :, 0]
    R = diag.projection_residual(k)[0, :, 0]
    # t=1: kbar = e1; t=2: kbar = (e1+e2)/2; t=3: kbar = (2e1+e2)/3
    assert torch.allclose(C, torch.tensor([1.0, 1 / math.sqrt(2), 2 / math.sqrt(5)]), atol=1e-5)
    assert torch.allclose(R, torch.tensor([0.0, 0.0, 2 / math.sqrt(5) - math.sqrt(5) / 3]), atol=1e-5)


def test_aligned_keys_are_concentrated_with_zero_residual():
    k = torch.tensor([3.0, -1.0, 2.0]).repeat(1, 6, 2, 1) * torch.arange(1, 7).view(1, 6, 1, 1)
    assert torch.allclose(diag.key_concentration(k), torch.ones(1, 6, 2), atol=1e-5)
    assert diag.projection_residual(k).abs().max() < 1e-5


def test_residual_equals_cos_minus_mean_norm_and_is_scale_free():
    torch.manual_seed(0)
    k = torch.randn(2, 50, 3, 8)
    C, R = diag.key_concentration(k), diag.projection_residual(k)
    kbar = diag.running_mean(diag.normalize_keys(k), dim=1).norm(dim=-1)
    assert torch.allclose(R, (C - kbar).abs(), atol=2e-3)  # (eps aside) App. A.2: |r| = |cos(alpha) - |kbar||
    scaled = k * torch.rand(2, 50, 3, 1).add(0.1) * 7
    assert torch.allclose(diag.key_concentration(scaled), C, atol=1e-5)
    assert torch.allclose(diag.projection_residual(scaled), R, atol=1e-5)
    assert C.min() >= -1 and C.max() <= 1 + 1e-6


def test_nmse_definition():
    torch.manual_seed(0)
    y = torch.randn(2, 16, 3, 4) * 2 + 1
    assert diag.nmse_token_head(y, y).abs().max() == 0
    noise = torch.randn_like(y) * 0.5
    e = diag.nmse_token_head(y, y + noise)
    for b in range(2):
        expected = noise[b].pow(2).mean() / y[b].var(unbiased=False)
        assert torch.allclose(e[b].mean(), expected, rtol=1e-5)
    assert e.shape == (2, 16, 3)


def test_binned_mean():
    b = diag.binned_mean(np.array([0.05, 0.06, 0.5, 2.0, -1.0]), np.array([1.0, 3.0, 5.0, 7.0, 9.0]),
                         np.array([0.0, 0.1, 1.0]))
    assert b["count"] == [3, 2] and b["nmse"] == [pytest.approx(13 / 3), pytest.approx(6.0)]
    assert diag.binned_mean(np.array([0.5]), np.array([1.0]), np.array([0.0, 0.1, 1.0]))["nmse"][0] is None


def test_hardness_prefers_high_residual_low_concentration():
    scores = diag.hardness_scores(mean_c=[0.9, 0.5, 0.9], mean_r=[0.1, 0.4, 0.1])
    assert scores[1] > scores[0] == scores[2]
    assert diag.hardness_scores([0.5, 0.5], [0.2, 0.2]) == [0.0, 0.0]


def test_causal_attention_matches_explicit_softmax():
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 5, 4, 8), torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8)
    out = diag.causal_attention(q, k, v, scale=0.3)
    for t in range(5):
        for h in range(4):
            s = (q[0, t, h] @ k[0, : t + 1, h // 2].T) * 0.3
            assert torch.allclose(out[0, t, h], torch.softmax(s, -1) @ v[0, : t + 1, h // 2], atol=1e-5)


# ------------------------------------------------------------------------------------------- hooks
def _seqs(vocab, n=2, T=40):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (n, T), generator=g)


def test_window_covering_everything_has_zero_nmse():
    """mechanism 'none' with a window >= T is exact softmax attention: the plumbing must report ~0."""
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    model = tiny_llama(320)
    linearize(model, LinearizeConfig(mechanism="none", window=64, short_conv=True))
    res = diag.summarize_nmse(diag.collect(model, _seqs(320), with_nmse=True))
    assert res["layers"] == [0, 1] and len(res["tokenwise"]) == 40
    assert res["mean"] < 1e-8


def test_gdn_nmse_positive_and_geometry_matches_base():
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    seqs = _seqs(320)
    base = diag.collect(tiny_llama(320), seqs, with_nmse=False)
    model = linearize(tiny_llama(320), LinearizeConfig(mechanism="gdn"))
    rec = diag.collect(model, seqs, with_nmse=True)
    # layer 0 sees the same input in both models, so its frozen keys (C, R) agree
    assert torch.allclose(base[0]["C"], rec[0]["C"], atol=1e-5)
    assert torch.allclose(base[0]["R"], rec[0]["R"], atol=1e-5)
    res = diag.summarize_nmse(rec)
    assert 0 < res["mean"] < 100 and all(v > 0 for v in res["layerwise"])
    assert sum(res["by_C"]["count"]) == 2 * 40 * 4 * 2  # layers x positions x query heads x sequences
    geo = diag.summarize_geometry(base)
    assert len(geo["C_t"]) == 40 and geo["C_t"][0] == pytest.approx(1.0, abs=1e-5)
    assert len(geo["hardness"]) == 2


def test_lora_is_disabled_for_the_teacher():
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    model = linearize(tiny_llama(320), LinearizeConfig(mechanism="none", window=64, lora=True))
    for n, p in model.named_parameters():  # make LoRA non-trivial
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)
    res = diag.summarize_nmse(diag.collect(model, _seqs(320), with_nmse=True))
    assert res["mean"] > 1e-4  # the student uses LoRA, the frozen teacher does not


# ------------------------------------------------------------------------------------------- CLI
def test_cli_diagnose_then_hybrid_training(tmp_path):
    from golinear.bench.cli import main as cli
    base = write_tiny_backbone(tmp_path / "base")
    data = write_books(tmp_path / "data")
    ckpt = tmp_path / "ckpt"
    common = ["--base", str(base), "--data-dir", str(data), "--heldout-docs", "2", "--seq-len", "32"]
    assert cli(["train", *common, "--mechanism", "gdn", "--window", "4", "--sinks", "2", "--steps", "4",
                "--eval-sequences", "2", "--out", str(ckpt)]) == 0
    out = tmp_path / "diag"
    assert cli(["diagnose", *common, "--checkpoint", str(ckpt), "--fresh", "gla", "--sequences", "2",
                "--out", str(out)]) == 0
    res = json.loads((out / "diagnostics.json").read_text())
    run = res["runs"]["ckpt"]
    assert run["before"]["mean"] > 0 and run["after"]["mean"] > 0 and run["seed"] == 0
    assert "gla (untrained)" in res["runs"]
    for png in ("fig2b_layerwise_nmse.png", "fig2c_tokenwise_nmse.png", "fig3_residual_concentration.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    scores = json.loads((out / "layer_scores.json").read_text())
    assert len(scores["layer_scores"]) == 2
    hard = scores["ranking_hardest_first"][0]
    hybrid = tmp_path / "hybrid"
    assert cli(["train", *common, "--steps", "2", "--eval-sequences", "1", "--keep-full", "0.5", "--select",
                "hardness", "--layer-scores", str(out / "layer_scores.json"), "--out", str(hybrid)]) == 0
    cfg = json.loads((hybrid / "config.json").read_text())
    assert cfg["linearize"]["keep_full"] == 0.5
    from golinear.models.checkpoint.weights import load_checkpoint
    model, _, _ = load_checkpoint(hybrid, base=str(base))
    assert model.config.golinear["full_layers"] == [hard]
    assert cli(["diagnose", *common, "--fresh", "gdn:bad", "--out", str(tmp_path / "bad")]) == 2  # one line, exit 2
    assert not (tmp_path / "bad").exists()  # rejected before anything is written
