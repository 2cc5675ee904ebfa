"""`golinear run`: model specs, the evaluation matrix, bad input before work, and (slow) real runs on
SmolLM2: kill + resume without loss or duplicates, a no-op re-run, rendering, and two data-parallel
ranks (gloo, CPU) whose merged cell equals the one-process cell."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _tiny import free_port

from golinear.bench.run import specs as S
from golinear.bench.run.plan import default_data_dir, plan_cells, resolve_suites
from golinear.bench.run.runner import run_matrix
from golinear.bench.results.store import Store

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- specs
def test_presets_overrides_and_key_value_specs():
    full = S.parse_model_spec("full")
    assert full.is_full_attention and math.isinf(full.budget) and full.key == "base=smollm2-135m"
    gdn = S.parse_model_spec("gdn-default")
    assert gdn.model_args() == {"base": "smollm2-135m", "mechanism": "gdn", "window": 56, "sinks": 8,
                                "short_conv": True}
    assert gdn.budget == 64 and gdn.label == "gdn-default"
    wider = S.parse_model_spec("gdn-default,window=120")
    assert wider.full["window"] == 120 and wider.key != gdn.key and wider.label == "gdn-default,window=120"
    same = S.parse_model_spec("short_conv=true,sinks=8,mechanism=gdn,window=56")
    assert same.key == gdn.key  # canonical: order and spelling do not matter
    hybrid = S.parse_model_spec("mechanism=gla,full_layers=3+7,keep_full=0.1,select=hardness")
    assert hybrid.model_args()["full_layers"] == [3, 7]
    assert [m.label for m in S.parse_models("full; gdn-default ;full")] == ["full", "gdn-default"]


@pytest.mark.parametrize("text,err", [
    ("nonsense", "unknown model 'nonsense'"),
    ("mechanism=mamba", "unknown mechanism 'mamba'"),
    ("gdn-default,colour=red", "unknown key 'colour'"),
    ("window=abc", "expected a non-negative integer"),
    ("mechanism=none", "needs a window"),
    ("checkpoint=/no/such/folder", "does not exist"),
])
def test_bad_specs_name_the_problem(text, err):
    with pytest.raises((ValueError, FileNotFoundError), match=err):
        S.parse_model_spec(text)


def test_checkpoint_folder_spec(tmp_path):
    import torch
    from safetensors.torch import save_file
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"base": "smollm2-135m", "linearize": {}}))
    save_file({"w": torch.zeros(3)}, str(tmp_path / "ck" / "new_params.safetensors"))
    spec = S.parse_model_spec(str(tmp_path / "ck"))
    assert spec.label == "ck" and not spec.is_full_attention and "base" not in spec.model_args()
    key = spec.key
    assert spec.base_name == "smollm2-135m" and "checkpoint_files=" in key
    save_file({"w": torch.ones(3)}, str(tmp_path / "ck" / "new_params.safetensors"))  # changed: a new identity
    assert S.parse_model_spec(str(tmp_path / "ck")).key != key
    import shutil
    shutil.copytree(tmp_path / "ck", tmp_path / "elsewhere" / "ck")  # a copy keeps its identity
    assert S.parse_model_spec(str(tmp_path / "elsewhere" / "ck")).key == S.parse_model_spec(str(tmp_path / "ck")).key


# ----------------------------------------------------------------------------- planning
def test_budget_sweep_includes_baselines_at_the_same_budgets():
    models = S.parse_models("full;gdn-default")
    cells = plan_cells(models, resolve_suites("lambada,sniah"), budgets=[128, 256], limit=2)
    lam = [c for c in cells if c.entry.suite == "lambada"]
    assert [c.model.label for c in lam] == ["full", "gdn-default"]  # one cell per task (acc + ppl inside)
    sn1 = [c for c in cells if c.entry.task == "golinear_sniah_1"]
    got = sorted((c.model.family, c.model.full["sinks"], c.model.full["window"], c.model.full["mechanism"])
                 for c in sn1)
    assert got == sorted([("full", 0, 0, None), ("gdn-default", 8, 120, "gdn"), ("gdn-default", 8, 248, "gdn"),
                          (S.WINDOW_ONLY_LABEL, 8, 120, "none"), (S.WINDOW_ONLY_LABEL, 8, 248, "none")])
    assert sn1[0].config == {"limit": 2, "context_length": 4096, "num_samples": 2, "seed": 42}
    assert len({c.key.digest for c in cells}) == len(cells)  # no duplicate cells


def test_budget_sweep_evaluates_a_named_untrained_window_at_each_budget():
    """`swa-sink` named alone under --budgets used to be dropped without a word: it runs at each budget."""
    cells = plan_cells(S.parse_models("swa-sink"), resolve_suites("sniah"), budgets=[128, 256], limit=2)
    sn1 = [c for c in cells if c.entry.task == "golinear_sniah_1"]
    got = sorted((str(c.model.full["mechanism"]), c.model.full["sinks"], c.model.full["window"]) for c in sn1)
    assert got == [("None", 0, 0), ("none", 8, 120), ("none", 8, 248)]


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,exc,err", [
    (dict(models="full", suites="cr,bogus"), ValueError, "unknown suite"),
    (dict(models="bogus-model", suites="cr"), ValueError, "unknown model"),
    (dict(models="full", suites="cr", data_dir="/no/such/data"), FileNotFoundError, "data folder"),
    (dict(models="gdn-default", suites="sniah", budgets=[8]), ValueError, "must exceed the 8 sink"),
    (dict(models="full", suites="sniah", context_length=100), ValueError, "1024..32768"),
    (dict(models="full", suites="cr", limit=0), ValueError, "positive integer"),
    (dict(models="full", suites="sniah", num_samples=10_001), ValueError, "--num-samples 10001: allowed 1..10,000"),
    (dict(models="full", suites="cr", data_dir="EMPTY"), FileNotFoundError, "does not have piqa/valid.jsonl"),
    (dict(models="full", suites="sniah", data_dir="EMPTY"), FileNotFoundError, "paul_graham_essays .task S-NIAH-2, task S-NIAH-3.; fetch it"),
    (dict(models="full", suites="ruler", context_length=1024), ValueError, "HQA at --context-length 1024"),
])
def test_bad_input_fails_before_any_work(tmp_path, monkeypatch, kwargs, exc, err):
    from golinear.bench.run import runner
    monkeypatch.setattr(runner, "build_lm", lambda *a, **k: pytest.fail("a model was loaded"))
    if kwargs.get("data_dir") == "EMPTY":  # a data folder that exists but lacks the files
        (tmp_path / "empty").mkdir()
        kwargs = {**kwargs, "data_dir": str(tmp_path / "empty")}
    with pytest.raises(exc, match=err):
        run_matrix(store=tmp_path / "store", progress=False, **kwargs)
    assert Store(tmp_path / "store").cells() == [] and not (tmp_path / "store").exists()


def test_every_tasks_samples_are_built_before_the_first_model_loads(tmp_path, monkeypatch):
    """A cell's wall time is its evaluation: the samples of every long-context cell to run are generated (and
    memoized) before any model loads, once per task and configuration, with the arguments the task's dataset
    builder uses, so building the cell's dataset finds them instead of generating them again."""
    from golinear.bench.run import runner
    from golinear.tasks.ruler import cache

    class Loaded(Exception):
        pass

    monkeypatch.setenv("GOLINEAR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_MEMO", {})
    built = []
    monkeypatch.setattr(cache, "build_samples", lambda task, *a, **k: built.append(task) or [])
    monkeypatch.setattr(runner, "build_lm", lambda *a, **k: (_ for _ in ()).throw(Loaded()))
    with pytest.raises(Loaded):
        run_matrix("full;swa-sink", "sniah", tmp_path / "store", budgets=[128, 256], context_length=1024,
                   num_samples=2, progress=False)
    assert sorted(built) == ["golinear_sniah_1", "golinear_sniah_2", "golinear_sniah_3"]
    from golinear.tasks.ruler.hooks import build_dataset
    from golinear.bench.run.execute import long_metadata
    cell = next(c for c in plan_cells(S.parse_models("swa-sink"), resolve_suites("sniah"), budgets=[128],
                                      context_length=1024, num_samples=2) if c.entry.task == "golinear_sniah_2")
    build_dataset(cell.entry.task, **long_metadata(cell, default_data_dir()))
    assert len(built) == 3  # what the cell's dataset builder asks for is what was built


