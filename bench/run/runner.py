"""`golinear run`: evaluate models x suites x configurations into the result store, resumably.

Every cell (one model configuration, one task, one evaluation configuration) is evaluated with
lm-eval's `simple_evaluate` and written to the store atomically with its provenance the moment it
finishes; cells already in the store are skipped, so a killed run resumes without loss or duplicates.
Under `accelerate launch` (or torchrun) the ranks split each cell's requests as lm-eval does and rank 0
writes the merged result. `run_matrix` is the Python entry point (used by `golinear demo` and `check`).
Which cells: bench.run.plan; running one through lm-eval: bench.run.execute; its provenance: bench.run.provenance.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from golinear.bench.results import request_cache
from golinear.bench.run import specs as S
from golinear.bench.run.execute import (build_lm, build_samples_first, build_task_manager, check_checkpoint_base,
                                        distributed_context, evaluate_cell, refuse_shadowing, validate_model)
from golinear.bench.run.plan import LONG_SUITES  # noqa: F401 - bench.demo reads runner.LONG_SUITES
from golinear.bench.run.plan import (ALL_SUITES, Cell, cell_data, check_data_dir, check_long_context_fits, check_presses,
                                 check_task_data, default_data_dir, plan_cells, resolve_suites)
from golinear.bench.run.provenance import ModelInfo, git_state, package_versions
from golinear.bench.run.run_summary import score_table
from golinear.bench.results.store import Store
from golinear.models.util.data_dir import require_hub


# ----------------------------------------------------------------------------- running
@dataclass
class RunSummary:
    planned: int = 0
    skipped: int = 0
    evaluated: int = 0
    cells: list = field(default_factory=list)  # the planned cells' store records (rank 0)
    plan: str = ""  # a dry run's report (bench.run.estimate)


def parse_batch_size(value):
    """--batch-size: a positive integer, 'auto' or 'auto:N' (lm-eval's forms)."""
    text = str(value).strip().lower()
    if text.isdigit() and int(text) >= 1:
        return int(text)
    if text == "auto" or (text.startswith("auto:") and text[5:].isdigit() and int(text[5:]) >= 1):
        return text
    raise ValueError(f"--batch-size {value!r}: allowed a positive integer, 'auto' or 'auto:N'")


MAX_NUM_SAMPLES = 10_000  # generated long-context samples a task; beyond it a run would only build prompts for hours


def check_run_values(*, limit, budgets, sinks, context_length, num_samples, seed, entries) -> None:
    """The run's numeric options, each against its allowed range (one line naming the value)."""
    def positive(name, v):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} {v!r}: expected a positive integer")
    positive("--limit", limit)
    positive("--num-samples", num_samples)
    if num_samples is not None and num_samples > MAX_NUM_SAMPLES:
        raise ValueError(f"--num-samples {num_samples}: allowed 1..{MAX_NUM_SAMPLES:,} (samples are generated per "
                         "task; the paper's setting is 500)")
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
               progress=True, wait_s: float = 2.0, tasks=None, generation: str = "fast",
               dry_run: bool = False) -> RunSummary:
    """Evaluate every missing cell of models x suites (x budgets) into `store`; returns a summary.

    `models`: spec strings or ModelSpecs; `suites`: names (cr, mmlu, lambada, sniah, ruler) or a
    comma-separated string; `tasks`: only these of the suites' tasks (task or display names; None: all). All input is validated before any model is loaded, and before anything is
    written. Another run on the same store evaluates different cells: each cell is claimed first, and a
    cell claimed by a live process is waited for (`wait_s` between looks) rather than evaluated twice.
    `dry_run`: every check as above, then the cells still to evaluate and their estimated time in `plan`; nothing
    loaded or written.
    """
    from tqdm.auto import tqdm
    logging.getLogger("sqlitedict").setLevel(logging.CRITICAL)  # its thread's errors reach us; said in one line
    from golinear.bench.backends.lm_backend import check_device
    from golinear.bench.run.execute import check_generation
    check_generation(generation)
    device = check_device(device, here=not dry_run)  # first: reading a backbone's config (a GGUF) takes seconds
    data_dir = check_data_dir(data_dir if data_dir is not None else default_data_dir())
    if data_dir:  # local data: never wait on Hub retries (lm-eval pitfall); set before `datasets` loads
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if isinstance(models, str):
        models = S.parse_models(models)
    models = [S.parse_model_spec(m) if isinstance(m, str) else m for m in models]
    for m in models:
        check_checkpoint_base(m)
    entries = resolve_suites(suites, extra_suites, tasks)
    batch_size = parse_batch_size(batch_size)
    budgets = sorted({int(b) for b in budgets}) if budgets else None
    check_run_values(limit=limit, budgets=budgets, sinks=sinks, context_length=context_length,
                     num_samples=num_samples, seed=seed, entries=entries)
    if include_path is not None and not os.path.isdir(include_path):
        raise FileNotFoundError(f"--include-path {include_path!r}: not a folder (expected a folder of lm-eval task YAMLs)")
    if include_path is not None:
        refuse_shadowing(include_path, data_dir)
    check_task_data(entries, data_dir)
    if data_dir is None and any(not e.long for e in entries):  # their documents come from the Hub
        require_hub(f"--suites {','.join(dict.fromkeys(e.suite for e in entries if not e.long))}")
    data = {e.task: cell_data(e, data_dir) for e in entries}  # SHA256SUMS checked here, once per run
    store = store if isinstance(store, Store) else Store(store)
    rank, world = distributed_context()
    cells = plan_cells(models, entries, budgets=budgets, sinks=sinks, limit=limit,
                       context_length=context_length, num_samples=num_samples, seed=seed, data=data)
    check_presses(models, entries, cells, budgets)
    here = _here_or_cpu(device) if dry_run else device  # (checked above) a dry run may plan for another machine
    for spec in {c.model.key: c.model for c in cells}.values():
        validate_model(spec, here)
    done = {c.key.digest for c in cells if store.has(c.key)}
    check_long_context_fits([c for c in cells if c.key.digest not in done], data_dir)
    if dry_run:
        from golinear.bench.run import estimate
        todo = [c for c in cells if c.key.digest not in done]
        rows = estimate.plan_rows(todo, estimate.measured_speeds(store.cell_files(), device))
        return RunSummary(planned=len(cells), skipped=len(done),
                          plan=estimate.render(rows, len(cells), len(done), store.root, device))
    if rank == 0:
        store.ensure_writable()  # the last check: nothing is written before every input passed
    if world > 1:
        import torch.distributed as dist
        box = [sorted(done)]
        dist.broadcast_object_list(box, src=0)  # every rank works on rank 0's to-do list
        done = set(box[0])
    todo = [c for c in cells if c.key.digest not in done]
    summary = RunSummary(planned=len(cells), skipped=len(cells) - len(todo))
    for c in todo if world == 1 else []:  # before any model loads: a claim from another host is never waited on
        held = store.other_host_claim(c.key)
        if held:
            path, owner = held
            raise ValueError(f"{c.entry.task} of {c.model.label!r} is claimed by host {owner.get('host')!r} (pid "
                             f"{owner.get('pid')!r}): {path}; let that run finish, or, if none runs there, delete "
                             "that file to take the claim over")

    if todo:
        tm = task_manager or build_task_manager(data_dir, include_path, {c.entry.task for c in todo})
        names = set(tm.all_tasks)
        missing = sorted({c.entry.task for c in todo} - names)
        if missing:
            raise ValueError(f"unknown task(s) {missing}: not registered with lm-eval (check tasks/ and --data-dir)")
        build_samples_first(todo, data_dir, progress and not rank)
        versions, git = package_versions(), git_state()
        bar = tqdm(total=len(cells), initial=summary.skipped, desc="cells", unit="cell", disable=not progress or rank)
        try:  # the bar is closed before any error or Ctrl-C line is printed
            by_model: dict[str, list[Cell]] = {}
            for c in todo:
                by_model.setdefault(c.model.key, []).append(c)
            # models in the order given (cells are task by task, so a model with a task done would otherwise wait
            # behind every untouched one: a resumed run goes on with the model it was stopped in)
            given = {key: i for i, key in enumerate(dict.fromkeys(c.model.key for c in cells))}
            queue, deferred = sorted(by_model.values(), key=lambda g: given[g[0].model.key]), set()
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
                lm = build_lm(spec, batch_size, device, generation)  # under a launcher HFLM puts each rank on its own device
                info = ModelInfo.from_lm(lm)
                for c in claimed_in_turn(store, group, world, wait_s, summary):
                    bar.set_postfix_str(f"{spec.label} / {c.entry.task}")
                    try:
                        summary.evaluated += evaluate_into(store, lm, c, tm, data_dir, bootstrap_iters, info, versions,
                                                           git, world, rank)
                    finally:
                        if world == 1:
                            store.release(c.key)
                    bar.update(1)
                del lm
        finally:
            bar.close()
    if rank == 0:
        summary.cells = [store.get(c.key) for c in cells]
    return summary


