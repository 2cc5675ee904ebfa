"""scripts/gpu/eval_speed.sh, checked without a GPU: with `golinear` replaced by a recorder, each stage's commands are
ones golinear accepts (every row spec parses, each checkpoint is shipped), and the parity stage runs the fast and the
reference path on the same samples."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu" / "eval_speed.sh"


def recorded(tmp_path, *stages, code=0) -> list[list[str]]:
    log, stub = tmp_path / "calls", tmp_path / "bin"
    stub.mkdir()
    (stub / "golinear").write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" >> {log}\nprintf "\\n" >> {log}\n')
    (stub / "golinear").chmod(0o755)
    env = dict(os.environ, PATH=f"{stub}:{os.environ['PATH']}", PYTHON="true")
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), *stages], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, proc.stderr
    return [line.rstrip("\0").split("\0") for line in log.read_text().splitlines() if line] if log.exists() else []


def option(call, name):
    return call[call.index(name) + 1]


def test_every_row_parses_and_parity_compares_the_same_samples(tmp_path):
    from golinear.bench.run import specs as S
    calls = recorded(tmp_path)
    assert [c[0] for c in calls] == ["run"] * 3
    speed, fast, reference = calls
    for call in calls:
        models = S.parse_models(option(call, "--models"))
        assert len(models) == 6 and all(m.dtype == "bfloat16" for m in models)
        assert option(call, "--device") == "cuda" and option(call, "--batch-size") == "64"
    assert option(speed, "--num-samples") == "500" and "--tasks" not in speed
    assert "--generation" not in fast and option(reference, "--generation") == "reference"
    same = ("--tasks", "--num-samples", "--models", "--context-length", "--batch-size")
    assert [option(fast, o) for o in same] == [option(reference, o) for o in same]
    assert option(fast, "--store") != option(reference, "--store")


def test_an_unknown_stage_is_one_line(tmp_path):
    assert recorded(tmp_path, "matrix", code=2) == []
