"""`golinear check`: the comparison rules on hand-made rows, and (slow) a real SmolLM2 baseline that the
same model passes and a deliberately damaged copy of its weights fails."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from golinear.bench.run.check import compare, render, run_check

ROOT = Path(__file__).resolve().parent.parent


def baseline(*cells):
    return {"cells": [dict(task=t, metric=m, display=t, higher_is_better=h, value=v, stderr=se, n=n)
                      for t, m, h, v, se, n in cells]}


def current(*rows):
    return [dict(task=t, metric=m, value=v, n=n) for t, m, v, n in rows]


def test_compare_statuses():
    b = baseline(("arc", "acc", True, 0.50, 0.05, 20), ("piqa", "acc", True, 0.60, 0.05, 20),
                 ("lam", "perplexity", False, 20.0, 2.0, 20), ("lam", "acc", True, 0.40, 0.1, 20),
                 ("hs", "acc_norm", True, 0.30, 0.1, 20), ("wg", "acc", True, 0.5, 0.1, 20))
    c = current(("arc", "acc", 0.41, 20),          # -0.09 within 2 x 0.05
                ("piqa", "acc", 0.45, 20),         # -0.15 beyond 0.10
                ("lam", "perplexity", 30.0, 20),   # +10 beyond 4 (lower is better)
                ("lam", "acc", 0.75, 20),          # better
                ("wg", "acc", 0.5, 19))            # subset changed; hs missing
    rows = {(r["task"], r["metric"]): r["status"] for r in compare(b, c, z=2.0)}
    assert rows == {("arc", "acc"): "ok", ("piqa", "acc"): "DROP", ("lam", "perplexity"): "DROP",
                    ("lam", "acc"): "improved", ("hs", "acc_norm"): "MISSING", ("wg", "acc"): "N-CHANGED"}
    text = render(compare(b, c, z=2.0))
    assert "DROP" in text and "MISSING" in text and "0.6000" in text and "-0.1500" in text


def test_absolute_floor_and_nan():
    b = baseline(("arc", "acc", True, 0.5, 0.0, 10))
    assert compare(b, current(("arc", "acc", 0.49, 10)), z=2.0)[0]["status"] == "DROP"
    assert compare(b, current(("arc", "acc", 0.49, 10)), z=2.0, min_abs=0.02)[0]["status"] == "ok"
    assert compare(b, current(("arc", "acc", float("nan"), 10)), z=2.0)[0]["status"] == "DROP"


def test_missing_baseline_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="--update"):
        run_check("full", tmp_path / "none.json")


def test_committed_baseline_is_well_formed():
    path = ROOT / "leaderboards" / "baseline" / "smollm2-full.json"
    data = json.loads(path.read_text())
    assert data["model"] == "full" and data["subset"]["limit"] >= 1
    tasks = {c["task"] for c in data["cells"]}
    assert {"golinear_piqa", "golinear_lambada_openai"} <= tasks
    for c in data["cells"]:
        assert c["n"] == data["subset"]["limit"] and c["stderr"] is not None and c["value"] is not None


def _check_cli(capsys, *args) -> tuple[int, str, str]:
    """`golinear check ARGS` through the CLI's main() in this process: (the exit code the console script returns,
    stdout, stderr). The tests below are about the check's verdict, not the process boundary."""
    from golinear.bench.cli import main
    capsys.readouterr()
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_damaged_weights_fail_the_check(tmp_path, capsys):
    """Baseline from the real SmolLM2 (LAMBADA, 8 docs); the same model passes; a copy whose weights were
    perturbed (noise of half each tensor's std) drops beyond tolerance and the CLI exits 1."""
    import torch
    from golinear.models.backbones.backbone import load_backbone
    base = tmp_path / "baseline.json"
    code, report = run_check("full", base, update=True, suites="lambada", limit=8, batch_size=4, progress=False)
    assert code == 0 and base.exists(), report
    data = json.loads(base.read_text())
    assert {(c["task"], c["metric"]) for c in data["cells"]} == {("golinear_lambada_openai", "acc"),
                                                                 ("golinear_lambada_openai", "perplexity")}
    code, report = run_check("full", base, batch_size=4, progress=False)
    assert code == 0, report
    assert "passed" in report

    model, tok = load_backbone("smollm2-135m")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * p.float().std() * 0.5)
    damaged = tmp_path / "damaged"
    model.save_pretrained(damaged)
    tok.save_pretrained(damaged)
    code, out, err = _check_cli(capsys, "--model", f"base={damaged}", "--baseline", str(base), "--batch-size", "4")
    assert code == 1, out + err[-2000:]
    assert "FAILED" in out and "DROP" in out and "perplexity" in out


