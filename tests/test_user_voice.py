"""The project speaks to its users: no tracked file reads like a team's run diary.

Walks the tracked text files (``git ls-files``) and fails on words that belong to how the work was organised
rather than to golinear: numbered work periods, borrowed hardware and its per-call limits and time, the remote
output folder variable, tracker numbers and work-period phrasing (DIARY_PATTERNS below). The words themselves are
assembled from pieces here, so that this file is not a hit of the repository's own grep for them.
The patterns are narrow enough that
ordinary English ("a call to prefill", "the session's tokenizer", "time on the device") passes.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_DOLLAR = "$"
LENT, DEVICE, SESSION, ISSUE = "le" + "nt", "dev" + "ice", "sess" + "ion", "iss" + "ue"

# (what it is, pattern); compiled case-insensitively.
DIARY_PATTERNS = [
    ("numbered session", r"\bsessions?\s*#?\d+\b|\bsession-\d+\b"),
    ("borrowed machine", rf"\b{LENT}\b"),
    (f"{DEVICE} call", rf"\b{DEVICE}[ -]calls?\b|\bcall-by-call\b|\b\d+\s*[KMG]i?B (?:per|a|each) call\b"
                       r"|\bper-call (?:size|limit)"),
    (f"{DEVICE} time", rf"\b{DEVICE}[ -](?:time|budget|minutes|hours|seconds)\b"),
    ("remote output folder", "(?-i:" + re.escape(_DOLLAR) + r"\{?OUT\b)"),
    # (PR needs a space or '#': base64 text holds 'Pr7'; a '#' after ':' is a CSS colour, e.g. color:#222)
    ("issue number", r"\b(?:issues?|pull requests?|tickets?)\s*#?\d+\b|\bPRs?(?:\s+#?|#)\d+\b"
                     r"|(?<![\w&#/:])#\d{1,4}(?:'s|\b)(?![0-9a-f;])"),
    ("work period", r"\bwork(?:ing)? periods?\b|\b(?:this|last|next|previous|earlier|later) session\b"
                    r"|\bGPU queue\b|\bits queue\b|\bcost (?:us )?device\b"),
]
# In the pages people read (prose_docs below), also the words of how the work was done rather than what golinear
# does: the machine it was built on, hand corrections, the history of a fix. (A cell's provenance may say how
# it was corrected: that is its record, not a page.)
DOC_PATTERNS = [
    ("working arrangement", r"\bdev(?:elopment)?[ -]box\b|\bcorrected by hand\b|\bwhile building this\b"
                            r"|\bshared (?:its|our|the) (?:CPU|GPU|machine)s? with\b|\bour (?:machine|box|CPU|GPU)s?\b"),
    ("fix history", r"\(was:? [`'\"]|\(was: "),
]
DOC_COMPILED = [(name, re.compile(pattern, re.IGNORECASE)) for name, pattern in DOC_PATTERNS]
COMPILED = [(name, re.compile(pattern, re.IGNORECASE)) for name, pattern in DIARY_PATTERNS]

SKIP_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".pdf", ".safetensors", ".bin", ".pt", ".gz", ".whl", ".zip"}


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if not name or path.suffix.lower() in SKIP_SUFFIXES or not path.is_file():
            continue
        if path == Path(__file__).resolve():
            continue  # this file names the patterns it looks for
        paths.append(path)
    return paths


def diary_hits(text: str, patterns=COMPILED) -> list[tuple[int, str, str]]:
    """(line number, kind, matched text) for every diary word in ``text``."""
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        for name, pattern in patterns:
            for match in pattern.finditer(line):
                hits.append((number, name, match.group(0)))
    return hits


def read_text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


@pytest.mark.parametrize("line", [
    f"Ran in {SESSION} 31 on the {LENT} H200.",
    f"Two {DEVICE} calls (9.5 minutes of {DEVICE} time) trained it.",
    "Each part stays under 64 MiB per call; results go to " + _DOLLAR + "OUT/store.",
    f"See {ISSUE} #17 and #13's targets.",
    "In the previous session the GPU queue held three runs.",
])
def test_a_planted_diary_line_fails(line):
    assert diary_hits(line), line


@pytest.mark.parametrize("line", [
    "On the 2-core dev box, CPU, the copy went to a temporary folder.",
    "provenance.git was corrected by hand to 60980ea.",
    "## Found on CPU while building this",
    "The committed run shared its CPU with evaluation work.",
    "exit 2 before any model loads (was: a traceback after loading)",
    "request-cache file names (was `--nofp` for every model)",
])
def test_a_planted_working_arrangement_in_a_page_fails(line):
    assert diary_hits(line, COMPILED + DOC_COMPILED), line


@pytest.mark.parametrize("line", [
    "The decoder makes one call to prefill, then one step per token; each op picks its backend per call.",
    "Time on the device is measured with CUDA events; the session's tokenizer is reused.",
    "Each cell keeps its provenance; an issue in the store is reported with its path.",
    "Table 2 lists 13 rows; colour #1f77b4 marks GDN; see section 3.",
    "The output norm is applied per head, the retention slots per layer.",
    "Generated files; do not edit by hand. The model has no trainable parameters (was it linearized?).",
])
def test_ordinary_english_passes(line):
    assert not diary_hits(line, COMPILED + DOC_COMPILED), diary_hits(line, COMPILED + DOC_COMPILED)


def test_tracked_files_speak_to_users():
    found = []
    for path in tracked_text_files():
        text = read_text(path)
        if text is None:
            continue
        for number, name, matched in diary_hits(text):
            found.append(f"{path.relative_to(ROOT)}:{number}: {name}: {matched!r}")
    assert not found, f"{len(found)} diary words in tracked files:\n" + "\n".join(found[:200])


# Absolute paths of one machine's folders: a reader's machine has none of them. (`~/.cache/...`, `/scratch/$USER`
# and `/usr/bin/time` name what every machine of that kind has.)
MACHINE_PATH = re.compile(r"(?<![\w.$~-])/(?:tmp|work|home|root|Users|mnt)/")
REPO_PATH = re.compile(r"(?<![\w./-])((?:bench|models|tasks|tests|scripts)/[\w./-]*\w)(?![\w{*])")


def prose_docs() -> list[Path]:
    """The tracked pages people read: README.md, DESIGN.md, docs/*.md and every README.md (generated tables under
    leaderboards/ are written by golinear from their rows)."""
    return [p for p in tracked_text_files() if p.suffix == ".md" and (
        p.name in ("README.md", "DESIGN.md") or p.parent == ROOT / "docs")]


@pytest.mark.parametrize("line, hit", [("--data-dir /tmp/golinear-data --store /tmp/store", True),
                                       ("the reference folder /work/shared/data", True),
                                       ("`bash unpack.sh /scratch/$USER`, `~/.cache/golinear`, /usr/bin/time -v", False)])
def test_a_machine_path_is_found(line, hit):
    assert bool(MACHINE_PATH.search(line)) is hit


def test_docs_name_no_absolute_path_of_a_machine():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:120]}" for p in prose_docs()
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if MACHINE_PATH.search(line)]
    assert not found, "\n".join(found)


def test_the_code_paths_docs_point_to_exist():
    """A page that points to models/layers.py after the file moved sends its reader nowhere."""
    missing = []
    for p in prose_docs():
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            for m in REPO_PATH.finditer(line):
                rel = m.group(1).rstrip(".")
                if not any((base / rel).exists() for base in (ROOT, p.parent)):
                    missing.append(f"{p.relative_to(ROOT)}:{n}: {rel}")
    assert not missing, "\n".join(missing)


def test_training_md_states_the_shipped_checkpoints_count_and_sizes():
    """docs/training.md's count and size range of the shipped checkpoints, from the folder itself."""
    sizes = sorted(f.stat().st_size for f in (ROOT / "checkpoints" / "smollm2-135m").glob("*/new_params.safetensors"))
    text = " ".join((ROOT / "docs" / "training.md").read_text(encoding="utf-8").split())
    stated = f"holds {len(sizes)} checkpoints"
    size_range = f"from {round(sizes[0] / 1e3)} KB to {round(sizes[-1] / 1e6)} MB each"
    assert stated in text and size_range in text, (stated, size_range)


def test_pages_speak_of_golinear_not_of_how_it_was_built():
    found = [f"{p.relative_to(ROOT)}:{n}: {name}: {m!r}" for p in prose_docs()
             for n, name, m in diary_hits(p.read_text(encoding="utf-8"), DOC_COMPILED)]
    assert not found, "\n".join(found)
