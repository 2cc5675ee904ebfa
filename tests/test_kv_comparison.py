"""kv-compression.md/.csv/.png: the presses beside the linearized rows at equal budgets, on the settings a press ran at."""
import pandas as pd
import pytest

from golinear.bench.boards import kv_comparison as K
from golinear.bench.boards.leaderboard import render
from golinear.bench.boards.measured import measured_frame
from golinear.bench.results.store import Store


def cell(key, label, task, value, budget, *, family=None, full=False, ctx=4096, n=50, linearize=None):
    t = "golinear_" + task.lower().replace("-", "_")
    return {"key": {"model": key, "task": t, "config": {"limit": None, "context_length": ctx, "num_samples": n,
                                                         "seed": 42}},
            "model": {"label": label, "family": family or label, "backbone": "smollm2-135m", "full_attention": full,
                      "budget": "inf" if full else budget, "info": {"linearize": linearize or {}}},
            "task": t, "display": task, "suite": "sniah", "metric": "score", "n": n,
            "metrics": {"score,none": {"value": value, "stderr": 1.0}}}


def cells():
    out = []
    for i, task in enumerate(["S-NIAH-1", "S-NIAH-2", "S-NIAH-3"]):
        out.append(cell("base=smollm2-135m", "full", task, 90.0 + i, None, full=True))
        for b in (256, 1024):
            out.append(cell(f"base=smollm2-135m,press=snapkv,kv_budget={b}", f"snapkv (kvpress) @{b}", task,
                            b / 32 + i, b, family="snapkv (kvpress)"))
            out.append(cell(f"base=smollm2-135m,mechanism=none,sinks=8,window={b - 8}", f"swa-sink @{b}", task,
                            b / 64, b, family="swa-sink"))
        out.append(cell("base=smollm2-135m,kv_budget=256,press=streaming_llm", "streaming_llm (kvpress) @256", task,
                        4.0 + 2 * i, "256", family="streaming_llm (kvpress)"))
        out.append(cell("base=smollm2-135m,checkpoint=gdn-w248-s8-sc", "gdn-w248-s8-sc", task, 20.0, 256,
                        linearize={"mechanism": "gdn", "window": 248, "sinks": 8}))
        # a linearized row at the study's setting only: no press ran there, so it is not in this comparison
        out.append(cell("base=smollm2-135m,checkpoint=gdn-w248-s8-sc", "gdn-w248-s8-sc", task, 30.0, 256, n=500,
                        linearize={"mechanism": "gdn", "window": 248, "sinks": 8}))
    return out


def test_rows_are_the_press_settings_side_by_side_by_budget():
    t = K.table(measured_frame(cells()))
    assert set(t["n"]) == {50}  # the 500-sample cell has no press beside it
    at256 = t[(t["budget"] == "256") & (t["row"] != K.STREAMING)].set_index("kind")
    assert at256.loc[K.KINDS["press"], "S-NIAH"] == pytest.approx(8 + 1)
    assert at256.loc[K.KINDS["linearized"], "S-NIAH-1"] == pytest.approx(20.0)
    assert at256.loc[K.KINDS["window"], "S-NIAH"] == pytest.approx(4.0)
    assert list(t["budget"]) == ["256", "256", "256", "256", "1024", "1024", "inf"]
    md = K.to_markdown(t)
    assert "4096 tokens, 50 samples a task" in md and "| 1024 | KV-cache compression (kvpress) | snapkv" in md
    assert K.plot(t)[:4] == b"\x89PNG"


def test_no_press_no_rows():
    without = [c for c in cells() if "press=" not in c["key"]["model"]]
    t = K.table(measured_frame(without))
    assert t.empty and "No press" in K.to_markdown(t)


def test_the_leaderboard_writes_the_comparison(tmp_path):
    store = Store(tmp_path / "store")
    for c in cells():
        store.put(c)
    render(store, tmp_path / "out")
    md = (tmp_path / "out" / "kv-compression.md").read_text()
    assert md.startswith("# Linearize or compress the KV cache") and "kv-compression.png" in md
    assert (tmp_path / "out" / "kv-compression.png").read_bytes()[:4] == b"\x89PNG"


