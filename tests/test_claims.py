"""`golinear claims`: each rule's verdict on holds / fails / missing, the seeds' spread, the choice of evidence
(store before held-out CE, finished runs before short ones), and a render from the real repository files.

Stores and checkpoint folders are fabricated in tmp_path; the paper's side is the real reference CSVs.
"""
import json
import statistics

import pandas as pd
import pytest

from golinear.bench.claims import caveats, catalog, evidence, metrics, page, paper_rows, render, rules, targets, verdicts
from golinear.bench.cli import main as cli_main
from golinear.bench.cli_args import REFERENCE_DIR, REPO_ROOT
from golinear.bench.boards.leaderboard import load_reference
from golinear.bench.results.store import Store
from golinear.models.spec import checkpoint_identity

CR_TASKS = {"golinear_piqa": "acc", "golinear_arc_easy": "acc", "golinear_arc_challenge": "acc_norm",
            "golinear_hellaswag": "acc_norm", "golinear_winogrande": "acc"}
CE, CR = metrics.CE, metrics.METRICS["CR"]


def checkpoint(root, name, heldout, *, steps=2500, requested=2500, full=3.47, seed=0):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": name}))  # what the store key's files hash reads
    (d / "train_config.json").write_text(json.dumps({
        "train": {"steps": requested, "seed": seed}, "summary": {"step": steps},
        "results": {"heldout_loss_trained": heldout, "heldout_loss_full_attention": full}}))


def put_cr(store, name, score, *, full=False, limit=None, folder=None):
    """The five CR cells of one model, every task at `score` (a fraction), keyed by the folder's files."""
    files = None if full else checkpoint_identity(folder)
    key = "base=smollm2-135m" if full else f"base=smollm2-135m,checkpoint={name},checkpoint_files={files}"
    for task, metric in CR_TASKS.items():
        store.put({"key": {"model": key, "task": task, "config": {"limit": limit, "num_fewshot": 0}},
                   "model": {"label": name, "family": name, "backbone": "smollm2-135m", "full_attention": full,
                             "budget": "inf" if full else 64},
                   "task": task, "suite": "cr", "metric": metric, "n": 20,
                   "metrics": {f"{metric},none": {"value": score, "stderr": 0.01}}})


def table(tmp_path, store=None):
    store = store or Store(tmp_path / "store")
    return verdicts.claims_table(store, tmp_path / "ck", REFERENCE_DIR).set_index("claim")


def row(t, start):
    return t.loc[next(c for c in t.index if c.startswith(start))]


# ----------------------------------------------------------------------------- each rule: holds, fails, missing
@pytest.mark.parametrize("rule,holds,fails,missing", [
    (rules.ordering, {"gdn": 3.0, "kgla": 3.5, "gla": 3.51, "hedgehog": 4.5},
     {"gdn": 10.68, "kgla": 5.08, "gla": 7.22, "hedgehog": 5.12}, {"gdn": 3.0, "kgla": 3.5, "gla": 3.51}),
    (rules.close_gap, {"full": 3.47, "gdn": 3.48}, {"full": 3.47, "gdn": 3.695}, {"gdn": 3.48}),
    (rules.gap_target, {"full": 3.47, "gdn": 3.48}, {"full": 3.47, "gdn": 3.6}, {"full": 3.47}),
    (rules.near_best, {"gdn": 3.566, "kgla": 3.572, "gla": 3.57}, {"gdn": 3.566, "kgla": 3.572, "gla": 6.75},
     {"kgla": 3.5, "gla": 3.5}),
    (rules.rises, {"b128": 3.5, "b256": 3.44, "b1024": 3.37}, {"b128": 3.5, "b256": 3.52}, {"b128": 3.5}),
    (lambda s, m: rules.beats(s, m, a="56+8", b="64"), {"gdn:56+8": 3.7, "gdn:64": 4.36},
     {"gdn:56+8": 3.7, "gdn:64": 4.36, "gla:56+8": 5.0, "gla:64": 4.9}, {"gdn:56+8": 3.7, "gla:64": 4.9}),
])
def test_each_rule_decides_holds_fails_and_refuses_missing(rule, holds, fails, missing):
    assert rule(holds, CE)[0] is True
    assert rule(fails, CE)[0] is False
    assert rule(missing, CE)[0] is None


