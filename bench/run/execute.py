"""Execution of `golinear run` cells: building the lm-eval model of a spec (checked first without weights),
the process group under a launcher (the backend's HFLM splits each cell's requests over it), the task
manager, one cell through lm-eval's `simple_evaluate` and its result as a store record."""
from __future__ import annotations

import copy
import math
import os
import time
from pathlib import Path

from golinear.bench import quiet

from golinear.bench.results import request_cache
from golinear.bench.run import specs as S
from golinear.bench.run.plan import Cell, TaskEntry
from golinear.bench.run.provenance import CellProvenance, ModelInfo, data_hashes, hardware, jsonable

LM_EVAL_SEEDS = {"random_seed": 0, "numpy_random_seed": 1234, "torch_random_seed": 1234, "fewshot_random_seed": 1234}


# ----------------------------------------------------------------------------- tasks
def build_task_manager(data_dir: str | None, include_path=None, tasks=()):
    """One TaskManager for the process: tasks.standard's folders (plus `include_path`) alone when they hold every
    task in `tasks`, else with lm-eval's built-in tasks too (indexing those YAMLs takes ~10 s a process, paid by
    every `golinear run`; our tasks name the built-in files they mirror by path and need no index)."""
    from lm_eval.tasks import TaskManager
    from golinear.tasks.standard import task_manager
    for defaults in (False, True):
        tm = task_manager(data_dir, include_defaults=defaults)
        if include_path:  # extra user task folders on top of ours
            paths = [tm.include_path] if isinstance(tm.include_path, (str, Path)) else list(tm.include_path or [])
            tm = TaskManager(include_path=paths + [include_path], include_defaults=defaults, metadata=tm.metadata)
        if defaults or set(tasks) <= set(tm.all_tasks):
            return tm


def refuse_shadowing(include_path: str, data_dir: str | None) -> None:
    """A task folder of the user's may add tasks, never redefine golinear's: a cell is keyed by its task's name and
    golinear's own files, so a task of the same name read from elsewhere would be stored (and served to later runs)
    as golinear's."""
    from lm_eval.tasks import TaskManager
    from golinear.tasks.standard import task_manager
    theirs = set(TaskManager(include_path=str(include_path), include_defaults=False).all_tasks)
    clash = sorted(theirs & set(task_manager(data_dir, include_defaults=False).all_tasks))
    if clash:
        raise ValueError(f"--include-path {str(include_path)!r} defines {', '.join(clash[:5])}"
                         f"{' ...' if len(clash) > 5 else ''}, which golinear defines too; rename them (a task "
                         "is stored under its name, so it may not replace golinear's)")


def with_metadata(tm, metadata: dict):
    """A shallow copy of an indexed TaskManager whose tasks receive `metadata` (RULER's lengths etc.)."""
    from lm_eval.tasks._factory import TaskFactory
    tm2 = copy.copy(tm)
    tm2.metadata = {**(tm.metadata or {}), **metadata}
    tm2._factory = TaskFactory(meta=tm2.metadata)
    return tm2


# ----------------------------------------------------------------------------- models
# `golinear run --generation reference`: each backend's one-at-a-time definition of its batched decoder (HF generate
# for full attention, one prompt at a time for a linearized model, kvpress's DynamicCache for a press): the parity
# cross-check of the fast paths, never the default
GENERATIONS = ("fast", "reference")
REFERENCE_GENERATION = {"golinear-hf": "hf", "linearized": "sequential", "golinear-press": "dynamic"}


def check_generation(generation: str) -> str:
    if generation not in GENERATIONS:
        raise ValueError(f"--generation {generation!r}; allowed: {', '.join(GENERATIONS)}")
    return generation


def backend_and_args(spec: S.ModelSpec, generation: str = "fast") -> tuple[str, dict]:
    check_generation(generation)
    backend = "golinear-press" if spec.press is not None else (
        "golinear-hf" if spec.is_full_attention else "linearized")
    args = spec.model_args()
    if generation == "reference":
        args["generation"] = REFERENCE_GENERATION[backend]
    return backend, args