def test_the_streaming_press_is_checked_against_the_window_and_a_partial_row_has_no_mean():
    """The cross-check sentence compares the StreamingLLM press with window + sinks task by task, in points and
    samples; a row missing a task shows no (bold) mean; a question-aware press is its own family."""
    rows = cells() + [cell("base=smollm2-135m,kv_budget=256,press=snapkv,question_aware=true",
                           "snapkv (kvpress, question-aware) @256", "S-NIAH-1", 50.0, "256",
                           family="snapkv (kvpress, question-aware)")]
    t = K.table(measured_frame(rows))
    md = K.to_markdown(t)
    # window + sinks at 256 scores 4.0 on every task; the press 4, 6, 8: 4 points = 2 of 50 samples at most
    assert "at 256, 4.00 against 4.00, 6.00 against 4.00, 8.00 against 4.00 (largest difference 4.00 points, " \
           "2 of 50 samples)" in md
    qa = t[t["row"] == "snapkv (kvpress, question-aware)"]
    assert list(qa["kind"]) == [K.KINDS["press_qa"]] and qa["S-NIAH"].isna().all()
    assert "| 256 | KV-cache compression, question-aware (kvpress) | snapkv (kvpress, question-aware) | 50.00 ±2.0 |  " \
           "|  |  |" in md and "****" not in md


def test_peak_memory_is_shown_beside_the_scores_when_a_latency_run_is_there(tmp_path):
    """kv-compression.md carries one peak-memory column per prompt length from kv-memory/latency.csv (a
    `golinear latency` run), rows grouped by family; without the file, no memory table."""
    from golinear.bench.boards import kv_memory
    from golinear.bench.speed import latency
    base = dict(model="smollm2-135m", weights="real", dtype="float32", batch=1, device="cpu", new_tokens=4,
                status="ok", date="2026-12-05")
    peaks = {"full": (1.2, 2.9), "snapkv (kvpress) @1024": (1.3, 3.1),
             "snapkv (kvpress, chunked prefill 2048) @1024": (1.1, 1.2), "gdn-default,window=1016": (1.0, 1.1),
             "swa-sink,window=1016": (1.0, 1.05)}
    csv = tmp_path / "out" / "kv-memory" / "latency.csv"
    csv.parent.mkdir(parents=True)
    latency.merge_rows(csv, [dict(base, config=c, length=L, peak_gib=p) for c, ps in peaks.items()
                             for L, p in zip((4096, 32768), ps)])
    t = kv_memory.table(csv)
    assert list(t["family"]) == ["full attention", K.KINDS["press"], K.KINDS["press"], "linearized",
                                 K.KINDS["window"]]
    assert t.set_index("config").at["full", "32768 tokens"] == pytest.approx(2.9)
    store = Store(tmp_path / "store")
    for c in cells():
        store.put(c)
    render(store, tmp_path / "out")
    md = (tmp_path / "out" / "kv-compression.md").read_text()
    assert "| snapkv (kvpress, chunked prefill 2048) @1024 | KV-cache compression (kvpress) | 1.10 | 1.20 | +0.10 |" \
        in md and "| full | full attention | 1.20 | 2.90 | +1.70 |" in md and "growth, 4096 to 32768" in md
    assert "the process's peak resident set" in md and "smollm2-135m float32 on cpu, batch 1" in md
    assert kv_memory.markdown(tmp_path / "missing.csv") == ""


def test_one_recipe_trained_at_each_budget_is_one_row_though_the_study_has_its_seeds():
    """The default recipe's checkpoints at 256 and 1024 make one line across budgets: a second seed at the study's
    setting (500 samples, no press there) does not crowd the comparison's family into checkpoint labels."""
    lin = dict(mechanism="gdn", sinks=8, short_conv=True)
    extra = []
    for task in ("S-NIAH-1", "S-NIAH-2", "S-NIAH-3"):
        for b in (256, 1024):
            extra.append(cell(f"base=smollm2-135m,checkpoint=gdn-w{b - 8}-s8-sc", f"gdn-w{b - 8}-s8-sc", task, b / 16, b,
                              linearize=dict(lin, window=b - 8)))
        extra.append(cell("base=smollm2-135m,checkpoint=gdn-w248-s8-sc-seed1", "gdn-w248-s8-sc-seed1", task, 1.0, 256,
                          n=500, linearize=dict(lin, window=248)))
        extra.append(cell("base=smollm2-135m,checkpoint=gdn-w248-s8-sc", "gdn-w248-s8-sc", task, 2.0, 256, n=500,
                          linearize=dict(lin, window=248)))
    for c in extra:
        c["model"]["info"]["trained"] = True
    base = [c for c in cells() if "checkpoint=" not in c["key"]["model"]]
    t = K.table(measured_frame(base + extra))
    rows = t[t["kind"] == K.KINDS["linearized"]]
    assert list(rows["budget"]) == ["256", "1024"] and rows["row"].nunique() == 1
    assert rows["row"].iloc[0].endswith("trained at each budget") and list(rows["S-NIAH"]) == [16.0, 64.0]


