"""kv-compression.md's trade-off table: the paired verdict per budget beside what each side costs at 8B dimensions."""
import pandas as pd

from golinear.bench.boards import kv_tradeoff as T


def paired():
    row = dict(context=4096, n=500, dtype="bfloat16", linearized="gdn-w", pairs=1500.0, verdict="press better")
    return pd.DataFrame([
        dict(row, superseded=False, budget="256", press="compactor (kvpress)", **{"press S-NIAH": 33.0},
             **{"linearized S-NIAH": 5.0}, difference=28.0, low=25.4, high=30.7),
        dict(row, superseded=False, budget="1024", press="kvzip (kvpress)", **{"press S-NIAH": 69.7},
             **{"linearized S-NIAH": 24.3}, difference=45.4, low=42.4, high=48.4),
        dict(row, superseded=True, budget="128", press="snapkv (kvpress)", **{"press S-NIAH": 1.0},
             **{"linearized S-NIAH": 2.0}, difference=-1.0, low=-3.0, high=1.0)])


def latency(tmp_path, rows):
    cols = ["model", "device", "config", "length", "batch", "status", "prefill_s", "decode_ms_per_token",
            "decode_vs_bound", "peak_gib"]
    path = tmp_path / "latency.csv"
    pd.DataFrame(rows, columns=cols).to_csv(path, index=False)
    return path


def test_costs_come_from_the_card_that_measured_the_presses_at_the_longest_length(tmp_path):
    m = "llama-3.1-8b"
    path = latency(tmp_path, [
        (m, "H100", "kvzip (kvpress) @1024", 32768, 1, "ok", 10.09, 8.39, 1.68, 23.11),
        (m, "H100", "kvzip (kvpress) @1024", 4096, 1, "ok", 0.69, 8.26, 1.66, 17.36),
        (m, "H100", "kvzip (kvpress) @256", 32768, 4, "ok", 9.0, 9.0, 1.7, 40.0),  # another batch: not this table's
        (m, "H100", "gdn-default", 32768, 1, "ok", 0.94, 8.10, 1.62, 16.53),
        (m, "H100", "gdn-default", 4096, 1, "ok", 0.12, 8.02, 1.60, 15.99),
        (m, "H200", "gdn-default", 32768, 1, "ok", 0.70, 6.00, 1.50, 16.00),  # no press measured on this card
        (m, "cpu", "compactor (kvpress) @256", 32768, 1, "ok", 99.0, 99.0, 9.9, 9.9),  # not a GPU row
        (m, "H100", "compactor (kvpress) @256", 32768, 1, "OOM", None, None, None, None)])  # nothing measured
    md = T.markdown(paired(), path)
    assert "on H100, 32768 tokens, batch 1" in md
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert len(lines) == 3  # header and the two current budgets; the superseded setting's row is not here
    assert lines[1].startswith("| 256 | compactor (kvpress) | 33.00 | gdn-w | 5.00 | +28.00 [+25.40, +30.70] |")
    assert "not measured" in lines[1] and "| 0.94 | 8.10 (1.62x) | 16.53 |" in lines[1]  # the press's cost not borrowed
    assert "| 10.09 | 8.39 (1.68x) | 23.11 | 0.94 | 8.10 (1.62x) | 16.53 |" in lines[2]
    assert "6.00" not in md and "99.00" not in md


def test_without_latency_rows_the_table_has_the_verdicts_alone_and_without_a_comparison_nothing(tmp_path):
    md = T.markdown(paired(), tmp_path / "missing.csv")
    assert "prefill" not in md and "| 1024 | kvzip (kvpress) | 69.70 |" in md and md.count("\n| ") == 3
    assert T.markdown(paired().iloc[2:], tmp_path / "missing.csv") == ""
