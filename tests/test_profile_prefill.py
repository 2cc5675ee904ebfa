"""scripts/gpu/profile_prefill.py on the CPU (its check mode: aten ops instead of CUDA kernels): a row per config with
its prefill time and grouped ops; bad values refused before any model is built."""
from __future__ import annotations

import pytest

from _scripts import load_script


def test_a_row_per_config(tmp_path):
    out = tmp_path / "prefill.md"
    profile = load_script("gpu/profile_prefill.py")
    assert profile.main(["--device", "cpu", "--model", "smollm2-135m", "--configs", "full-static;gdn-default",
                         "--length", "24", "--batch", "2", "--reps", "1", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| full-static") or
            line.startswith("| gdn-default")]
    assert len(rows) == 2
    for row in rows:
        cells = row.split(" | ")
        assert float(cells[1]) > 0 and float(cells[2]) > 0  # prefill ms, ops


@pytest.mark.parametrize("flag", ["--length", "--batch", "--reps"])
def test_bad_values_are_refused(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as e:
        load_script("gpu/profile_prefill.py").main(["--device", "cpu", flag, "0", "--out", str(tmp_path / "x.md")])
    assert e.value.code == 2 and f"{flag} 0" in capsys.readouterr().err
    assert not (tmp_path / "x.md").exists()


def test_window_blocks_give_a_row_per_block_and_leave_the_default(tmp_path):
    from golinear.models.attention.ops import window
    out = tmp_path / "prefill.md"
    profile = load_script("gpu/profile_prefill.py")
    assert profile.main(["--device", "cpu", "--model", "smollm2-135m", "--configs", "mechanism=none,window=8,sinks=2",
                         "--length", "40", "--batch", "1", "--reps", "1", "--window-blocks", "16,32",
                         "--out", str(out)]) == 0
    text = out.read_text()
    assert "| mechanism=none,window=8,sinks=2 (window block 16) |" in text
    assert "| mechanism=none,window=8,sinks=2 (window block 32) |" in text
    assert window.PREFILL_BLOCK == window.WINDOW_BLOCK  # the default again afterwards


@pytest.mark.parametrize("value", ["0", "10", "a,64"])
def test_bad_window_blocks_are_refused(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as e:
        load_script("gpu/profile_prefill.py").main(["--device", "cpu", "--window-blocks", value,
                                                    "--out", str(tmp_path / "x.md")])
    assert e.value.code == 2 and f"--window-blocks {value!r}" in capsys.readouterr().err
    assert not (tmp_path / "x.md").exists()
