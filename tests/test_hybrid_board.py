"""The Figure 5 analog (bench/boards/hybrid.py): strict-GDN hybrids read by what each cell's model info says, CR from its
five tasks, the two curves plotted with the strict model and full attention as their ends."""
import pandas as pd
import pytest

from golinear.bench.boards import hybrid as H
from golinear.bench.boards import leaderboard as L
from golinear.bench.results.store import Store

TASKS = {"golinear_piqa": "acc", "golinear_arc_easy": "acc", "golinear_arc_challenge": "acc_norm",
         "golinear_hellaswag": "acc_norm", "golinear_winogrande": "acc", "golinear_lambada_openai": "acc"}
STRICT = {"mechanism": "gdn", "window": 0, "sinks": 0, "short_conv": False, "lora": False, "out_norm": True,
          "keep_full": 0.0, "select": "uniform", "full_layers": None}


def put_model(store, name, score, *, lin=None, full=False, limit=None, options=None):
    info = {"linearize": lin} if lin is not None else {}
    if options:
        info["cache_options"] = options
    for task, metric in TASKS.items():
        metrics = {metric: score} | ({"perplexity": 100 * (1 - score)} if "lambada" in task else {})
        store.put({"key": {"model": f"m={name}", "task": task, "config": {"limit": limit, "num_fewshot": 0}},
                   "model": {"label": name, "family": name, "backbone": "smollm2-135m", "full_attention": full,
                             "budget": "inf" if full else 0, "info": info},
                   "task": task, "suite": "lambada" if "lambada" in task else "cr", "metric": metric, "n": 20,
                   "metrics": {f"{m},none": {"value": v, "stderr": 0.01} for m, v in metrics.items()}})


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store")
    put_model(s, "full", 0.50, full=True)
    put_model(s, "gdn-onorm", 0.30, lin=STRICT)
    put_model(s, "gdn-full10-uniform", 0.35, lin=STRICT | {"keep_full": 0.1})
    put_model(s, "gdn-full10-hardness", 0.38, lin=STRICT | {"keep_full": 0.1, "select": "hardness"})
    put_model(s, "gdn-full20-hardness", 0.40, lin=STRICT | {"keep_full": 0.2, "select": "hardness"}, limit=20)
    put_model(s, "gdn-w56-s8", 0.45, lin=STRICT | {"window": 56, "sinks": 8})  # a window: not a hybrid
    put_model(s, "gdn-l3", 0.45, lin=STRICT | {"full_layers": [3]})  # layers named by hand: no curve point
    put_model(s, "gdn-onorm,window=28", 0.2, lin=STRICT, options={"window": 28})  # cache options: not strict
    return s


def test_rows_are_the_strict_models_by_share_with_cr_from_five_tasks(store, tmp_path):
    L.render(store, tmp_path / "out")
    t = pd.read_csv(tmp_path / "out" / "hybrid.csv")
    assert list(t["model"]) == ["gdn-onorm", "gdn-full10-hardness", "gdn-full10-uniform", "full"]
    assert list(t["share of full layers"]) == ["0%", "10%", "10%", "100%"]  # the subset row (limit 20) is left out
    row = t.set_index("model").loc["gdn-full10-hardness"]
    assert row["selection"] == "hardness" and row["CR"] == pytest.approx(38.0) and row["LAMBADA"] == pytest.approx(38.0)
    assert row["LAMBADA ppl"] == pytest.approx(62.0)


def test_the_plot_and_the_page_carry_the_curves(store, tmp_path):
    L.render(store, tmp_path / "out")
    png = (tmp_path / "out" / "hybrid.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    assert "alt='Strict GDN hybrids'" in (tmp_path / "out" / "index.html").read_text()
    assert H.hybrid_plot(pd.DataFrame(columns=["share of full layers", "selection"])) is None


def test_hybrid_of_reads_the_model_info():
    assert H.hybrid_of({"full_attention": True}) == (1.0, "full")
    assert H.hybrid_of({"info": {"linearize": STRICT}}) == (0.0, "none")
    assert H.hybrid_of({"info": {"linearize": STRICT | {"keep_full": 0.3, "select": "hardness"}}}) == (0.3, "hardness")
    assert H.hybrid_of({"info": {"linearize": STRICT | {"short_conv": True}}}) is None
    assert H.hybrid_of({"info": {}}) is None
