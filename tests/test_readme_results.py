"""The README's results table is what bench/boards/readme_results.py writes from the committed CSVs, and the README
stays a short entry page (at most 150 lines, none over 120 characters outside tables)."""
from __future__ import annotations

import re
from pathlib import Path

from golinear.bench.boards import readme_results

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _copied_board(tmp_path: Path) -> Path:
    """A copy of the committed leaderboards' CSVs, to change one of them."""
    board = tmp_path / "leaderboards"
    board.mkdir()
    for csv in (ROOT / "leaderboards").glob("*.csv"):
        (board / csv.name).write_text(csv.read_text())
    return board


def test_the_readme_table_is_the_generated_one():
    text = README.read_text()
    assert readme_results.BEGIN in text and readme_results.END in text
    assert readme_results.readme_with_results(text, ROOT / "leaderboards") == text, \
        "README's results table is stale: run `golinear claims` (or python -m golinear.bench.boards.readme_results)"


def test_the_table_is_compact_and_links_to_existing_full_tables():
    rows = readme_results.rows(ROOT / "leaderboards")
    assert 0 < len(rows) <= 15
    for row in rows:
        links = re.findall(r"\]\(([^)]+)\)", row)
        assert links, row
        assert all((ROOT / link).is_file() for link in links), row


def test_a_changed_csv_changes_the_table(tmp_path):
    board = _copied_board(tmp_path)
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


def test_the_kv_compression_row_names_the_best_of_each_family_at_each_budget(tmp_path):
    """One row per current setting (context, samples, dtype), naming how many presses it holds; a superseded setting
    (an earlier, smaller run) is left to kv-compression.md."""
    board = _copied_board(tmp_path)
    default = "gdn + window + 8 sinks + short conv, trained at each budget"
    (board / "kv-compression.csv").write_text(
        "context,n,dtype,superseded,budget,kind,row,S-NIAH-1,S-NIAH-2,S-NIAH-3,S-NIAH\n"
        "4096,500,bfloat16,False,256,KV-cache compression (kvpress),snapkv (kvpress),1,2,3,2.0\n"
        "4096,500,bfloat16,False,256,KV-cache compression (kvpress),streaming_llm (kvpress),4,5,6,5.0\n"
        f'4096,500,bfloat16,False,256,linearized,"{default}",7,8,9,8.0\n'
        "4096,500,bfloat16,False,1024,KV-cache compression (kvpress),snapkv (kvpress),30,30,30,30.0\n"
        "4096,500,bfloat16,False,1024,linearized,other,,,,\n"
        "4096,500,bfloat16,False,inf,full attention,full attention,90,90,90,90.0\n"
        "1024,50,float32,True,256,KV-cache compression (kvpress),kvzip (kvpress),99,99,99,99.0\n"
        f'1024,50,float32,True,256,linearized,"{default}",7,8,9,8.0\n')
    row = [r for r in readme_results.rows(board) if "kv-compression.md" in r]
    assert len(row) == 1  # at 1024 the linearized row has no mean: 256 alone is compared; 1K is superseded
    assert "budget 256, S-NIAH at 4K, 500 samples a task (same samples, bfloat16): best of 2 kvpress presses" in row[0]
    assert "| 5.00 (streaming_llm) | 8.00 (default recipe) |" in row[0]


def test_the_full_attention_reference_reads_the_study_setting_only(tmp_path):
    """A full-attention S-NIAH cell at another sample count (the 50-sample KV-compression matrix) or in another
    dtype (the bf16 GPU matrix) is not averaged into the study's reference (4K, 500 samples, float32)."""
    board = _copied_board(tmp_path)
    sniah = board / "sniah.csv"
    head, *lines = sniah.read_text().splitlines()
    study = [ln for ln in lines if ",full attention,S-NIAH-" in ln and ",4096,500,float32," in ln]
    mean = sum(float(ln.rsplit(",", 1)[1]) for ln in study) / len(study)
    others = [ln for ln in lines if not (",full attention," in ln and ",4096,50," in ln)]
    odd = [ln.replace(",4096,500,", ",4096,50,").rsplit(",", 1)[0] + ",0.0000" for ln in study]
    gpu = [ln.replace(",float32,", ",bfloat16,").rsplit(",", 1)[0] + ",0.0000" for ln in study]  # another dtype
    assert gpu != study
    sniah.write_text("\n".join([head, *others, *odd, *gpu]) + "\n")
    row = next(r for r in readme_results.rows(board) if r.startswith("| default recipe trained at cache budget "
                                                                       "1024, 4K context | S-NIAH mean"))
    assert f"| S-NIAH mean | {mean:.2f} |" in row


def test_the_latency_rows_read_one_device(tmp_path):
    """Rows of another card (an H100 run beside the H200 one) neither replace nor mix into the quoted rows."""
    board = _copied_board(tmp_path)
    import pandas as pd
    latency = pd.read_csv(board / "latency.csv")
    quoted = latency[latency.device == readme_results.LATENCY_DEVICE].copy()
    other = quoted.assign(device="NVIDIA Other", decode_ms_per_token=0.125, peak_gib=0.125)
    pd.concat([latency, other]).to_csv(board / "latency.csv", index=False)
    rows = [r for r in readme_results.rows(board) if "latency.md" in r]
    assert len(rows) == 2 and not any("0.12" in r for r in rows)
    assert rows == [r for r in readme_results.rows(ROOT / "leaderboards") if "latency.md" in r]
