"""What the demo prints is readable in a terminal: narrow tables with labelled columns, a note that n = 1-4 differences
are noise, a reason when a checkpoint's perplexity is below full attention's, and no lm-eval chatter (the bars of
its quick steps, `bootstrapping for stddev`) between the request bars."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from golinear.bench import demo, quiet
from golinear.bench.run.run_summary import noise_note, task_table

ROOT = Path(__file__).resolve().parent.parent
CELLS = ROOT / "leaderboards" / "store" / "cells"
WIDTH = 100


def committed(folder_prefix: str) -> list[dict]:
    """The committed standard-suite cells of one model, as if run with --limit 4 (n = 4, as the demo's)."""
    folder = next(p for p in sorted(CELLS.glob(f"{folder_prefix}-*")) if p.name.count("-") == folder_prefix.count("-") + 1)
    cells = [json.loads(p.read_text()) for p in sorted(folder.glob("golinear_*--num_fewshot0--*.json"))]
    return [{**c, "n": 4, "key": {**c["key"], "config": {**c["key"].get("config", {}), "limit": 4}}} for c in cells]


def test_the_demos_score_table_is_narrow_with_a_labelled_difference():
    full, gdn = committed("full"), committed("gdn-w56-s8-sc")
    table = task_table(full + gdn + [None])
    lines = table.splitlines()
    assert max(map(len, lines)) <= WIDTH, table
    labels = [cell_label for cell_label in (full[0]["model"]["label"], gdn[0]["model"]["label"])]
    header = lines[0].split()
    assert header[:2] == ["task", "n"] and header[2:4] == labels and " - ".join(reversed(labels)) in lines[0]
    assert len(lines) == 2 + len(full)  # header, rule, one row per task
    for a, b, line in zip(full, gdn, lines[2:]):
        assert line.split()[0] == a["display"] == b["display"] and line.split()[1] == "4"
        assert line.split()[-1] == f"{round(100 * b['value'], 1) - round(100 * a['value'], 1):+.1f}"
    assert task_table([None]) == ""
    assert noise_note(full + gdn).startswith("With n of 4 one document or sample moves a score by 25 points")
    one, twelve = {**full[0], "n": 1}, {**full[0], "n": 12}
    assert "n of 1-12 one document or sample moves a score by 8-100 points" in noise_note([one, None, twelve])
    assert noise_note([None]) == ""


def summary(full_ppl: float, gdn_ppl: float) -> list[dict]:
    row = {"mechanism": "", "new params": "426,780", "budget": 64, "MiB @1K": 18.44, "MiB @32K": 18.44,
           "load+ppl s": 13.3}
    return [{"model": "full", **row, "ppl": full_ppl}, {"model": "gdn-w56-s8-sc", **row, "ppl": gdn_ppl}]


def test_the_summary_is_narrow_and_each_short_header_is_explained():
    rows = summary(14.71, 17.55)
    rows[0]["mechanism"], rows[1]["mechanism"] = "full attention", "GDN+w56+s8+SC"
    assert max(map(len, demo.summary_table(rows).splitlines())) <= WIDTH
    (legend,) = demo.summary_notes(rows, 512)
    for header in ("budget", "MiB @1K / @32K", "ppl", "load+ppl s"):
        assert f"{header}:" in legend


def test_a_perplexity_below_full_attentions_is_explained_only_when_it_happens():
    assert len(demo.summary_notes(summary(14.71, 17.55), 512)) == 1
    notes = demo.summary_notes(summary(24.0, 21.5), 512)
    assert len(notes) == 2 and notes[1].startswith("gdn-w56-s8-sc: perplexity below full attention's")


def test_lm_eval_bootstrap_is_computed_without_its_print_or_bar(monkeypatch, capfd):
    import lm_eval.api.metrics as M
    monkeypatch.setenv("DISABLE_MULTIPROC", "1")
    # lm-eval's own function (an earlier run in this process may have quieted it already), restored after the test
    monkeypatch.setattr(M, "bootstrap_stderr", getattr(M.bootstrap_stderr, "__wrapped__", M.bootstrap_stderr))
    xs = [float(i % 7) for i in range(200)]
    loud = M.bootstrap_stderr(M.mean, xs, iters=1000)
    out = capfd.readouterr()
    assert "bootstrapping for stddev" in out.out  # lm-eval's own, unquieted
    quiet.lm_eval_quiet_steps()
    quiet.lm_eval_quiet_steps()  # idempotent: wrapped once
    assert M.bootstrap_stderr(M.mean, xs, iters=1000) == pytest.approx(loud)
    out = capfd.readouterr()
    assert out.out == "" and out.err == ""


@pytest.mark.parametrize("desc, drawn", [("Running loglikelihood requests", True), ("Running generate_until requests", True),
                                         ("Tokenizing inputs", False), ("Checking cached requests", False), (None, False)])
def test_only_lm_eval_request_bars_are_drawn(desc, drawn, monkeypatch):
    import lm_eval.api.model
    import lm_eval.api.task
    monkeypatch.setattr(lm_eval.api.model, "tqdm", lm_eval.api.model.tqdm)
    monkeypatch.setattr(lm_eval.api.task, "tqdm", lm_eval.api.task.tqdm)
    quiet.lm_eval_quiet_steps()
    bar = lm_eval.api.model.tqdm(range(3), desc=desc)
    assert bar.disable is (not drawn)
    bar.close()
    assert lm_eval.api.task.tqdm is lm_eval.api.model.tqdm
