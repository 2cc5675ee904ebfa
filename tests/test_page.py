"""The leaderboard page in a real headless browser: sorting, filtering and the switch for the paper's rows.

It opens the committed leaderboards/index.html (rendered by `golinear leaderboard` from leaderboards/store) and
checks what the browser shows against leaderboards/standard.csv, rendered from the same store. With
GOLINEAR_SCREENSHOT_DIR set, the screenshots docs/evaluation.md shows are written there too.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from golinear.bench.boards import page
from golinear.bench.boards.page import column_order
from tests._chromium import Chromium, browser_path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "leaderboards" / "index.html"
FIRST_MODEL = """(function(){var r=[...document.querySelectorAll('#table-standard tbody tr')]
  .find(function(r){return r.offsetParent!==null;});return r.cells[0].firstChild.textContent;})()"""
VISIBLE = "[...document.querySelectorAll('#table-standard tbody tr')].filter(r => r.offsetParent !== null)"


def click_header(browser, name: str) -> None:
    browser.evaluate(f"[...document.querySelectorAll('#table-standard th')].find(h => h.textContent === "
                     f"{json.dumps(name)}).click()")


def save(png: bytes, name: str, tmp_path: Path) -> None:
    (tmp_path / name).write_bytes(png)
    if os.environ.get("GOLINEAR_SCREENSHOT_DIR"):
        (Path(os.environ["GOLINEAR_SCREENSHOT_DIR"]) / name).write_bytes(png)


@pytest.fixture(scope="module")
def browser():
    if browser_path() is None:
        pytest.skip("no chromium on the PATH (`.ci/run` installs the Debian package)")
    b = Chromium(width=1400, height=1000)
    try:
        b.open(PAGE)
        yield b
    finally:
        b.close()


def test_page_opens_on_the_figures_and_sorts_the_scores(browser, tmp_path):
    standard = pd.read_csv(ROOT / "leaderboards" / "standard.csv")
    ours = standard[standard["source"] == "measured"]
    assert browser.evaluate("document.querySelectorAll('.figs figure img').length") >= 3
    assert browser.evaluate("[...document.querySelectorAll('#table-standard th')].slice(0, 4)"
                            ".map(h => h.textContent).join('|')") == "model|cache|CR|MMLU"
    save(browser.screenshot(), "leaderboard.png", tmp_path)

    browser.evaluate("document.getElementById('show-paper').click()")  # the paper's rows hidden
    assert browser.evaluate(f"{VISIBLE}.length") == len(ours)
    click_header(browser, "CR")  # first click: best first
    assert browser.evaluate(FIRST_MODEL) == ours.loc[ours["CR"].idxmax(), "model"]
    click_header(browser, "CR")
    assert browser.evaluate(FIRST_MODEL) == ours.loc[ours["CR"].idxmin(), "model"]
    click_header(browser, "LAMBADA ppl")  # lower is better: lowest first
    assert browser.evaluate(FIRST_MODEL) == ours.loc[ours["LAMBADA ppl"].idxmin(), "model"]
    click_header(browser, "CR")
    browser.evaluate("document.getElementById('standard').scrollIntoView(); window.scrollBy(0, -60)")
    save(browser.screenshot(), "leaderboard-sorted.png", tmp_path)

    browser.evaluate("document.getElementById('show-paper').click()")  # and shown again
    assert browser.evaluate(f"{VISIBLE}.length") == len(standard)
    assert browser.evaluate(FIRST_MODEL) == standard.loc[standard["CR"].idxmax(), "model"]


def test_a_table_is_within_the_first_screens(browser):
    """A reader sees scores before scrolling far: the first table begins within 2,400 px of the top, and the headline
    figures follow it."""
    browser.evaluate("window.scrollTo(0, 0)")
    top = browser.evaluate("document.querySelector('table.board').getBoundingClientRect().top + window.scrollY")
    figures = browser.evaluate("document.getElementById('figures').getBoundingClientRect().top + window.scrollY")
    assert top < 2400 and top < figures, (top, figures)


def test_filter_keeps_the_rows_that_contain_the_text(browser):
    browser.evaluate("var f = document.querySelector(\"input[data-table='table-standard']\"); f.value = 'gdn-onorm';"
                     "f.dispatchEvent(new Event('input'))")
    shown = browser.evaluate(f"{VISIBLE}.map(r => r.textContent)")
    assert shown and all("gdn-onorm" in text for text in shown)
    browser.evaluate("f.value = ''; f.dispatchEvent(new Event('input'))")


def test_scores_come_before_the_settings():
    table = pd.DataFrame({"status": ["measured"], "source": ["measured"], "backbone": ["b"], "model": ["m"],
                          "setting": ["base=b"], "params": ["0"], "cache": ["inf"], "PIQA": [60.0], "CR": [50.0],
                          "LAMBADA ppl": [20.0]})
    lead, scores, other = column_order(table)
    assert (lead, scores, other) == (["model", "cache"], ["CR", "PIQA", "LAMBADA ppl"], ["backbone", "params"])


def test_headline_figures_read_at_page_width_and_tables_scroll_in_their_box(browser, tmp_path):
    """At 1400 px: the linearize-or-compress plot is a headline figure; no headline image is shrunk below half its
    drawn size (a legend wider than its plots was); every table fits the page or scrolls inside its own box; big
    numbers carry separators."""
    browser.evaluate("window.scrollTo(0, 0)")
    alts = browser.evaluate("[...document.querySelectorAll('.figs figure img')].map(i => i.alt)")
    assert "Linearize or compress" in alts and "S-NIAH against cache budget" in alts, alts
    scales = browser.evaluate("[...document.querySelectorAll('.figs figure img')]"
                              ".map(i => [i.alt, i.clientWidth / i.naturalWidth])")
    assert all(scale >= 0.5 for _, scale in scales), scales
    page = browser.evaluate("document.documentElement.clientWidth")
    boxes = browser.evaluate("[...document.querySelectorAll('table.board')].map(t => [t.id, "
                             "t.parentElement.className, t.parentElement.getBoundingClientRect().right])")
    assert boxes and all(cls == "scroll" and right <= page for _, cls, right in boxes), (page, boxes)
    assert browser.evaluate("document.documentElement.scrollWidth") <= page  # nothing overflows the page itself
    big = browser.evaluate("[...document.querySelectorAll('td.score')].map(td => td.textContent)"
                           ".filter(t => parseFloat(t.replace(/,/g, '')) >= 10000)")
    assert big and all("," in t for t in big), big[:5]
    (tmp_path / "figures.png").write_bytes(browser.screenshot())  # for a look (pytest --basetemp)


def test_linearize_or_compress_figure_is_drawn_at_its_own_size(browser, tmp_path):
    """At 1400 px the linearize-or-compress figure is shown at its drawn size (its intervals, drawn side by side at
    each budget, are not shrunk together; a row of its own where it is wider than a column), each panel's legend
    under it (the image is no wider than its panels: at most 6.5 inches of 100 px a panel)."""
    browser.evaluate("window.scrollTo(0, 0)")
    fig = browser.evaluate("(function(){var i=[...document.querySelectorAll('.figs figure img')]"
                           ".find(i => i.alt === 'Linearize or compress'); i.scrollIntoView();"
                           "return [i.clientWidth, i.naturalWidth, i.parentElement.className];})()")
    shown, drawn, cls = fig
    assert shown >= 0.95 * drawn and (cls == "wide") == (drawn > page.WIDE_PX), fig
    kv = pd.read_csv(ROOT / "leaderboards" / "kv-compression.csv")
    panels = len((kv[~kv["superseded"]] if (~kv["superseded"]).any() else kv).groupby(["context", "n", "dtype"]))
    assert drawn <= 650 * panels, (drawn, panels)
    save(browser.screenshot(), "kv-compression-page.png", tmp_path)
