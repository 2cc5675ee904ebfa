"""Training: data split/packing, schedule, the loop (loss falls), exact resume, time budget, the CLI."""
from __future__ import annotations

import json
import math
import os
import signal

import numpy as np
import pytest
import torch

from golinear.models.training import data as data_mod
from golinear.models.training import train as train_mod
from golinear.models.training import train_utils
from _tiny import tiny_llama, tiny_tokenizer, write_books, write_tiny_backbone


# ------------------------------------------------------------------------------------------------ data
def test_heldout_ids_deterministic_and_order_free():
    ids = [f"author/book {i}" for i in range(50)]
    a = data_mod.heldout_ids(ids, 5)
    b = data_mod.heldout_ids(list(reversed(ids)), 5)
    assert a == b and len(set(a)) == 5
    with pytest.raises(ValueError, match="heldout_docs"):
        data_mod.heldout_ids(ids, 50)


def test_prepare_books_keeps_heldout_out_of_training(tmp_path):
    data_dir = write_books(tmp_path)
    tok = tiny_tokenizer()
    td = data_mod.prepare_books(tok, data_dir, heldout_docs=2, seed=3)
    held = set(td.meta["heldout_ids"])
    assert len(held) == 2 and td.meta["n_docs"] == 12
    docs = dict(data_mod.read_jsonl_docs(data_mod.book_files(data_dir)))
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    held_stream = data_mod.tokenize_docs([docs[i] for i in td.meta["heldout_ids"]], tok)
    assert np.array_equal(td.heldout, held_stream)
    # every training document is a non-held-out book: split the stream at EOS and decode the titles
    pieces = np.split(td.train, np.where(td.train == eos)[0] + 1)
    titles = {tok.decode(p[:3].tolist()).split(".")[0] for p in pieces if len(p)}
    held_titles = {docs[i].split(".")[0] for i in held}
    assert titles and not (titles & held_titles)
    assert td.train.dtype == np.uint16 and (td.train == eos).sum() == 10


def test_token_file_roundtrip_and_truncation(tmp_path):
    tok = tiny_tokenizer()
    td = data_mod.prepare_books(tok, write_books(tmp_path), train_tokens=500, heldout_docs=2)
    assert len(td.train) == 500
    path = td.save(tmp_path / "tok.npz")
    back = data_mod.TokenData.load(path)
    assert np.array_equal(back.train, td.train) and back.meta == td.meta
    with pytest.raises(FileNotFoundError, match="token file"):
        data_mod.TokenData.load(tmp_path / "missing.npz")


def test_packed_sequences_permutation_and_epochs():
    stream = np.arange(100, dtype=np.uint16)
    seqs = data_mod.PackedSequences(stream, seq_len=10, seed=1)
    first_epoch = {int(seqs[i][0]) for i in range(10)}
    assert first_epoch == set(range(0, 100, 10))  # each chunk exactly once per epoch
    assert [int(seqs[i][0]) for i in range(10)] != list(range(0, 100, 10))  # shuffled
    again = data_mod.PackedSequences(stream, seq_len=10, seed=1)
    assert all(torch.equal(seqs[i], again[i]) for i in range(25))
    assert {int(seqs[i][0]) for i in range(10, 20)} == first_epoch
    assert seqs.batch(3, 2).shape == (2, 10)
    with pytest.raises(ValueError, match="not one sequence"):
        data_mod.PackedSequences(stream[:5], seq_len=10)


def test_hf_dataset_source_with_local_json(tmp_path):
    pytest.importorskip("datasets")
    path = tmp_path / "docs.jsonl"
    texts = [f"document {i} " + "the cat sat on the mat " * 20 for i in range(200)]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = tiny_tokenizer()
    td = data_mod.prepare_hf(tok, "json", data_files=[str(path)], heldout_fraction=0.1, heldout_tokens=None)
    assert td.meta["source"] == "hf" and len(td.heldout) > 0 and len(td.train) > len(td.heldout)
    held = [t for t in texts if data_mod._hash_unit(t) < 0.1]
    assert len(td.heldout) == sum(len(tok(t, add_special_tokens=False)["input_ids"]) + 1 for t in held)