def test_ruler_profile_rule_and_the_paper_numbers_it_reads():
    ok = {"agg@small": 35, "ret@small": 2, "avg@small": 18, "agg@large": 67, "ret@large": 28, "avg@large": 47}
    assert rules.ruler_profile(ok, CR)[0] is True
    assert rules.ruler_profile(ok | {"ret@large": 65}, CR)[0] is False  # retrieval caught up
    assert rules.ruler_profile(ok | {"avg@large": 10}, CR)[0] is False  # falls with the budget
    assert rules.ruler_profile({k: v for k, v in ok.items() if k != "avg@large"}, CR)[0] is None
    paper = paper_rows.ruler_rows(load_reference(REFERENCE_DIR))["Llama-3.1-8B"]
    assert paper["avg@small"] == 18.50 and paper["avg@large"] == 47.52
    assert paper["agg@small"] == pytest.approx((34.44 + 60.04 + 21.27 + 23.49) / 4)


def test_retention_rules_judge_each_variant_at_every_budget():
    """A variant meets the target only at every named budget; some variant must; a variant short of a
    budget is named, not judged; CR stays within the tolerance (points) or '~' (held-out CE)."""
    ahead = lambda s, m=CR: rules.retention_ahead(s, m, budgets="256, 512")  # noqa: E731
    base = {"default@256": 5.0, "default@512": 13.0}
    ok, why = ahead(base | {"half@256": 6.0, "half@512": 14.0, "free@256": 2.9, "free@512": 11.3})
    assert ok is True and "half: 256 ahead by 1.00, 512 ahead by 1.00 (met)" in why and "free: " in why
    ok, why = ahead(base | {"half@256": 6.0, "half@512": 12.0})
    assert ok is False and "512 behind by 1.00 (not met)" in why
    ok, why = ahead(base | {"half@256": 6.0})
    assert ok is None and "(not every budget measured)" in why
    within = lambda s, m=CR: rules.retention_within(s, m, budgets="128", tol=rules.RETENTION_TOLERANCE)  # noqa: E731
    assert within({"default@128": 45.0, "half@128": 44.6})[0] is True
    assert within({"default@128": 45.0, "half@128": 44.4})[0] is False
    assert within({"default@128": 3.50, "half@128": 3.53}, CE)[0] is False  # 0.03 nats: beyond '~'
    cr = rules.rule_text(catalog.CLAIMS[-1].parts[2].rule)
    assert "0.5 points" in cr and "128, 256, 512, 1024" in cr


def test_retention_ahead_must_clear_the_seeds_spread():
    """The retention target asks for a margin beyond the seeds' spread: with `spreads` a variant meets it only where it
    and the default recipe both have seeds and the margin exceeds their stds added; a one-seed row is not met."""
    ahead = lambda s, sp: rules.retention_ahead(s, CR, budgets="256", spreads=sp)  # noqa: E731
    s = {"default@256": 5.0, "half@256": 8.0}
    ok, why = ahead(s, {"default@256": 0.5, "half@256": 2.0})
    assert ok is True and "ahead by 3.00 (seeds' spread 2.50)" in why
    assert ahead(s, {"default@256": 0.5, "half@256": 2.6})[0] is False  # 3.0 is not beyond 3.1
    ok, why = ahead(s, {"default@256": 0.5})
    assert ok is False and "(one seed: no spread)" in why
    assert ahead(s, None)[0] is True  # the paper's rows: no seeds, 'ahead' alone
    parts = [p for c in catalog.CLAIMS for p in c.parts if p.seeded]
    assert len(parts) == 2 and all("seeds' spread" in rules.rule_text(p.rule) for p in parts)


