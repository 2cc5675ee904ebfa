"""Scaling on CPU: random-weight backbone folders (models.backbones.random_base) are deterministic, identical on every
rank and on every FSDP shard; an FSDP2 run on one (2 gloo processes, stopped and resumed) saves the same files
and new parameters as a one-process run; the scaling renderer (bench.speed.scaling) merges, computes speed-ups and
the extrapolation, and compares evaluation stores.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _tiny import free_port, tiny_tokenizer, write_books

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=512, max_position_embeddings=1024)
RECIPE = ["--mechanism", "gdn", "--window", "4", "--sinks", "2", "--short-conv", "--seq-len", "32", "--steps", "8",
          "--lr", "1e-2", "--eval-sequences", "2", "--log-every", "2", "--heldout-docs", "2", "--seed", "0"]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}", CUDA_VISIBLE_DEVICES="",
                OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def _run(cmd: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _base(tmp: Path, name: str = "qwen3-32b", seed: int = 0) -> Path:
    from golinear.models.backbones.random_base_write import write_random_base
    tok_dir = tmp / "tok"
    if not tok_dir.exists():
        tiny_tokenizer().save_pretrained(tok_dir)
    return write_random_base(tmp / f"{name}-{seed}", name, seed=seed, overrides=TINY, tokenizer_from=str(tok_dir))


def test_named_configs_hold_the_published_dimensions():
    from golinear.models.backbones.backbone import named_config
    c = named_config("qwen3-32b")
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.vocab_size, c.tie_word_embeddings) == (5120, 25600, 64, 64, 8, 128, 151936, False)
    with torch.device("meta"):
        import transformers
        n = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(c).parameters())
    assert 32.0e9 < n < 33.5e9  # Qwen3-32B: 32.8B parameters


def test_random_base_is_a_function_of_the_seed(tmp_path):
    from golinear.models.backbones.backbone import fingerprint, load_backbone, load_tokenizer
    a, b, other = _base(tmp_path), _base(tmp_path / "again"), _base(tmp_path, seed=1)
    assert not list(a.glob("*.safetensors"))  # no weights written: a few files of config and tokenizer
    ma, mb, mo = (load_backbone(str(f))[0] for f in (a, b, other))
    sa, sb = ma.state_dict(), mb.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert fingerprint(ma) == fingerprint(mb) != fingerprint(mo)
    assert ma.config.vocab_size == 512 and len(load_tokenizer(str(a))) == len(tiny_tokenizer())
    norm = sa["model.layers.0.input_layernorm.weight"]
    assert torch.equal(norm, torch.ones_like(norm)) and 0.015 < float(sa["model.embed_tokens.weight"].std()) < 0.025
    ids = torch.randint(0, 300, (1, 16))
    assert torch.isfinite(ma(input_ids=ids, labels=ids).loss)


def test_sharded_fill_equals_the_whole_build(tmp_path):
    """The FSDP path's pieces in one process (no DTensor: each 'shard' is the whole tensor): same weights, same new
    parameters, same base fingerprint as load_backbone + linearize."""
    from golinear.models.backbones import random_base
    from golinear.models.backbones.backbone import load_backbone
    from golinear.models.attention.linearize import LinearizeConfig, linearize, new_parameters
    from golinear.models.training.train_utils import seed_everything
    base = _base(tmp_path)
    cfg = LinearizeConfig(mechanism="gdn", window=4, sinks=2, short_conv=True, lora=True)
    whole, _ = load_backbone(str(base))
    seed_everything(0)
    linearize(whole, cfg, base_name=str(base))
    model = random_base.skeleton(base)
    plan = random_base.plan(model)
    seed_everything(0)
    with random_base.new_parameters_on_cpu(model):
        linearize(model, cfg, base_name=str(base))
    new_full = {n: p.detach().clone() for n, p in new_parameters(model).items()}
    saved = random_base.real_buffers(model)
    model.to_empty(device="cpu")
    fp = random_base.fill_sharded(model, plan, 0, "cpu", new_full)
    random_base.restore_buffers(model, "cpu", saved)
    assert fp == whole.config.golinear["base_fingerprint"]
    s1, s2 = whole.state_dict(), model.state_dict()
    assert set(s1) == set(s2) and all(torch.equal(s1[k], s2[k]) for k in s1)
    b1, b2 = dict(whole.named_buffers()), dict(model.named_buffers())
    assert all(torch.equal(b1[k], b2[k]) for k in b1)


def test_ranks_build_the_same_backbone(tmp_path):
    base = _base(tmp_path, "llama-3.1-8b")
    out = tmp_path / "ranks.json"
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
          str(ROOT / "scripts/scaling/check_ranks.py"), str(base), str(out)], timeout=120)
    rec = json.loads(out.read_text())
    assert rec["identical"] and len(rec["fingerprints"]) == 2


def _train(base: Path, data: Path, tokens: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--base", str(base), "--data-dir", str(data), "--tokens", str(tokens), "--out", str(out),
            *RECIPE, *extra]


def test_fsdp_on_a_random_base_resumes_and_matches_one_process(tmp_path):
    """2 gloo processes under scripts/scaling/accelerate/fsdp2.yaml through train_peak.py, stopped after step 4 and
    resumed: the run folder holds the same files as a one-process run (batch 2: same global batch), with the
    same new parameters (fp32, 1e-5) and the same base fingerprint; each rank wrote its peak-memory record."""
    from golinear.bench.cli import main as cli
    base, data, tokens = _base(tmp_path), write_books(tmp_path / "data"), tmp_path / "tok.npz"
    assert cli(_train(base, data, tokens, tmp_path / "single", "--batch-size", "2")) == 0
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
              str(ROOT / "scripts/scaling/accelerate/fsdp2.yaml"), "--num_processes", "2",
              "--main_process_port"]
    peak = tmp_path / "fsdp.peak"
    for stop in (["--stop-after", "4"], []):
        _run(launch + [str(free_port()), str(ROOT / "scripts/scaling/train_peak.py"), str(peak),
                       *_train(base, data, tokens, tmp_path / "fsdp", "--save-every", "1000", *stop)])
        if stop:
            assert (tmp_path / "fsdp" / "state.safetensors").exists() and not (tmp_path / "fsdp" / "new_params.safetensors").exists()
    names = lambda d: sorted(p.name for p in d.iterdir())  # noqa: E731
    assert names(tmp_path / "fsdp") == names(tmp_path / "single")
    a, b = load_file(tmp_path / "single" / "new_params.safetensors"), load_file(tmp_path / "fsdp" / "new_params.safetensors")
    assert set(a) == set(b) and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    ca, cb = (json.loads((tmp_path / r / "config.json").read_text()) for r in ("single", "fsdp"))
    assert ca["base_fingerprint"] == cb["base_fingerprint"] is not None
    rec = json.loads((tmp_path / "fsdp" / "train_config.json").read_text())
    assert rec["environment"]["fsdp"] and rec["summary"]["world_size"] == 2
    ranks = sorted(json.loads(p.read_text())["rank"] for p in tmp_path.glob("fsdp.peak.rank*.json"))
    assert ranks == [0, 1]


def _fake_run(folder: Path, gpus: int, batch: int, tps: float, peaks: list[float], fsdp: bool = False,
              base: str = "") -> Path:
    folder.mkdir(parents=True)
    rec = {"base": base, "train": {"seq_len": 4096, "batch_size": batch},
           "environment": {"processes": gpus, "fsdp": {"activation_checkpointing": True} if fsdp else None},
           "summary": {"world_size": gpus, "steady_tokens_per_s": tps, "tokens_per_s": tps / 2, "train_wall_s": 60.0,
                       "step": 30}}
    (folder / "train_config.json").write_text(json.dumps(rec))
    (folder / "train_log.jsonl").write_text("".join(json.dumps({"step": s, "loss": 11.0 - s / 100 + gpus / 1e4})
                                                    + "\n" for s in (10, 20, 30)))
    for rank, peak in enumerate(peaks):
        Path(f"{folder}.peak.rank{rank}.json").write_text(json.dumps({"rank": rank, "peak_allocated_gib": peak}))
    return folder


def test_render_merges_by_key_and_extrapolates(tmp_path):
    from golinear.bench.speed import scaling
    base = _base(tmp_path, "llama-3.1-8b")
    one = _fake_run(tmp_path / "r1", 1, 2, 10_000.0, [70.0], base=str(base))
    two = _fake_run(tmp_path / "r2", 2, 1, 19_000.0, [50.0, 51.5], base=str(base))
    fsdp = _fake_run(tmp_path / "r3", 2, 1, 900.0, [60.0, 61.0], fsdp=True, base="qwen3-32b")
    timing = tmp_path / "timing.json"
    timing.write_text(json.dumps({"runs": [{"suite": "cr", "gpus": 1, "wall_s": 300.0, "batch_size": 32, "models": "full", "returncode": 0},
                                           {"suite": "cr", "gpus": 2, "wall_s": 160.0, "batch_size": 32, "models": "full", "returncode": 0}]}))
    out = tmp_path / "lb"
    assert scaling.main(["--runs", str(one), str(two), str(fsdp), "--eval-timing", str(timing), "--commit", "abc",
                         "--same-curve", str(one), str(two), "--out", str(out)]) == 0
    rows = scaling.read_csv(out / "scaling.csv")
    assert list(rows[0])[:9] == ["mode", "gpus", "model_dims", "seq_len", "global_batch", "tokens_per_s",
                                 "peak_gib_per_gpu", "wall_s", "commit"]
    by = {(r["mode"], r["gpus"], r["model_dims"]): r for r in rows}
    dims = "llama-3.1-8b+" + ",".join(f"{k}={v}" for k, v in sorted(TINY.items()))
    ddp = by[("ddp", "2", dims)]
    assert ddp["speedup_vs_1gpu"] == "1.9" and ddp["peak_gib_per_gpu"] == "51.5" and ddp["global_batch"] == "2"
    assert by[("eval-cr", "2", "smollm2-135m")]["speedup_vs_1gpu"] == "1.875"
    assert by[("fsdp2", "2", "qwen3-32b")]["tokens_per_s"] == "900.0"
    # a later call's row with the same key replaces the old one; other rows stay
    _fake_run(tmp_path / "r2b", 2, 1, 18_000.0, [50.0, 50.0], base=str(base))
    assert scaling.main(["--runs", str(tmp_path / "r2b"), "--out", str(out)]) == 0
    rows = scaling.read_csv(out / "scaling.csv")
    assert len(rows) == 5 and {r["tokens_per_s"] for r in rows if r["mode"] == "ddp"} == {"18000.0"}
    md = (out / "scaling.md").read_text()
    assert "max |difference| 0.0001 over 3 logged steps" in md  # the first call's check is kept
    rows = [dict(r, model_dims="llama-3.1-8b") for r in rows]
    ext = scaling.extrapolate(rows)
    assert [e["gpus"] for e in ext] == [1, 2, 8]
    assert ext[0]["hours"] == pytest.approx(10.24e6 / 10_000 / 3600)
    assert ext[2]["tokens_per_s"] == pytest.approx(8 * 10_000 * 18_000 / 20_000)
    assert "Not yet measured" in scaling.render_md([]) and "not yet measured" in scaling.render_md([])


def test_compare_stores_names_identical_and_differing_cells(tmp_path):
    from golinear.bench.speed import scaling
    for store, value, n in (("ref", 0.5, 100), ("dp", 0.5, 100)):
        for task, v in (("golinear_piqa", value), ("golinear_arc_easy", value + (0.01 if store == "dp" else 0))):
            f = tmp_path / store / "cells" / "full-1" / f"{task}--x.json"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps({"task": task, "n": n, "value": v, "metric": "acc",
                                     "provenance": {"world_size": 2 if store == "dp" else 1}}))
    lines = scaling.compare_stores(tmp_path / "dp", tmp_path / "ref")
    assert len(lines) == 2
    assert any("golinear_piqa: identical" in x for x in lines) and any("arc_easy: DIFFERS" in x for x in lines)
