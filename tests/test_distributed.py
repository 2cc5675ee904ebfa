"""Data-parallel training on CPU: two processes (gloo) under `accelerate launch` end with identical new
parameters, equal to a one-process run with the same global batch; the CLI runs under the launcher too.

This file is also the worker script the launcher starts (see `__main__` below).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _tiny import free_port

ROOT = Path(__file__).resolve().parent.parent
STEPS, SEQ_LEN = 6, 32


def _setup(data_dir: Path):
    from golinear.models.training import data as data_mod
    from _tiny import tiny_llama, tiny_tokenizer
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=0)
    model.requires_grad_(False)
    model.lm_head.requires_grad_(True)
    model.model.layers[1].self_attn.o_proj.requires_grad_(True)
    td = data_mod.prepare_books(tok, data_dir, heldout_docs=2)
    return model, data_mod.PackedSequences(td.train, SEQ_LEN, seed=0)


def worker(out: Path, data_dir: Path) -> None:
    from golinear.models.training import train as train_mod
    model, seqs = _setup(data_dir)
    cfg = train_mod.TrainConfig(seq_len=SEQ_LEN, batch_size=1, steps=STEPS, lr=1e-2, save_every=10**6, log_every=2)
    trainer = train_mod.Trainer(model, seqs, cfg, out / "run")
    summary = trainer.train()
    torch.save({n: p.detach().cpu() for n, p in trainer.named.items()}, out / f"rank{trainer.rank}.pt")
    (out / f"rank{trainer.rank}.json").write_text(json.dumps(summary))


def _launch(args: list[str], tmp_path: Path, ok: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}", CUDA_VISIBLE_DEVICES="",
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--main_process_port", str(free_port()), "--mixed_precision", "no",
           "--dynamo_backend", "no", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_two_ranks_end_identical_and_match_one_process(tmp_path):
    from _tiny import write_books
    from golinear.models.training import train as train_mod
    data_dir = write_books(tmp_path / "data")
    _launch([str(Path(__file__)), str(tmp_path), str(data_dir)], tmp_path)
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert r0.keys() == r1.keys() and len(r0) == 2
    for name in r0:
        assert torch.equal(r0[name], r1[name]), name
    summary = json.loads((tmp_path / "rank0.json").read_text())
    assert summary["world_size"] == 2 and summary["tokens"] == STEPS * 2 * SEQ_LEN

    # one process, batch 2 = the same global batches (rank r takes sequence 2*step + r)
    model, seqs = _setup(data_dir)
    init = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    cfg = train_mod.TrainConfig(seq_len=SEQ_LEN, batch_size=2, steps=STEPS, lr=1e-2, save_every=10**6, log_every=2)
    single = train_mod.Trainer(model, seqs, cfg, tmp_path / "single")
    single.train()
    for name in r0:
        assert not torch.allclose(r0[name], init[name])  # training moved them
        assert torch.allclose(r0[name], single.named[name].detach(), atol=1e-5), name


@pytest.mark.parametrize("argv", [["params"], ["train", "--base", "no-such-backbone", "--steps", "0"]])
def test_every_command_destroys_the_process_group_it_ran_under(tmp_path, argv):
    """A launched rank that leaves its gloo group to interpreter teardown can abort after its work is done."""
    import torch.distributed as dist
    from golinear.bench.cli import main as cli
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        cli(argv)
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.slow
def test_cli_train_under_accelerate_launch(tmp_path):
    from _tiny import write_books, write_tiny_backbone
    base = write_tiny_backbone(tmp_path / "base")
    data_dir = write_books(tmp_path / "data")
    out = tmp_path / "ckpt"
    _launch(["-m", "golinear.bench.cli", "train", "--base", str(base), "--data-dir", str(data_dir), "--heldout-docs", "2",
             "--seq-len", "32", "--steps", "3", "--eval-sequences", "1", "--mechanism", "gla", "--window", "0",
             "--sinks", "0", "--no-short-conv", "--tokens", str(tmp_path / "tok.npz"), "--out", str(out)], tmp_path)
    record = json.loads((out / "train_config.json").read_text())
    assert record["summary"]["world_size"] == 2 and record["summary"]["tokens"] == 3 * 2 * 32
    assert (out / "new_params.safetensors").exists() and (out / "loss.png").exists()



@pytest.mark.slow
def test_ddp_refuses_sequences_that_never_reach_the_linear_state(tmp_path):
    """Sequences of 32 tokens under the default recipe's 56 + 8 sinks: DDP would stop at the second step with
    "Expected to have finished reduction" (the gates get no gradient); the trainer says why before the first."""
    from _tiny import write_books, write_tiny_backbone
    base = write_tiny_backbone(tmp_path / "base")
    proc = _launch(["-m", "golinear.bench.cli", "train", "--base", str(base), "--data-dir", str(write_books(tmp_path / "data")),
                    "--heldout-docs", "2", "--seq-len", "32", "--steps", "3", "--eval-sequences", "1",
                    "--tokens", str(tmp_path / "tok.npz"), "--out", str(tmp_path / "ckpt")], tmp_path, ok=False)
    out = proc.stdout + proc.stderr
    assert "seq_len=32 with 2 data-parallel processes" in out and "allowed: seq_len > 64" in out, out[-3000:]
    assert "finished reduction" not in out and not (tmp_path / "ckpt" / "new_params.safetensors").exists()


if __name__ == "__main__":
    from golinear.bench.cli import end_process_group
    worker(Path(sys.argv[1]), Path(sys.argv[2]))
    end_process_group()