def validate_model(spec: S.ModelSpec, device: str) -> None:
    """Every check that needs no weights: the backend's argument check (names, dtype, device, checkpoint
    folder), the backbone's config (base) and the linearize options against it (models.spec)."""
    from golinear.bench.backends.lm_backend import checked_model_args
    from golinear.models.spec.backbone_checks import check_against_backbone
    try:
        backend, args = backend_and_args(spec)
        check_against_backbone(checked_model_args(backend, {**args, "device": device})[1])
    except ValueError as e:
        raise ValueError(f"model {spec.label!r}: {e}") from None


def build_lm(spec: S.ModelSpec, batch_size=1, device="cpu", generation: str = "fast"):
    """An lm-eval LM for a spec: `golinear-hf` for full attention, `golinear-press` for a compressed cache,
    `linearized` otherwise; `generation` "reference" generates on each one's one-at-a-time definition."""
    import lm_eval.models  # noqa: F401 - registers the built-ins first (registry pitfall)
    from lm_eval.api.registry import get_model

    import golinear.bench.backends.lm_backend  # noqa: F401 - registers golinear-hf and linearized
    import golinear.bench.backends.press_backend  # noqa: F401 - registers golinear-press
    backend, args = backend_and_args(spec, generation)
    return get_model(backend).create_from_arg_obj(args, {"batch_size": batch_size, "device": device})


def check_checkpoint_base(spec: S.ModelSpec) -> None:
    """A checkpoint trained on another backbone is refused before any work."""
    ckpt, base = spec.full["checkpoint"], spec.args.get("base")
    if not ckpt or not base:
        return
    if (Path(ckpt) / "config.json").exists():
        from golinear.models.spec import read_checkpoint_config
        ck_base = read_checkpoint_config(ckpt).get("base")  # names the file when its JSON is broken
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


# ----------------------------------------------------------------------------- results
def _metric_key(result: dict, metric: str) -> str | None:
    if "," in metric:
        return metric if metric in result else None
    if f"{metric},none" in result:
        return f"{metric},none"
    cands = sorted(k for k in result if k.startswith(metric + ",") and "_stderr" not in k)
    return cands[0] if cands else None


def _n_docs(res: dict, name: str, which: str = "effective") -> int:
    """Documents scored ("effective") or in the whole task ("original"), summed over a group's subtasks."""
    ns = res.get("n-samples", {})
    if name in ns:
        return int(ns[name][which])
    return sum(_n_docs(res, sub, which) for sub in res.get("group_subtasks", {}).get(name, []))


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
    return {"metric": name, "filter": filt, "value": _number(result[mkey]), "per_sample": per_sample(res, name, filt),
            "stderr": _number(result.get(f"{name}_stderr,{filt}")), "n": _n_docs(res, entry.task),
            "n_task": _n_docs(res, entry.task, "original"),
            "metrics": dict(sorted(metrics.items())), "higher_is_better": entry.higher_is_better,
            "n_shot": res.get("n-shot", {}).get(entry.task), "lm_eval_versions": res.get("versions", {})}


def per_sample(res: dict, metric: str, filt: str) -> dict[str, float]:
    """Each sample's score of the cell's metric, keyed "<task>/<doc id>/<doc hash, 12 hex>" (a group's subtasks
    each under its name): what a paired comparison of two rows on the same samples reads, and only where the
    samples are the same documents."""
    out = {}
    for task, samples in sorted((res.get("samples") or {}).items()):
        for s in samples:
            v = _number(s.get(metric)) if s.get("filter", "none") == filt else None
            if v is not None:
                out[f"{task}/{s['doc_id']}/{str(s.get('doc_hash', ''))[:12]}"] = v
    return out


