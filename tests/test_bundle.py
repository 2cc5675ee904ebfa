"""`golinear bundle` for a GPU machine without network: a small bundle (a locally built wheel, one suite's data,
the default checkpoint, split into parts) is joined, installed into a fresh virtual environment with pip
--no-index and no reachable network, and runs commands from it."""
import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
NO_NETWORK = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "PIP_NO_INDEX": "1",
              "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

PROBE = '''import json, os, sys
from pathlib import Path


def main():
    from golinear.models.spec.checkpoint_paths import resolve_checkpoint  # from the bundle's repo/, found through PYTHONPATH
    data = Path(os.environ["GOLINEAR_DATA"])
    files = sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file())
    out = {"python": sys.executable, "checkpoint": str(resolve_checkpoint("gdn-w56-s8-sc")), "data": files,
           "cwd": os.getcwd()}
    Path(sys.argv[1]).write_text(json.dumps(out))
'''


def probe_wheel(folder: Path) -> Path:
    """A pure-Python wheel with a console script, written by hand (the wheel format is a zip with a RECORD)."""
    files = {"golinear_probe/__init__.py": PROBE.encode(),
             "golinear_probe-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: golinear-probe\nVersion: 0.1\n",
             "golinear_probe-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                   b"Tag: py3-none-any\n",
             "golinear_probe-0.1.dist-info/entry_points.txt": b"[console_scripts]\ngolinear-probe = golinear_probe:main\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},"
                     f"{len(b)}\n" for n, b in files.items()) + "golinear_probe-0.1.dist-info/RECORD,,\n"
    path = folder / "golinear_probe-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, b in files.items():
            z.writestr(n, b)
        z.writestr("golinear_probe-0.1.dist-info/RECORD", record)
    return path


