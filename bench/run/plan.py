"""Planning of `golinear run`: which cells there are (models x suite tasks x evaluation configurations),
each cell's identity (CellKey, with the hashes of the data and config files its task reads) and the checks
that need no model (suite names, data folder, task data, long-context room)."""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from golinear.bench.run import specs as S
from golinear.bench.results.store import CellKey
from golinear.models.training.data_hashes import verify_files

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDARD_SUITES = ("cr", "mmlu", "lambada", "validation")
LONG_SUITES = ("sniah", "ruler", "sniah_values")
ALL_SUITES = STANDARD_SUITES + LONG_SUITES
DEFAULT_FEWSHOT = {"cr": 0, "mmlu": 5, "lambada": 0, "validation": 0}


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
    """Display name and data folders of a RULER/S-NIAH task, from golinear.tasks.ruler's task table."""
    from golinear.tasks.ruler import resolve_task
    from golinear.tasks.ruler.constants import RECIPES
    try:
        t = resolve_task(task)
    except ValueError:  # not one of tasks.ruler's tasks (an extra suite's)
        return {}
    family, args = RECIPES[t.ruler]
    data = ["paul_graham_essays"] if args.get("type_haystack") == "essay" else []
    data += {"squad": ["squad_v2"], "hotpotqa": ["hotpotqa_sample100", "hotpotqa"]}.get(args.get("dataset"), [])
    return {"display": t.display, "metric": "score", "data": data}


def suite_module(suite: str):
    return importlib.import_module("golinear.tasks.standard" if suite in STANDARD_SUITES else "golinear.tasks.ruler")


def resolve_suites(names, extra_suites: dict | None = None, tasks=None) -> list[TaskEntry]:
    """Suite names -> task entries, from golinear.tasks.standard / tasks.ruler SUITES (plus extra_suites); tasks (a list
    or comma-separated string of task or display names, any case, e.g. MQ,MV,VT): only those of the suites."""
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
            items = suite_module(name).SUITES[name]
        out += [_entry(name, it) for it in items]
    return out if tasks is None else select_tasks(out, tasks)


def select_tasks(entries: list[TaskEntry], tasks) -> list[TaskEntry]:
    """The entries named in `tasks` (task or display names, any case); ValueError naming an unknown one."""
    wanted = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    names = {n.lower() for e in entries for n in (e.task, e.display)}
    bad = [t for t in wanted if t.lower() not in names]
    if bad or not wanted:
        allowed = ", ".join(f"{e.display} ({e.task})" for e in entries)
        raise ValueError(f"unknown task(s) {bad or wanted} in these suites; allowed: {allowed}")
    keep = {t.lower() for t in wanted}
    return [e for e in entries if e.task.lower() in keep or e.display.lower() in keep]


def default_data_dir() -> str | None:
    """tasks.standard.local_data's rule (imported when asked: it loads `datasets`, which --help need not)."""
    from golinear.tasks.standard.local_data import default_data_dir as rule
    return rule()


def check_data_dir(data_dir: str | None) -> str | None:
    if data_dir is None:
        return None
    p = Path(data_dir).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"data folder {data_dir!r} does not exist (set --data-dir or GOLINEAR_DATA)")
    return str(p.resolve())


def check_task_data(entries, data_dir: str | None) -> None:
    """Every local file the suites need exists before any work starts: one FileNotFoundError naming each missing
    part of the data folder (what needs it) and one command that fetches them all."""
    from golinear.models.util.data_dir import MissingData, all_missing, top_folder
    by_suite, missing = {}, []
    for e in entries:
        by_suite.setdefault(e.suite, []).append(e.task)
        if e.data and data_dir and not any((Path(data_dir) / d).exists() for d in e.data):
            missing.append(MissingData(data_dir, e.data[0], f"task {e.display}"))
    known = {e.rel_path for e in missing}  # a folder the entries named: its files' errors add nothing
    for suite, tasks in by_suite.items():
        mod = suite_module(suite)
        for task in dict.fromkeys(tasks) if hasattr(mod, "check_data") else ():
            try:
                mod.check_data([task], data_dir)
            except MissingData as e:
                if top_folder(e.rel_path) not in known:
                    missing.append(e)
    if missing:
        raise all_missing(missing)


