"""Every link between the repository's Markdown files points at a file that exists and, with a `#anchor`, at a
heading it has (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+?\.md)(?:#([^)\s]+))?\)")


def anchors(md: Path) -> set[str]:
    out = set()
    for line in md.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def test_markdown_links_and_anchors_resolve():
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "*.md"], capture_output=True, text=True).stdout.split()
    broken = []
    for name in files:
        md = ROOT / name
        for target, anchor in LINK.findall(md.read_text()):
            if "://" in target:
                continue
            path = (md.parent / target).resolve()
            if not path.is_file():
                broken.append(f"{name}: {target}")
            elif anchor and anchor not in anchors(path):
                broken.append(f"{name}: {target}#{anchor}")
    assert not broken, broken