def golinear(*argv, cwd=ROOT):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([sys.executable, "-m", "golinear.bench.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "lambada_openai").is_dir(), reason="needs the shared data folder")
def test_a_split_bundle_installs_offline_and_runs(tmp_path):
    wheel = probe_wheel(tmp_path)
    bundle = tmp_path / "bundle"
    r = golinear("bundle", "--out", str(bundle), "--no-download", "--wheel", str(wheel), "--no-backbone",
                 "--suites", "lambada", "--data-dir", str(DATA), "--checkpoints", "gdn-w56-s8-sc", "--split-mb", "2",
                 cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    parts = sorted(bundle.glob("golinear-bundle.tar.part-*"))
    assert len(parts) > 1 and all(p.stat().st_size <= 2 * 2**20 for p in parts)
    assert sorted(p.name for p in bundle.iterdir()) == sorted([p.name for p in parts] + ["unpack.sh"])

    machine = tmp_path / "gpu-machine"  # what the offline machine does: join, install, run
    subprocess.run(["bash", str(bundle / "unpack.sh"), str(machine)], check=True, capture_output=True)
    here = machine / "golinear-bundle"
    manifest = json.loads((here / "MANIFEST.json").read_text())
    assert manifest["wheels"] == [wheel.name] and manifest["checkpoints"] == ["gdn-w56-s8-sc"]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    recorded = json.loads((here / "repo" / ".golinear-git.json").read_text())  # the copy has no .git
    assert recorded == manifest["git"] and recorded["commit"] == head and not (here / "repo" / ".git").exists()
    assert manifest["data_files"] and all(f.startswith("lambada_openai/") for f in manifest["data_files"])
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable, **NO_NETWORK}
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(here / "run.sh"), str(out), "golinear-probe", "{out}/probe.json"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = json.loads((out / "probe.json").read_text())
    assert got["python"].startswith(str(here / "venv"))  # the bundle's fresh environment
    assert Path(got["checkpoint"]) == here / "repo" / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"
    assert Path(got["cwd"]) == here / "repo"
    assert set(manifest["data_files"]) | {"SHA256SUMS"} == set(got["data"])
    lines = (here / "data" / "SHA256SUMS").read_text().splitlines()
    sums = {name.lstrip("*./"): digest for digest, name in (line.split(maxsplit=1) for line in lines)}
    for f in manifest["data_files"]:  # the copied data is byte for byte the data folder's
        assert hashlib.sha256((here / "data" / f).read_bytes()).hexdigest() == sums[f]
    # a golinear command from the bundle's repository, in the same environment (help needs no torch)
    r = subprocess.run(["bash", str(here / "run.sh"), str(out), "golinear", "bundle", "--help"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "usage: golinear bundle" in r.stdout, r.stderr[-2000:]
    assert "usage: golinear bundle" in (out / "run.log").read_text()


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    r = golinear("bundle", "--out", str(tmp_path / "b"), "--no-download", "--wheel", str(probe_wheel(tmp_path)),
                 "--checkpoints", "no-such-run", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "looked in" in r.stderr and "no-such-run" in r.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    r = golinear("bundle", "--out", str(tmp_path / "full"), "--no-download", "--wheel", str(tmp_path / "nope.whl"))
    assert r.returncode == 2 and "--out" in r.stderr
    r = golinear("bundle", "--out", str(tmp_path / "b"), "--no-download", "--wheel", str(tmp_path / "nope.whl"))
    assert r.returncode == 2 and "nope.whl" in r.stderr
    r = golinear("bundle", "--out", str(tmp_path / "b"), "--no-download", "--wheel", str(probe_wheel(tmp_path)),
                 "--split-mb", "0")
    assert r.returncode == 2 and "--split-mb 0.0" in r.stderr
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob("b.partial-*"))


def test_bundle_pins_every_wheel_and_a_changed_wheel_installs_nothing(tmp_path):
    """The bundle records each wheel's sha256; run.sh checks them before pip opens a wheel and installs with
    --require-hashes: a wheel changed after the build stops it in one line, no environment made."""
    wheel = probe_wheel(tmp_path)
    bundle = tmp_path / "bundle"
    r = golinear("bundle", "--out", str(bundle), "--no-download", "--wheel", str(wheel), "--no-backbone", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"bash {bundle.name}/run.sh OUT_DIR" in r.stdout
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert (bundle / "wheels" / "SHA256SUMS").read_text() == f"{digest}  {wheel.name}\n"
    assert (bundle / "requirements-hashed.txt").read_text() == f"golinear-probe==0.1 --hash=sha256:{digest}\n"
    shipped = bundle / "wheels" / wheel.name
    shipped.write_bytes(shipped.read_bytes().replace(b"def main():", b"def main(): 0;"))  # same size, other code
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable, **NO_NETWORK}
    r = subprocess.run(["bash", str(bundle / "run.sh"), str(tmp_path / "out"), "golinear-probe", "{out}/p.json"],
                       env=env, capture_output=True, text=True, timeout=300)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and wheel.name in err[0] and "sha256" in err[0], r.stderr
    assert not (bundle / "venv").exists()


def test_run_sh_keeps_an_out_path_with_an_ampersand(tmp_path):
    wheel = probe_wheel(tmp_path)
    bundle = tmp_path / "b & c"
    r = golinear("bundle", "--out", str(bundle), "--no-download", "--wheel", str(wheel), "--no-backbone", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "bash 'b & c/run.sh' OUT_DIR" in r.stdout  # the printed hint is quoted
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable, **NO_NETWORK}
    out = tmp_path / "out&more"
    r = subprocess.run(["bash", str(bundle / "run.sh"), str(out), "echo", "{out}/x"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == f"{out}/x", r.stdout + r.stderr


def small_bundle(tmp_path, where: Path) -> subprocess.CompletedProcess:
    r = golinear("bundle", "--out", str(where), "--no-download", "--wheel", str(probe_wheel(tmp_path)),
                 "--no-backbone", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def run_sh(bundle: Path, out: Path, *argv, **env):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(out.parent), "PYTHON": sys.executable, **NO_NETWORK, **env}
    return subprocess.run(["bash", str(bundle / "run.sh"), str(out), *argv], env=env, capture_output=True,
                          text=True, timeout=300)


def test_run_sh_writes_no_path_a_shell_reads(tmp_path):
    """A bundle's path with quotes, `$()`, backticks, `&`, spaces or newlines runs nothing of that path: the
    `golinear` launcher holds no path, and an environment path a pip launcher would hand to a shell is refused."""
    payload = tmp_path / "P"
    hostile = tmp_path / f'x"$(touch {payload})"`touch {payload}` y'
    small_bundle(tmp_path, hostile)
    r = run_sh(hostile, tmp_path / "out", "golinear", "bundle", "--help")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "GOLINEAR_VENV" in r.stderr, r.stderr
    assert not payload.exists() and not (hostile / "venv").exists()
    r = run_sh(hostile, tmp_path / "out", "golinear", "bundle", "--help", GOLINEAR_VENV=str(tmp_path / "v"))
    assert r.returncode == 0 and "usage: golinear bundle" in r.stdout, r.stdout + r.stderr
    assert not payload.exists()
    plain = tmp_path / "a b'c&d\ne"  # only characters a shell keeps as they are inside double quotes
    small_bundle(tmp_path, plain)
    r = run_sh(plain, tmp_path / "out 2", "golinear", "bundle", "--help")
    assert r.returncode == 2 and "newline" in r.stderr
    plain = plain.rename(tmp_path / "a b'c&d")
    r = run_sh(plain, tmp_path / "out 2", "golinear", "bundle", "--help")
    assert r.returncode == 0 and "usage: golinear bundle" in r.stdout, r.stdout + r.stderr
    assert "${0%/*}" in (plain / "venv" / "bin" / "golinear").read_text()
    copy = tmp_path / "copy"  # an environment copied along with a bundle was not made here: refused
    subprocess.run(["cp", "-a", str(plain), str(copy)], check=True)
    r = run_sh(copy, tmp_path / "out", "echo", "ran")
    assert r.returncode == 1 and "was not made on this machine" in r.stderr and "ran" not in r.stdout, r.stderr


def test_the_whole_bundle_is_pinned_by_one_sha256(tmp_path):
    """`golinear bundle` prints the sha256 of a manifest of every file; run.sh checks every file against it (run.sh
    and repo/ too) and refuses one added, changed or missing, even when the wheels' own sums were changed with them."""
    bundle = tmp_path / "b"
    r = small_bundle(tmp_path, bundle)
    manifest = bundle / "BUNDLE-SHA256SUMS"
    assert f"sha256 of BUNDLE-SHA256SUMS: {hashlib.sha256(manifest.read_bytes()).hexdigest()}" in r.stdout
    listed = {line.split("  ", 1)[1] for line in manifest.read_text().splitlines()}
    on_disk = {"./" + str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file()} - {"./BUNDLE-SHA256SUMS"}
    assert listed == on_disk and {"./run.sh", "./repo/bench/cli.py", "./MANIFEST.json"} <= listed
    assert subprocess.run(["sha256sum", "--quiet", "-c", "BUNDLE-SHA256SUMS"], cwd=bundle).returncode == 0
    out = tmp_path / "out"

    def refused(what: str):
        r = run_sh(bundle, out, "echo", "ran")
        err = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(err) == 1 and what in err[0] and "ran" not in r.stdout, r.stderr
        assert not (bundle / "venv" / "bin" / "python").exists()  # nothing installed

    wheel = next((bundle / "wheels").glob("*.whl"))  # a new wheel with its sums changed to match
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (bundle / "wheels" / "SHA256SUMS").write_text(f"{digest}  {wheel.name}\n")
    (bundle / "requirements-hashed.txt").write_text(f"golinear-probe==0.1 --hash=sha256:{digest}\n")
    refused("differs from the sha256 recorded")
    subprocess.run(["rm", "-rf", str(bundle)], check=True)
    small_bundle(tmp_path, bundle)
    (bundle / "repo" / "sitecustomize.py").write_text(f"open({str(tmp_path / 'P')!r}, 'w')\n")
    refused("repo/sitecustomize.py is not one of the bundle's files")
    (bundle / "repo" / "sitecustomize.py").unlink()
    cli = bundle / "repo" / "bench" / "cli.py"
    cli.write_text(cli.read_text() + "\n")
    refused("repo/bench/cli.py differs")
    cli.write_text(cli.read_text()[:-1])
    (bundle / "repo" / "bench" / "__pycache__").mkdir()
    (bundle / "repo" / "bench" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"x")
    refused("__pycache__/cli.cpython-311.pyc is not one of")
    subprocess.run(["rm", "-rf", str(bundle / "repo" / "bench" / "__pycache__")], check=True)
    (bundle / "venv" / "bin").mkdir(parents=True)  # an environment shipped inside the bundle
    (bundle / "venv" / ".golinear-installed").write_text("x")
    refused("was not made on this machine")
    subprocess.run(["rm", "-rf", str(bundle / "venv")], check=True)
    (bundle / "repo" / "README.md").unlink()
    refused("README.md is missing")
    assert not (tmp_path / "P").exists()


def test_code_without_git_names_the_commit_its_bundle_was_made_from(tmp_path, monkeypatch):
    from golinear.bench.run import provenance
    monkeypatch.delenv("GOLINEAR_GIT_COMMIT", raising=False)
    monkeypatch.setattr(provenance, "REPO_ROOT", tmp_path)  # a bundle's repo/: no .git
    (tmp_path / provenance.GIT_RECORD).write_text(json.dumps({"commit": "abc123", "dirty": True}))
    assert provenance.git_state() == {"commit": "abc123", "dirty": True, "source": provenance.GIT_RECORD}
