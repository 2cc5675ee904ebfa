"""Files a user can be handed (a run folder's resume state, a store's request cache, a bundle's wheels) are read as
data: nothing in them is unpickled or executed, and a damaged or foreign one is set aside or refused in one line."""
from __future__ import annotations

import os
import pickle

import pytest

from golinear.bench.cli import main as golinear


class RunsCode:
    """Unpickling this creates the file it names: proof that a pickle was opened."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def signals_restored():
    import signal
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in old.items():
        signal.signal(s, h)


def cli_train(tmp_path, *extra):
    from _tiny import write_books, write_tiny_backbone
    base = tmp_path / "base"
    if not base.exists():
        write_tiny_backbone(base)
        write_books(tmp_path / "data")
    return golinear(["train", "--base", str(base), "--data-dir", str(tmp_path / "data"), "--seq-len", "32",
                     "--eval-sequences", "1", "--heldout-docs", "2", "--log-every", "1", "--window", "8",
                     "--sinks", "2", "--out", str(tmp_path / "run"), *extra])


# ------------------------------------------------------------------------------------------------ resume state
def test_resume_state_round_trips_without_pickle(tmp_path):
    import random

    import numpy as np
    import torch

    from golinear.models.training import resume_state
    from golinear.models.training.train_utils import rng_state
    p = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.AdamW([p], lr=1e-3)
    p.sum().backward()
    opt.step()
    state = {"step": 3, "note": None, "loss_window": [1.5, float("inf")], "params": {"w": p.detach().clone()},
             "optimizer": opt.state_dict(), "rng": rng_state(), "world_size": 1}
    resume_state.save(state, tmp_path / "s.safetensors")
    back = resume_state.load(tmp_path / "s.safetensors")
    assert back["step"] == 3 and back["note"] is None and back["loss_window"] == [1.5, float("inf")]
    assert torch.equal(back["params"]["w"], state["params"]["w"])
    assert set(back["optimizer"]["state"]) == {0} and torch.equal(back["optimizer"]["state"][0]["exp_avg"],
                                                                    opt.state_dict()["state"][0]["exp_avg"])
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    opt.load_state_dict(back["optimizer"])  # the optimizer takes it back
    random.setstate(back["rng"]["python"])
    np.random.set_state(back["rng"]["numpy"])
    assert back["rng"]["numpy"][1].dtype == np.uint32 and np.array_equal(back["rng"]["numpy"][1],
                                                                         state["rng"]["numpy"][1])
    assert b"__reduce__" not in (tmp_path / "s.safetensors").read_bytes()


def test_a_pickled_resume_state_is_refused_unopened(tmp_path, capsys, signals_restored):
    """An older golinear's state.pt (a pickle) is never opened: here one that would run code when unpickled."""
    run = tmp_path / "run"
    run.mkdir()
    marker = tmp_path / "code-ran"
    (run / "state.pt").write_bytes(pickle.dumps(RunsCode(marker)))
    from _tiny import write_books, write_tiny_backbone
    write_tiny_backbone(tmp_path / "base")
    write_books(tmp_path / "data")
    before = sorted(os.listdir(run))
    capsys.readouterr()
    assert cli_train(tmp_path, "--steps", "4") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "state.pt" in err[0] and "pickle" in err[0] and "delete it" in err[0], err
    assert not marker.exists() and sorted(os.listdir(run)) == before  # nothing ran, nothing was written


def test_a_damaged_resume_state_is_one_line(tmp_path, capsys, signals_restored):
    from golinear.models.training.train import STATE_FILE
    assert cli_train(tmp_path, "--steps", "12", "--stop-after", "3") == 0
    (tmp_path / "run" / STATE_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}")
    capsys.readouterr()
    assert cli_train(tmp_path, "--steps", "12") == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "resume state" in last and "unreadable" in last, err