def test_every_mean_has_its_interval_and_a_winner_only_where_the_paired_interval_excludes_0():
    """± is 1.96 standard errors (the mean of three tasks: their errors combined); at each budget the best press and
    the best linearized row are compared sample by sample, and a winner is named only where the difference's 95 %
    interval excludes 0. Cells without per-sample scores (stored before golinear kept them) get no paired test."""
    import random
    rng = random.Random(0)
    rows = cells()
    t = K.table(measured_frame(rows))
    r = t[(t["budget"] == "1024") & (t["kind"] == K.KINDS["press"])].iloc[0]
    assert r["S-NIAH-1 ±"] == pytest.approx(1.96) and r["S-NIAH ±"] == pytest.approx(1.96 * 3 ** 0.5 / 3)
    assert "33.00 ±2.0" in K.to_markdown(t) and "no paired comparison" in K.to_markdown(t)

    def scores(p):  # 50 samples a task, each right with probability p
        return {f"t/{i}/h": 100.0 * (rng.random() < p) for i in range(50)}
    for c in rows:
        key = c["key"]["model"]
        if "press=snapkv" in key and "1024" in key:
            c["per_sample"] = {f"{c['task']}/{k}": v for k, v in scores(0.9).items()}
        elif "checkpoint=gdn-w248-s8-sc" in key:
            c["per_sample"] = {f"{c['task']}/{k}": v for k, v in scores(0.2).items()}
        elif "press=snapkv" in key and "256" in key:
            c["per_sample"] = {f"{c['task']}/{k}": v for k, v in scores(0.25).items()}
    lin1024 = [cell(f"base=smollm2-135m,checkpoint=gdn-w1016-s8-sc", "gdn-w1016-s8-sc", task, 30.0, 1024,
                    linearize={"mechanism": "gdn", "window": 1016, "sinks": 8}) for task in ("S-NIAH-1", "S-NIAH-2",
                                                                                            "S-NIAH-3")]
    for c in lin1024:
        c["per_sample"] = {f"{c['task']}/{k}": v for k, v in scores(0.3).items()}
    md = K.to_markdown(K.table(measured_frame(rows + lin1024)))
    at = {line.split(":")[0]: line for line in md.splitlines() if line.startswith("- at ")}
    assert "the press better: +" in at["- at 1024"] and "over 150 paired samples" in at["- at 1024"]
    assert "no difference: " in at["- at 256"]  # 25 % against 20 % right on 150 samples: the interval holds 0


def test_a_row_fitted_to_the_test_format_is_shown_but_never_the_best_linearized():
    """A retention scorer fitted to 7-digit numbers (the S-NIAH needles' format) is tuned to the test: its row is
    labelled so and the paired comparison takes the best of the other linearized rows."""
    label = "gdn-w248-s8-sc,window=124,retain=124,retain_score=fitted,scorer=numbers.safetensors"
    fitted = [cell(f"base=smollm2-135m,checkpoint=gdn-w248-s8-sc,retain=124,retain_score=fitted,"
                   f"scorer=numbers.safetensors,window=124", label, task, 99.0, 256,
                   linearize={"mechanism": "gdn", "window": 124, "sinks": 8, "retain": 124})
              for task in ("S-NIAH-1", "S-NIAH-2", "S-NIAH-3")]
    t = K.table(measured_frame(cells() + fitted))
    assert list(t[t["row"] == label]["kind"]) == [K.KINDS["fitted"]]
    (_, budget, press, lin, _), = [p for p in K.best_pairs(t) if p[1] == "256"]
    assert lin["row"] != label and lin["S-NIAH"] == pytest.approx(20.0)
    assert "linearized, scorer fitted to the test's needle format" in K.to_markdown(t)


