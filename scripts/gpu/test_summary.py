"""docs/gpu-tests.csv and docs/gpu-tests.md: the GPU test set's results per test file, from the JUnit XML files of
scripts/gpu/tests.sh, with the card, versions, date and commit each file ran on (read here, on the machine that ran
them).

The CSV keeps the results as data, one row per test file, so that a rerun of a few files (--merge) replaces only their
rows and keeps the others with their own card, date and commit; the markdown is rendered from the whole CSV.
  test_summary.py OUT/chunks/c*.xml --out OUT/gpu-tests.md [--also docs/gpu-tests.md] [--merge docs/gpu-tests.csv]
  test_summary.py --render-only --out docs/gpu-tests.md          (the markdown again from the CSV beside it)
"""
from __future__ import annotations

import argparse
import collections
import csv
import datetime
import importlib.metadata
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the versions that decide what a GPU test exercises: CSV column -> distribution
DISTS = {"torch": "torch", "triton": "triton", "fla": "flash-linear-attention", "transformers": "transformers"}
FIELDS = ["file", "passed", "failed", "skipped", "seconds", "card", *DISTS, "date", "commit", "skips"]
COUNTS = ("passed", "failed", "skipped")


# ------------------------------------------------------------------------------------------------ one run
def test_file(classname: str) -> str:
    """tests.test_gpu or tests.test_gpu.TestClass -> tests/test_gpu.py (a class name is not a file)."""
    parts = classname.split(".")
    while len(parts) > 1 and parts[-1][:1].isupper():
        parts.pop()
    return "/".join(parts) + ".py"