SHIPPED = ROOT / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"
SHIPPED_BASELINE = ROOT / "leaderboards" / "baseline" / "smollm2-gdn-default.json"


@pytest.mark.slow
def test_shipped_checkpoint_passes_and_a_damaged_copy_fails(tmp_path, capsys):
    """CI's regression check on the shipped default-recipe checkpoint, and the same check (LAMBADA rows of the same
    baseline) on a copy whose new parameters were damaged (noise of 3x each tensor's std): the CLI exits 1 with a
    DROP."""
    import shutil
    import torch
    from safetensors.torch import load_file, save_file
    code, out, err = _check_cli(capsys, "--model", str(SHIPPED), "--baseline", str(SHIPPED_BASELINE))
    assert code == 0, out + err[-2000:]
    damaged = tmp_path / SHIPPED.name
    shutil.copytree(SHIPPED, damaged)
    tensors = load_file(str(damaged / "new_params.safetensors"))
    gen = torch.Generator().manual_seed(0)
    tensors = {k: v + torch.randn(v.shape, generator=gen) * 3 * (v.float().std() + 1e-3) for k, v in tensors.items()}
    save_file(tensors, str(damaged / "new_params.safetensors"))
    # the damaged copy against the baseline's LAMBADA rows only (its accuracy and perplexity, same 20 docs): the
    # verdict needs one task, and the five CR tasks would triple this half's time
    lambada = json.loads(SHIPPED_BASELINE.read_text())
    lambada["cells"] = [c for c in lambada["cells"] if c["task"] == "golinear_lambada_openai"]
    lambada["subset"]["suites"] = "lambada"
    lambada.pop("parameters", None)  # the scores' verdict here; the statistics fail it earlier (test_hostile_user)
    assert len(lambada["cells"]) == 2
    (tmp_path / "lambada.json").write_text(json.dumps(lambada))
    code, out, err = _check_cli(capsys, "--model", str(damaged), "--baseline", str(tmp_path / "lambada.json"))
    assert code == 1, out + err[-2000:]
    assert "DROP" in out and "MISSING" not in out and "N-CHANGED" not in out, out


def test_temp_store_is_removed_on_sigterm_and_swept_after_sigkill(tmp_path):
    """A killed `golinear check` leaves no temp store: SIGTERM unwinds; SIGKILL's is swept next time."""
    import signal
    code = ("import sys, time; sys.path.insert(0, '.'); from golinear.bench.run.check import temp_store\n"
            "with temp_store() as d:\n    print(d, flush=True)\n    time.sleep(60)\n")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    root = Path(__file__).resolve().parent.parent
    for sig in (signal.SIGTERM, signal.SIGKILL):
        p = subprocess.Popen([sys.executable, "-c", code], cwd=root, env=env, stdout=subprocess.PIPE, text=True)
        folder = Path(p.stdout.readline().strip())
        assert folder.is_dir() and folder.parent == tmp_path
        p.send_signal(sig)
        p.wait(timeout=30)
        if sig == signal.SIGTERM:
            assert p.returncode == 128 + signal.SIGTERM and not folder.exists()
        else:
            assert folder.exists()  # nothing can run on SIGKILL ...
            done = subprocess.run([sys.executable, "-c", code.replace("time.sleep(60)", "pass")], cwd=root,
                                  env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0 and not folder.exists()  # ... so the next check removes it