def _here_or_cpu(device: str) -> str:
    """The device when this machine has it, else the CPU (the model checks of a dry run planned elsewhere)."""
    from golinear.bench.backends.lm_backend import check_device
    try:
        return check_device(device)
    except ValueError:
        return "cpu"


def evaluate_into(store: Store, lm, c: Cell, tm, data_dir, bootstrap_iters, info, versions, git, world, rank) -> int:
    """One claimed cell through lm-eval into the store (1 when this rank wrote it). Its request cache keeps the
    scored requests of a killed or interrupted attempt, is dropped once the cell is stored, and is never left
    empty; a full disk is one line (bench.results.request_cache)."""
    cache = store.request_cache(c.key, c.model.label, info.weights_fingerprint)
    try:
        record = evaluate_cell(lm, c, tm, data_dir, bootstrap_iters, info, versions, git, world, cache)
        if record is not None:  # rank 0 holds the merged result
            store.put(record)
    except (OSError, sqlite3.OperationalError) as e:
        if request_cache.is_disk_full(e):
            raise request_cache.disk_full_error(e, cache, rank, store.path_for(c.key, c.model.label)) from None
        request_cache.drop_if_empty(cache, rank)
        raise
    except BaseException:  # failed or interrupted (Ctrl-C)
        request_cache.drop_if_empty(cache, rank)
        raise
    if world > 1:
        lm.barrier()  # every rank is done with its request cache before rank 0 removes them all
    if rank == 0:
        request_cache.drop(cache)
    if world > 1:  # ...and no rank makes the next cell's cache folder while rank 0 removes empty
        lm.barrier()  # ones (seen on CPU: rank 1's sqlite "unable to open database file")
    return int(record is not None)


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


# ----------------------------------------------------------------------------- CLI
def _int_list(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--budgets {text!r}: expected comma-separated integers, e.g. 128,256,512") from None


def main(args) -> int:
    bs = parse_batch_size(args.batch_size)
    s = run_matrix(args.models, args.suites, args.store, limit=args.limit,
                   budgets=_int_list(args.budgets) if args.budgets else None, sinks=args.sinks,
                   context_length=args.context_length, num_samples=args.num_samples,
                   data_dir=args.data_dir,
                   batch_size=bs, device=args.device, seed=args.seed, include_path=args.include_path,
                   tasks=args.tasks, generation=getattr(args, "generation", "fast"),
                   dry_run=getattr(args, "dry_run", False))
    if s.plan:
        print(s.plan)
        return 0
    if distributed_context()[0] == 0:
        table = score_table(s.cells)
        if table:
            print("\n" + table + "\n")
        print(f"golinear run: {s.planned} cells planned, {s.skipped} already in {args.store}, {s.evaluated} evaluated")
        print(f"golinear run: store {Path(args.store).resolve()} (tables: golinear leaderboard --store {args.store} "
              f"--out <folder>)")
    return 0