# ------------------------------------------------------------------------------------------------ schedule
def test_cosine_schedule_and_groups():
    assert train_mod.cosine_lr_factor(0, 100) == 1.0
    assert math.isclose(train_mod.cosine_lr_factor(50, 100), 0.5)
    assert train_mod.cosine_lr_factor(100, 100) == 0.0
    assert math.isclose(train_mod.cosine_lr_factor(0, 100, warmup=10), 0.1)
    assert math.isclose(train_mod.cosine_lr_factor(100, 100, min_ratio=0.1), 0.1)
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    groups = train_mod.param_groups({"x.lin.w": a, "x.q_proj.lora_A.default.weight": b}, train_mod.TrainConfig())
    assert [(g["name"], g["lr"]) for g in groups] == [("new", 2e-3), ("lora", 5e-4)]


# ------------------------------------------------------------------------------------------------ loop
def _stand_in(seed=0):
    """Tiny random Llama with only lm_head and one o_proj trainable (stand-in for new parameters)."""
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=seed)
    model.requires_grad_(False)
    model.lm_head.requires_grad_(True)
    model.model.layers[0].self_attn.o_proj.requires_grad_(True)
    return model, tok


def _sequences(tmp_path, tok, seq_len=32):
    td = data_mod.prepare_books(tok, write_books(tmp_path / "data"), heldout_docs=2)
    return data_mod.PackedSequences(td.train, seq_len, seed=0), data_mod.heldout_sequences(td.heldout, seq_len, 4)


def _cfg(**kw):
    base = dict(seq_len=32, batch_size=2, steps=30, lr=1e-2, save_every=10**6, log_every=5, eval_sequences=4)
    base.update(kw)
    return train_mod.TrainConfig(**base)


