"""scripts/gpu/generation.sh, checked without a GPU: with `golinear` replaced by a recorder, its command passes
`golinear generation`'s own checks (the CUDA device stood in for) and runs the rows the comparison needs at equal
work: full attention both ways, the linearized decoder, and the three press rows at 1024."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu" / "generation.sh"
DATA = ROOT.parent / "shared" / "data"


def test_the_command_passes_golinear_generations_checks(tmp_path, monkeypatch):
    import pytest
    if not DATA.is_dir():
        pytest.skip("needs the shared data folder")
    log, stub = tmp_path / "calls", tmp_path / "bin"
    stub.mkdir()
    (stub / "golinear").write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" >> {log}\n')
    (stub / "golinear").chmod(0o755)
    env = dict(os.environ, PATH=f"{stub}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    argv = log.read_text().rstrip("\0").split("\0")
    assert argv[0] == "generation"
    from golinear.bench.backends import lm_backend
    from golinear.bench.cli import build_parser
    from golinear.bench.speed import generation
    monkeypatch.setattr(lm_backend, "check_device", lambda device: "cuda:0")
    args = build_parser("generation").parse_args(argv)
    monkeypatch.setenv("GOLINEAR_DATA", str(DATA))
    generation._check(args)
    assert {"full", "full-static", "linear", "press"} <= set(args.rows) and args.new_tokens == 128
    assert [s.press for s in args.press_specs] == ["snapkv", "kvzip", "adakv_expected_attention"]
    assert {s.kv_budget for s in args.press_specs} == {1024}
