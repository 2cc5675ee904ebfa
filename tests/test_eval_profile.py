"""scripts/gpu/eval_profile.py: a real `golinear run` (tiny backbone, S-NIAH on the CPU) under the phase timers, and the
table it renders; the timers leave the functions as they were."""
import json
import sys
from pathlib import Path

import pytest

from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
def test_profile_of_a_linearized_row_times_prefill_and_decode(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "tests"))
    from _tiny import write_tiny_backbone

    from golinear.models.decoding.fast_decode import FastDecoder
    prof = load_script("gpu/eval_profile.py")
    base = write_tiny_backbone(tmp_path / "base")
    before = FastDecoder.decode
    rc = prof.main([str(tmp_path / "out"), "--", "--models", f"mechanism=gdn,window=8,sinks=2,base={base}",
                    "--suites", "sniah", "--tasks", "golinear_sniah_1", "--context-length", "1024",
                    "--num-samples", "2", "--batch-size", "2", "--device", "cpu", "--store", str(tmp_path / "store")])
    assert rc == 0, capsys.readouterr().err[-2000:]
    assert FastDecoder.decode is before  # undone
    cells = json.loads((tmp_path / "out" / "cells.json").read_text())["cells"]
    assert len(cells) == 1 and cells[0]["n"] == 2
    phases = cells[0]["phases"]
    # each phase the run went through is recorded (what the timers measured is not a test's business)
    assert {"cell, whole (lm-eval)", "generation, whole", "prefill (static decoder)", "decode steps"} <= set(phases)
    assert not {name for name in phases if name.startswith("press") or "retention" in name}, phases
    out = tmp_path / "profile.md"
    assert prof.main(["--render", str(tmp_path / "out" / "cells.json"), "--out", str(out)]) == 0
    table = out.read_text()
    assert "| golinear_sniah_1 | 2 |" in table and "decode steps" in table


def test_usage_error_is_one_line(capsys):
    assert load_script("gpu/eval_profile.py").main(["out"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared data folder")
def test_profile_of_a_press_row_times_its_batched_compression(tmp_path, capsys):
    """A press row's phases: its contexts compressed in one batched prefill (compress_contexts) and loaded."""
    sys.path.insert(0, str(ROOT / "tests"))
    pytest.importorskip("kvpress")
    from _tiny import write_tiny_backbone
    prof = load_script("gpu/eval_profile.py")
    base = write_tiny_backbone(tmp_path / "base")
    rc = prof.main([str(tmp_path / "out"), "--", "--models", f"press=snapkv,kv_budget=256,base={base}",
                    "--suites", "sniah", "--tasks", "golinear_sniah_1", "--context-length", "1024",
                    "--num-samples", "2", "--batch-size", "2", "--device", "cpu", "--store", str(tmp_path / "store")])
    assert rc == 0, capsys.readouterr().err[-2000:]
    phases = json.loads((tmp_path / "out" / "cells.json").read_text())["cells"][0]["phases"]
    # (a phase under 1 ms is not recorded: the tiny backbone's cache loads faster than that)
    assert {"press: prefill, whole", "press: compressed context", "decode steps"} <= set(phases), phases
