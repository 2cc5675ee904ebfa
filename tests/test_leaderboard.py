"""Leaderboard rendering from synthetic cells (the point here is rendering, not evaluation).

The real-model path (golinear run -> leaderboard) is covered in tests/test_runner.py.
"""
import re

import pandas as pd
import pytest

from golinear.bench.boards import leaderboard as L
from golinear.bench.run.specs import WINDOW_ONLY_LABEL
from golinear.bench.results.store import Store

STD = {"golinear_piqa": ("acc", "cr"), "golinear_arc_easy": ("acc", "cr"), "golinear_arc_challenge": ("acc_norm", "cr"),
       "golinear_hellaswag": ("acc_norm", "cr"), "golinear_winogrande": ("acc", "cr"), "golinear_mmlu": ("acc", "mmlu"),
       "golinear_lambada_openai": ("acc", "lambada")}


def put(store, label, key, task, metrics, *, suite, full=False, budget="inf", config=None, n=20, family=None,
        backbone="smollm2-135m"):
    store.put({"key": {"model": key, "task": task, "config": config or {"limit": 20, "num_fewshot": 0}},
               "model": {"label": label, "family": family or label, "backbone": backbone, "full_attention": full,
                         "budget": budget, "new_parameters": 0 if full else 1_234_567},
               "task": task, "suite": suite, "metric": next(iter(metrics)), "n": n,
               "metrics": {f"{m},none": {"value": v, "stderr": 0.01} for m, v in metrics.items()}})


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store")
    scores = {"full": 0.60, "gdn-default": 0.50, "gla-default": 0.55}
    for i, (task, (metric, suite)) in enumerate(STD.items()):
        for label, base in scores.items():
            metrics = {metric: base + 0.01 * i}
            if task == "golinear_lambada_openai":
                metrics["perplexity"] = 20.0 if label == "full" else 35.0
            put(s, label, f"base=smollm2-135m,m={label}", task, metrics, suite=suite, full=label == "full",
                budget="inf" if label == "full" else 64)
    long_cfg = {"limit": 5, "context_length": 4096, "num_samples": 5, "seed": 42}
    for task in ("golinear_sniah_1", "golinear_sniah_2", "golinear_sniah_3"):
        put(s, "full", "base=smollm2-135m,m=full", task, {"score": 100.0}, suite="sniah", full=True,
            config=long_cfg, n=5)
        for b in (128, 256):
            put(s, f"gdn-default @{b}", f"m=gdn,b={b}", task, {"score": b / 10.0}, suite="sniah", budget=b,
                family="gdn-default", config=long_cfg, n=5)
            put(s, f"window @{b}", f"m=none,b={b}", task, {"score": 0.0}, suite="sniah", budget=b,
                family=WINDOW_ONLY_LABEL, config=long_cfg, n=5)
    for sub in L.RULER_COLS:
        put(s, "gdn-default @128", "m=gdn,b=128", f"golinear_ruler_{sub.lower()}", {"score": 10.0}, suite="ruler",
            budget=128, family="gdn-default", config=long_cfg, n=3 if sub == "HQA" else 5)
    return s


def test_standard_table_rows_columns_and_gap(store, tmp_path):
    L.render(store, tmp_path / "out")
    t = pd.read_csv(tmp_path / "out" / "standard.csv")
    measured = t[t.status == "measured"].set_index("model")
    assert list(measured.index) == ["full", "gdn-default", "gla-default"]  # full first, then by name
    assert measured.loc["full", "PIQA"] == pytest.approx(60.0)
    assert measured.loc["full", "CR"] == pytest.approx(sum(60 + i for i in range(5)) / 5)
    assert measured.loc["gla-default", "LAMBADA ppl"] == pytest.approx(35.0)  # not scaled to %
    gap = t[(t.status == "gap") & (t.source == "measured")].iloc[0]
    assert gap["CR"] == pytest.approx(5.0) and gap["MMLU"] == pytest.approx(5.0)  # full - best (gla)
    assert pd.isna(gap["LAMBADA ppl"])