def test_a_target_with_several_parts_holds_only_when_one_variant_meets_every_part():
    """Variant 'slots' is ahead on S-NIAH but loses CR; variant 'quarter' keeps CR but is behind on S-NIAH: read part
    by part each part is met (the old rule: both parts 'hold'), yet no single variant meets the target."""
    sniah = {"default@256": 5.0, "slots@256": 9.0, "quarter@256": 4.0}
    cr = {"default@256": 46.0, "slots@256": 44.0, "quarter@256": 46.1}
    spreads = {r: 0.5 for r in sniah}
    parts = {"S-NIAH": rules.variants_ahead(sniah, CR, budgets="256", spreads=spreads)[0],
             "CR": rules.variants_within(cr, CR, budgets="256")[0]}
    assert rules.retention_ahead(sniah, CR, budgets="256", spreads=spreads)[0] is True  # each part alone: met
    assert rules.retention_within(cr, CR, budgets="256")[0] is True
    assert targets.one_variant(parts) == (False, [], ["slots", "quarter"])
    assert targets.one_variant(parts | {"CR": {"slots": True, "quarter": True}}) == (True, ["slots"],
                                                                                    ["slots", "quarter"])
    assert targets.one_variant({"S-NIAH": {"slots": True}, "CR": {"quarter": True}}) == (None, [], [])


def test_the_retention_target_is_judged_as_one_and_names_its_caveats():
    """On the committed files: no variant meets all four parts (the numbers scorer misses CR and LAMBADA budgets,
    the trained rows the S-NIAH margin), so the one retention row does not hold, where the part-by-part reading
    said 'holds' four times; the numbers scorer is named as fitted to the test format."""
    t = verdicts.claims_table(Store(REPO_ROOT / "leaderboards" / "store"), REPO_ROOT / "checkpoints" / "smollm2-135m",
                              REFERENCE_DIR)
    retention = t[t["claim"].str.startswith("Retention slots")]
    assert len(retention) == 1
    r = retention.iloc[0]
    assert caveats.base(r["verdict"]) == "does not hold" and r["why"].startswith("no variant meets every part")
    assert ("numbers scorer [fitted to the test's value type: numbers] (fitted to the test format): S-NIAH mean at 256 "
            "and 512 met") in r["why"]


def test_a_verdict_cell_names_its_caveats():
    fitted = "gdn-w248-s8-sc,window=124,retain=124,retain_score=fitted,scorer=numbers.safetensors"
    roles = {"x@256": fitted, "default@256": "gdn-w248-s8-sc", "full": "full", "window": "none@256"}
    assert caveats.caveats("S-NIAH", roles, {"x@256": 2, "default@256": 2, "full": 1, "window": 1}) == {caveats.FITTED}
    assert caveats.caveats(CE.name, {"gdn": "gdn"}, {"gdn": 1}) == {caveats.ONE_SEED, caveats.CE_ONLY}
    assert caveats.caveats("CR", {"gdn": "gdn", "full": "full"}, {"gdn": 3, "full": 1}) == set()
    assert caveats.cell(True, {caveats.CE_ONLY, caveats.FITTED, caveats.ONE_SEED}) == \
        "holds (fitted to the test format; one seed; on held-out CE only)"
    assert caveats.cell(False, set()) == "does not hold" and caveats.cell(None, {caveats.ONE_SEED}) == "not measured"