# ----------------------------------------------------------------------------- one cell
def env_info_once() -> None:
    """lm-eval collects torch's environment report (nvidia-smi, pip and more, in subprocesses: about 0.8 s on a GPU
    machine) for every `simple_evaluate`, a third of a 30-sample S-NIAH cell's time; the report cannot change within a
    process, so it is collected at the first cell and copied into the others."""
    import lm_eval.evaluator
    if getattr(lm_eval.evaluator.add_env_info, "once", False):
        return
    original, report = lm_eval.evaluator.add_env_info, {}

    def add_env_info(storage: dict):
        if not report:
            original(report)
        storage.update(report)
    add_env_info.once = True
    lm_eval.evaluator.add_env_info = add_env_info


def long_metadata(cell: Cell, data_dir) -> dict:
    """What a long-context task's dataset builder reads (tasks/ruler/hooks.py): length, seed, count, tokenizer."""
    cfg = cell.config
    meta = {"max_seq_lengths": [cfg["context_length"]], "seed": cfg["seed"]}
    if cfg["num_samples"] is not None:
        meta["num_samples"] = cfg["num_samples"]
    meta["tokenizer"] = cell.model.base_name  # prompts are sized with the evaluated model's tokenizer
    if data_dir:
        meta["data_dir"] = data_dir
    return meta


def build_samples_first(cells: list[Cell], data_dir, progress: bool = True) -> None:
    """Generate the S-NIAH/RULER samples of every cell to run before any model loads (memoized in this process and
    on disk, tasks/ruler/cache.py), so a cell's wall time is its evaluation: otherwise the first row evaluated pays
    each task's sample building (~8 s a 4K task of 500 samples) and later rows read them."""
    from tqdm.auto import tqdm

    from golinear.tasks.ruler.hooks import samples
    todo = {}
    for c in cells:
        if c.entry.long:
            meta = long_metadata(c, data_dir)
            todo.setdefault(repr(sorted(meta.items())) + c.entry.task, (c.entry.task, meta))
    for task, meta in tqdm(list(todo.values()), desc="samples", unit="task", disable=not progress or not todo):
        samples(task, **meta)


def evaluate_cell(lm, cell: Cell, tm, data_dir, bootstrap_iters, info: ModelInfo, versions, git, world,
                  cache: Path | None = None) -> dict | None:
    """One cell through lm-eval. With `cache`, lm-eval's CachingLM keeps each scored request there as it
    goes (as JSON: bench.results.request_cache), and requests an earlier, killed attempt already scored are read back
    instead of recomputed."""
    import lm_eval
    quiet.lm_eval_git_probe()
    env_info_once()
    quiet.lm_eval_quiet_steps()
    e, cfg = cell.entry, cell.config
    resumed = 0
    if cache is not None:
        resumed = request_cache.prepare(cache, getattr(lm, "rank", 0) or 0)
    if e.long:
        tm = with_metadata(tm, long_metadata(cell, data_dir))
    t0 = time.perf_counter()
    try:
        with request_cache.json_values():
            res = lm_eval.simple_evaluate(model=lm, tasks=[e.task], task_manager=tm, num_fewshot=e.num_fewshot,
                                          limit=cfg.get("limit"), bootstrap_iters=bootstrap_iters, log_samples=True,
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
    model = {"label": cell.model.label, "family": cell.model.family, "args": jsonable(cell.model.model_args()),
             "budget": "inf" if math.isinf(cell.model.budget) else cell.model.budget,
             "backbone": info.base or cell.model.base_name, "full_attention": cell.model.is_full_attention,
             "new_parameters": info.new_parameters, "info": info.raw}
    provenance = CellProvenance(
        versions=versions, git=git, data=data_hashes(res, e, data_dir),
        seeds=LM_EVAL_SEEDS | ({"task_seed": cfg["seed"]} if e.long else {}), limit=cfg.get("limit"),
        world_size=world, hardware=hardware(lm), model_fingerprint=info.base_fingerprint,
        checkpoint_fingerprint=info.checkpoint_fingerprint, resumed_requests=resumed)
    return {"key": cell.key.as_dict(), "model": model, "task": e.task, "suite": e.suite, "display": e.display,
            **out, "wall_time_s": round(wall, 3), "provenance": provenance.as_dict()}
