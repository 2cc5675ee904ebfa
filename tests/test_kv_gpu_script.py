"""scripts/gpu/kv_compression.sh, the GPU run behind the linearize-or-compress table, checked without a GPU: with
`golinear` replaced by a recorder, every stage's command is one golinear accepts (each model and configuration
spec parses, each checkpoint is shipped, each press runs) and the press matrix covers every available press."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu" / "kv_compression.sh"


def recorded(tmp_path, *stages) -> list[list[str]]:
    log = tmp_path / "calls"
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "golinear").write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" >> {log}\nprintf "\\n" >> {log}\n')
    (stub / "golinear").chmod(0o755)
    env = dict(os.environ, PATH=f"{stub}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), *stages], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line.rstrip("\0").split("\0") for line in log.read_text().splitlines() if line]


def option(call, name):
    return call[call.index(name) + 1]


def test_every_stage_is_a_command_golinear_accepts(tmp_path):
    from golinear.bench.run.specs import parse_models
    from golinear.models.kv_compression.presses import ALL_PRESSES
    calls = recorded(tmp_path, "sniah", "sniah512", "ruler", "latency")
    runs = [c for c in calls if c[0] == "run"]
    assert [option(c, "--suites") for c in runs] == ["sniah", "sniah", "sniah", "ruler"]
    budgets = []
    for c in runs:
        assert option(c, "--num-samples") == ("100" if c is runs[3] else "500")  # RULER: 8 tasks x 100 a row
        assert option(c, "--context-length") == "4096"
        assert option(c, "--batch-size") == "64"
        # one dtype for every row (in float32 a batched prefill's grouped-KV attention would hold the whole matrix)
        assert all(spec.endswith(",dtype=bfloat16") for spec in option(c, "--models").split(";")), c
        specs = parse_models(option(c, "--models"))  # every spec parses, every checkpoint resolves
        budgets.append({s.kv_budget for s in specs if s.press})
        if c is runs[1]:
            assert {s.press for s in specs if s.press} == set(ALL_PRESSES)
    assert budgets == [{256}, {1024}, {512}, {1024}]
    (latency,) = [c for c in calls if c[0] == "latency"]
    from golinear.bench.run.specs import parse_model_spec
    from golinear.bench.speed.latency import STATIC_DECODES
    from golinear.bench.speed.latency_press import check_press_spec
    labels = option(latency, "--configs").split(";")
    assert labels[:2] == ["full-static", "gdn-default"] and "full-static" in STATIC_DECODES
    configs = [parse_model_spec(t) for t in labels[1:]]
    for spec in configs:
        if spec.press:
            check_press_spec(spec, [4096, 32768])  # what golinear latency checks before any model
    assert {s.press for s in configs if s.press} == {"kvzip", "compactor", "lagkv"}
    # the best press of each budget as it ran: the trade-off table borrows no row from another budget
    assert {(s.press, s.kv_budget) for s in configs if s.press and s.kv_budget < 1024} == {("compactor", 256),
                                                                                          ("compactor", 512)}
    assert any(s.prefill_chunk for s in configs)  # the memory-matched rows, where a press allows a chunked prefill
    assert option(latency, "--batch") == "1,8" and option(latency, "--lengths") == "4096,32768"


def test_an_unknown_stage_is_one_line(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "bogus"], capture_output=True, text=True,
                          env=dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}"))
    assert proc.returncode == 2 and "unknown stage 'bogus'" in proc.stderr


def test_the_top_rows_are_the_users_choice(tmp_path, monkeypatch):
    """The 512 stage runs the three best of each family, read off the 256/1024 table: TOP_PRESSES, TOP_LINEAR_512."""
    monkeypatch.setenv("TOP_PRESSES", "keydiff")
    (call,) = recorded(tmp_path, "sniah512")
    assert "press=keydiff,kv_budget=512" in option(call, "--models") and "snapkv" not in option(call, "--models")


def test_a_dry_run_plans_every_evaluation_stage_and_skips_the_latency(tmp_path, monkeypatch):
    """DRY_RUN=1: each evaluation stage is the same `golinear run` with --dry-run, and nothing is timed."""
    monkeypatch.setenv("DRY_RUN", "1")
    calls = recorded(tmp_path, "sniah", "ruler", "latency")
    assert [c[0] for c in calls] == ["run"] * 3 and all(c[-1] == "--dry-run" for c in calls)
    monkeypatch.delenv("DRY_RUN")
    (tmp_path / "again").mkdir()
    real = recorded(tmp_path / "again", "sniah", "ruler")
    assert [[a for a in c[:-1] if "out" not in a] for c in calls] == [[a for a in c if "out" not in a] for c in real]
