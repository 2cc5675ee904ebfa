"""The study's evaluation on a GPU machine: `golinear store merge`, and scripts/study/device_eval.sh run
as a CPU dry run (two workers, a deadline inside the call, a second call on the same machine, the merge)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bench.cli import main as cli
from bench.store import CellKey, Store

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "leaderboards" / "store"


def committed_cell(task: str) -> dict:
    path = next((COMMITTED / "cells").glob(f"full-*/{task}--*.json"))
    return json.loads(path.read_text())


def with_limit(cell: dict, limit: int) -> dict:
    """The same cell under another key (limit), as a GPU run with --limit would write it."""
    key = {**cell["key"], "config": {**cell["key"]["config"], "limit": limit}}
    return {**cell, "key": key, "digest": CellKey.from_dict(key).digest}


def dry_eval(tmp_path: Path, **env) -> tuple[str, Path]:
    """device_eval.sh as a CPU dry run on a fresh "machine" folder under tmp_path: its stdout and that folder."""
    work = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
    env = {**os.environ, "DRY": "1", "PY": sys.executable, "EXTRA_ARGS": "--limit 1", "EVAL_WORK": str(work),
           "OUT": str(work / "out"), "PARTIAL": str(tmp_path / "none-carried"), **env}
    r = subprocess.run(["bash", "scripts/study/device_eval.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, work


def test_store_merge_adds_missing_cells_and_keeps_existing_ones(tmp_path, capsys):
    src, dest = Store(tmp_path / "src"), Store(tmp_path / "dest")
    piqa = committed_cell("golinear_piqa")
    kept = dest.put({**piqa, "value": 0.123})  # dest's own number for this key must survive the merge
    src.put(piqa)
    src.put(with_limit(piqa, 2))
    assert cli(["store", "merge", str(src.root), "--store", str(dest.root)]) == 0
    assert "1 of 2 cells" in capsys.readouterr().out
    assert json.loads(kept.read_text())["value"] == 0.123
    assert dest.has(CellKey.from_dict(with_limit(piqa, 2)["key"]))
    assert cli(["store", "merge", str(src.root), "--store", str(dest.root)]) == 0  # again: nothing new
    assert "0 of 2 cells" in capsys.readouterr().out


def test_store_merge_refuses_a_damaged_source_before_writing(tmp_path):
    src, dest = Store(tmp_path / "src"), Store(tmp_path / "dest")
    src.put(committed_cell("golinear_piqa"))
    bad = src.put(with_limit(committed_cell("golinear_piqa"), 3))
    bad.write_text("{}")
    assert cli(["store", "merge", str(src.root), "--store", str(dest.root)]) == 2
    assert not dest.root.exists()
    assert cli(["store", "merge", str(tmp_path / "nowhere"), "--store", str(dest.root)]) == 2


def run_call(tmp: Path, budget: int) -> tuple[subprocess.CompletedProcess, float, Path]:
    out = tmp / f"out-{budget}"
    env = {**os.environ, "DRY": "1", "PY": sys.executable, "OMP_NUM_THREADS": "1", "K": "2", "BUDGET": str(budget),
           "NAMES": "gdn-w56-s8-sc gdn-w64", "SUITES": "lambada", "EXTRA_ARGS": "--limit 2",
           "EVAL_WORK": str(tmp / "machine"), "OUT": str(out), "STAGGER_S": "1",
           "PARTIAL": str(tmp / "none-carried")}
    t = time.time()
    r = subprocess.run(["bash", "scripts/study/device_eval.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    return r, time.time() - t, out


def evaluated(r: subprocess.CompletedProcess) -> list[str]:
    """The script's unit lines that wrote a cell (one cell per unit here: LAMBADA)."""
    return [line for line in r.stdout.splitlines() if line.startswith("w") and line.endswith("1 evaluated")]


def returned(out: Path) -> set[str]:
    return {m.name for m in tarfile.open(out / "cells.tgz").getmembers() if m.isfile()}