def test_reference_gap_rows_reproduce_the_paper(store, tmp_path):
    """Tables 1-3 print 'Gap with Full, %' = full - best linearized; ours must give the same numbers."""
    L.render(store, tmp_path / "out")
    t = pd.read_csv(tmp_path / "out" / "standard.csv")
    gaps = t[t.status == "gap"].set_index(["source", "backbone"])
    paper = {("arXiv 2607.07706 Table 5 (= Table 1)", "Llama-3.1-8B"): (10.9, 37.7, 30.12),
             ("arXiv 2607.07706 Table 5 (= Table 1)", "Qwen3-8B-Base"): (17.18, 51.37, 47.35),
             ("arXiv 2607.07706 Table 6 (= Table 2)", "Llama-3.1-8B"): (0.17, 6.37, 5.97),
             ("arXiv 2607.07706 Table 6 (= Table 2)", "Qwen3-8B-Base"): (0.27, 5.97, 6.42),
             ("arXiv 2607.07706 Table 7 (= Table 3)", "Llama-3.1-8B"): (0.16, 6.08, 4.50),
             ("arXiv 2607.07706 Table 7 (= Table 3)", "Qwen3-8B-Base"): (-1.44, 5.84, 3.01)}
    for key, (cr, mmlu, lam) in paper.items():
        row = gaps.loc[key]
        assert (round(row["CR"], 2), round(row["MMLU"], 2), round(row["LAMBADA"], 2)) == (cr, mmlu, lam), key


def test_reference_rows_are_marked_and_cover_the_tables(store, tmp_path):
    L.render(store, tmp_path / "out")
    t = pd.read_csv(tmp_path / "out" / "standard.csv")
    rep = t[t.status == "reported"]
    for table in ("Table 4", "Table 5", "Table 6", "Table 7", "Table 10"):
        assert rep.source.str.contains(table).any(), table
    for prior in ("Llamba", "LoLCATs", "Liger-GLA", "Lizard", "LoLA", "STILL"):
        assert rep.model.str.startswith(prior).any(), prior
    assert set(rep.backbone) >= {"Llama-3.1-8B", "Qwen3-0.6B-Base", "Qwen3-32B (instruct)"}
    # Table 10 prints no CR: it is the mean of the five reported tasks
    q06 = rep[(rep.backbone == "Qwen3-0.6B-Base") & (rep.model == "Full attention")].iloc[0]
    assert q06["CR"] == pytest.approx((70.24 + 65.74 + 38.31 + 53.69 + 58.56) / 5)


def test_budget_tables(store, tmp_path):
    L.render(store, tmp_path / "out")
    s = pd.read_csv(tmp_path / "out" / "sniah.csv")
    m = s[s.status == "measured"]
    assert list(m.model.unique()) == ["full attention", "gdn-default", WINDOW_ONLY_LABEL]
    g = m[(m.model == "gdn-default") & (m.task == "S-NIAH-2")].iloc[0]
    assert (g["128"], g["256"]) == (12.8, 25.6) and pd.isna(g["inf"])
    assert m[m.model == "full attention"]["inf"].tolist() == [100.0] * 3
    rep = s[s.status == "reported"]
    assert rep[(rep.model == "STILL (prior work)") & (rep.task == "S-NIAH-1")]["1024"].item() == 89.0
    r = pd.read_csv(tmp_path / "out" / "ruler.csv")
    row = r[r.status == "measured"].iloc[0]
    assert row["Avg"] == pytest.approx(10.0) and row["HQA n"] == 3 and row["cache"] == 128
    assert (r[r.status == "reported"].model == "Mamba-2 (prior work)").any()
    line = next(l for l in (tmp_path / "out" / "ruler.md").read_text().splitlines() if l.startswith("| measured"))
    assert [c.strip() for c in line.split("|")][-3:-1] == ["5", "3"]  # counts, not "5.00" beside reported rows


def test_rendering_is_deterministic_and_html_self_contained(store, tmp_path):
    out = tmp_path / "out"
    first = L.render(store, out)
    names = sorted(p.name for p in first)
    assert names == ["hybrid.csv", "hybrid.md", "index.html", "kv-compression-paired.csv", "kv-compression.csv",
                     "kv-compression.md", "ruler.csv", "ruler.md", "sniah.csv", "sniah.md",
                     "sniah_budget.png", "standard.csv", "standard.md"]
    snapshot = {p.name: p.read_bytes() for p in out.iterdir()}
    assert L.render(store, out) == []  # nothing changed
    assert {p.name: p.read_bytes() for p in out.iterdir()} == snapshot
    page = (out / "index.html").read_text()
    assert "data:image/png;base64," in page
    assert not re.search(r"(src|href)=['\"](https?:|//|/)", page)  # no external resources
    assert "reported" in page and "measured" in page
    md = (out / "standard.md").read_text()
    assert "| measured" in md and L.MEASURED_GAP_LABEL in md and not re.search(r"20\d\d-\d\d-\d\d", md)


