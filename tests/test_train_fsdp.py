"""FSDP training on CPU: `golinear train` under `accelerate launch` with examples/accelerate-fsdp.yaml, two
gloo processes, a tiny random Llama with tied embeddings like SmolLM2 (GDN + window/sinks + short conv +
LoRA: frozen and trainable parameters in every sharded unit). Only rank 0 reads the backbone; the backbone
is really sharded (rank 0 holds about half of it); the saved new parameters equal a one-process run with
the same global batch and seed (fp32, atol 1e-5); a stopped and resumed FSDP run (with activation
checkpointing) equals the uninterrupted one bit for bit; bad FSDP settings get clear errors.
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

from _tiny import free_port
from golinear.models.training import train as train_mod
from golinear.models.training import train_fsdp, train_utils

ROOT = Path(__file__).resolve().parent.parent
STEPS, SEQ_LEN, ATOL = 8, 32, 1e-5
RECIPE = ["--mechanism", "gdn", "--window", "4", "--sinks", "2", "--short-conv", "--lora", "--seq-len", str(SEQ_LEN),
          "--steps", str(STEPS), "--lr", "1e-2", "--lora-lr", "1e-2", "--eval-sequences", "2", "--log-every", "2",
          "--heldout-docs", "2", "--seed", "0"]


def _args(setup: dict, out: Path, *extra: str) -> list[str]:
    return ["train", "--base", str(setup["base"]), "--data-dir", str(setup["data"]), "--tokens",
            str(setup["tokens"]), "--out", str(out), *RECIPE, *extra]


def _launch_fsdp(args: list[str], *launcher_args: str) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}", CUDA_VISIBLE_DEVICES="",
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "examples" / "accelerate-fsdp.yaml"), "--num_processes", "2", "--main_process_port",
           str(free_port()), *launcher_args, "-m", "golinear.bench.cli",
           *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _tied_backbone(folder: Path) -> Path:
    import transformers
    from _tiny import tiny_tokenizer
    tok = tiny_tokenizer()
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _record(folder: Path) -> dict:
    return json.loads((folder / train_mod.CONFIG_FILE).read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One FSDP run (2 processes, batch 1 each) and one plain run (1 process, batch 2): same global batches."""
    from _tiny import write_books
    from golinear.bench.cli import main as cli
    tmp = tmp_path_factory.mktemp("fsdp")
    setup = {"base": _tied_backbone(tmp / "base"), "data": write_books(tmp / "data"), "tokens": tmp / "tok.npz",
             "tmp": tmp}
    assert cli(_args(setup, tmp / "single", "--batch-size", "2")) == 0  # also writes the token file
    _launch_fsdp(_args(setup, tmp / "fsdp", "--save-every", "1000"))
    return setup


def _initial_new_parameters(base: Path) -> dict:
    from golinear.models.backbones.backbone import load_backbone
    from golinear.models.attention.linearize import LinearizeConfig, linearize, new_parameters
    model, _ = load_backbone(str(base))
    train_utils.seed_everything(0)  # the trainer seeds right before linearizing
    linearize(model, LinearizeConfig(mechanism="gdn", window=4, sinks=2, short_conv=True, lora=True))
    return {n: p.detach().clone() for n, p in new_parameters(model).items()}


def test_fsdp_shards_trains_and_matches_one_process(runs):
    tmp = runs["tmp"]
    fsdp, single = _record(tmp / "fsdp"), _record(tmp / "single")
    summary = fsdp["summary"]
    assert summary["finished"] and summary["world_size"] == 2 and summary["tokens"] == STEPS * 2 * SEQ_LEN
    assert fsdp["environment"]["fsdp"]["version"] == 2 and single["environment"]["fsdp"] is None
    # the backbone is sharded: rank 0 holds about half of all parameters (FSDP pads odd first dimensions)
    assert summary["parameters"] == single["summary"]["parameters"]
    assert summary["parameters_on_rank"] < 0.55 * summary["parameters"]
    assert single["summary"]["parameters_on_rank"] == single["summary"]["parameters"]

    trained, reference = load_file(str(tmp / "fsdp" / "new_params.safetensors")), \
        load_file(str(tmp / "single" / "new_params.safetensors"))
    init = _initial_new_parameters(runs["base"])
    assert trained.keys() == reference.keys() == init.keys()
    assert any("lora_" in n for n in trained) and any(".self_attn.lin." in n for n in trained)
    moved = [n for n in trained if not torch.allclose(trained[n], init[n], atol=1e-6)]
    assert len(moved) == len(trained), sorted(set(trained) - set(moved))  # every new parameter trained
    for name in trained:
        assert torch.allclose(trained[name], reference[name], atol=ATOL, rtol=0), \
            (name, float((trained[name] - reference[name]).abs().max()))

    # held-out losses from the sharded model (all ranks evaluate) equal the unsharded ones
    for key in ("heldout_loss_full_attention", "heldout_loss_init", "heldout_loss_trained"):
        assert fsdp["results"][key] == pytest.approx(single["results"][key], abs=ATOL), key
    assert fsdp["results"]["heldout_loss_full_attention"] != pytest.approx(fsdp["results"]["heldout_loss_init"])
    # the logged loss is the global batch's: the same curve as the one-process run
    log_f = train_utils.read_log(tmp / "fsdp" / train_mod.LOG_FILE)
    log_s = train_utils.read_log(tmp / "single" / train_mod.LOG_FILE)
    assert [r["step"] for r in log_f] == [r["step"] for r in log_s] == [2, 4, 6, 8]
    for a, b in zip(log_f, log_s):
        assert a["loss"] == pytest.approx(b["loss"], abs=ATOL) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


