"""scripts/study/device_train.sh without a GPU: what a stash call keeps on the machine (the token file, carried run
folders from any .device/resume* folder) and what a later call brings back (BRING: run folders, state.pt only while
a run is unfinished). The machine's scratch root is a temporary folder (GOLINEAR_DEVICE_TMP)."""
import json
import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_folder(path: Path, finished: bool):
    path.mkdir(parents=True)
    (path / "train_config.json").write_text(json.dumps({"summary": {"finished": finished}}))
    (path / "state.pt").write_bytes(b"optimizer state")
    (path / "new_params.safetensors").write_bytes(b"weights")


def call(repo: Path, dev: Path, out: Path, **env) -> str:
    out.mkdir(exist_ok=True)
    e = dict(os.environ, GOLINEAR_DEVICE_TMP=str(dev), OUT=str(out), SRC=".") | {"NAMES": "", "BRING": ""} | env
    r = subprocess.run(["bash", str(ROOT / "scripts/study/device_train.sh")], cwd=repo, env=e, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_a_stash_call_keeps_tokens_and_run_folders_and_a_later_call_brings_them_back(tmp_path):
    repo, dev = tmp_path / "repo", tmp_path / "machine"
    (repo / ".device" / "train").mkdir(parents=True)
    (repo / "scripts").symlink_to(ROOT / "scripts")
    (repo / ".device" / "train" / "tokens.npz").write_bytes(b"tokens")
    run_folder(repo / ".device" / "resume" / "run-a", finished=True)
    run_folder(repo / ".device" / "resume-gla" / "run-b", finished=False)
    text = call(repo, dev, tmp_path / "out1")
    assert "resumable: run-a" in text and "resumable: run-b" in text and "stashed only" in text
    assert (dev / "golinear-stash" / "train" / "tokens.npz").read_bytes() == b"tokens"
    assert (dev / "ck" / "run-b" / "state.pt").exists()

    # the next call carries none of it: the token file is linked from the stash, the folders are already there
    for d in ("train", "resume", "resume-gla"):
        subprocess.run(["rm", "-rf", str(repo / ".device" / d)], check=True)
    run_folder(repo / ".device" / "resume" / "run-b", finished=False)  # a stale copy: the machine's wins
    (dev / "ck" / "run-b" / "state.pt").write_bytes(b"newer state")
    text = call(repo, dev, tmp_path / "out2", BRING="run-a run-b")
    assert "run-b: already on the machine" in text
    assert (repo / ".device" / "train" / "tokens.npz").read_bytes() == b"tokens"
    parts = sorted((tmp_path / "out2").glob("ck.tgz.part-*"))
    assert parts
    (tmp_path / "ck.tgz").write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(tmp_path / "ck.tgz") as t:
        names = set(t.getnames())
        assert t.extractfile("run-b/state.pt").read() == b"newer state"
    assert {"run-a/train_config.json", "run-a/new_params.safetensors", "run-b/state.pt"} <= names
    assert "run-a/state.pt" not in names  # finished: the checkpoint without its optimizer state


def test_what_comes_back_is_whole_run_folders_within_the_room_finished_first(tmp_path):
    """An archive over the size limit of what comes back loses its tail (a state.pt cut in two): whole folders are chosen."""
    repo, dev = tmp_path / "repo", tmp_path / "machine"
    repo.mkdir()
    (repo / "scripts").symlink_to(ROOT / "scripts")
    for name, finished in (("run-a", True), ("run-b", False), ("run-c", False)):
        run_folder(dev / "ck" / name, finished)
        (dev / "ck" / name / "state.pt").write_bytes(os.urandom(3 << 19))  # 1.5 MiB
    text = call(repo, dev, tmp_path / "out", BRING="run-c run-a run-b", ROOM_MIB="2")
    assert 'left on the machine (over the 2 MiB brought back): run-b; bring them with BRING="run-b"' in text
    parts = sorted((tmp_path / "out").glob("ck.tgz.part-*"))
    (tmp_path / "ck.tgz").write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(tmp_path / "ck.tgz") as t:
        names = set(t.getnames())
    assert "run-a/new_params.safetensors" in names and "run-a/state.pt" not in names  # finished: no state, first
    assert "run-c/state.pt" in names and not any(n.startswith("run-b") for n in names)


FAKE_TRAIN = """#!/usr/bin/env bash
# stands in for `python3 -m bench.cli train`: a run that saves its state on TERM (models/train.py catch_sigterm),
# or, for a name ending in seed2, one that ignores the TERM
out=""; while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
mkdir -p $out; echo '{"summary": {"finished": false}}' > $out/train_config.json
case $out in *seed2) trap '' TERM;; *) trap 'echo saved on TERM > $out/state.pt; exit 0' TERM;; esac
while true; do sleep 0.2; done
"""


def test_the_runs_get_a_term_before_the_budget_and_a_kill_at_it(tmp_path):
    repo, dev, bin_ = tmp_path / "repo", tmp_path / "machine", tmp_path / "bin"
    repo.mkdir(), bin_.mkdir()
    (repo / "scripts").symlink_to(ROOT / "scripts")
    (bin_ / "python3").write_text(FAKE_TRAIN)
    (bin_ / "python3").chmod(0o755)
    text = call(repo, dev, tmp_path / "out", NAMES="gdn-seed1 gdn-seed2", BUDGET="6", STOP_S="3",
                PATH=f"{bin_}:{os.environ['PATH']}")
    assert "deadline: TERM to the runs still going" in text
    assert (dev / "ck" / "gdn-seed1" / "state.pt").read_text() == "saved on TERM\n"
    assert text.count("killed pid") == 1 and not (dev / "ck" / "gdn-seed2" / "state.pt").exists()


def test_a_run_finished_on_the_machine_is_not_relaunched_but_still_comes_back(tmp_path):
    """A warm call may list every run of the set; one already at its last step must not load and re-evaluate."""
    repo, dev = tmp_path / "repo", tmp_path / "machine"
    (repo / ".device").mkdir(parents=True)
    (repo / "scripts").symlink_to(ROOT / "scripts")
    run_folder(dev / "ck" / "gdn-onorm", finished=True)
    text = call(repo, dev, tmp_path / "out", NAMES="gdn-onorm")
    assert "gdn-onorm: finished on the machine, not relaunched" in text
    assert "launched gdn-onorm" not in text
    parts = sorted((tmp_path / "out").glob("ck.tgz.part-*"))
    (tmp_path / "ck.tgz").write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(tmp_path / "ck.tgz") as t:
        assert "gdn-onorm/new_params.safetensors" in t.getnames()