def test_a_training_free_role_reads_its_own_cells_and_no_held_out_ce(tmp_path):
    """A role '<recipe>,<cache options>' is the recipe's folder evaluated with those options: its cells are the
    ones keyed by the folder's files under that family name; the folder's held-out CE is not its own."""
    ck = tmp_path / "ck"
    checkpoint(ck, "gdn-w248-s8-sc", 3.4)
    store = Store(tmp_path / "store")
    opts = ",window=124,retain=124,retain_score=proj_residual"
    put_cr(store, "gdn-w248-s8-sc", 0.40, folder=ck / "gdn-w248-s8-sc")
    files = checkpoint_identity(ck / "gdn-w248-s8-sc")
    for task, metric in CR_TASKS.items():
        store.put({"key": {"model": f"base=smollm2-135m,checkpoint=gdn-w248-s8-sc,checkpoint_files={files}"
                           + opts.replace("window=124,", "") + ",window=124",
                           "task": task, "config": {"limit": None, "num_fewshot": 0}},
                   "model": {"label": "x", "family": "gdn-w248-s8-sc" + opts, "backbone": "smollm2-135m",
                             "full_attention": False, "budget": 256},
                   "task": task, "suite": "cr", "metric": metric, "n": 20,
                   "metrics": {f"{metric},none": {"value": 0.38, "stderr": 0.01}}})
    ev = evidence.evidence(store, ck)
    assert evidence.role_scores(ev, "gdn-w248-s8-sc", None, "CR")[0] == [pytest.approx(40.0)]
    assert evidence.role_scores(ev, "gdn-w248-s8-sc" + opts, None, "CR")[0] == [pytest.approx(38.0)]
    assert evidence.role_scores(ev, "gdn-w248-s8-sc" + opts, None, CE.name) == ([], "")
    assert evidence.role_scores(ev, "gdn-w248-s8-sc,window=60,retain=60,retain_score=proj_residual", None, "CR")[0] == []


def put_long(store, key, family, display, value, budget, *, context_length=4096, num_samples=500):
    """One S-NIAH / RULER cell, by default at 4K, 500 samples (`display` is the column, value in points)."""
    task = "golinear_" + display.lower().replace("-", "_")
    store.put({"key": {"model": key, "task": task, "config": {"limit": None, "context_length": context_length,
                                                               "num_samples": num_samples}},
               "model": {"label": family, "family": family, "backbone": "smollm2-135m", "full_attention": False,
                         "budget": budget},
               "task": task, "display": display, "suite": "ruler", "metric": "score", "n": 500,
               "metrics": {"score,none": {"value": value, "stderr": 1.0}}})


def test_retention_table_lays_out_the_retention_rows_at_equal_budget(tmp_path):
    """retention.md/.csv: at each budget the untrained window, the default recipe and the retention rows (claims'
    roles), each column the mean over the seeds measured in it; a suite's mean only where all its tasks are there."""
    from golinear.bench.claims import retention_table as R
    from golinear.bench.boards.measured import RULER_COLS, SNIAH_TASKS
    ck, store = tmp_path / "ck", Store(tmp_path / "store")
    for name, seed in (("gdn-w248-s8-sc", 0), ("gdn-w248-s8-sc-seed1", 1)):
        checkpoint(ck, name, 3.4, seed=seed)
    files = {n: checkpoint_identity(ck / n) for n in ("gdn-w248-s8-sc", "gdn-w248-s8-sc-seed1")}
    key = lambda n, opts="": f"base=smollm2-135m,checkpoint={n},checkpoint_files={files[n]}{opts}"  # noqa: E731
    for i, t in enumerate(SNIAH_TASKS):  # the default recipe, two seeds: 4 and 6, 5 and 7, 6 and 8
        put_long(store, key("gdn-w248-s8-sc"), "gdn-w248-s8-sc", t, 4.0 + i, 256)
        put_long(store, key("gdn-w248-s8-sc-seed1"), "gdn-w248-s8-sc-seed1", t, 6.0 + i, 256)
    put_long(store, key("gdn-w248-s8-sc"), "gdn-w248-s8-sc", "MK", 7.0, 256)  # one RULER task, seed 0
    numbers = ",window=124,retain=124,retain_score=fitted,scorer=numbers.safetensors"
    for t in RULER_COLS:  # the numbers scorer training-free on seed 0: all eight tasks at 10
        put_long(store, key("gdn-w248-s8-sc", numbers), "gdn-w248-s8-sc" + numbers, t, 10.0, 256)
    put_long(store, "base=smollm2-135m,mechanism=none,sinks=8,window=248", "window", "S-NIAH-1", 5.0, 256)
    table = R.long_table(evidence.evidence(store, ck))

    def get(row, col):
        return table[(table["budget"] == 256) & (table["row"] == row) & (table["column"] == col)]
    d = get("default", "S-NIAH-2").iloc[0]
    assert (d["mean"], d["n"]) == (pytest.approx(6.0), 2) and d["std"] == pytest.approx(statistics.stdev([5, 7]))
    assert get("default", "S-NIAH").iloc[0]["mean"] == pytest.approx(6.0)
    assert get("default", "MK").iloc[0]["n"] == 1 and get("default", "RULER").empty  # seven tasks missing
    free = "training-free, half as slots, numbers scorer [fitted to the test's value type: numbers]"
    assert get(free, "RULER").iloc[0]["mean"] == pytest.approx(10.0) and get(free, "S-NIAH").empty
    assert get(R.BASELINE, "S-NIAH-1").iloc[0]["mean"] == pytest.approx(5.0)
    assert set(table["budget"]) == {256} and "trained, half as slots" not in set(table["row"])
    md = R.to_markdown(table)
    assert "| 256 | default | 5.00 (2) | 6.00 (2) | 7.00 (2) | **6.00 (2)** | 7.00 |" in md
    assert f"| 256 | {free} |" in md and "| **10.00** |" in md and "`mechanism=none,window=248,sinks=8`" in md
    assert md.count("\n| 256 |") == 3