def test_fsdp_exact_resume(runs):
    """Stop after step 5 (resume state saved every 2 steps: the stop itself saves), resume: the same bits.
    Both parts recompute layers in backward (fsdp_activation_checkpointing), which changes no number."""
    tmp = runs["tmp"]
    out = tmp / "resumed"
    _launch_fsdp(_args(runs, out, "--save-every", "2", "--stop-after", "5"), "--fsdp_activation_checkpointing", "true")
    stopped = _record(out)["summary"]
    assert not stopped["finished"] and stopped["step"] == 5 and (out / train_mod.STATE_FILE).exists()
    from golinear.models.training import resume_state
    state = resume_state.load(out / train_mod.STATE_FILE)
    params = {n: p for n, p in state["params"].items()}
    assert all(type(p) is torch.Tensor for p in params.values())  # full tensors, not shards
    q = next(n for n in params if n.endswith("self_attn.conv.q"))
    assert params[q].shape == (4 * 16, 4)  # q_dim x kernel: the whole tensor
    _launch_fsdp(_args(runs, out, "--save-every", "2"), "--fsdp_activation_checkpointing", "true")
    assert _record(out)["environment"]["fsdp"]["activation_checkpointing"] is True
    resumed, uninterrupted = load_file(str(out / "new_params.safetensors")), \
        load_file(str(tmp / "fsdp" / "new_params.safetensors"))
    for name in uninterrupted:
        assert torch.equal(resumed[name], uninterrupted[name]), name
    strip = lambda log: [(r["step"], r["loss"], r["lr"]) for r in log]
    assert strip(train_utils.read_log(out / train_mod.LOG_FILE)) == \
        strip(train_utils.read_log(tmp / "fsdp" / train_mod.LOG_FILE))


def test_fsdp_bad_settings():
    with pytest.raises(ValueError, match="this run has 1"):
        train_fsdp.fsdp_settings(True, 1, env={})
    assert train_fsdp.fsdp_settings(False, 2, env={}) is None
    fsdp_env = {"ACCELERATE_USE_FSDP": "true"}
    assert train_fsdp.fsdp_settings(False, 2, env=dict(fsdp_env, FSDP_VERSION="2"))["reshard_after_forward"] is True
    with pytest.raises(ValueError, match="fsdp_version 1"):  # accelerate's default when the config omits it
        train_fsdp.fsdp_settings(False, 2, env=dict(fsdp_env, FSDP_VERSION="1"))
    with pytest.raises(ValueError, match="fsdp_offload_params"):
        train_fsdp.fsdp_settings(True, 2, env={"FSDP_OFFLOAD_PARAMS": "true"})
    with pytest.raises(ValueError, match="FSDP_RESHARD_AFTER_FORWARD='SHARD_GRAD_OP'"):
        train_fsdp.fsdp_settings(True, 2, env={"FSDP_RESHARD_AFTER_FORWARD": "SHARD_GRAD_OP"})


def test_fsdp_refuses_unshardable_parameters():
    """FSDP2 shards on dim 0: a 0-dim new parameter cannot be sharded (checked before any collective)."""
    from _tiny import tiny_llama
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    model = linearize(tiny_llama(320), LinearizeConfig(mechanism="gdn", window=4, sinks=2))
    model.model.layers[0].self_attn.lin.register_parameter("gain", torch.nn.Parameter(torch.tensor(1.0)))
    with pytest.raises(ValueError, match=r"0-dim parameters cannot be sharded: \['model.layers.0.self_attn.lin.gain'\]"):
        train_fsdp.shard_model(model, torch.device("cpu"), 2)


def test_cli_fsdp_in_one_process_is_a_clear_error(tmp_path, capsys):
    from golinear.bench.cli import main as cli
    assert cli(["train", "--fsdp", "--base", str(tmp_path / "unused"), "--out", str(tmp_path / "o")]) == 2
    assert "FSDP shards across processes but this run has 1" in capsys.readouterr().err
