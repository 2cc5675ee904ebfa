"""`golinear run`: evaluate models x suites x configurations into the result store, resumably.

Every cell (one model configuration, one task, one evaluation configuration) is evaluated with
lm-eval's `simple_evaluate` and written to the store atomically with its provenance the moment it
finishes; cells already in the store are skipped, so a killed run resumes without loss or duplicates.
Under `accelerate launch` (or torchrun) the ranks split each cell's requests as lm-eval does and rank 0
writes the merged result. `run_matrix` is the Python entry point (used by `golinear demo` and `check`).
"""
from __future__ import annotations

import copy
import importlib
import importlib.metadata
import logging
import math
import os
import platform
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

from bench import specs as S
from bench.store import CellKey, Store, hash_data_paths
from models.data_hashes import verify_files

REPO_ROOT = Path(__file__).resolve().parent.parent
STANDARD_SUITES = ("cr", "mmlu", "lambada")
LONG_SUITES = ("sniah", "ruler")
ALL_SUITES = STANDARD_SUITES + LONG_SUITES
DEFAULT_FEWSHOT = {"cr": 0, "mmlu": 5, "lambada": 0}
LM_EVAL_SEEDS = {"random_seed": 0, "numpy_random_seed": 1234, "torch_random_seed": 1234, "fewshot_random_seed": 1234}
log = logging.getLogger("golinear.run")


# ----------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class TaskEntry:
    """One lm-eval task (or group, e.g. mmlu) and the metric that its leaderboard column shows."""
    suite: str
    task: str
    metric: str
    display: str
    num_fewshot: int | None = None
    higher_is_better: bool = True
    data: tuple = ()  # data paths (relative to the data dir) the task reads, for provenance hashes

    @property
    def long(self) -> bool:
        return self.suite in LONG_SUITES


def _entry(suite: str, item) -> TaskEntry:
    """Normalise one SUITES item: a task name, a (task, metric[, display]) tuple or a dict."""
    if isinstance(item, str):
        item = {"task": item, **(_long_task_details(item) if suite in LONG_SUITES else {})}
    elif isinstance(item, (tuple, list)):
        item = dict(zip(("task", "metric", "display"), item))
    elif not isinstance(item, dict):
        item = {k: getattr(item, k) for k in ("task", "metric", "display", "num_fewshot") if hasattr(item, k)}
    task = item.get("task") or item.get("name")
    metric = item.get("metric") or ("acc" if suite in STANDARD_SUITES else "score")
    nf = item.get("num_fewshot", DEFAULT_FEWSHOT.get(suite))
    data = item.get("data") or item.get("data_files") or ()
    return TaskEntry(suite, task, metric, item.get("display") or item.get("label") or task, nf,
                     item.get("higher_is_better", metric not in ("perplexity", "word_perplexity")),
                     tuple([data] if isinstance(data, str) else data))


def _long_task_details(task: str) -> dict:
    """Display name and data folders of a RULER/S-NIAH task, from tasks.ruler's task table."""
    try:
        ruler = importlib.import_module("tasks.ruler")
        from tasks.ruler.constants import RECIPES
        t = ruler.resolve_task(task)
    except (ModuleNotFoundError, ValueError, ImportError):
        return {}
    family, args = RECIPES[t.ruler]
    data = ["paul_graham_essays"] if args.get("type_haystack") == "essay" else []
    data += {"squad": ["squad_v2"], "hotpotqa": ["hotpotqa_sample100", "hotpotqa"]}.get(args.get("dataset"), [])
    return {"display": t.display, "metric": "score", "data": data}


def suite_module(suite: str):
    return importlib.import_module("tasks.standard" if suite in STANDARD_SUITES else "tasks.ruler")


def resolve_suites(names, extra_suites: dict | None = None) -> list[TaskEntry]:
    """Suite names -> task entries, from tasks.standard / tasks.ruler SUITES (plus extra_suites)."""
    names = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    known = set(ALL_SUITES) | set(extra_suites or {})
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"unknown suite(s) {bad or names}; allowed: {sorted(known)}")
    out = []
    for name in names:
        if extra_suites and name in extra_suites:
            items = extra_suites[name]
        else:
            try:
                items = suite_module(name).SUITES[name]
            except ModuleNotFoundError as e:
                raise ValueError(f"suite {name!r} is not available in this build ({e.name} missing)") from None
        out += [_entry(name, it) for it in items]
    return out