def test_long_context_evidence_is_the_studys_setting_only(tmp_path):
    """A cell of the same model and task at another context length or sample count (the needle-type matrix at 1K,
    50 samples) has its own table: averaged into the study's 4K cell it would move a verdict."""
    ck, store = tmp_path / "ck", Store(tmp_path / "store")
    checkpoint(ck, "gdn-w248-s8-sc", 3.4)
    key = f"base=smollm2-135m,checkpoint=gdn-w248-s8-sc,checkpoint_files={checkpoint_identity(ck / 'gdn-w248-s8-sc')}"
    put_long(store, key, "gdn-w248-s8-sc", "S-NIAH-1", 40.0, 256)
    put_long(store, key, "gdn-w248-s8-sc", "S-NIAH-1", 14.0, 256, context_length=1024, num_samples=50)
    put_long(store, key, "gdn-w248-s8-sc", "S-NIAH-1", 20.0, 256, num_samples=50)
    ev = evidence.evidence(store, ck)
    assert evidence.role_scores(ev, "gdn-w248-s8-sc", ["S-NIAH-1"], "S-NIAH")[0] == [pytest.approx(40.0)]


def test_retention_plot_draws_the_tables_suite_means_by_budget():
    """retention.png: a line per (suite mean, row) through the table's cells in budget order, the seeds' std as an
    error bar; no suite mean measured, no picture."""
    from golinear.bench.claims import retention_plot as P
    cells = [(512, "default", "RULER", 12.0, 0.5, 2), (256, "default", "RULER", 5.0, None, 1),
             (256, "default", "MK", 7.0, None, 1), (1024, "untrained window + sinks", "S-NIAH", 23.0, None, 1)]
    table = pd.DataFrame([{"budget": b, "row": r, "target": "", "column": c, "mean": m, "std": s, "n": n, "runs": ""}
                          for b, r, c, m, s, n in cells])
    assert P.series(table) == {("RULER", "default"): [(256, 5.0, None), (512, 12.0, 0.5)],
                               ("S-NIAH", "untrained window + sinks"): [(1024, 23.0, None)]}
    assert P.plot(table).startswith(b"\x89PNG")
    assert P.plot(table[table["column"] == "MK"]) is None


def test_direction_follows_the_metric():
    assert rules.close_gap({"full": 50.0, "gdn": 49.5}, CR)[0] is True  # higher is better: 0.5 points behind
    assert rules.close_gap({"full": 50.0, "gdn": 47.0}, CR)[0] is False
    assert rules.close_gap({"full": 3.47, "gdn": 3.0}, CE)[0] is True  # below full attention's loss: no gap


