"""The page, its plots and the latency figure read without a guide: a table near the top, one full-attention line per
panel, no GPU plot described as the CPU's, no folder of the measuring machine in a row's name."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from golinear.bench.boards import leaderboard as L
from golinear.bench.boards.page import render_page
from golinear.bench.speed import latency_render

ROOT = Path(__file__).resolve().parent.parent


def sniah_rows() -> pd.DataFrame:
    base = {"status": "measured", "source": "measured", "backbone": "smollm2-135m", "task": "S-NIAH-3", "128": None,
            "256": None}
    full = [{**base, "model": "full attention", "context": c, "n": n, "inf": v}
            for c, n, v in ((4096, 50, 62.0), (4096, 500, 63.2), (1024, 50, 72.0))]
    gdn = [{**base, "model": "gdn-default", "context": 4096, "n": 500, "128": 10.0, "256": 20.0, "inf": None}]
    paper = [{**base, "status": "reported", "source": "paper", "model": "full attention", "context": 4096, "n": "",
              "inf": 90.0}]
    return pd.DataFrame(full + gdn + paper)


def test_the_sniah_plot_draws_one_row_per_model_at_one_context():
    rows, context = L.plotted_rows(sniah_rows())
    assert context == 4096
    full = rows[(rows["model"] == "full attention") & (rows["status"] == "measured")]
    assert len(full) == 1 and full.iloc[0]["n"] == 500  # the run with the most samples
    assert len(rows) == 3 and set(rows["context"]) == {4096}
    assert L.sniah_plot(sniah_rows())[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_committed_sniah_plot_has_one_full_attention_line_per_status_and_panel():
    rows, _ = L.plotted_rows(pd.read_csv(ROOT / "leaderboards" / "sniah.csv"))
    full = rows[rows["model"] == "full attention"]
    assert not full.duplicated(["status", "task"]).any(), full


def test_the_memory_panel_says_what_it_measured_on_that_device():
    gpu, cpu = latency_render.memory_title("NVIDIA H100 80GB HBM3"), latency_render.memory_title("cpu")
    assert "CPU" not in gpu and "process" not in gpu and "CUDA" in gpu
    assert "process" in cpu


def test_a_scorer_file_is_named_by_its_file_name_in_latency_rows(tmp_path):
    rows = pd.read_csv(ROOT / "leaderboards" / "latency.csv").head(4).copy()
    rows["config"] = [f"gdn-default,window=28,retain=28,retain_score=fitted,scorer=/tmp/x/s{i}.safetensors"
                      for i in range(len(rows) - 1)] + ["snapkv (kvpress, chunked prefill 512) @256"]
    latency_render.render(rows, tmp_path)
    text = (tmp_path / "latency.md").read_text()
    assert "/tmp/" not in text and "scorer=s0.safetensors" in text
    assert "snapkv (kvpress, chunked prefill 512) @256" in text  # other rows' names as they are
    assert (tmp_path / "latency.png").read_bytes()[:4] == b"\x89PNG"


def test_the_page_shows_a_table_before_the_figures(tmp_path):
    table = pd.DataFrame({"status": ["measured"], "source": ["measured"], "model": ["full"], "cache": ["inf"],
                          "CR": [46.8]})
    page = render_page([("ruler", "RULER", "", table), ("hybrid", "Hybrid", "", table)], {}, {}, tmp_path)
    first_table, figures = page.index("<table"), page.index("Headline figures")
    assert first_table == page.index("id='table-ruler'") - len("<table class='board' ") < figures
    assert figures < page.index("id='table-hybrid'")


def test_the_latency_figures_decode_panel_is_log_scaled(tmp_path, monkeypatch):
    """HF's eager decode row sits an order of magnitude above the static decoders' rows: on a linear axis it squeezes
    every row that matters into the panel's bottom tenth, so the decode panel (like prefill) is log-scaled."""
    import matplotlib.pyplot as plt
    figures = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    rows = pd.read_csv(ROOT / "leaderboards" / "latency.csv")
    latency_render.render_plot(rows, tmp_path / "latency.png")
    decode_axes = [ax for ax in figures[0].axes if ax.get_title().startswith("decode")]
    assert decode_axes and all(ax.get_yscale() == "log" for ax in decode_axes)
