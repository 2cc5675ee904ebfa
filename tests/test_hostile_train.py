"""The `golinear train` cases of docs/store.md's second hostile-user table: a resume or a finished folder under
other settings is refused naming each setting (--force starts over), and Ctrl-C or SIGTERM stops a run with its
state saved and a non-zero exit."""
from __future__ import annotations

import pytest

from golinear.bench.cli import main as golinear


# ----------------------------------------------------------------------------- golinear train: settings, Ctrl-C
def cli_train(tmp_path, *extra):
    from _tiny import write_books, write_tiny_backbone
    base = tmp_path / "base"
    if not base.exists():
        write_tiny_backbone(base)
        write_books(tmp_path / "data")
    return golinear(["train", "--base", str(base), "--data-dir", str(tmp_path / "data"), "--seq-len", "32",
                     "--eval-sequences", "1", "--heldout-docs", "2", "--log-every", "1", "--window", "8",
                     "--sinks", "2", "--out", str(tmp_path / "run"), *extra])


RESUME_CHANGES = [  # (arguments of the re-run, the words naming the setting)
    (["--seq-len", "16"], "seq_len 32 -> 16"),
    (["--steps", "8"], "steps 12 -> 8"),
    (["--mechanism", "gla"], "mechanism 'gdn' -> 'gla'"),
    (["--no-short-conv"], "short_conv True -> False"),
    (["--lr", "0.01", "--warmup-steps", "3"], "lr 0.002 -> 0.01; warmup_steps 0 -> 3"),
]


@pytest.fixture
def signals_restored():
    import signal
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in old.items():
        signal.signal(s, h)


def test_a_resume_with_other_settings_is_refused_naming_each(tmp_path, capsys, signals_restored):
    from golinear.models.training.train import STATE_FILE
    assert cli_train(tmp_path, "--steps", "12", "--stop-after", "3") == 0  # stopped, resumable
    state = tmp_path / "run" / STATE_FILE
    saved = state.read_bytes()
    for extra, words in RESUME_CHANGES:
        capsys.readouterr()
        argv = ["--steps", "12", *extra] if "--steps" not in extra else extra
        assert cli_train(tmp_path, *argv) == 2, words
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "holds an unfinished run with other settings" in err[0] and words in err[0], err
        assert state.read_bytes() == saved  # nothing touched
    assert cli_train(tmp_path, "--steps", "12", "--seq-len", "16", "--force") == 0  # asked for: starts over
    import json
    record = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert record["train"]["seq_len"] == 16 and record["summary"]["tokens"] == 12 * 16 * record["train"]["batch_size"]


def test_a_finished_folder_with_other_settings_is_refused(tmp_path, capsys, signals_restored):
    assert cli_train(tmp_path, "--steps", "4") == 0
    for extra, words in [(["--lr", "0.003"], "lr 0.002 -> 0.003"), (["--grad-clip", "0.5"], "grad_clip 1.0 -> 0.5"),
                         (["--weight-decay", "0.1"], "weight_decay"), (["--heldout-docs", "3"], "heldout_docs 2 -> 3"),
                         (["--warmup-steps", "2"], "warmup_steps")]:
        capsys.readouterr()
        assert cli_train(tmp_path, "--steps", "4", *extra) == 2, words
        err = capsys.readouterr().err
        assert "holds a finished run with other settings" in err and words in err, err


@pytest.mark.parametrize("sig,code,words", [("SIGINT", 130, "stopped by Ctrl-C at step 3/12"),
                                            ("SIGTERM", 143, "stopped by SIGTERM at step 3/12")])
def test_train_stopped_by_a_signal_saves_its_state_and_exits_non_zero(tmp_path, capsys, monkeypatch,
                                                                      signals_restored, sig, code, words):
    import os
    import signal

    from golinear.models.training import train as train_mod
    real, calls = train_mod.Trainer._batch, []

    def batch_then_signal(self):  # the signal arrives while step 3 is in flight
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), getattr(signal, sig))
        return real(self)
    monkeypatch.setattr(train_mod.Trainer, "_batch", batch_then_signal)
    assert cli_train(tmp_path, "--steps", "12", "--save-every", "100") == code
    captured = capsys.readouterr()
    assert words in captured.out and "state saved" in captured.out and "Traceback" not in captured.err
    assert (tmp_path / "run" / train_mod.STATE_FILE).exists()
    monkeypatch.undo()
    assert cli_train(tmp_path, "--steps", "12", "--save-every", "100") == 0  # resumes and finishes
    from golinear.models.training.train_utils import read_log
    steps = [r["step"] for r in read_log(tmp_path / "run" / train_mod.LOG_FILE)]
    assert steps == list(range(1, 13))