# ----------------------------------------------------------------------------- evidence and verdict vocabulary
def test_held_out_ce_verdicts_are_labelled_and_missing_roles_are_named(tmp_path):
    ck = tmp_path / "ck"
    for name, loss in {"gdn": 3.0, "kgla": 3.5, "gla": 3.51, "hedgehog": 4.5, "gdn-w56-s8": 3.8,
                       "gdn-w64": 3.7}.items():
        checkpoint(ck, name, loss)
    t = table(tmp_path)
    strict = row(t, "Strict ordering GDN")
    assert strict["verdict"] == "holds (one seed; on held-out CE only)" and "not the paper's metric" in strict["ours at 135M"]
    sinks = row(t, "Sinks beat")
    assert sinks["verdict"] == "does not hold (one seed; on held-out CE only)"
    assert "gla-w56-s8" in sinks["why"] and "kgla-w64" in sinks["why"]  # named, not silently dropped
    hybrid = row(t, "Hardness-selected")
    assert hybrid["verdict"] == "not measured" and "gdn-full10-hardness" in hybrid["why"]
    assert {caveats.base(v) for v in t["verdict"]} <= set(metrics.VERDICTS)


def test_store_rows_come_before_held_out_ce_and_name_a_short_run(tmp_path):
    ck = tmp_path / "ck"
    checkpoint(ck, "gdn-w56-s8-sc", 3.63, steps=379)
    checkpoint(ck, "gdn-w56-s8-sc-10m", 3.567)
    store = Store(tmp_path / "store")
    put_cr(store, "full", 0.50, full=True)
    put_cr(store, "gdn-w56-s8-sc", 0.499, folder=ck / "gdn-w56-s8-sc")  # 0.1 points behind: within 0.5
    put_cr(store, "gdn-w56-s8-sc-10m", 0.30, limit=20, folder=ck / "gdn-w56-s8-sc-10m")  # a subset: never used
    put_cr(store, "gdn-w56-s8-sc-10m", 0.20, folder=tmp_path)  # an earlier version of the folder: never used
    r = row(table(tmp_path, store), "Default recipe vs full attention: CR")
    assert r["verdict"] == "holds (one seed)" and "CR (points" in r["ours at 135M"]
    assert "379 of 2500 steps" in r["ours at 135M"] and "not yet evaluated: `gdn-w56-s8-sc-10m`" in r["ours at 135M"]
    put_cr(store, "gdn-w56-s8-sc-10m", 0.40, folder=ck / "gdn-w56-s8-sc-10m")  # finished, full sets: replaces it
    r = row(table(tmp_path, store), "Default recipe vs full attention: CR")
    assert r["verdict"] == "does not hold (one seed)" and "gdn 40.00" in r["ours at 135M"] and "379" not in r["ours at 135M"]


def test_seeds_spread_is_mean_and_sample_std_of_the_finished_seed_folders(tmp_path):
    ck = tmp_path / "ck"
    checkpoint(ck, "gdn-w56-s8-sc", 9.9, steps=379)  # short: left out while finished seeds exist
    checkpoint(ck, "gdn-w56-s8-sc-seed0", 9.8, seed=0)  # a second folder of seed 0: counted once
    for name, loss, seed in (("gdn-w56-s8-sc-10m", 3.0, 0), ("gdn-w56-s8-sc-seed1", 3.2, 1),
                             ("gdn-w56-s8-sc-seed2", 3.4, 2)):
        checkpoint(ck, name, loss, seed=seed)
    checkpoint(ck, "kgla-w56-s8-sc", 3.21)
    r = row(table(tmp_path), "With the short conv")
    assert r["seeds"] == f"gdn: {3.2:.4f} +- {statistics.stdev([3.0, 3.2, 3.4]):.4f} (3 seeds)"
    assert "gdn 3.200" in r["ours at 135M"] and r["verdict"] == "holds (one seed; on held-out CE only)"  # kgla: 1 seed


