"""golinear's calls into transformers on the lowest and the highest version pyproject.toml admits: the cache argument
changed its name in 5.24 (models/backbones/cache_arg.py), so each call that passes or reads a cache runs under both,
and both give the same tokens. The lowest version is installed beside the environment (pip --target, no other
package changed); the highest admitted one is the environment's own (constraints.txt)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the lowest admitted transformers and what it imports that the environment's newer stack no longer brings (or
# brings too new), each pinned by version and sha256 (pip --require-hashes: what a test installs is what was checked)
LOWEST = {  # wheel: sha256 (all py3-none-any)
    "transformers==5.17.0": "78ec1ce21579b38dfb83950a0658cd119f87212a2fcfdff478096ce9d6c03801",
    "huggingface_hub==1.33.0": "04e434b06e100eddbce9a6e817d72693a7884b10a79bd67ab48080d5c07eb899",
    "httpx==0.29.0": "6734dcf742ced6e8018e45d3f9f7728975b6b3e1085a24f3e2c056069d858bd1",
    "httpcore==1.0.9": "2d400746a40668fc9dec9810239072b40b4484b640a8c38fd654a024c7a1bf55",
    "h11==0.16.0": "63cf8bbe7522de3bf65932fda1d9c2772064ffb3dae62d55932da54b31cb6c86",
    "anyio==4.16.0": "c66ae634e0b8228396b801741beb3294326d4b6102f7bba4041c0dfb58c29026",
}

SCRIPT = r'''
import json, sys, warnings
import torch, transformers
sys.path.insert(0, sys.argv[2])
from _tiny import write_tiny_backbone
from golinear.models.backbones.backbone import load_backbone
from golinear.models.attention.linearize import LinearizeConfig, linearize
from golinear.models.kv_compression.generate import generate
from golinear.models.kv_compression.static_decode import PressDecoder
from golinear.bench.speed.latency_runs import run_full
warnings.simplefilter("error", FutureWarning)  # a deprecated argument of ours fails here
model, _ = load_backbone(sys.argv[1])
ids = list(range(5, 300))
out = {"version": transformers.__version__}
out["press"] = generate(model, ids, 5, "snapkv", 128, 6)
dec = PressDecoder(model, max_len=140)
out["press_static"] = torch.cat([dec.prefill([(ids, 5)], "snapkv", 128), dec.decode(5)], 1)[0].tolist()
run_full(model, torch.tensor([ids]), 3)
torch.manual_seed(0)
linearize(model, LinearizeConfig.from_dict({"mechanism": "gdn", "window": 8, "sinks": 2}))
out["linear_hf_generate"] = model.generate(torch.tensor([ids[:40]]), max_new_tokens=6, do_sample=False)[0, 40:].tolist()
print(json.dumps(out))
'''


def lowest_admitted() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'"transformers>=([0-9.]+),', text).group(1)


def run_script(tmp_path, extra_path: str | None) -> dict:
    from _tiny import write_tiny_backbone
    base = tmp_path / "base"
    if not base.exists():
        write_tiny_backbone(base)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (extra_path, str(ROOT)) if p))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(base), str(ROOT / "tests")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_cache_calls_run_alike_on_the_lowest_and_highest_admitted_transformers(tmp_path):
    low = lowest_admitted()
    assert f"transformers=={low}.0" in LOWEST or f"transformers=={low}" in LOWEST  # pinned beside the bound
    cache = Path(os.environ.get("GOLINEAR_CACHE", Path.home() / ".cache" / "golinear"))
    target = cache / f"test-transformers-{low}-pinned"
    if not (target / "transformers").is_dir():
        reqs = tmp_path / "lowest.txt"
        reqs.write_text("".join(f"{r} --hash=sha256:{h}\n" for r, h in LOWEST.items()))
        partial = target.with_name(f"{target.name}.partial-{os.getpid()}")  # a failed install leaves no target
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
                              "--require-hashes", "--target", str(partial), "-r", str(reqs)],
                             capture_output=True, text=True, timeout=600)
        assert pip.returncode == 0, pip.stderr[-2000:]
        partial.rename(target)
    lowest, highest = run_script(tmp_path, str(target)), run_script(tmp_path, None)
    from packaging.version import Version
    assert Version(lowest["version"]) == Version(low) < Version(highest["version"])
    assert {k: v for k, v in lowest.items() if k != "version"} == {k: v for k, v in highest.items() if k != "version"}
    assert lowest["press"] == lowest["press_static"]
