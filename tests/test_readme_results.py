"""The README's results table is what bench/readme_results.py writes from the committed CSVs, and the README
stays a short entry page (at most 150 lines, none over 120 characters outside tables)."""
from __future__ import annotations

import re
from pathlib import Path

from golinear.bench import readme_results

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_readme_table_is_the_generated_one():
    text = README.read_text()
    assert readme_results.BEGIN in text and readme_results.END in text
    assert readme_results.readme_with_results(text, ROOT / "leaderboards") == text, \
        "README's results table is stale: run `golinear claims` (or python -m golinear.bench.readme_results)"


def test_the_table_is_compact_and_links_to_existing_full_tables():
    rows = readme_results.rows(ROOT / "leaderboards")
    assert 0 < len(rows) <= 15
    for row in rows:
        links = re.findall(r"\]\(([^)]+)\)", row)
        assert links, row
        assert all((ROOT / link).is_file() for link in links), row


def test_a_changed_csv_changes_the_table(tmp_path):
    board = tmp_path / "leaderboards"
    board.mkdir()
    for csv in (ROOT / "leaderboards").glob("*.csv"):
        (board / csv.name).write_text(csv.read_text())
    tables = board / "tables.csv"
    tables.write_text(tables.read_text().replace("46.7813", "12.3456"))
    assert "12.35" in readme_results.table(board)
    assert "12.35" not in readme_results.table(ROOT / "leaderboards")


def test_a_readme_without_markers_is_left_alone():
    assert readme_results.readme_with_results("# x\n", ROOT / "leaderboards") == "# x\n"


def test_the_readme_is_a_short_entry_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150
    wide = [n for n, line in enumerate(lines, 1) if len(line) > 120 and not line.startswith("|")]
    assert not wide, f"lines over 120 characters outside tables: {wide}"