def check_long_context_fits(cells, data_dir) -> None:
    """Each long-context task's prompts (sized to --context-length, the tokens to generate included) fit the
    model's max_position_embeddings, and RULER's QA tasks have room for whole documents (one sample per QA
    task and tokenizer is built now), so either fails before any model loads or file is written."""
    from golinear.models.spec.backbone_checks import backbone_config
    seen, limits = set(), {}
    for c in cells:
        if not c.entry.long:
            continue
        if c.model.base_name not in limits:
            limits[c.model.base_name] = getattr(backbone_config(c.model.base_name), "max_position_embeddings", None)
        allowed = limits[c.model.base_name]
        if allowed and c.config["context_length"] > allowed:
            raise ValueError(f"{c.entry.display} at --context-length {c.config['context_length']}: its prompts are "
                             f"longer than model {c.model.label!r} allows (max_position_embeddings {allowed}); "
                             f"use --context-length {allowed} or less")
        if c.entry.suite != "ruler" or not c.entry.task.endswith(("_hqa", "_sqa")):
            continue
        k = (c.entry.task, c.model.base_name, c.config["context_length"])
        if k in seen:
            continue
        seen.add(k)
        from golinear.tasks.ruler import build_samples
        try:
            build_samples(c.entry.task, c.model.base_name, max_seq_length=c.config["context_length"],
                          num_samples=1, seed=c.config["seed"], data_dir=data_dir)
        except ValueError as e:
            raise ValueError(f"{c.entry.display} at --context-length {c.config['context_length']}: {e}") from None


def check_presses(models, entries, cells, budgets) -> None:
    """A press row is a compressed cache over a long prompt; each way it could be something else is refused before
    any model loads: on scoring suites only (it would be full attention), its own kv_budget beside --budgets (one
    would silently replace the other), a budget that keeps the whole prompt (full attention under a press's name),
    or one that cannot hold the question it must read uncompressed."""
    presses = [m for m in models if m.press is not None]
    if not presses:
        return
    if not any(e.long for e in entries):
        raise ValueError(f"model {presses[0].label!r}: a press compresses the cache of a long prompt before its question; "
                         "on a scoring task (the suites given) it would be full attention; run presses on the "
                         "long-context suites: --suites sniah or ruler")
    for m in presses:
        if budgets and m.kv_budget:
            raise ValueError(f"model {m.label!r}: kv_budget={m.kv_budget} beside --budgets {','.join(map(str, budgets))}; "
                             "give one of them (--budgets runs the press at each budget)")
    from golinear.tasks.ruler.split import fixed_question_text
    tokenizers, seen = {}, set()
    for c in cells:
        if c.model.press is None or not c.entry.long:
            continue
        budget, n = c.model.kv_budget, c.config["context_length"]
        if budget >= n:
            raise ValueError(f"model {c.model.label!r}: kv_budget={budget} keeps the whole {n}-token prompt, so the "
                             f"row would be full attention; allowed: below --context-length {n}")
        if c.model.question_aware or (c.model.key, c.entry.task) in seen:
            continue
        seen.add((c.model.key, c.entry.task))
        if c.model.base_name not in tokenizers:
            from golinear.models.backbones.backbone import load_tokenizer
            tokenizers[c.model.base_name] = load_tokenizer(c.model.base_name)
        tok = tokenizers[c.model.base_name]
        least = len(tok(fixed_question_text(c.entry.task), add_special_tokens=False)["input_ids"])
        if budget <= least:
            raise ValueError(f"model {c.model.label!r}: kv_budget={budget} cannot hold {c.entry.display}'s question "
                             f"(at least {least} tokens, read uncompressed); use a budget above {least}")


def task_data_files(task: str, suite: str, data_dir: str | None) -> set[Path]:
    """The local files a task reads, as its suite module declares them (tasks.standard / tasks.ruler)."""
    if not data_dir:
        return set()
    mod = suite_module(suite)
    found = set()
    if hasattr(mod, "builtin_yamls") and hasattr(mod, "local_files"):
        for builtin in mod.builtin_yamls(task):
            found |= {Path(p) for p in mod.local_files(builtin, data_dir)}
    elif hasattr(mod, "data_files"):
        found |= {Path(p) for p in mod.data_files(task, data_dir)}
    return found


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
            if m.is_full_attention:
                continue
            add(S.full_attention(m))
            if m.full["mechanism"] == "none":  # the untrained window + sinks the user named: at each budget
                for b in budgets:
                    add(m.with_budget(b, sinks))
                continue
            if m.press is not None:  # a compressed cache at each budget, beside full attention
                for b in budgets:
                    add(m.with_budget(b, sinks))
                continue
            for b in budgets:
                add(m.with_budget(b, sinks))
            for b in budgets:
                add(S.window_only(m, b, sinks))
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
            # a press compresses after the prompt: on a scoring task it would be full attention (not evaluated)
            cells += [Cell(m, e, config, data.get(e.task)) for m in models if m.press is None]
    return cells