def test_each_panel_spans_its_own_budgets_names_its_own_rows_and_shows_every_interval():
    """A panel's x axis has ticks at the budgets it holds and no other; its legend names the rows it draws (no
    shared legend of every panel's rows); the rows at one budget sit side by side, so no interval hides another."""
    short = [cell("base=smollm2-135m,press=kvzip,kv_budget=256", "kvzip (kvpress) @256", task, 60.0 + i, 256,
                  family="kvzip (kvpress)", ctx=1024) for i, task in enumerate(["S-NIAH-1", "S-NIAH-2", "S-NIAH-3"])]
    short += [cell("base=smollm2-135m,mechanism=none,sinks=8,window=248", "swa-sink @256", task, 20.0, 256,
                   family="swa-sink", ctx=1024) for task in ["S-NIAH-1", "S-NIAH-2", "S-NIAH-3"]]
    t = K.table(measured_frame(cells() + short))
    fig = K.figure(t)
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert len(panels) == 2 and not fig.legends
    for (ctx, n), g in t[t["S-NIAH"].notna()].groupby(["context", "n"]):
        ax = next(a for title, a in panels.items() if f"{ctx} tokens" in title)
        drawn = g[g["kind"] != K.KINDS["full"]]
        budgets = sorted({int(b) for b in drawn["budget"]})
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(b) for b in budgets]
        lo, hi = ax.get_xlim()
        assert lo < budgets[0] and hi > budgets[-1] and hi / lo < 4 * budgets[-1] / budgets[0]
        names = [t.get_text() for t in ax.get_legend().get_texts()]
        assert sorted(names) == sorted(set(g["row"]))  # full attention's line among them where it ran
        xs = [x for line in ax.get_lines() if line.get_marker() == "o" for x in line.get_xdata()]
        assert len(xs) == len(drawn) and len(set(xs)) == len(xs)  # no two points (and their bars) at one x
    K.pyplot().close(fig)


def test_a_bf16_run_is_a_table_of_its_own_and_the_study_setting_supersedes_the_others():
    """Rows are compared only within one setting (context, samples, dtype): the GPU matrix in bf16 at 4K and 500
    samples is its own table, first, its recipe's checkpoints one family there (the float32 ones of the same recipe
    crowd nothing), and the smaller float32 tables are marked superseded (and the paired CSV says so)."""
    lin = dict(mechanism="gdn", sinks=8)  # the recipe of cells()' float32 row at 256
    gpu = []
    for task in ("S-NIAH-1", "S-NIAH-2", "S-NIAH-3"):
        for b in (256, 1024):
            gpu.append(cell(f"base=smollm2-135m,press=snapkv,kv_budget={b},dtype=bfloat16", f"snapkv (kvpress) @{b}",
                            task, 1.0, b, family="snapkv (kvpress)", n=500))
            gpu.append(cell(f"checkpoint=gdn-w{b - 8}-s8-sc,dtype=bfloat16", f"gdn-w{b - 8}-s8-sc,dtype=bfloat16", task,
                            b / 16, b, n=500, linearize=dict(lin, window=b - 8)))
        gpu.append(cell("base=smollm2-135m,dtype=bfloat16", "full,dtype=bfloat16", task, 80.0, None, full=True, n=500))
    for c in gpu:
        c["model"]["args"] = {"dtype": "bfloat16"}
    t = K.table(measured_frame(cells() + gpu))
    assert list(dict.fromkeys(zip(t["n"], t["dtype"], t["superseded"]))) == [(500, "bfloat16", False),
                                                                          (50, "float32", True)]
    bf16 = t[t["dtype"] == "bfloat16"]
    lin_rows = bf16[bf16["kind"] == K.KINDS["linearized"]]
    assert lin_rows["row"].nunique() == 1 and lin_rows["row"].iloc[0].endswith(", untrained")  # as cells() has it
    assert list(bf16[bf16["kind"] == K.KINDS["full"]]["S-NIAH"]) == [80.0]  # the float32 full row is not averaged in
    md = K.to_markdown(t)
    assert md.index("500 samples a task, bfloat16, the same samples") < md.index(
        "50 samples a task, float32 (superseded by the 500-sample table at 4096 tokens above)")
    paired = K.paired_table(t)
    assert set(zip(paired["dtype"], paired["superseded"])) == {("bfloat16", False), ("float32", True)}