def test_seeds_table_is_mean_and_std_of_each_columns_seeds(tmp_path):
    """seeds.md/.csv: one row per recipe with two or more finished seeds (a short run and a one-seed recipe are
    left out), each column's mean +- sample std over the seeds that have it, every seed's value in the CSV."""
    from golinear.bench.claims import seeds
    ck, store = tmp_path / "ck", Store(tmp_path / "store")
    checkpoint(ck, "gdn-w56-s8-sc", 9.9, steps=379)
    for name, loss, seed in (("gdn-w56-s8-sc-10m", 3.0, 0), ("gdn-w56-s8-sc-seed1", 3.2, 1),
                             ("gdn-w56-s8-sc-seed2", 3.4, 2)):
        checkpoint(ck, name, loss, seed=seed)
    checkpoint(ck, "kgla-w56-s8-sc", 3.21)
    put_cr(store, "full", 0.50, full=True)
    put_cr(store, "gdn-w56-s8-sc", 0.30, folder=ck / "gdn-w56-s8-sc")  # the short run: not a seed
    put_cr(store, "gdn-w56-s8-sc-10m", 0.40, folder=ck / "gdn-w56-s8-sc-10m")
    put_cr(store, "gdn-w56-s8-sc-seed1", 0.44, folder=ck / "gdn-w56-s8-sc-seed1")  # seed 2: no cells yet
    put_cr(store, "kgla-w56-s8-sc", 0.45, folder=ck / "kgla-w56-s8-sc")
    ev = evidence.evidence(store, ck)
    md = seeds.to_markdown(ev)
    gdn = next(line for line in md.splitlines() if line.startswith("| gdn-w56-s8-sc |")).split(" | ")
    header = next(line for line in md.splitlines() if line.startswith("| recipe |")).split(" | ")
    cell = dict(zip(header, gdn))
    assert cell["CR"] == f"42.00 ± {statistics.stdev([40.0, 44.0]):.2f} (2)" and cell["PIQA"] == cell["CR"]
    assert cell["held-out CE |"].startswith(f"3.200 ± {statistics.stdev([3.0, 3.2, 3.4]):.3f} (3)")
    assert "kgla" not in md and "| full attention |  | 50.00 (1) |" in md
    csv = seeds.long_table(ev).set_index(["recipe", "column"])
    assert csv.loc[("gdn-w56-s8-sc", "CR"), "values"] == "gdn-w56-s8-sc-10m=40.0000 gdn-w56-s8-sc-seed1=44.0000"
    assert csv.loc[("gdn-w56-s8-sc", "held-out CE"), "n"] == 3


def test_paper_tables_put_each_recipe_beside_the_papers_row(tmp_path):
    """tables.md/.csv: full attention, then every mechanism x recipe of the paper's Tables 1-3 (Hedgehog only
    strict), ours as mean ± std over the finished seeds (store cells; held-out CE from the folders), the paper's CR
    and LAMBADA of the same row from the reference CSV; a recipe without cells has empty cells."""
    from golinear.bench.claims import paper_tables
    ck, store = tmp_path / "ck", Store(tmp_path / "store")
    for name, loss, seed in (("gdn-w56-s8-sc-10m", 3.0, 0), ("gdn-w56-s8-sc-seed1", 3.2, 1),
                             ("gdn-w56-s8-sc-seed2", 3.4, 2)):
        checkpoint(ck, name, loss, seed=seed)
    checkpoint(ck, "kgla-w64", 4.07)
    checkpoint(ck, "kgla-onorm", 4.17)
    put_cr(store, "full", 0.50, full=True)
    put_cr(store, "gdn-w56-s8-sc-10m", 0.40, folder=ck / "gdn-w56-s8-sc-10m")
    put_cr(store, "gdn-w56-s8-sc-seed1", 0.44, folder=ck / "gdn-w56-s8-sc-seed1")  # seed 2: no cells yet
    put_cr(store, "kgla-w64", 0.45, folder=ck / "kgla-w64")
    t = paper_tables.frame(evidence.evidence(store, ck), load_reference(REFERENCE_DIR))
    assert len(t) == 1 + 4 + 4 * 3 + 3  # + our ablation: strict + output norm for GLA, kGLA, GDN
    by = t.set_index(["recipe", "mechanism"])
    conv = by.loc[("SWA 56 + 8 sinks + short conv", "GDN")]
    assert (conv["CR mean"], conv["CR n"]) == (pytest.approx(42.0), 2)
    assert conv["CR std"] == pytest.approx(statistics.stdev([40.0, 44.0]))
    assert (conv["held-out CE mean"], conv["held-out CE n"]) == (pytest.approx(3.2), 3)
    assert conv["paper CR Llama-3.1-8B"] == pytest.approx(73.77)  # Table 7's GDN + short conv
    swa64 = by.loc[("SWA 64", "kGLA")]
    assert swa64["CR mean"] == pytest.approx(45.0) and swa64["paper CR Llama-3.1-8B"] == pytest.approx(68.36)
    assert by.loc[("full attention", "-")]["CR mean"] == pytest.approx(50.0)
    strict = by.loc[("strict (no window, frozen q/k/v)", "GLA")]
    assert strict["CR n"] == 0 and strict["paper CR Llama-3.1-8B"] == pytest.approx(61.81)
    onorm = by.loc[("strict + output RMSNorm (`--out-norm`)", "kGLA")]  # the paper has no such row
    assert onorm["paper table"] == "ours, not in the paper" and onorm["held-out CE mean"] == pytest.approx(4.17)
    assert pd.isna(onorm["paper CR Llama-3.1-8B"]) and onorm["CR n"] == 0
    md = paper_tables.to_markdown(t)
    assert "| 42.00 ± 2.83 (2) |" in md and "| 45.00 |" in md
    assert md.count("| Hedgehog |") == 1 and md.count("\n| ") == len(t) + 1


