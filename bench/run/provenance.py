"""Provenance of a `golinear run` cell: what the backend says about the evaluated weights (ModelInfo),
package versions, git state, hardware and the hashes of the data files a task read (CellProvenance)."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from golinear.bench.run.plan import REPO_ROOT, TaskEntry, task_data_files
from golinear.bench.results.store import hash_data_paths
from golinear.models.spec import ModelSpec

def jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and (math.isinf(obj) or math.isnan(obj)):
        return str(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


@dataclass(frozen=True)
class ModelInfo:
    """The backend's account of the evaluated weights (`lm.golinear_info`, from golinear.models.load.load_model
    or models.checkpoint.load_checkpoint), JSON-safe; `raw` is stored whole under the record's model.info.
    `spec` is what was loaded in the one schema (models.spec): backbone and linearize options, a checkpoint's
    own included; full attention has no mechanism."""
    raw: dict
    base: str | None = None
    base_fingerprint: str | None = None
    checkpoint_fingerprint: str | None = None
    new_parameters: int | None = None
    spec: ModelSpec = ModelSpec()

    @classmethod
    def from_lm(cls, lm) -> "ModelInfo":
        return cls.from_info(getattr(lm, "golinear_info", {}) or {})

    @classmethod
    def from_info(cls, info: dict) -> "ModelInfo":
        """The loader's info keys, each read by its one name; the weights' configuration through models.spec."""
        raw = jsonable(dict(info))
        lin = raw.get("linearize")
        spec = (ModelSpec.from_checkpoint_config({"base": raw.get("base"), "linearize": lin}) if lin
                else ModelSpec(base=raw.get("base")))
        return cls(raw, raw.get("base"), raw.get("base_fingerprint"), raw.get("checkpoint_fingerprint"),
                   raw.get("new_parameters"), spec)

    @property
    def weights_fingerprint(self) -> str | None:
        """The evaluated weights' identity for the request cache: backbone fingerprint plus checkpoint's."""
        return "-".join(x for x in (self.base_fingerprint, self.checkpoint_fingerprint) if x) or None


@dataclass(frozen=True)
class CellProvenance:
    """Where a cell's number came from: the record's `provenance`."""
    versions: dict
    git: dict
    data: dict
    seeds: dict
    limit: int | None
    world_size: int
    hardware: dict
    model_fingerprint: str | None
    checkpoint_fingerprint: str | None
    resumed_requests: int = 0  # wall_time_s counts the last attempt only; these requests came from earlier ones

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if not self.resumed_requests:
            del out["resumed_requests"]
        return out


def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "lm_eval", "datasets", "accelerate", "peft", "tokenizers"):
        try:
            out[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    try:
        out["golinear"] = importlib.metadata.version("golinear")
    except importlib.metadata.PackageNotFoundError:
        import tomllib
        out["golinear"] = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    return out


def hardware(lm) -> dict:
    """Where a cell ran: device (GPU name on CUDA), weights dtype, and which ops backend the linear layers use."""
    import torch
    device = str(getattr(lm, "device", "cpu"))
    out = {"device": device, "dtype": str(getattr(getattr(lm, "model", None), "dtype", None))}
    if getattr(lm, "generation", None):  # which decoder generated (hf, batched = the static-cache decoder, ...)
        out["generation"] = lm.generation
    if device.startswith("cuda") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    try:
        from golinear.models.attention import ops
        out["ops"] = ops.backend_name(torch.empty(0, device=device))
    except Exception as exc:  # provenance must never stop an evaluation
        out["ops"] = f"unknown ({type(exc).__name__})"
    if device.startswith("cuda"):  # the recorded Triton autotuning choices the kernels ran with (speed only)
        out["kernel_configs"] = kernel_configs_used()
    return out


def kernel_configs_used() -> str:
    """Which file of recorded kernel configurations this process pins (models.attention.ops.kernel_configs): its
    name and content hash, 'off' or 'none' (the kernels autotuned)."""
    try:
        from golinear.models.attention.ops import kernel_configs
        if os.environ.get("GOLINEAR_KERNEL_CONFIGS", "").strip().lower() in ("off", "0", "none"):
            return "off"
        path = kernel_configs.card_file()
        if path is None or not path.exists():
            return "none"
        return f"{path.name} sha256:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    except Exception as exc:  # provenance must never stop an evaluation
        return f"unknown ({type(exc).__name__})"


GIT_RECORD = ".golinear-git.json"  # in a copy without .git (an offline bundle's repo/): git_state where it was made


def git_state() -> dict:
    """HEAD and whether bench/models/tasks differ from it. GOLINEAR_GIT_COMMIT overrides both where the
    .git beside the code is not the tree's own (a newer tree copied beside an older .git); an offline
    bundle's copy of the code has no .git and says where it was copied from in GIT_RECORD (bench.offline.bundle)."""
    if os.environ.get("GOLINEAR_GIT_COMMIT"):
        return {"commit": os.environ["GOLINEAR_GIT_COMMIT"], "dirty": False, "source": "GOLINEAR_GIT_COMMIT"}
    record = REPO_ROOT / GIT_RECORD
    if record.is_file():
        made = json.loads(record.read_text())
        return {"commit": str(made.get("commit")), "dirty": bool(made.get("dirty")), "source": GIT_RECORD}

    def git(*args):
        r = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "bench", "models", "tasks")
    return {"commit": commit, "dirty": bool(dirty) if commit else None}


def _paths_in(obj, found: set):
    if isinstance(obj, dict):
        for v in obj.values():
            _paths_in(v, found)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _paths_in(v, found)
    elif isinstance(obj, str) and obj.startswith(os.sep) and len(obj) < 4096:
        p = Path(obj)
        if p.exists() and not p.is_relative_to(sys.prefix):
            found.add(p)


def data_hashes(res: dict, entry: TaskEntry, data_dir: str | None) -> dict:
    """sha256 of the data files a task read: declared by its suite, named in its lm-eval configs, entry.data."""
    found = task_data_files(entry.task, entry.suite, data_dir)
    _paths_in(res.get("configs", {}), found)
    if data_dir:
        found |= {Path(data_dir) / d for d in entry.data}
    skip = [data_dir] if data_dir else []
    hashes = hash_data_paths(found, skip_roots=skip)
    def rel(k):
        for root in ([data_dir] if data_dir else []) + [str(REPO_ROOT)]:
            if k.startswith(root + os.sep):
                return os.path.relpath(k, root)
        return k
    hashes = {rel(k): v for k, v in hashes.items()}
    hub = [] if data_dir else sorted({c.get("dataset_path") for c in res.get("configs", {}).values()
                  if isinstance(c, dict) and c.get("dataset_path") and not str(c["dataset_path"]).startswith(os.sep)
                  and c.get("dataset_path") not in ("json", "parquet", "csv", "arrow")})
    return {"files": dict(sorted(hashes.items())), "hub_datasets": hub}