def default_data_dir() -> str | None:
    env = os.environ.get("GOLINEAR_DATA")
    if env:
        return env
    d = REPO_ROOT.parent / "shared" / "data"
    return str(d) if d.is_dir() else None


def check_data_dir(data_dir: str | None) -> str | None:
    if data_dir is None:
        return None
    p = Path(data_dir).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"data folder {data_dir!r} does not exist (set --data-dir or GOLINEAR_DATA)")
    return str(p.resolve())


def build_task_manager(data_dir: str | None, include_path=None):
    """One TaskManager for the process (indexing takes seconds): ours if tasks.standard exists."""
    from lm_eval.tasks import TaskManager
    try:
        std = importlib.import_module("tasks.standard")
    except ModuleNotFoundError as e:
        if e.name not in ("tasks.standard", "tasks"):
            raise
        std = None
    if std is not None and hasattr(std, "task_manager"):
        tm = std.task_manager(data_dir)
        if include_path:  # extra user task folders on top of ours
            paths = [tm.include_path] if isinstance(tm.include_path, (str, Path)) else list(tm.include_path or [])
            tm = TaskManager(include_path=paths + [include_path], metadata=tm.metadata)
        return tm
    return TaskManager(include_path=include_path)


def with_metadata(tm, metadata: dict):
    """A shallow copy of an indexed TaskManager whose tasks receive `metadata` (RULER's lengths etc.)."""
    from lm_eval.tasks._factory import TaskFactory
    tm2 = copy.copy(tm)
    tm2.metadata = {**(tm.metadata or {}), **metadata}
    tm2._factory = TaskFactory(meta=tm2.metadata)
    return tm2


def check_task_data(entries, data_dir: str | None) -> None:
    """Every local file the suites need exists (FileNotFoundError naming it) before any work starts."""
    by_suite = {}
    for e in entries:
        by_suite.setdefault(e.suite, []).append(e.task)
        if e.data and data_dir and not any((Path(data_dir) / d).exists() for d in e.data):
            raise FileNotFoundError(f"task {e.display} needs {' or '.join(e.data)} in the data folder {data_dir!r}")
    for suite, tasks in by_suite.items():
        try:
            mod = suite_module(suite)
        except ModuleNotFoundError:
            continue
        if hasattr(mod, "check_data"):
            mod.check_data(list(dict.fromkeys(tasks)), data_dir)


def check_long_context_fits(cells, data_dir) -> None:
    """RULER's QA tasks need room for whole documents: build one sample per QA task and tokenizer now,
    so a too-short --context-length fails before any evaluation (not after an hour of other cells)."""
    seen = set()
    for c in cells:
        if c.entry.suite != "ruler" or not c.entry.task.endswith(("_hqa", "_sqa")):
            continue
        k = (c.entry.task, c.model.base_name, c.config["context_length"])
        if k in seen:
            continue
        seen.add(k)
        from tasks.ruler import build_samples
        try:
            build_samples(c.entry.task, c.model.base_name, max_seq_length=c.config["context_length"],
                          num_samples=1, seed=c.config["seed"], data_dir=data_dir)
        except ValueError as e:
            raise ValueError(f"{c.entry.display} at --context-length {c.config['context_length']}: {e}") from None


# ----------------------------------------------------------------------------- planning
@dataclass
class Cell:
    model: S.ModelSpec
    entry: TaskEntry
    config: dict
    data: dict | None = None  # {file: sha256} of the task's data and config files (part of the identity)

    @property
    def key(self) -> CellKey:
        return CellKey(self.model.key, self.entry.task, self.config, self.data)