def test_the_page_shows_the_current_table_then_its_costs_and_ruler_and_the_superseded_tables_last(tmp_path):
    """kv-compression.md: the current setting's table, its trade-off table, the figure, then the superseded ones."""
    gpu = []
    for task in ("S-NIAH-1", "S-NIAH-2", "S-NIAH-3"):
        gpu.append(cell("base=smollm2-135m,press=snapkv,kv_budget=256", "snapkv (kvpress) @256", task, 40.0, 256,
                        family="snapkv (kvpress)", n=500))
        gpu.append(cell("checkpoint=gdn-w248-s8-sc", "gdn-w248-s8-sc", task, 20.0, 256, n=500,
                        linearize={"mechanism": "gdn", "window": 248, "sinks": 8}))
    for c in gpu:
        c["per_sample"] = {f"{c['task']}/{i}/h": c["metrics"]["score,none"]["value"] for i in range(500)}
    store = Store(tmp_path / "store")
    for c in cells() + gpu:
        store.put(c)
    render(store, tmp_path / "out")
    md = (tmp_path / "out" / "kv-compression.md").read_text()
    where = [md.index(s) for s in ("500 samples a task, float32, the same samples", "The trade-off at each budget",
                                   "![S-NIAH mean", "50 samples a task, float32 (superseded")]
    assert where == sorted(where), where


def test_ruler_cells_of_a_press_get_the_same_comparison_in_their_own_table(tmp_path):
    """Where a press ran RULER, its eight tasks are a table of their own (a mean only over all eight) with the same
    paired comparison; S-NIAH's table is unchanged by them, and the leaderboard writes both CSVs."""
    import random
    rng = random.Random(1)

    def ruler(key, label, task, p, budget, **kw):
        c = cell(key, label, task, 0.0, budget, n=100, **kw)
        c["suite"] = "ruler"
        c["task"] = c["key"]["task"] = f"golinear_ruler_{task.lower()}"
        c["per_sample"] = {f"{c['task']}/{i}/h": 100.0 * (rng.random() < p) for i in range(100)}
        c["metrics"]["score,none"]["value"] = sum(c["per_sample"].values()) / 100
        return c
    rows = []
    for task in K.RULER.tasks:
        rows.append(ruler("base=smollm2-135m,press=kvzip,kv_budget=1024", "kvzip (kvpress) @1024", task, 0.6, 1024,
                          family="kvzip (kvpress)"))
        rows.append(ruler("base=smollm2-135m,checkpoint=gdn-w1016-s8-sc", "gdn-w1016-s8-sc", task, 0.2, 1024,
                          linearize={"mechanism": "gdn", "window": 1016, "sinks": 8}))
    partial = [ruler("base=smollm2-135m,press=lagkv,kv_budget=1024", "lagkv (kvpress) @1024", "MK", 0.9, 1024,
                     family="lagkv (kvpress)")]
    t = K.table(measured_frame(rows + partial), K.RULER)
    assert list(t.columns[7:16]) == [*K.RULER.tasks, "RULER"]
    by = t.set_index("row")
    assert by.loc["lagkv (kvpress)", "MK"] > 0 and pd.isna(by.loc["lagkv (kvpress)", "RULER"])  # 1 task of 8: no mean
    md = K.to_markdown(t)
    assert md.startswith("RULER's eight tasks at 4096 tokens, 100 samples a task") and "| MK | MQ |" in md
    assert "the press better: +" in md and "over 800 paired samples" in md
    paired = K.paired_table(t)
    assert list(paired["press"]) == ["kvzip (kvpress)"] and "press RULER" in paired.columns
    assert K.table(measured_frame(rows)).empty  # no S-NIAH cell: the S-NIAH comparison has no rows

    store = Store(tmp_path / "store")
    for c in rows + cells():
        store.put(c)
    render(store, tmp_path / "out")
    assert "RULER's eight tasks at 4096 tokens" in (tmp_path / "out" / "kv-compression.md").read_text()
    assert "kvzip (kvpress)" in (tmp_path / "out" / "kv-compression-ruler-paired.csv").read_text()