def test_unwritable_store_fails_before_any_work(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="not writable"):
        run_matrix("full", "cr", tmp_path / "f" / "store", progress=False)


def test_cli_prints_one_line_errors(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "golinear.bench.cli", "run", "--models", "full", "--suites", "nope",
                           "--store", str(tmp_path / "s")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "golinear run: error: unknown suite" in proc.stderr
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- real runs (slow)
def _env():
    return dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")


def _golinear_here(capsys, *args) -> tuple[int, str, str]:
    """`golinear ARGS` in this process (its main(), as the console script calls it): (exit code, stdout, stderr).
    For the runs whose test is not about the process boundary: no interpreter start and imports to pay again."""
    from golinear.bench.cli import main
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_real_run_kill_resume_noop_and_render(tmp_path, capsys):
    """Two cells on the real SmolLM2 (full attention and the untrained window+sink model, LAMBADA, 3 docs).

    The first run (a process of its own) is SIGKILLed as soon as one cell lands; the re-run evaluates only the
    other; a third run does no work; the leaderboard shows the measured rows (these three in this process)."""
    store = tmp_path / "store"
    args = ["run", "--models", "full;swa-sink", "--suites", "lambada", "--limit", "3", "--store", str(store),
            "--batch-size", "4"]
    with open(tmp_path / "first.err", "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "golinear.bench.cli", *args], cwd=ROOT, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True)
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None and not list(store.glob("cells/*/*.json")):
            time.sleep(0.5)
        ended = proc.poll()  # None: still running, as it should be
        if ended is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = Store(store).cells()  # every file present is a whole cell (no partial writes)
    assert len(before) == 1, (ended, (tmp_path / "first.err").read_text()[-3000:])  # killed during the second

    code, out, err = _golinear_here(capsys, *args)
    assert code == 0, err[-3000:]
    assert f"2 cells planned, {len(before)} already in" in out
    assert f"{2 - len(before)} evaluated" in out
    cells = Store(store).cells()
    assert len(cells) == 2 and len(list(store.glob("cells/*/*.json"))) == 2
    for c in cells:
        assert c["n"] == 3 and 0.0 <= c["value"] <= 1.0 and c["metrics"]["perplexity,none"]["value"] > 1.0
        prov = c["provenance"]
        assert prov["versions"]["lm_eval"] == "0.4.13" and prov["git"]["commit"]
        assert prov["model_fingerprint"] and prov["limit"] == 3
        assert prov["hardware"]["device"] == "cpu" and prov["hardware"]["ops"] == "reference"
        assert "lambada_openai/lambada_test.jsonl" in prov["data"]["files"]  # data, relative to the data dir
        assert len(prov["data"]["files"]["lambada_openai/lambada_test.jsonl"]) == 64
    labels = sorted(c["model"]["label"] for c in cells)
    assert labels == ["full", "swa-sink"]

    from golinear.bench.run import runner
    real_build = runner.build_lm
    runner.build_lm = lambda *a, **k: pytest.fail("a finished cell's model was loaded again")
    try:
        code, out, _ = _golinear_here(capsys, *args)
    finally:
        runner.build_lm = real_build
    assert code == 0 and "2 already in" in out and "0 evaluated" in out
    assert [c["digest"] for c in Store(store).cells()] == [c["digest"] for c in cells]  # untouched

    code, _, err = _golinear_here(capsys, "leaderboard", "--store", str(store), "--out", str(tmp_path / "lb"))
    assert code == 0, err[-2000:]
    md = (tmp_path / "lb" / "standard.md").read_text()
    assert re.search(r"\| measured +\| measured +\| smollm2-135m +\| full +\|", md)
    assert re.search(r"\| measured +\| measured +\| smollm2-135m +\| swa-sink +\|", md)


@pytest.mark.slow
def test_data_parallel_two_ranks_merge_into_one_cell(tmp_path, capsys):
    """accelerate launch with two CPU processes (gloo): rank 0 writes one cell equal to a one-process run
    (run in this process)."""
    common = ["--models", "full", "--suites", "lambada", "--limit", "4", "--batch-size", "2"]
    code, _, err = _golinear_here(capsys, "run", *common, "--store", str(tmp_path / "one"))
    assert code == 0, err[-3000:]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--main_process_port", str(free_port()), "--mixed_precision", "no",
           "--dynamo_backend", "no", "-m", "golinear.bench.cli", "run", *common, "--store", str(tmp_path / "two")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    one, two = Store(tmp_path / "one").cells(), Store(tmp_path / "two").cells()
    assert len(one) == len(two) == 1 and one[0]["digest"] == two[0]["digest"]
    assert two[0]["provenance"]["world_size"] == 2 and one[0]["provenance"]["world_size"] == 1
    assert not (tmp_path / "two" / "partial").exists()  # both ranks' request caches removed once the cell landed
    assert two[0]["n"] == one[0]["n"] == 4
    for k, m in one[0]["metrics"].items():
        assert two[0]["metrics"][k]["value"] == pytest.approx(m["value"], rel=1e-5), k


@pytest.mark.slow
def test_killed_cell_resumes_from_its_request_cache(tmp_path, monkeypatch):
    """A cell killed mid-way keeps the requests it scored (lm-eval's CachingLM, under <store>/partial); the
    re-run scores only the rest, records how many it resumed, removes the cache, and equals a clean run."""
    from golinear.bench.backends import lm_backend
    kw = dict(limit=3, batch_size=1, device="cpu", progress=False)
    clean = run_matrix("full", "lambada", tmp_path / "clean", **kw).cells[0]
    assert "resumed_requests" not in clean["provenance"]
    assert not list((tmp_path / "clean").glob("partial/*/*.db"))  # finished: nothing left behind

    real_call, calls = lm_backend.GolinearHF._model_call, []

    def dies_on_third(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")  # what a SIGINT does mid-cell
        return real_call(self, *a, **k)

    monkeypatch.setattr(lm_backend.GolinearHF, "_model_call", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        run_matrix("full", "lambada", tmp_path / "killed", **kw)
    assert Store(tmp_path / "killed").cells() == []  # no partial cell
    partial = list((tmp_path / "killed").glob("partial/*/*_rank0.db"))
    assert len(partial) == 1
    fp = clean["model"]["info"]["base_fingerprint"]
    assert partial[0].name.endswith(f"--{fp}_rank0.db")  # keyed by the model's weights

    def counted(self, *a, **k):
        calls.append(1)
        return real_call(self, *a, **k)

    monkeypatch.setattr(lm_backend.GolinearHF, "_model_call", counted)
    calls.clear()
    resumed = run_matrix("full", "lambada", tmp_path / "killed", **kw).cells[0]
    assert resumed["provenance"]["resumed_requests"] == 2 and len(calls) == 1  # only the unscored request
    assert not list((tmp_path / "killed").glob("partial/*/*.db*"))
    assert resumed["digest"] == clean["digest"] and resumed["n"] == clean["n"] == 3
    for k, m in clean["metrics"].items():
        assert resumed["metrics"][k]["value"] == pytest.approx(m["value"], rel=1e-6), k
    # each sample's score, keyed by task, document and its hash: what a paired comparison of two rows reads
    assert len(clean["per_sample"]) == 3 and resumed["per_sample"] == clean["per_sample"]
    assert all(k.startswith("golinear_lambada_openai/") and len(k.split("/")[2]) == 12 for k in clean["per_sample"])
    assert sum(clean["per_sample"].values()) / 3 == pytest.approx(clean["value"])


# ----------------------------------------------------------------------------- bad input and re-runs (slow, real runs)
@pytest.mark.slow
def test_two_identical_runs_at_once_both_finish_and_share_the_work(tmp_path):
    """Two identical `golinear run`s on one store: both exit 0, every cell is evaluated once (claims), and
    no claim or request cache is left behind."""
    store = tmp_path / "store"
    args = [sys.executable, "-m", "golinear.bench.cli", "run", "--models", "full;swa-sink", "--suites", "lambada",
            "--limit", "3", "--store", str(store), "--batch-size", "4"]
    procs = [subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "2 cells planned" in out
    evaluated = sum(int(re.search(r"(\d+) evaluated", out).group(1)) for out, _ in outs)
    assert evaluated == 2  # no cell evaluated twice
    cells = Store(store).cells()
    assert sorted(c["model"]["label"] for c in cells) == ["full", "swa-sink"]
    assert not (store / "claims").exists() and not list(store.glob("partial/**/*.db*"))


@pytest.mark.slow
def test_fixed_data_file_makes_a_new_cell_not_a_stale_hit(tmp_path, capsys):
    """The issue's first row: a cell measured on an edited data copy (no SHA256SUMS to catch it) is not
    reused once the data is right: the data hashes are part of the key."""
    data = tmp_path / "data"
    shutil.copytree(Path(default_data_dir()) / "lambada_openai", data / "lambada_openai")
    f = data / "lambada_openai" / "lambada_test.jsonl"
    lines = f.read_text().splitlines()
    row = json.loads(lines[0])
    row["text"] = row["text"].rsplit(" ", 1)[0] + " zebra"  # a different target word
    f.write_text("\n".join([json.dumps(row)] + lines[1:]) + "\n")
    args = ["run", "--models", "full", "--suites", "lambada", "--limit", "3", "--store", str(tmp_path / "s")]
    code, _, err = _golinear_here(capsys, *args, "--data-dir", str(data))
    assert code == 0, err[-3000:]
    code, out, _ = _golinear_here(capsys, *args, "--data-dir", default_data_dir())
    assert code == 0 and "0 already in" in out and "1 evaluated" in out
    cells = Store(tmp_path / "s").cells()
    assert len(cells) == 2 and cells[0]["key"]["data"] != cells[1]["key"]["data"]
    assert cells[0]["metrics"]["perplexity,none"] != cells[1]["metrics"]["perplexity,none"]


def test_budget_sweep_keeps_retention_slots_inside_the_budget():
    """A model with retention slots keeps them at every budget: window = budget - sinks - retain."""
    ret = S.parse_model_spec("gdn-default,window=48,retain=8,retain_score=delta_error")
    at128 = ret.with_budget(128, 8)
    assert (at128.sinks, at128.window, at128.retain, at128.budget) == (8, 112, 8, 128)
    with pytest.raises(ValueError, match="must exceed the 8 sink tokens \\+ 8 retention slots"):
        ret.with_budget(16, 8)


def test_lm_evals_environment_report_is_collected_once_per_process(monkeypatch):
    """lm-eval's add_env_info (torch's collect_env: subprocesses, ~0.8 s a cell on a GPU machine) runs at the first
    cell only; every cell still gets the same report."""
    import lm_eval.evaluator

    from golinear.bench.run.execute import env_info_once
    calls = []

    def collect(storage):
        calls.append(1)
        storage.update(pretty_env_info=f"report {len(calls)}", transformers_version="x")
    monkeypatch.setattr(lm_eval.evaluator, "add_env_info", collect)
    env_info_once()
    env_info_once()  # installing twice wraps once
    first, second = {"results": 1}, {}
    lm_eval.evaluator.add_env_info(first)
    lm_eval.evaluator.add_env_info(second)
    assert calls == [1] and first["pretty_env_info"] == second["pretty_env_info"] == "report 1"
    assert first["results"] == 1 and second["transformers_version"] == "x"


def test_a_resumed_run_goes_on_with_the_model_it_was_stopped_in(tmp_path, monkeypatch):
    """Cells are planned task by task; models are evaluated in the order given, so a model whose first task is stored
    (a run stopped inside it) goes on before the models after it, not behind every untouched one."""
    import types
    from golinear.bench.run import runner
    from golinear.bench.results.store import Store
    from golinear.tasks.ruler import cache

    monkeypatch.setenv("GOLINEAR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_MEMO", {})
    monkeypatch.setattr(cache, "build_samples", lambda *a, **k: [])
    first, second = "mechanism=none,window=248,sinks=8", "mechanism=none,window=120,sinks=8"
    done_key = S.parse_model_spec(first).key
    monkeypatch.setattr(Store, "has", lambda self, key: key.model == done_key and key.task == "golinear_sniah_1")
    monkeypatch.setattr(runner, "build_lm", lambda spec, *a, **k: spec)
    monkeypatch.setattr(runner, "ModelInfo", types.SimpleNamespace(from_lm=lambda lm: None))
    order = []
    monkeypatch.setattr(runner, "evaluate_into",
                        lambda store, lm, c, *a: order.append((c.model.label, c.entry.task)) or 1)
    run_matrix(f"{first};{second}", "sniah", tmp_path / "store", context_length=1024, num_samples=2, progress=False)
    labels = [S.parse_model_spec(m).label for m in (first, second)]
    assert order == [(labels[0], "golinear_sniah_2"), (labels[0], "golinear_sniah_3"),
                     (labels[1], "golinear_sniah_1"), (labels[1], "golinear_sniah_2"), (labels[1], "golinear_sniah_3")]