def task_config_files(task: str) -> list[Path]:
    """The lm-eval YAMLs that define a task: `<task>.yaml`, its subtasks' `<task>_*.yaml` (MMLU's subjects),
    and the files they `include:`."""
    tasks_dir = REPO_ROOT / "tasks"
    own = sorted(p for p in tasks_dir.rglob("*.yaml") if p.stem == task or p.stem.startswith(task + "_"))
    out = set(own)
    for p in own:
        for line in p.read_text(encoding="utf-8").splitlines():
            if line.startswith("include:"):
                inc = (p.parent / line.split(":", 1)[1].strip().strip("'\"")).resolve()
                if inc.is_file():
                    out.add(inc)
    return sorted(out)


def cell_data(entry: TaskEntry, data_dir: str | None) -> dict:
    """{file: sha256} of everything a task reads: its data files (relative to the data folder, checked
    against the folder's SHA256SUMS; a mismatch is an error naming the file) and its config files
    (relative to the repository). With no local data folder (Hub datasets) only the config files."""
    data = set(task_data_files(entry.task, entry.suite, data_dir))
    if data_dir:
        for d in entry.data:
            p = Path(data_dir) / d
            data |= set(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else ({p} if p.exists() else set())
    out = verify_files(data, data_dir)
    for p in task_config_files(entry.task):
        out[os.path.relpath(p, REPO_ROOT)] = verify_files([p], None)[str(p.resolve())]
    return dict(sorted(out.items()))


def plan_cells(models, entries, *, budgets=None, sinks=8, limit=None, context_length=4096,
               num_samples=None, seed=42, data: dict | None = None) -> list[Cell]:
    """The matrix: standard tasks on the models as given; long tasks on the budget sweep when asked.

    With budgets, every linearized model is evaluated at sinks + (budget - sinks) window, next to full
    attention (budget inf) and the untrained window+sink attention at the same budgets. `data`: task ->
    {file: sha256} (cell_data), part of each cell's key.
    """
    data = data or {}
    cells = []
    long_models = list(models)
    if budgets:
        long_models, seen = [], set()

        def add(spec):
            if spec.key not in seen:
                seen.add(spec.key)
                long_models.append(spec)
        for m in models:
            if m.is_full_attention or m.full["mechanism"] == "none":
                continue
            add(S.full_attention(m))
            for b in budgets:
                add(m.with_budget(b, sinks))
            for b in budgets:
                add(S.window_only(m).with_budget(b, sinks))
        for m in models:  # models the user named that the sweep does not cover
            if m.is_full_attention:
                add(m)
    first = {}
    for e in entries:  # one cell per task: all its metrics come from one evaluation
        first.setdefault(e.task, e)
    for e in first.values():
        if e.long:
            n = num_samples if num_samples is not None else (limit if limit is not None else None)
            config = {"limit": limit, "context_length": context_length, "num_samples": n, "seed": seed}
            cells += [Cell(m, e, config, data.get(e.task)) for m in long_models]
        else:
            config = {"limit": limit, "num_fewshot": e.num_fewshot}
            cells += [Cell(m, e, config, data.get(e.task)) for m in models]
    return cells


# ----------------------------------------------------------------------------- models
def _backend_module():
    try:
        return importlib.import_module("bench.lm_backend")
    except ModuleNotFoundError as e:
        if e.name != "bench.lm_backend":
            raise
        return None


def backend_and_args(spec: S.ModelSpec) -> tuple[str, dict]:
    return ("golinear-hf" if spec.is_full_attention else "linearized"), spec.model_args()


LINEARIZE_KEYS = ("mechanism", "window", "sinks", "short_conv", "lora", "full_layers", "keep_full", "select")


def validate_model(spec: S.ModelSpec, device: str) -> None:
    """Every check that needs no weights: the backend's argument check (names, dtype, device, checkpoint
    folder), the backbone's config (base) and the linearize options against it (models.spec)."""
    from models.spec import backbone_config, check_linearize
    mod = _backend_module()
    a = spec.full
    try:
        if mod is not None and hasattr(mod, "check_model_args"):
            backend, args = backend_and_args(spec)
            mod.check_model_args(backend, {**args, "device": device})
        if a["mechanism"] is not None and not a["checkpoint"]:
            opts = {k: (list(a[k]) if isinstance(a[k], tuple) else a[k]) for k in LINEARIZE_KEYS}
            check_linearize(opts, spec.base_name)
        else:
            backbone_config(spec.base_name)
    except ValueError as e:
        raise ValueError(f"model {spec.label!r}: {e}") from None


def build_lm(spec: S.ModelSpec, batch_size=1, device="cpu"):
    """An lm-eval LM for a spec: `golinear-hf` for full attention, `linearized` otherwise."""
    import lm_eval.models  # noqa: F401 - registers the built-ins first (registry pitfall)
    from lm_eval.api.registry import get_model
    extra = {"batch_size": batch_size, "device": device}
    if _backend_module() is not None:
        backend, args = backend_and_args(spec)
        return get_model(backend).create_from_arg_obj(args, extra)
    if not spec.is_full_attention:
        raise ValueError(f"model {spec.label!r} needs the 'linearized' backend (bench/lm_backend.py), "
                         "which this build lacks")
    # Interim path: lm-eval's own HF backend on the same backbone folder.
    from models.backbone import fingerprint, resolve
    a = spec.full
    lm = get_model("hf").create_from_arg_obj({"pretrained": resolve(a["base"]), "dtype": a["dtype"]}, extra)
    lm.golinear_info = {"spec": spec.key, "backbone_fingerprint": fingerprint(lm.model),
                        "checkpoint_fingerprint": None, "new_params": 0, "cache_budget": "inf"}
    return lm


def check_checkpoint_base(spec: S.ModelSpec) -> None:
    """A checkpoint trained on another backbone is refused before any work."""
    ckpt, base = spec.full["checkpoint"], spec.args.get("base")
    if not ckpt or not base:
        return
    if (Path(ckpt) / "config.json").exists():
        from models.checkpoint import read_config
        meta = read_config(ckpt)  # names the file when its JSON is broken
        ck_base = meta.get("base") or meta.get("base_model")
        if ck_base and ck_base != base:
            raise ValueError(f"checkpoint {ckpt!r} was trained on {ck_base!r}, not on base {base!r}")


# ----------------------------------------------------------------------------- data parallel
def distributed_context():
    """(rank, world_size): initialises the process group when launched by accelerate/torchrun."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    import torch
    from accelerate import PartialState
    state = PartialState(cpu=not torch.cuda.is_available())  # gloo on CPU (MULTI_CPU), nccl on GPU
    return state.process_index, state.num_processes


def attach_data_parallel(lm, rank: int, world_size: int):
    """Give an LM lm-eval's data-parallel hooks (rank, world_size, gathers, barrier) over torch.distributed.

    lm-eval's evaluator then shards each task's requests across ranks and gathers the per-document
    metrics to rank 0. Backends built from an in-memory model (HFLM(pretrained=<module>)) are
    single-process by default; this is what makes them data-parallel.
    """
    import torch
    import torch.distributed as dist
    if world_size <= 1 or getattr(lm, "world_size", 1) == world_size:
        return lm
    lm._rank, lm._world_size = rank, world_size

    def all_gather(self, tensor):
        t = tensor.reshape(1) if tensor.dim() == 0 else tensor
        parts = [torch.zeros_like(t) for _ in range(world_size)]
        dist.all_gather(parts, t)
        return torch.cat(parts)

    def gather_object(self, obj, dst=0):
        out = [None] * world_size if rank == dst else None
        dist.gather_object(obj, out, dst=dst)
        return out

    lm.all_gather = types.MethodType(all_gather, lm)
    lm.gather_object = types.MethodType(gather_object, lm)
    lm.barrier = types.MethodType(lambda self: dist.barrier(), lm)
    return lm


# ----------------------------------------------------------------------------- provenance
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
    if device.startswith("cuda") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    try:
        from models import ops
        out["ops"] = ops.backend_name(torch.empty(0, device=device))
    except Exception as exc:  # provenance must never stop an evaluation
        out["ops"] = f"unknown ({type(exc).__name__})"
    return out


def git_state() -> dict:
    """HEAD and whether bench/models/tasks differ from it. GOLINEAR_GIT_COMMIT overrides both where the
    .git beside the code is not the tree's own (the GPU machine receives an older .git with a newer tree)."""
    if os.environ.get("GOLINEAR_GIT_COMMIT"):
        return {"commit": os.environ["GOLINEAR_GIT_COMMIT"], "dirty": False, "source": "GOLINEAR_GIT_COMMIT"}

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


def task_data_files(task: str, suite: str, data_dir: str | None) -> set[Path]:
    """The local files a task reads, as its suite module declares them (tasks.standard / tasks.ruler)."""
    if not data_dir:
        return set()
    try:
        mod = suite_module(suite)
    except ModuleNotFoundError:
        return set()
    found = set()
    if hasattr(mod, "builtin_yamls") and hasattr(mod, "local_files"):
        for builtin in mod.builtin_yamls(task):
            found |= {Path(p) for p in mod.local_files(builtin, data_dir)}
    elif hasattr(mod, "data_files"):
        found |= {Path(p) for p in mod.data_files(task, data_dir)}
    return found


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


# ----------------------------------------------------------------------------- results
def _metric_key(result: dict, metric: str) -> str | None:
    if "," in metric:
        return metric if metric in result else None
    if f"{metric},none" in result:
        return f"{metric},none"
    cands = sorted(k for k in result if k.startswith(metric + ",") and "_stderr" not in k)
    return cands[0] if cands else None


def _n_docs(res: dict, name: str) -> int:
    ns = res.get("n-samples", {})
    if name in ns:
        return int(ns[name]["effective"])
    return sum(_n_docs(res, sub) for sub in res.get("group_subtasks", {}).get(name, []))


def _number(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def extract_cell(res: dict, entry: TaskEntry) -> dict:
    """metric/value/stderr/n (and every other metric) of one task or group from lm-eval's results."""
    result = res.get("groups", {}).get(entry.task) or res["results"].get(entry.task)
    if result is None:
        raise RuntimeError(f"lm-eval returned no result for {entry.task!r}")
    mkey = _metric_key(result, entry.metric)
    if mkey is None:
        raise RuntimeError(f"task {entry.task!r} has no metric {entry.metric!r}; it has "
                           f"{sorted(k for k in result if ',' in k)}")
    name, filt = mkey.split(",", 1)
    metrics = {}
    for k, v in result.items():
        if "," in k and "_stderr" not in k and _number(v) is not None:
            m, f = k.split(",", 1)
            metrics[k] = {"value": _number(v), "stderr": _number(result.get(f"{m}_stderr,{f}"))}
    return {"metric": name, "filter": filt, "value": _number(result[mkey]),
            "stderr": _number(result.get(f"{name}_stderr,{filt}")), "n": _n_docs(res, entry.task),
            "metrics": dict(sorted(metrics.items())), "higher_is_better": entry.higher_is_better,
            "n_shot": res.get("n-shot", {}).get(entry.task), "lm_eval_versions": res.get("versions", {})}


# ----------------------------------------------------------------------------- running
@dataclass
class RunSummary:
    planned: int = 0
    skipped: int = 0
    evaluated: int = 0
    cells: list = field(default_factory=list)  # the planned cells' store records (rank 0)


def parse_batch_size(value):
    """--batch-size: a positive integer, 'auto' or 'auto:N' (lm-eval's forms)."""
    text = str(value).strip().lower()
    if text.isdigit() and int(text) >= 1:
        return int(text)
    if text == "auto" or (text.startswith("auto:") and text[5:].isdigit() and int(text[5:]) >= 1):
        return text
    raise ValueError(f"--batch-size {value!r}: allowed a positive integer, 'auto' or 'auto:N'")


def check_run_values(*, limit, budgets, sinks, context_length, num_samples, seed, entries) -> None:
    """The run's numeric options, each against its allowed range (one line naming the value)."""
    def positive(name, v):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} {v!r}: expected a positive integer")
    positive("--limit", limit)
    positive("--num-samples", num_samples)
    if not isinstance(sinks, int) or sinks < 0:
        raise ValueError(f"--sinks {sinks!r}: expected a non-negative integer")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"--seed {seed!r}: expected a non-negative integer")
    for b in budgets or []:
        if b <= sinks:
            raise ValueError(f"cache budget {b} must exceed the {sinks} sink tokens")
    if any(e.long for e in entries) and not 1024 <= int(context_length) <= 32768:
        raise ValueError(f"--context-length {context_length}: allowed 1024..32768")