def test_missing_store_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        L.render(tmp_path / "nope", tmp_path / "out")


def test_a_reference_row_without_a_cache_size_shows_a_dash_not_nan():
    """STILL's cache is "NA" in the paper's table: the row shows '-', and no reference cell reads 'nan'."""
    import pandas as pd

    from golinear.bench.boards.leaderboard import load_reference, standard_table
    table = standard_table(pd.DataFrame(), load_reference()["standard"])
    still = table[table.model.str.startswith("STILL")]
    assert list(still.cache) == ["-"]
    assert not (table.astype(str) == "nan").any().any()


def test_markdown_tables_escape_what_a_label_holds():
    """A model label is text in a Markdown table as on the page: a `|` or a line break cannot split the row, a tag
    cannot become HTML; prose like `<=` stays as written."""
    import pandas as pd

    from golinear.bench.boards.markdown import md_cell, md_table
    from golinear.bench.boards.leaderboard import to_markdown
    label = "my|model\n<img src=x onerror=alert(1)>"
    assert md_cell(label) == "my\\|model &lt;img src=x onerror=alert(1)>" and md_cell("gap <= 0.5") == "gap <= 0.5"
    for md in (to_markdown(pd.DataFrame({"model": [label], "Avg": [1.0]})), md_table(pd.DataFrame({"model": [label]}))):
        rows = [line for line in md.strip().splitlines() if "model" not in line or "my" in line]
        assert any("my\\|model &lt;img" in r for r in rows) and "<img" not in md, md
        assert len(md.strip().splitlines()) == 3, md  # header, rule, one row


def test_measured_gap_compares_rows_at_the_papers_budget(store, tmp_path):
    """A linearized row at a budget of 1,024 (nearly every prompt inside its softmax window) scoring above full
    attention does not make the gap: the measured gap row compares the rows at the paper's budget (64) only."""
    for i, (task, (metric, suite)) in enumerate(STD.items()):
        put(store, "gdn-w1016", "base=smollm2-135m,m=gdn-w1016", task, {metric: 0.90 + 0.01 * i}, suite=suite,
            budget=1024)
    L.render(store, tmp_path / "out")
    t = pd.read_csv(tmp_path / "out" / "standard.csv")
    assert "gdn-w1016" in set(t[t.status == "measured"].model)
    gap = t[(t.status == "gap") & (t.source == "measured")].iloc[0]
    assert gap["CR"] == pytest.approx(5.0) and gap["MMLU"] == pytest.approx(5.0)  # still full - gla (budget 64)
    assert gap["model"] == L.MEASURED_GAP_LABEL and "paper's budget (64)" in gap["model"]


def test_a_trained_control_gets_its_own_gap_row(store, tmp_path):
    """With the same-training control's cells in the store, a second gap row: the control minus the best linearized
    row at the paper's budget (the cost of linearizing alone), beside the gap with untrained full attention."""
    L.render(store, tmp_path / "before")
    before = pd.read_csv(tmp_path / "before" / "standard.csv")
    assert L.CONTROL_GAP_LABEL not in set(before.model)
    for i, (task, (metric, suite)) in enumerate(STD.items()):
        put(store, L.CONTROL, "base=smollm2-135m,m=control", task, {metric: 0.65 + 0.01 * i}, suite=suite,
            budget=8192)
    L.render(store, tmp_path / "out")
    t = pd.read_csv(tmp_path / "out" / "standard.csv")
    gaps = t[(t.status == "gap") & (t.source == "measured")].set_index("model")
    assert gaps.loc[L.MEASURED_GAP_LABEL, "CR"] == pytest.approx(5.0)  # full - gla, the control not among them
    assert gaps.loc[L.CONTROL_GAP_LABEL, "CR"] == pytest.approx(10.0)  # control - gla
    assert gaps.loc[L.CONTROL_GAP_LABEL, "MMLU"] == pytest.approx(10.0)