@pytest.mark.slow
def test_device_eval_dry_run_stops_at_its_deadline_and_resumes_without_redoing(tmp_path):
    """Two calls on one (warm) machine: the first is cut by its budget, the second finishes; every cell is
    evaluated once, and the returned tarballs merge into a copy of the committed store."""
    # a worker starts a unit only with >= 30 s left: both workers start (t ~2 and ~3 s), and the third unit could
    # start only if a unit finished by t = 4 s (they take 8-25 s: imports, model load). 40 s let it start once
    # units got faster (8-9 s on a quiet machine)
    budget = 34
    first, wall, out1 = run_call(tmp_path, budget=budget)
    assert first.returncode == 0, first.stdout + first.stderr
    assert wall < budget + 30, first.stdout  # the deadline holds (timeout -k 10 on each run, then packing)
    second, _, out2 = run_call(tmp_path, budget=400)
    assert second.returncode == 0, second.stdout + second.stderr
    # the third unit cannot start in call 1 (a unit, imports and model load included, takes > 2 s)
    assert len(evaluated(first)) < 3, first.stdout
    assert len(evaluated(first)) + len(evaluated(second)) == 3, first.stdout + second.stdout  # each cell once
    assert len(returned(out1)) == len(evaluated(first))
    names = returned(out2)
    assert len(names) == 3 and all("limit2" in n for n in names)  # the second call returns all new cells
    assert (out2 / "logs.tgz").exists() and (out2 / "partial.tgz.part-aa").exists()
    store = tmp_path / "merged"
    shutil.copytree(COMMITTED, store)
    before = len(Store(store).cells())
    r = subprocess.run(["bash", "scripts/study/merge_eval.sh", str(out2), str(store)], cwd=ROOT,
                       env={**os.environ, "PY": sys.executable, "PARTIAL": str(tmp_path / "partial")},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "3 of 3 cells" in r.stdout and len(Store(store).cells()) == before + 3


def test_request_caches_come_back_in_parts_and_merge_restores_them(tmp_path):
    """The unfinished cells' request caches return split into parts under the per-file limit (PART_BYTES), at most
    PARTS_MAX of them, else not at all (said); merge_eval.sh joins the parts into PARTIAL byte for byte."""
    cache = os.urandom(250_000)  # random: gzip leaves it ~250 KB, so 3 parts of 100 KB

    def call(name: str, parts_max: int) -> tuple[str, Path]:
        work = tmp_path / name
        (work / "store" / "partial" / "m-1").mkdir(parents=True)
        (work / "store" / "partial" / "m-1" / "hellaswag.db").write_bytes(cache)
        env = {**os.environ, "DRY": "1", "PY": sys.executable, "K": "0", "BUDGET": "60", "NAMES": "gdn-w64",
               "SUITES": "lambada", "EVAL_WORK": str(work), "OUT": str(work / "out"), "PART_BYTES": "100000",
               "PARTIAL": str(tmp_path / "none-carried"),
               "PARTS_MAX": str(parts_max)}
        r = subprocess.run(["bash", "scripts/study/device_eval.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout, work / "out"
    said, out = call("small", parts_max=2)
    assert "not returned" in said and not list(out.glob("partial*"))
    said, out = call("fits", parts_max=4)
    parts = sorted(out.glob("partial.tgz.part-*"))
    assert len(parts) == 3 and all(p.stat().st_size <= 100_000 for p in parts), parts
    r = subprocess.run(["bash", "scripts/study/merge_eval.sh", str(out), str(tmp_path / "store")], cwd=ROOT,
                       env={**os.environ, "PY": sys.executable, "PARTIAL": str(tmp_path / "partial")},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "partial" / "partial" / "m-1" / "hellaswag.db").read_bytes() == cache


def test_pending_units_leaves_out_units_the_store_has(tmp_path):
    """A unit whose cells are all in the store costs no `golinear run` process; a missing one stays."""
    units = "full\tcr\nfull\tlambada\nmechanism=none,window=3,sinks=1\tcr\n"  # (a model the study never evaluates)
    r = subprocess.run([sys.executable, "scripts/study/pending_units.py", "--", "--store", str(COMMITTED)],
                       cwd=ROOT, input=units, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "mechanism=none,window=3,sinks=1\tcr\n", r.stderr
    r = subprocess.run([sys.executable, "scripts/study/pending_units.py", "--", "--store", str(COMMITTED),
                        "--limit", "2"], cwd=ROOT, input=units, capture_output=True, text=True)
    assert r.stdout == units  # another configuration: nothing is in the store


@pytest.mark.slow
def test_device_eval_split_workers_share_one_model_and_names_carry_cache_options(tmp_path):
    """SPLIT=2, K=4 (full attention is always a unit too): two workers on one model's five CR tasks evaluate
    different cells (each once); a name with cache options after its folder evaluates that checkpoint with them;
    an empty folder in CKPT (what a sparse checkout leaves) is passed over for the tree's checkpoint."""
    (tmp_path / "ck" / "gdn-w64").mkdir(parents=True)
    env = {**os.environ, "DRY": "1", "PY": sys.executable, "OMP_NUM_THREADS": "1", "K": "4", "SPLIT": "2",
           "BUDGET": "400", "NAMES": "gdn-w64,window=32,sinks=8", "SUITES": "cr", "EXTRA_ARGS": "--limit 1",
           "CKPT": str(tmp_path / "ck"), "EVAL_WORK": str(tmp_path / "machine"), "OUT": str(tmp_path / "out"),
           "STAGGER_S": "1", "PARTIAL": str(tmp_path / "none-carried")}
    r = subprocess.run(["bash", "scripts/study/device_eval.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    units = [line for line in r.stdout.splitlines() if line.startswith("w") and " rc=" in line]
    counts = [int(u.split()[-2]) for u in units if u.endswith("evaluated") and "gdn-w64" in u]
    assert len(counts) == 2 and sum(counts) == 5 and min(counts) >= 1, r.stdout  # both workers, each cell once
    cells = [json.loads(tarfile.open(tmp_path / "out" / "cells.tgz").extractfile(m).read())
             for m in tarfile.open(tmp_path / "out" / "cells.tgz").getmembers() if m.isfile()]
    ours = [c for c in cells if "checkpoint=gdn-w64" in c["key"]["model"]]
    assert len(ours) == 5 and all("window=32" in c["key"]["model"] and c["model"]["budget"] == 40 for c in ours)


def test_device_eval_plan_groups_list_their_own_names_suites_tasks_and_splits(tmp_path):
    """PLAN="SUITES[TASKS][/SPLIT]: NAMES; ...": each group's names x suites (only TASKS of them, `-`: all), its
    own SPLIT (copy-major over the whole list), `full` where a group names it; without PLAN, full +
    NAMES/SUITES/SPLIT make one group. K=0: the listing only."""
    def units(**env) -> list[list[str]]:
        work = dry_eval(tmp_path, **{"K": "0", "BUDGET": "60", **env})[1]
        return [[Path(f).name if "/" in f else f for f in line.split("\t")]
                for line in (work / "units.txt").read_text().splitlines()]
    assert units(PLAN="lambada/2: full gdn-w64; cr[PIQA,arc_easy]: gdn-w56-s8 mechanism=none,window=56,sinks=8") == [
        ["full", "lambada", "-", "1"], ["gdn-w64", "lambada", "-", "1"],
        ["gdn-w56-s8", "cr", "PIQA,arc_easy", "1"], ["mechanism=none,window=56,sinks=8", "cr", "PIQA,arc_easy", "1"],
        ["full", "lambada", "-", "2"], ["gdn-w64", "lambada", "-", "2"]]
    assert units(NAMES="gdn-w64", SUITES="cr lambada", SPLIT="2") == [
        ["full", "cr", "-", "1"], ["gdn-w64", "cr", "-", "1"], ["full", "lambada", "-", "1"],
        ["gdn-w64", "lambada", "-", "1"], ["full", "cr", "-", "2"], ["gdn-w64", "cr", "-", "2"],
        ["full", "lambada", "-", "2"], ["gdn-w64", "lambada", "-", "2"]]
    # a unit whose chosen tasks are all in the store is left out: full attention's committed PIQA cell (the other
    # model is one the study never evaluates)
    assert units(PLAN="cr[PIQA]: full mechanism=none,window=3,sinks=1", EXTRA_ARGS="") == [
        ["mechanism=none,window=3,sinks=1", "cr", "PIQA", "1"]]


def test_device_eval_searches_each_carried_checkpoint_folder(tmp_path):
    """CKPT may name several carried folders (space-separated, so calls can carry them apart): a checkpoint found in
    the second is stashed and listed; a name in none of them nor the tree is skipped, said. K=0: the listing only."""
    (tmp_path / "ck1").mkdir()
    shutil.copytree(ROOT / "checkpoints" / "smollm2-135m" / "gdn-w64", tmp_path / "ck2" / "gdn-w64-carried")
    said, work = dry_eval(tmp_path, K="0", BUDGET="60", PLAN="lambada: gdn-w64-carried nowhere",
                          CKPT=f"{tmp_path / 'ck1'} {tmp_path / 'ck2'}")
    listed = [line.split("\t")[0] for line in (work / "units.txt").read_text().splitlines()]
    assert listed == [str(work / "ckpt" / "gdn-w64-carried")], said
    assert (work / "ckpt" / "gdn-w64-carried" / "config.json").is_file()
    assert "no checkpoint nowhere in" in said and "skipped" in said


def test_device_eval_says_when_workers_would_stay_idle(tmp_path):
    """Fewer units than workers (a long suite's tasks not spread with /N) is said before the workers start; a
    budget under 30 s lets no worker take a unit, so nothing is evaluated here."""
    def run(plan: str, k: str) -> str:
        return dry_eval(tmp_path, K=k, BUDGET="20", STAGGER_S="0", PLAN=plan)[0]
    assert "only 2 units for 3 workers" in run("sniah: gdn-w64 gdn-w56-s8", "3")
    assert "units for" not in run("sniah/3: gdn-w64 gdn-w56-s8", "3")


def test_run_tasks_selects_tasks_of_the_suites_and_names_the_allowed_ones(tmp_path, capsys):
    from bench.plan import resolve_suites
    assert [e.task for e in resolve_suites("ruler", tasks="mq,MV,golinear_ruler_vt")] == [
        "golinear_ruler_mq", "golinear_ruler_mv", "golinear_ruler_vt"]
    assert cli(["run", "--models", "full", "--suites", "cr", "--tasks", "PIQA,MQ", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown task(s) ['MQ'] in these suites; allowed: PIQA (golinear_piqa), ARC-e" in err
    assert not any(tmp_path.iterdir())