def run_matrix(models, suites, store, *, limit=None, budgets=None, sinks=8, context_length=4096,
               num_samples=None, data_dir=None, batch_size=1, device="cpu", seed=42,
               bootstrap_iters=1000, include_path=None, extra_suites=None, task_manager=None,
               progress=True, wait_s: float = 2.0) -> RunSummary:
    """Evaluate every missing cell of models x suites (x budgets) into `store`; returns a summary.

    `models`: spec strings or ModelSpecs; `suites`: names (cr, mmlu, lambada, sniah, ruler) or a
    comma-separated string. All input is validated before any model is loaded, and before anything is
    written. Another run on the same store evaluates different cells: each cell is claimed first, and a
    cell claimed by a live process is waited for (`wait_s` between looks) rather than evaluated twice.
    """
    from tqdm.auto import tqdm
    data_dir = check_data_dir(data_dir if data_dir is not None else default_data_dir())
    if data_dir:  # local data: never wait on Hub retries (lm-eval pitfall); set before `datasets` loads
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if isinstance(models, str):
        models = S.parse_models(models)
    models = [S.parse_model_spec(m) if isinstance(m, str) else m for m in models]
    for m in models:
        check_checkpoint_base(m)
    entries = resolve_suites(suites, extra_suites)
    batch_size = parse_batch_size(batch_size)
    budgets = sorted({int(b) for b in budgets}) if budgets else None
    check_run_values(limit=limit, budgets=budgets, sinks=sinks, context_length=context_length,
                     num_samples=num_samples, seed=seed, entries=entries)
    check_task_data(entries, data_dir)
    data = {e.task: cell_data(e, data_dir) for e in entries}  # SHA256SUMS checked here, once per run
    store = store if isinstance(store, Store) else Store(store)
    rank, world = distributed_context()
    cells = plan_cells(models, entries, budgets=budgets, sinks=sinks, limit=limit,
                       context_length=context_length, num_samples=num_samples, seed=seed, data=data)
    for spec in {c.model.key: c.model for c in cells}.values():
        validate_model(spec, device)
    done = {c.key.digest for c in cells if store.has(c.key)}
    check_long_context_fits([c for c in cells if c.key.digest not in done], data_dir)
    if rank == 0:
        store.ensure_writable()  # the last check: nothing is written before every input passed
    if world > 1:
        import torch.distributed as dist
        box = [sorted(done)]
        dist.broadcast_object_list(box, src=0)  # every rank works on rank 0's to-do list
        done = set(box[0])
    todo = [c for c in cells if c.key.digest not in done]
    summary = RunSummary(planned=len(cells), skipped=len(cells) - len(todo))

    if todo:
        tm = task_manager or build_task_manager(data_dir, include_path)
        names = set(tm.all_tasks)
        missing = sorted({c.entry.task for c in todo} - names)
        if missing:
            raise ValueError(f"unknown task(s) {missing}: not registered with lm-eval (check tasks/ and --data-dir)")
        versions, git = package_versions(), git_state()
        bar = tqdm(total=len(cells), initial=summary.skipped, desc="cells", unit="cell", disable=not progress or rank)
        by_model: dict[str, list[Cell]] = {}
        for c in todo:
            by_model.setdefault(c.model.key, []).append(c)
        queue, deferred = list(by_model.values()), set()
        while queue:
            group = queue.pop(0)
            if world == 1:
                left = [c for c in group if not store.has(c.key)]  # another run may have finished some
                summary.skipped += len(group) - len(left)
                bar.update(len(group) - len(left))
                group = left
                if not group:
                    continue
                if group[0].model.key not in deferred and all(store.claimed_elsewhere(c.key) for c in group):
                    deferred.add(group[0].model.key)  # another run is on all of them: other models first
                    queue.append(group)
                    continue
            spec = group[0].model
            dev = f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if world > 1 and device.startswith("cuda") else device
            lm = attach_data_parallel(build_lm(spec, batch_size, dev), rank, world)
            info = _jsonable(dict(getattr(lm, "golinear_info", {}) or {}))
            for c in claimed_in_turn(store, group, world, wait_s, summary):
                bar.set_postfix_str(f"{spec.label} / {c.entry.task}")
                cache = store.request_cache(c.key, spec.label, model_fingerprint(info))
                try:
                    record = evaluate_cell(lm, c, tm, data_dir, bootstrap_iters, info, versions, git, world, cache)
                    if record is not None:  # rank 0 holds the merged result
                        store.put(record)
                        summary.evaluated += 1
                    if world > 1:
                        lm.barrier()  # every rank is done with its request cache before rank 0 removes them all
                    if rank == 0:
                        Store.drop_request_cache(cache)
                finally:
                    if world == 1:
                        store.release(c.key)
                bar.update(1)
            del lm
        bar.close()
    if rank == 0:
        summary.cells = [store.get(c.key) for c in cells]
    return summary