def counts(xml_files: list[Path]) -> dict[str, dict]:
    """Per test file: passed, failed (failures and errors), skipped, seconds and the skip reasons with their counts."""
    out: dict[str, dict] = collections.defaultdict(
        lambda: {"passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0, "skips": collections.Counter()})
    for path in xml_files:
        for case in ET.parse(path).iter("testcase"):
            c = out[test_file(case.get("classname", ""))]
            c["seconds"] += float(case.get("time", 0))
            if case.find("failure") is not None or case.find("error") is not None:
                c["failed"] += 1
            elif case.find("skipped") is not None:
                c["skipped"] += 1
                c["skips"][case.find("skipped").get("message", "")] += 1
            else:
                c["passed"] += 1
    return dict(out)


def machine() -> dict[str, str]:
    """The card and the versions, as CSV columns; a machine without CUDA (or torch) says so instead of failing."""
    try:
        import torch
        card = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    except ImportError:
        card = "no torch"
    where = {"card": card}
    for column, dist in DISTS.items():
        try:
            where[column] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            where[column] = "not installed"
    return where


def commit(root: Path, written: list[Path] = ()) -> str:
    """The short commit of the checkout that ran, + when tracked files differ from it; "unknown" without git.

    The files this summary writes are left out: a docs/gpu-tests.* left uncommitted by an earlier run is no change to
    the code that ran."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout
    try:
        if Path(git("rev-parse", "--show-toplevel").strip()).resolve() != root.resolve():
            return "unknown"  # a copy without its .git inside some other repository
        short = git("rev-parse", "--short", "HEAD").strip()
        outputs = [f":(exclude){p.resolve().relative_to(root.resolve())}" for p in written
                   if p.resolve().is_relative_to(root.resolve())]
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", *outputs).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return short + ("+" if dirty else "")


def skips_text(skips: collections.Counter) -> str:
    """"reason x n; reason2 x m": one CSV cell, so the reasons survive a merge (a ; inside a reason becomes ,)."""
    def clean(reason: str) -> str:
        return " ".join(reason.replace(";", ",").split()) or "(no reason given)"
    merged = collections.Counter()
    for reason, n in skips.items():
        merged[clean(reason)] += n
    return "; ".join(f"{reason} x {n}" for reason, n in sorted(merged.items()))


def parse_skips(text: str) -> collections.Counter:
    out = collections.Counter()
    for item in filter(None, (s.strip() for s in text.split(";"))):
        reason, _, n = item.rpartition(" x ")
        out[reason] += int(n)
    return out


def run_rows(table: dict[str, dict], where: dict[str, str], date: str, code: str) -> list[dict]:
    return [{"file": name, **{k: c[k] for k in COUNTS}, "seconds": c["seconds"], **where, "date": date,
             "commit": code, "skips": skips_text(c["skips"])} for name, c in sorted(table.items())]


# ------------------------------------------------------------------------------------------------ the CSV
def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row.update({k: int(row[k]) for k in COUNTS}, seconds=float(row["seconds"]), skips=row.get("skips") or "")
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows({**row, "seconds": f"{row['seconds']:.1f}"} for row in sorted(rows, key=lambda r: r["file"]))


def merge(old: list[dict], new: list[dict], root: Path) -> list[dict]:
    """The new rows replace their files' rows; the others stay as they were, unless their file is gone from root."""
    rerun = {row["file"] for row in new}
    kept = [row for row in old if row["file"] not in rerun and (root / row["file"]).is_file()]
    return sorted(kept + new, key=lambda r: r["file"])


# ------------------------------------------------------------------------------------------------ the markdown
def versions(row: dict) -> str:
    return ", ".join(f"{dist} {row[column]}" for column, dist in DISTS.items())


def render(rows: list[dict], run: dict | None = None) -> str:
    """The page from the whole CSV. run (files, ran, expected, merged) is the call that just ran: an incomplete one
    says so, about its own tests only."""
    setups = collections.Counter(f"{row['card']}; {versions(row)}" for row in rows)
    warning = []
    if run and run["expected"] and run["ran"] < run["expected"]:
        if run["merged"]:
            warning = [f"**Incomplete: the latest run has run {run['ran']} of its {run['expected']} GPU tests**: the "
                       f"rows of {', '.join(run['files']) or 'no file'} count only those, and the rows of files it "
                       "has not reached yet are from earlier runs (the script resumes where it stopped).", ""]
        else:
            warning = [f"**Incomplete: {run['ran']} of the {run['expected']} GPU tests have run** (the rest are not "
                       "counted below; the script resumes where it stopped).", ""]
    lines = ["# GPU tests", "",
             "Generated by `bash scripts/gpu/tests.sh OUT_DIR --docs` (the tests marked `gpu`, run on CUDA) from",
             "[gpu-tests.csv](gpu-tests.csv), a row per test file; refresh it whenever GPU code changes. A run of some",
             "files (pytest options that pick them, such as `-k \"test_gpu.py or test_latency.py\"`, in a new OUT_DIR)",
             "replaces only their rows: rows with an older date ran at the commit shown under code (+: with",
             "uncommitted changes) and are kept until their files are rerun.", "",
             "Ran on:", "", *[f"- {s} ({n} file{'s' * (n != 1)})" for s, n in sorted(setups.items())], "",
             *warning,
             "| file | passed | failed | skipped | seconds | card | date | code |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["file"]):
        lines.append(f"| {r['file']} | {r['passed']} | {r['failed']} | {r['skipped']} | {r['seconds']:.0f} | "
                     f"{r['card']} | {r['date']} | {r['commit']} |")
    total = {k: sum(r[k] for r in rows) for k in (*COUNTS, "seconds")}
    lines.append(f"| **all** | **{total['passed']}** | **{total['failed']}** | **{total['skipped']}** | "
                 f"{total['seconds']:.0f} | | | |")
    reasons = sum((parse_skips(r["skips"]) for r in rows), collections.Counter())
    if reasons:
        lines += ["", "Skipped, and why:", ""] + [f"- {n} x {r}" for r, n in sorted(reasons.items())]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("xml", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="the markdown; the CSV it renders is written beside it")
    ap.add_argument("--also", type=Path, help="a second copy (docs/gpu-tests.md), its CSV beside it too")
    ap.add_argument("--merge", type=Path, metavar="CSV",
                    help="replace only the rerun files' rows of this CSV (without it the rows are this run's alone)")
    ap.add_argument("--render-only", action="store_true", help="no XML: the markdown from the CSV beside --out")
    ap.add_argument("--expected", type=int, help="how many tests the run holds (a summary of fewer says so)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout that ran: its git commit, its tests/")
    ap.add_argument("--commit", help="the commit that ran, where its copy has no .git (a bundle): else from git")
    args = ap.parse_args(argv)
    mds = [p for p in (args.out, args.also) if p]
    if args.render_only:
        if args.xml or args.merge:
            ap.error("--render-only reads the CSV beside --out: no XML files, no --merge")
        rows, run = read_csv(args.out.with_suffix(".csv")), None
    else:
        table = counts([p for p in args.xml if p.exists()])
        csvs = [p.with_suffix(".csv") for p in mds] + ([args.merge] if args.merge else [])
        code = args.commit or commit(args.root, mds + csvs)
        new = run_rows(table, machine(), datetime.date.today().isoformat(), code)
        rows = merge(read_csv(args.merge), new, args.root) if args.merge else new
        run = {"files": sorted(table), "ran": sum(c[k] for c in table.values() for k in COUNTS),
               "expected": args.expected, "merged": bool(args.merge)}
        for path in dict.fromkeys(p.resolve() for p in csvs):
            write_csv(path, rows)
    text = render(rows, run)
    for path in mds:
        path.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