def test_the_rule_is_applied_to_the_papers_numbers(tmp_path):
    (tmp_path / "ck").mkdir()
    t = table(tmp_path)
    assert row(t, "Short conv beats LoRA")["rule on the paper's numbers"] == \
        "Llama-3.1-8B: holds; Qwen3-8B-Base: does not hold"  # Table 7: LoRA ahead on Qwen's CR
    assert "gdn 63.08" in row(t, "Strict ordering GDN")["paper's numbers"]


# ----------------------------------------------------------------------------- the real files, the command
def test_renders_from_the_repository_files(tmp_path):
    changed = render.render(REPO_ROOT / "leaderboards" / "store", REPO_ROOT / "checkpoints" / "smollm2-135m", tmp_path,
                       REFERENCE_DIR)
    assert {p.name for p in changed} == {"claims.md", "claims.csv", "seeds.md", "seeds.csv", "tables.md", "tables.csv",
                                         "retention.md", "retention.csv", "retention.png"}
    md = (tmp_path / "claims.md").read_text()
    assert all(c.text in md for c in catalog.CLAIMS) and md.count("\n| ") == len(catalog.CLAIMS) + 1
    assert render.render(REPO_ROOT / "leaderboards" / "store", REPO_ROOT / "checkpoints" / "smollm2-135m", tmp_path,
                    REFERENCE_DIR) == []  # deterministic: nothing rewritten


def test_the_readme_table_is_the_generated_one(tmp_path):
    """The README's claims table is what `golinear claims` writes from the committed files (a copy re-rendered is
    unchanged); a README without the markers is left as it is, and the table replaces whatever stood between them."""
    readme = tmp_path / "README.md"
    readme.write_text((REPO_ROOT / "README.md").read_text())
    out = tmp_path / "lb"
    render.render(REPO_ROOT / "leaderboards" / "store", REPO_ROOT / "checkpoints" / "smollm2-135m", out, REFERENCE_DIR,
             readme)
    assert readme.read_text() == (REPO_ROOT / "README.md").read_text()
    table = verdicts.claims_table(Store(REPO_ROOT / "leaderboards" / "store"), REPO_ROOT / "checkpoints" / "smollm2-135m",
                           REFERENCE_DIR)
    text = f"intro\n{page.README_BEGIN}\nstale | row\n{page.README_END}\nafter\n"
    new = page.readme_with_table(text, table)
    assert new.startswith(f"intro\n{page.README_BEGIN}\n| claim |") and new.endswith(f"{page.README_END}\nafter\n")
    assert "stale" not in new and new.count("\n| ") == len(catalog.CLAIMS) + 1
    assert page.readme_with_table(new, table) == new and page.readme_with_table("no markers\n", table) == "no markers\n"


def test_missing_input_is_a_one_line_error(tmp_path, capsys):
    assert cli_main(["claims", "--store", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "result store" in err and "nope" in err
