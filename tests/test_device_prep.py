"""The preparation scripts of the GPU runs (docs/study.md): the GGUF split into parts that join
back to the same bytes, and the checkpoint files a call carries (a missing checkpoint is a one-line error)."""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sh(script, *args, **env):
    return subprocess.run(["bash", str(ROOT / script), *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **{k: str(v) for k, v in env.items()}})


def test_gguf_parts_join_to_the_file(tmp_path):
    blob = os.urandom(45_000_000)  # three parts of at most 19.7 MB
    (tmp_path / "m.gguf").write_bytes(blob)
    out = sh("scripts/gpu/prepare_gguf.sh", GGUF=tmp_path / "m.gguf", OUT_DIR=tmp_path / "parts")
    assert out.returncode == 0, out.stderr
    parts = sorted((tmp_path / "parts").glob("?/smollm2.gguf.part?"))
    assert [p.parent.name for p in parts] == ["a", "b", "c"] and all(p.name.endswith(p.parent.name) for p in parts)
    assert b"".join(p.read_bytes() for p in parts) == blob
    assert f"GGUF_SHA={hashlib.sha256(blob).hexdigest()}" in out.stdout
    missing = sh("scripts/gpu/prepare_gguf.sh", GGUF=tmp_path / "none.gguf", OUT_DIR=tmp_path / "p2")
    assert missing.returncode == 2 and "no GGUF file" in missing.stdout


def test_pack_checkpoints_copies_the_three_files(tmp_path):
    src = tmp_path / "src"
    for name in ("a", "b"):
        (src / name).mkdir(parents=True)
        for f in ("config.json", "new_params.safetensors", "train_config.json", "train_log.jsonl"):
            (src / name / f).write_text(f"{name}/{f}")
    out = sh("scripts/study/pack_checkpoints.sh", tmp_path / "ck", "a", "b", SRC=src)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "ck" / "b").iterdir()) == ["config.json", "new_params.safetensors",
                                                                       "train_config.json"]
    assert (tmp_path / "ck" / "a" / "config.json").read_text() == "a/config.json"
    bad = sh("scripts/study/pack_checkpoints.sh", tmp_path / "ck2", "a", "zzz", SRC=src)
    assert bad.returncode == 2 and "no checkpoint" in bad.stdout and "zzz" in bad.stdout
    assert not (tmp_path / "ck2" / "zzz").exists()


def test_pack_checkpoints_reads_a_folder_the_sparse_tree_left_out_from_head(tmp_path):
    repo = tmp_path / "repo"
    (repo / "ck" / "a").mkdir(parents=True)
    for f in ("config.json", "new_params.safetensors", "train_config.json"):
        (repo / "ck" / "a" / f).write_text(f"committed {f}")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "a checkpoint"]):
        subprocess.run(git + args, check=True, capture_output=True)
    for f in (repo / "ck" / "a").iterdir():
        f.unlink()  # what `git sparse-checkout set ... '!/ck/*/'` leaves
    out = subprocess.run(["bash", str(ROOT / "scripts/study/pack_checkpoints.sh"), str(tmp_path / "out"), "a"],
                         cwd=repo, capture_output=True, text=True, env={**os.environ, "SRC": "ck"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "out" / "a" / "new_params.safetensors").read_text() == "committed new_params.safetensors"
    assert sorted(p.name for p in (tmp_path / "out" / "a").iterdir()) == ["config.json", "new_params.safetensors",
                                                                         "train_config.json"]


def test_device_setup_leaves_the_callers_variables(tmp_path):
    """A script that sources the set-up keeps its own settings: retention_check.sh's PARTS (which parts run) was
    once overwritten by the set-up's list of GGUF parts, and a GPU run ran none of them."""
    script = f'PARTS="c1 c2"; source {ROOT}/scripts/gpu/device_setup.sh >/dev/null; echo "PARTS=$PARTS"'
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "GOLINEAR_DEVICE_TMP": str(tmp_path / "dev")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "PARTS=c1 c2"