def test_loss_falls_and_only_trainable_params_change(tmp_path):
    model, tok = _stand_in()
    seqs, held = _sequences(tmp_path, tok)
    frozen_before = model.model.layers[1].mlp.up_proj.weight.clone()
    trainer = train_mod.Trainer(model, seqs, _cfg(), tmp_path / "run")
    before = trainer.evaluate(held)
    summary = trainer.train()
    after = trainer.evaluate(held)
    log = train_utils.read_log(tmp_path / "run" / train_mod.LOG_FILE)
    assert summary["finished"] and summary["tokens"] == 30 * 2 * 32
    assert [r["step"] for r in log] == [5, 10, 15, 20, 25, 30]
    assert log[-1]["loss"] < log[0]["loss"] - 0.5 and after < before - 0.5
    assert log[-1]["lr"] < 1e-4  # cosine ran to the end
    assert torch.equal(frozen_before, model.model.layers[1].mlp.up_proj.weight)
    train_utils.plot_loss(log, tmp_path / "run" / "loss.png", heldout={"full": 1.0})
    assert (tmp_path / "run" / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_exact_resume_matches_uninterrupted_run(tmp_path):
    model, tok = _stand_in()
    seqs, _ = _sequences(tmp_path, tok)
    full = train_mod.Trainer(model, seqs, _cfg(steps=12, save_every=4), tmp_path / "full")
    full.train()

    first, _ = _stand_in()
    t1 = train_mod.Trainer(first, seqs, _cfg(steps=12, save_every=4, stop_after=6), tmp_path / "resumed")
    s1 = t1.train()
    assert not s1["finished"] and s1["step"] == 6
    assert (tmp_path / "resumed" / train_mod.STATE_FILE).exists()
    # an interruption after step 6 wrote log lines past the saved state: a resume drops them
    torch.manual_seed(123)  # different RNG before resuming: the state restores it
    second, _ = _stand_in()
    t2 = train_mod.Trainer(second, seqs, _cfg(steps=12, save_every=4), tmp_path / "resumed")
    assert t2.try_resume() and t2.step == 6
    assert t2.train()["finished"]
    for name, p in full.named.items():
        assert torch.equal(p, t2.named[name]), name
    log_full = train_utils.read_log(tmp_path / "full" / train_mod.LOG_FILE)
    log_res = train_utils.read_log(tmp_path / "resumed" / train_mod.LOG_FILE)
    strip = lambda log: [{k: r[k] for k in ("step", "loss", "lr", "grad_norm")} for r in log]
    assert strip(log_full) == strip(log_res)


def test_resume_truncates_log_to_saved_step(tmp_path):
    model, tok = _stand_in()
    seqs, _ = _sequences(tmp_path, tok)
    t = train_mod.Trainer(model, seqs, _cfg(steps=20, save_every=5, stop_after=10), tmp_path / "r")
    t.train()
    with open(tmp_path / "r" / train_mod.LOG_FILE, "a") as f:  # lines from steps lost in a crash
        f.write(json.dumps({"step": 15, "loss": 9.0}) + "\n")
    t2 = train_mod.Trainer(_stand_in()[0], seqs, _cfg(steps=20, save_every=5), tmp_path / "r")
    t2.try_resume()
    assert [r["step"] for r in train_utils.read_log(tmp_path / "r" / train_mod.LOG_FILE)] == [5, 10]


def test_rng_state_roundtrip():
    state = train_utils.rng_state()
    a = (torch.rand(3), np.random.rand(), __import__("random").random())
    train_utils.set_rng_state(state)
    b = (torch.rand(3), np.random.rand(), __import__("random").random())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


class StepClock:
    """A clock that advances a fixed time per training step (read through the trainer's `clock`), so a time-budget
    test checks the fitting logic, not the machine's speed."""

    def __init__(self, seconds_per_step: float):
        self.t, self.dt = 1000.0, seconds_per_step

    def __call__(self) -> float:
        return self.t

    def step(self):
        self.t += self.dt


def test_time_budget_shrinks_step_count(tmp_path):
    model, tok = _stand_in()
    seqs, _ = _sequences(tmp_path, tok)
    clock = StepClock(0.1)
    t = train_mod.Trainer(model, seqs, _cfg(steps=100000, time_budget_s=3.0), tmp_path / "b", clock=clock)
    real_batch = t._batch
    t._batch = lambda: (clock.step(), real_batch())[1]
    summary = t.train()
    assert summary["finished"] and 25 <= summary["total_steps"] <= 30, summary  # 3 s at 10 steps/s, 3 % slack
    assert "time budget" in summary["budget_note"]
    assert summary["train_wall_s"] <= 3.0


def test_bad_config_values():
    with pytest.raises(ValueError, match="--seq-len"):
        train_mod.TrainConfig(seq_len=0).validate()
    with pytest.raises(ValueError, match="--warmup-steps"):
        train_mod.TrainConfig(steps=5, warmup_steps=5).validate()


def test_hard_stop_at_deadline_still_finishes(tmp_path):
    import time
    model, tok = _stand_in()
    seqs, _ = _sequences(tmp_path, tok)
    t = train_mod.Trainer(model, seqs, _cfg(steps=100000, time_budget_s=1.0), tmp_path / "h",
                          deadline=time.perf_counter() - 10)
    summary = t.train()
    assert summary["finished"] and summary["stopped_at_deadline"] and summary["step"] == 10
    assert "hard stop" in summary["budget_note"]


# ------------------------------------------------------------------------------------------------ reference checkpoints
def test_autocast_gives_the_linear_ops_one_dtype(monkeypatch):
    """Under bf16 autocast (the GPU recipe) q/k/v reaching the ops share a dtype (FLA's kernels need it)."""
    from golinear.models.attention import ops
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    seen = []
    for name in ("gdn_chunk", "window_sink_attention"):
        real = getattr(ops, name)

        def spy(q, k, v, *a, _real=real, **kw):
            seen.append((q.dtype, k.dtype, v.dtype))
            return _real(q, k, v, *a, **kw)
        monkeypatch.setattr(ops, name, spy)
    model = linearize(tiny_llama(320), LinearizeConfig(mechanism="gdn", window=4, sinks=2, short_conv=True))
    ids = torch.randint(0, 320, (1, 24))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert seen and all(len(set(d)) == 1 for d in seen), seen


def test_cuda_graph_refused_off_cuda_and_states_cross_modes(tmp_path):
    """--cuda-graph needs one CUDA process (CPU here: a clear error before any step). A graphed run's
    optimizer state (tensor learning rates, step counts on the device) resumes in an eager run and back."""
    from golinear.models.training import graph_step
    model, tok = _stand_in()
    seqs, _ = _sequences(tmp_path, tok)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--cuda-graph needs one CUDA process.*not CUDA"):
            train_mod.Trainer(model, seqs, _cfg(cuda_graph=True), tmp_path / "g")
    t = train_mod.Trainer(model, seqs, _cfg(steps=4), tmp_path / "e")
    t.train()
    opt = t.optimizer
    graph_step.make_capturable(opt, "cpu")  # the graphed layout (on the CPU here)
    assert all(torch.is_tensor(g["lr"]) and g["capturable"] for g in opt.param_groups)
    graph_step.set_lr(opt.param_groups[0], 0.5)
    assert float(opt.param_groups[0]["lr"]) == 0.5  # written in place: a captured graph reads the same tensor
    graph_step.make_eager(opt)
    assert all(type(g["lr"]) is float and not g["capturable"] for g in opt.param_groups)
    assert all(s["step"].device.type == "cpu" and s["step"].dtype == torch.float32 for s in opt.state.values())


def test_stop_at_seconds_keeps_the_schedule_and_resumes_exactly(tmp_path):
    """--stop-at-s leaves early with a resumable state; unlike --time-budget-s the schedule keeps every
    requested step, so the resumed run ends where an uninterrupted one does."""
    model, tok = _stand_in()
    seqs, _ = _sequences(tmp_path, tok)
    full = train_mod.Trainer(model, seqs, _cfg(steps=12), tmp_path / "full")
    full.train()
    first = train_mod.Trainer(_stand_in()[0], seqs, _cfg(steps=12, stop_at_s=0.0), tmp_path / "s")
    s1 = first.train()
    assert not s1["finished"] and s1["step"] == 1 and s1["total_steps"] == 12
    second = train_mod.Trainer(_stand_in()[0], seqs, _cfg(steps=12), tmp_path / "s")
    assert second.try_resume() and second.step == 1
    assert second.train()["finished"]
    for name, p in full.named.items():
        assert torch.equal(p, second.named[name]), name


def test_sigterm_stops_after_the_step_in_flight_and_resumes_exactly(tmp_path):
    """catch_sigterm(): a deadline's TERM (a cluster scheduler's) ends the run with a resumable state
    instead of killing it between saves; the resumed run ends where an uninterrupted one does."""
    model, tok = _stand_in()
    seqs, _ = _sequences(tmp_path, tok)
    full = train_mod.Trainer(model, seqs, _cfg(steps=12), tmp_path / "full")
    full.train()
    first = train_mod.Trainer(_stand_in()[0], seqs, _cfg(steps=12, save_every=10**6), tmp_path / "s")
    batch, calls = first._batch, []

    def batch_then_term():  # the TERM arrives while step 3 is in flight
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return batch()
    first._batch = batch_then_term
    old = signal.getsignal(signal.SIGTERM)
    try:
        first.catch_sigterm()
        s1 = first.train()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert not s1["finished"] and s1["step"] == 3 and (tmp_path / "s" / train_mod.STATE_FILE).exists()
    second = train_mod.Trainer(_stand_in()[0], seqs, _cfg(steps=12), tmp_path / "s")
    assert second.try_resume() and second.step == 3
    assert second.train()["finished"]
    for name, p in full.named.items():
        assert torch.equal(p, second.named[name]), name


# ------------------------------------------------------------------------------------- re-run semantics
def test_restart_without_state_drops_the_killed_attempts_log(tmp_path):
    """Killed before the first state save: the re-run starts at step 0 and its log holds each step once."""
    model, tok = _stand_in()
    seqs, _ = _sequences(tmp_path, tok)
    train_mod.Trainer(model, seqs, _cfg(steps=20, log_every=1, stop_after=6), tmp_path / "r").train()
    (tmp_path / "r" / train_mod.STATE_FILE).unlink()  # what a kill before the first save leaves
    with open(tmp_path / "r" / train_mod.LOG_FILE, "a") as f:
        f.write('{"step": 7, "lo')  # and a line cut short by the kill
    t = train_mod.Trainer(_stand_in()[0], seqs, _cfg(steps=20, log_every=1), tmp_path / "r")
    assert not t.try_resume()
    t.train()
    steps = [r["step"] for r in train_utils.read_log(tmp_path / "r" / train_mod.LOG_FILE)]
    assert steps == list(range(1, 21))


def test_state_is_saved_by_time_as_well_as_by_steps(tmp_path, monkeypatch):
    model, tok = _stand_in()
    seqs, _ = _sequences(tmp_path, tok)
    saves = []
    t = train_mod.Trainer(model, seqs, _cfg(steps=30, save_every=10**6, save_every_s=1e-9), tmp_path / "r")
    monkeypatch.setattr(t, "save_state", lambda: saves.append(t.step))
    t.train()
    assert saves[:2] == [10, 20]  # checked every 10 steps; step-count saves alone would come only at the end
    with pytest.raises(ValueError, match="--save-every-s"):
        _cfg(save_every_s=0).validate()


def _cli_train(tmp_path, *extra):
    from golinear.bench.cli import main as golinear
    base = tmp_path / "base"
    if not base.exists():
        write_tiny_backbone(base)
        write_books(tmp_path / "data")
    return golinear(["train", "--base", str(base), "--data-dir", str(tmp_path / "data"), "--seq-len", "32",
                     "--eval-sequences", "1", "--heldout-docs", "2", "--log-every", "1", "--window", "8",
                     "--sinks", "2", "--out", str(tmp_path / "run"), *extra])


def test_rerunning_a_finished_train_command_does_not_retrain(tmp_path, capsys):
    assert _cli_train(tmp_path, "--steps", "6") == 0
    weights = tmp_path / "run" / "new_params.safetensors"
    before = (weights.read_bytes(), weights.stat().st_mtime_ns)
    capsys.readouterr()
    assert _cli_train(tmp_path, "--steps", "6") == 0
    assert "already holds this finished run" in capsys.readouterr().out
    assert (weights.read_bytes(), weights.stat().st_mtime_ns) == before  # not retrained, not rewritten
    assert _cli_train(tmp_path, "--steps", "8") == 2  # other settings into a finished folder: refused
    assert "holds a finished run with other settings (steps 6 -> 8)" in capsys.readouterr().err
    assert _cli_train(tmp_path, "--steps", "6", "--force") == 0  # asked for: trained again, log restarted
    assert weights.stat().st_mtime_ns != before[1]
    steps = [r["step"] for r in train_utils.read_log(tmp_path / "run" / train_mod.LOG_FILE)]
    assert steps == [1, 2, 3, 4, 5, 6]
    card = (tmp_path / "run" / "README.md").read_text()  # the model card, written with the checkpoint
    assert card.startswith("---\nbase_model: ") and "library_name: golinear" in card and "6 steps" in card


def test_a_finished_run_kept_with_its_state_is_still_finished(tmp_path, capsys):
    assert _cli_train(tmp_path, "--steps", "4", "--keep-state") == 0
    weights = tmp_path / "run" / "new_params.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert _cli_train(tmp_path, "--steps", "4", "--keep-state") == 0
    assert "already holds this finished run" in capsys.readouterr().out and weights.stat().st_mtime_ns == mtime
