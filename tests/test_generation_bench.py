"""`golinear generation` (bench/speed/generation.py): bad input fails in one line before any model or data is loaded;
rows merge by key. (The full CPU run, 20 S-NIAH-1 samples at 2K on the real SmolLM2, takes ~30 min on 2 cores:
its rows are in leaderboards/generation-cpu/; scripts/gpu/generation.sh runs it on a GPU.)"""
from __future__ import annotations

import pandas as pd
import pytest

from golinear.bench.speed import generation
from golinear.bench.cli import main as cli


@pytest.mark.parametrize("argv,needle", [
    (["--context-length", "100"],
     "--context-length 100: max_seq_length 100 not allowed; use an integer from 1024 to 32768"),
    (["--samples", "0"], "--samples 0 must be >= 1"),
    (["--batch-size", "big"], "--batch-size 'big'; allowed: a positive integer or auto"),
    (["--rows", "full;fast"], "--rows ['fast']: allowed"),
    (["--linear", "full"], "--linear 'full' is full attention"),
    (["--dtype", "int8"], "--dtype 'int8'; allowed"),
    (["--data-dir", "/no/such/folder"], "--data-dir '/no/such/folder' does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, tmp_path, capsys):
    assert cli(["generation", "--device", "cpu", "--out-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing written


def test_rows_merge_by_key(tmp_path):
    path = tmp_path / "generation.csv"
    row = dict(model="m", config="full", device="cpu", dtype="float32", context_length=2048, batch_size=4,
               generation="hf", samples=20, samples_per_s=1.0, status="ok")
    generation.merge(path, [row, dict(row, config="full-static")], generation.COLUMNS, generation.KEY)
    df = generation.merge(path, [dict(row, samples_per_s=2.0)], generation.COLUMNS, generation.KEY)
    assert len(pd.read_csv(path)) == 2 == len(df)
    assert df.set_index("config").samples_per_s.to_dict() == {"full-static": 1.0, "full": 2.0}
    md = generation.render(df, None)
    assert "| full | hf | 4 | 20 | task stop rules (at most 128) | 2.000 |" in md


def test_speed_ups_compare_equal_work_only():
    """The committed H200 table's linear speed-up over full-static (samples/s, ~4 against ~50 new tokens a sample)
    is no longer printed; rows timed at the same new tokens a sample are compared by tokens/s."""
    row = dict(model="m", device="H200", dtype="bfloat16", context_length=4096, batch_size=32, samples=200,
               status="ok", commit="abc")
    old = [dict(row, config="full-static", generation="batched", samples_per_s=30.085, tokens_per_s=1507.1),
           dict(row, config="gdn-default", generation="batched", samples_per_s=71.663, tokens_per_s=287.7)]
    md = generation.render(pd.DataFrame(old, columns=generation.COLUMNS), None)
    assert "2.38x" not in md and "x |" not in md.split("## ")[-1]
    timed = [dict(r, stop_rules="off", tokens_per_sample=128, tokens_per_s=t) for r, t in zip(old, (400.0, 1000.0))]
    evaluated = dict(old[1], config="gdn-default" + generation.EVALUATED, stop_rules="task", tokens_per_s=287.7)
    md = generation.render(pd.DataFrame([*timed, evaluated], columns=generation.COLUMNS), None)
    lines = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| ")}
    assert "| 128 |" in lines["| full-static"] and "| 2.50x |" in lines["| full-static"]
    assert "| 1.00x |" in lines["| gdn-default"]
    evaluated = lines["| gdn-default (as evaluated)"]
    assert "x |" not in evaluated and "task stop rules" in evaluated


def test_timed_requests_have_stop_rules_off():
    from lm_eval.api.instance import Instance
    req = Instance("generate_until", {}, ("prompt", {"until": ["\n"], "max_gen_toks": 128, "do_sample": False}), 0)
    fixed = generation.fixed_length([req], 32)[0].args[1]
    assert fixed == {"until": [], "max_gen_toks": 32, "min_new_tokens": 32, "do_sample": False}
    assert req.args[1]["until"] == ["\n"]  # the as-evaluated request unchanged


@pytest.mark.parametrize("n,batch,sizes", [(200, 32, [8, 32]), (64, 32, [32]), (20, 32, [20]), (32, 32, [32]),
                                           (5, 1, [1]), (33, 32, [1, 32])])
def test_warm_up_covers_every_batch_size_of_the_timed_run(n, batch, sizes):
    """HFLM splits n requests into full batches and a remainder; each size gets its own decoder (and CUDA graph)."""
    assert generation.warm_sizes(n, batch) == sizes
    from lm_eval.models.utils import Collator
    chunks = Collator(list(range(n)), sort_fn=lambda x: x).get_batched(n=batch)
    assert sorted({len(c) for c in chunks}) == sizes


def test_rows_run_linear_first_and_files_list_them_in_table_order(tmp_path):
    """A run cut off by a time limit keeps the linear rows; the files keep full, full-static, linear, sequential."""
    from golinear.bench.cli import build_parser
    args = build_parser("generation").parse_args(["generation", "--device", "cpu", "--linear", "gdn-default",
                                                  "--rows", "full;full-static;linear-sequential;linear"])
    generation._check(args)
    plan = generation._plan(args)
    assert [(p[3], p[2]["generation"], p[4]) for p in plan] == [(20, "batched", True), (5, "sequential", True),
                                                                 (20, "batched", True), (20, "hf", True)]
    assert [p[0] for p in plan][2:] == ["full-static", "full"] and plan[1][0] == plan[0][0] + "-sequential"
    path = tmp_path / "generation.csv"
    row = dict(model="m", device="cpu", dtype="float32", context_length=2048, batch_size=4, status="ok")
    gpu = dict(row, device="H200")
    ran = [dict(row, config=c) for c in ("gdn-default", "gdn-default-sequential", "full-static", "full")]
    generation.merge(path, [dict(gpu, config="gdn-default"), dict(gpu, config="full"), *ran], generation.COLUMNS,
                     generation.KEY)
    df = generation.merge(path, [dict(gpu, config="full-static")], generation.COLUMNS, generation.KEY)
    assert list(zip(df.device, df.config)) == [
        ("H200", "full"), ("H200", "full-static"), ("H200", "gdn-default"),
        ("cpu", "full"), ("cpu", "full-static"), ("cpu", "gdn-default"), ("cpu", "gdn-default-sequential")]


@pytest.mark.parametrize("folder", ["leaderboards", "leaderboards/generation-cpu"])
def test_committed_tables_are_rendered_from_their_csvs(folder):
    """A committed generation.md is what render() writes from its CSVs: no speed-up survives from an older
    renderer that divided rows of unequal work."""
    from pathlib import Path
    board = Path(__file__).resolve().parent.parent / folder
    df = generation.sorted_rows(pd.read_csv(board / "generation.csv"))
    parity = board / "generation_parity.csv"
    par = pd.read_csv(parity) if parity.exists() else pd.DataFrame(columns=generation.PARITY_COLUMNS)
    assert (board / "generation.md").read_text() == generation.render(df, par)


def test_press_rows_are_one_per_spec_and_bad_specs_are_one_line(capsys, tmp_path):
    from golinear.bench.cli import build_parser
    args = build_parser("generation").parse_args(
        ["generation", "--device", "cpu", "--rows", "full-static;press;press-evaluated",
         "--presses", "press=snapkv,kv_budget=1024;press=kvzip,kv_budget=512"])
    generation._check(args)
    plan = generation._plan(args)
    assert [(p[0], p[1], p[4]) for p in plan] == [
        ("full-static", "golinear-hf", True), ("snapkv (kvpress) @1024", "golinear-press", True),
        ("kvzip (kvpress) @512", "golinear-press", True),
        ("snapkv (kvpress) @1024 (as evaluated)", "golinear-press", False),
        ("kvzip (kvpress) @512 (as evaluated)", "golinear-press", False)]
    assert [generation.row_kind(p[0]) for p in plan] == ["full-static", "press", "press", "press-evaluated",
                                                         "press-evaluated"]
    for presses, needle in (("press=snapkv", "--presses 'press=snapkv': expected press=<name>,kv_budget=<entries>"),
                            ("press=kvzap,kv_budget=64", "press 'kvzap' is not available")):
        assert cli(["generation", "--device", "cpu", "--out-dir", str(tmp_path), "--rows", "press",
                    "--presses", presses]) == 2
        assert needle in capsys.readouterr().err


@pytest.mark.slow
def test_press_rows_generate_the_tokens_asked_for_beside_full_static(tmp_path):
    """A press row times the same prompts, batch and new tokens as full-static (equal work: the speed-up column
    compares them); its as-evaluated row scores with the task's stop rules."""
    assert cli(["generation", "--device", "cpu", "--rows", "full-static;press;press-evaluated", "--samples", "2",
                "--context-length", "1024", "--new-tokens", "6", "--batch-size", "2",
                "--presses", "press=adakv_snapkv,kv_budget=256", "--out-dir", str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "generation.csv").set_index("config")
    press = df.loc["adakv_snapkv (kvpress) @256"]
    assert press.status == "ok" and press.new_tokens == 12 == df.loc["full-static"].new_tokens
    assert press.generation == "static" and press.stop_rules == "off"
    assert df.loc["adakv_snapkv (kvpress) @256 (as evaluated)"].score in (0.0, 50.0, 100.0)