def claimed_in_turn(store: Store, group: list, world: int, wait_s: float, summary: RunSummary):
    """Yield the cells of `group` this process should evaluate, each claimed (one process at a time).

    A cell another live process holds is passed over and looked at again later; when it appears in the
    store it counts as skipped. Under a launcher (world > 1) the ranks of one run share the work as
    lm-eval splits it, so the to-do list is rank 0's and no claims are taken."""
    if world > 1:
        yield from group
        return
    pending = list(group)
    while pending:
        progressed = False
        for c in list(pending):
            if store.has(c.key):  # another run finished it meanwhile
                pending.remove(c)
                summary.skipped += 1
                progressed = True
            elif store.claim(c.key):
                pending.remove(c)
                if store.has(c.key):  # finished between our look and our claim
                    store.release(c.key)
                    summary.skipped += 1
                else:
                    yield c
                progressed = True
                break  # re-scan: cells may have finished while this one ran
        if pending and not progressed:
            time.sleep(wait_s)


def model_fingerprint(info: dict) -> str | None:
    """The evaluated weights' identity for the request cache: backbone fingerprint plus checkpoint's."""
    base = _first(info, "base_fingerprint", "backbone_fingerprint", "fingerprint")
    ckpt = info.get("checkpoint_fingerprint")
    return "-".join(x for x in (base, ckpt) if x) or None


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and (math.isinf(obj) or math.isnan(obj)):
        return str(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def _first(info: dict, *names):
    for n in names:
        if info.get(n) is not None:
            return info[n]
    return None


def evaluate_cell(lm, cell: Cell, tm, data_dir, bootstrap_iters, info, versions, git, world,
                  cache: Path | None = None) -> dict | None:
    """One cell through lm-eval. With `cache`, lm-eval's CachingLM keeps each scored request there as it
    goes, and requests an earlier, killed attempt already scored are read back instead of recomputed."""
    import lm_eval
    e, cfg = cell.entry, cell.config
    resumed = 0
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        resumed = Store.cached_requests(cache, getattr(lm, "rank", 0) or 0)
    if e.long:
        meta = {"max_seq_lengths": [cfg["context_length"]], "seed": cfg["seed"]}
        if cfg["num_samples"] is not None:
            meta["num_samples"] = cfg["num_samples"]
        meta["tokenizer"] = cell.model.base_name  # prompts are sized with the evaluated model's tokenizer
        if data_dir:
            meta["data_dir"] = data_dir
        tm = with_metadata(tm, meta)
    t0 = time.perf_counter()
    try:
        res = lm_eval.simple_evaluate(model=lm, tasks=[e.task], task_manager=tm, num_fewshot=e.num_fewshot,
                                      limit=cfg.get("limit"), bootstrap_iters=bootstrap_iters, log_samples=False,
                                      use_cache=str(cache) if cache is not None else None, **LM_EVAL_SEEDS)
    finally:  # CachingLM hooked its sqlite file into the model: close it and unhook
        hook = getattr(lm, "cache_hook", None)
        if cache is not None and getattr(hook, "dbdict", None) is not None:
            from lm_eval.api.model import CacheHook
            hook.dbdict.close()
            lm.set_cache_hook(CacheHook(None))
    wall = time.perf_counter() - t0
    if res is None:  # not rank 0
        return None
    out = extract_cell(res, e)
    model = {"label": cell.model.label, "family": cell.model.family, "args": _jsonable(cell.model.model_args()),
             "budget": "inf" if math.isinf(cell.model.budget) else cell.model.budget,
             "backbone": info.get("base") or cell.model.base_name, "full_attention": cell.model.is_full_attention,
             "new_parameters": _first(info, "new_parameters", "new_params", "new_parameter_count"),
             "info": info}
    return {"key": cell.key.as_dict(), "model": model, "task": e.task, "suite": e.suite, "display": e.display,
            **out, "wall_time_s": round(wall, 3),
            "provenance": {"versions": versions, "git": git, "data": data_hashes(res, e, data_dir),
                           "seeds": LM_EVAL_SEEDS | ({"task_seed": cfg["seed"]} if e.long else {}),
                           "limit": cfg.get("limit"), "world_size": world, "hardware": hardware(lm),
                           # wall_time_s counts this attempt only; these requests came from earlier ones
                           **({"resumed_requests": resumed} if resumed else {}),
                           "model_fingerprint": _first(info, "base_fingerprint", "backbone_fingerprint",
                                                       "fingerprint"),
                           "checkpoint_fingerprint": info.get("checkpoint_fingerprint")}}


# ----------------------------------------------------------------------------- CLI
def _int_list(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--budgets {text!r}: expected comma-separated integers, e.g. 128,256,512") from None


def add_arguments(p):
    p.add_argument("--models", required=True,
                   help="';'-separated model specs: presets (" + ", ".join(sorted(S.PRESETS)) +
                        "), key=value lists (e.g. 'mechanism=gdn,window=120,sinks=8') or checkpoint folders")
    p.add_argument("--suites", default="cr,mmlu,lambada", help=f"comma-separated, from {','.join(ALL_SUITES)}")
    p.add_argument("--limit", type=int, default=None, help="first N documents per task (subtask for MMLU)")
    p.add_argument("--store", default="runs/store", help="result store folder (default runs/store)")
    p.add_argument("--budgets", default=None, help="cache budgets for sniah/ruler, e.g. 128,256,512,1024")
    p.add_argument("--sinks", type=int, default=8, help="sink tokens within each budget (default 8)")
    p.add_argument("--context-length", type=int, default=4096, help="sniah/ruler prompt length (default 4096)")
    p.add_argument("--num-samples", type=int, default=None, help="sniah/ruler samples per task (default: --limit, else the task's 500)")
    p.add_argument("--seed", type=int, default=42, help="seed of the generated sniah/ruler samples (RULER's 42)")
    p.add_argument("--data-dir", default=None, help="local data folder (default $GOLINEAR_DATA or ../shared/data)")
    p.add_argument("--include-path", default=None, help="extra lm-eval task folder")
    p.add_argument("--batch-size", default="1", help="batch size (int or 'auto')")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:0, ...")


def main(args) -> int:
    bs = parse_batch_size(args.batch_size)
    s = run_matrix(args.models, args.suites, args.store, limit=args.limit,
                   budgets=_int_list(args.budgets) if args.budgets else None, sinks=args.sinks,
                   context_length=args.context_length, num_samples=args.num_samples,
                   data_dir=args.data_dir,
                   batch_size=bs, device=args.device, seed=args.seed, include_path=args.include_path)
    if distributed_context()[0] == 0:
        print(f"golinear run: {s.planned} cells planned, {s.skipped} already in {args.store}, {s.evaluated} evaluated")
    return 0