def test_ctrl_c_before_training_is_one_line(tmp_path, capsys, monkeypatch, signals_restored):
    from golinear.models.training import train_cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(train_cli, "load_token_data", interrupted)
    assert cli_train(tmp_path, "--steps", "4") == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "golinear train: interrupted (Ctrl-C) before training began; nothing was saved"
    assert not any("Traceback" in line for line in err)


@pytest.mark.parametrize("flag,value,allowed", [("--grad-clip", "-1", "> 0"), ("--lr", "inf", "finite number > 0"),
                                                ("--lora-lr", "nan", "finite number > 0"),
                                                ("--min-lr-ratio", "2", "0..1"), ("--min-lr-ratio", "-0.1", "0..1"),
                                                ("--save-every", "0", ">= 1"), ("--weight-decay", "inf", ">= 0"),
                                                ("--save-every-s", "inf", "finite number > 0"),
                                                ("--time-budget-s", "-5", "seconds > 0")])
def test_impossible_training_values_are_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, flag,
                                                                            value, allowed):
    """Refused in one line before the data is prepared: nothing is written into --out (here: no folder at all)."""
    from golinear.models.training import data as data_mod
    from _tiny import write_books, write_tiny_backbone
    write_tiny_backbone(tmp_path / "base")
    write_books(tmp_path / "data")
    monkeypatch.setattr(data_mod, "prepare_books", lambda *a, **k: pytest.fail("data prepared"))
    capsys.readouterr()
    assert cli_train(tmp_path, "--steps", "4", flag, value) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag} " in err[0] and allowed in err[0], err
    assert not (tmp_path / "run").exists()


DAMAGED_STATES = [  # (the state's JSON metadata, the words of the one line)
    ("{}", "it lacks step, total_steps, world_size"),
    ("[1, 2]", "its metadata is a JSON list, not an object"),
    ('"text"', "its metadata is a JSON str, not an object"),
    ("WORLD_AS_TEXT", 'world_size is "1", not an integer'),
    ("NO_TENSOR", "a parameter is not a tensor of the file"),
]


@pytest.mark.parametrize("meta,words", DAMAGED_STATES, ids=[w for _, w in DAMAGED_STATES])
def test_a_damaged_resume_state_is_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch, signals_restored,
                                                                   meta, words):
    """A state whose JSON is {} or of the wrong type is refused naming the file before the backbone loads (it
    was a KeyError traceback after loading)."""
    import json
    from safetensors import safe_open
    from safetensors.torch import save_file
    from golinear.models.backbones import backbone
    from golinear.models.training import resume_state
    from golinear.models.training.train import STATE_FILE
    assert cli_train(tmp_path, "--steps", "6", "--stop-after", "2") == 0  # stopped, resumable
    state = tmp_path / "run" / STATE_FILE
    with safe_open(str(state), framework="pt") as f:
        tensors, tree = {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["golinear_resume_state"])
    if meta == "WORLD_AS_TEXT":
        meta = json.dumps({**tree, "world_size": "1"})
    elif meta == "NO_TENSOR":
        meta = json.dumps({**tree, "params": {n: 0 for n in tree["params"]}})
    save_file(tensors, str(state), metadata={"golinear_resume_state": meta})

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded before the state was checked")
    monkeypatch.setattr(backbone, "load_backbone", no_loading)
    capsys.readouterr()
    assert cli_train(tmp_path, "--steps", "6") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"resume state {str(state)!r} is damaged ({words}" in err[0], err
    assert "delete it (or --force) to start over" in err[0]
    with pytest.raises(ValueError, match="is damaged"):  # the trainer's own load says the same
        resume_state.load(state)
