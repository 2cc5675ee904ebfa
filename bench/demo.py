"""`golinear demo`, the README's main job on the embedded default (SmolLM2-135M-Instruct).

1. Converts the backbone and prints, for full attention and the default recipe (GDN + 56-token window +
   8 sinks + short conv): new parameters, cache budget, decode-cache memory, and perplexity on a held-out
   passage of the books corpus (the recipe is labelled untrained unless a checkpoint is given). Without a data
   folder the passage is the one shipped with golinear (demo_passage.txt: Ruth 1-4 in the King James Version,
   public domain, as Debian's bible-kjv-text 4.38 prints it; no book of the training corpus), the standard suites
   come from the Hugging Face Hub and S-NIAH/RULER, whose haystacks only a data folder holds, are skipped.
2. Evaluates both on a quick subset of every suite (`golinear run` cells in `--store`) and renders the
   leaderboard into `--out`. The subset is sized for a 2-core CPU (minutes, < 3 GB): a few documents per
   standard task, one MMLU category (one question per subject, 5-shot), one long-context sample per task
   at 1K tokens, skipping the tasks whose documents cannot fit that length (RULER's QA needs 2K).
"""
from __future__ import annotations

import math
import os
import textwrap
import time
from pathlib import Path

import torch
from tabulate import tabulate

from golinear.bench.cli_args import MMLU_BATCH, MMLU_CATEGORIES  # noqa: F401 - the --mmlu choices
from golinear.models.attention.linearize import DEFAULT_RECIPE, decode_state_bytes
from golinear.models.util.data_dir import chosen_data_dir, fetch_command, require_hub
from golinear.models.load import load_model

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"


SHIPPED_PASSAGE = Path(__file__).resolve().parent / "demo_passage.txt"
SHIPPED_NAME = "Ruth 1-4, King James Version (shipped with golinear)"


def heldout_passage(tokenizer, n_tokens: int, data_dir=None) -> tuple[torch.Tensor, str]:
    """The first n tokens of the first held-out book (never trained on: models.training.data's held-out rule), or
    of the shipped passage when there is no data folder or it lacks the books corpus (a partly fetched one)."""
    text, name = SHIPPED_PASSAGE.read_text(encoding="utf-8"), SHIPPED_NAME
    folder = chosen_data_dir(data_dir)
    if folder is not None:
        from golinear.models.training import data
        try:
            files = data.book_files(folder)
        except FileNotFoundError:
            print(f"the data folder {folder!r} has no books corpus ({data.BOOKS_FOLDER}/; fetch it with "
                  f"{fetch_command(folder, data.BOOKS_FOLDER)}): the perplexity passage is the shipped one")
        else:
            docs = dict(data.read_jsonl_docs(files))
            name = data.heldout_ids(docs, 8)[0]
            text = docs[name][:20 * n_tokens]
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :n_tokens]
    if ids.shape[1] < n_tokens:
        raise ValueError(f"--tokens {n_tokens}: the passage {name!r} has {ids.shape[1]} tokens; allowed: 2.."
                         f"{ids.shape[1]} (a data folder's books are longer)")
    return ids, name


@torch.no_grad()
def perplexity(model, ids: torch.Tensor) -> float:
    return math.exp(model(ids, labels=ids).loss.item())


def cache_bytes(model, info, context: int) -> int:
    if info["linearize"] is None:  # full attention: K and V of every layer for every token, fp32
        c = model.config
        return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * context * 4
    return decode_state_bytes(model, context=context)


def model_labels(checkpoint: str | None) -> tuple[str, str]:
    """The two rows' names, the same in the summary and in the scores (the run's labels)."""
    return "full", Path(checkpoint).name if checkpoint else "gdn-default"


def summary_rows(checkpoint: str | None, n_tokens: int, data_dir=None) -> list[dict]:
    from golinear.models.backbones.backbone import DEFAULT_BACKBONE, resolve
    rows = []
    recipe = {"checkpoint": checkpoint} if checkpoint else {
        "mechanism": DEFAULT_RECIPE.mechanism, "window": DEFAULT_RECIPE.window, "sinks": DEFAULT_RECIPE.sinks,
        "short_conv": DEFAULT_RECIPE.short_conv}
    t0 = time.time()
    resolve(DEFAULT_BACKBONE)  # the one-time conversion of the embedded backbone, apart from the rows' seconds
    if time.time() - t0 > 5:
        print(f"converted the embedded backbone once ({time.time() - t0:.0f} s); later commands reuse it")
    ids = book = None
    for label, kwargs in zip(model_labels(checkpoint), ({}, recipe)):
        t0 = time.time()
        model, tok, info = load_model(**kwargs)
        if ids is None:
            ids, book = heldout_passage(tok, n_tokens, data_dir)
        ppl = perplexity(model, ids)
        trained = info["linearize"] is None or info.get("trained")
        rows.append({
            "model": label + ("" if trained else " (untrained)"),
            "mechanism": "full attention" if info["linearize"] is None else "GDN+w56+s8+SC",
            "new params": f"{info['new_parameters']:,}",
            "budget": "inf" if info["linearize"] is None else info["cache_budget"],
            "MiB @1K": round(cache_bytes(model, info, 1024) / 2 ** 20, 2),
            "MiB @32K": round(cache_bytes(model, info, 32768) / 2 ** 20, 2),
            "ppl": round(ppl, 2),
            "load+ppl s": round(time.time() - t0, 1),
        })
        del model
    print(f"held-out passage: {'' if book == SHIPPED_NAME else 'book '}{book!r}, {ids.shape[1]} tokens (SmolLM2 "
          "tokenizer); fp32 on CPU")
    return rows


def summary_table(rows: list[dict]) -> str:
    return tabulate(rows, headers="keys", tablefmt="simple", disable_numparse=True)


def summary_notes(rows: list[dict], n_tokens: int) -> list[str]:
    """The summary table's legend, and why a checkpoint's perplexity can be below full attention's."""
    notes = [f"budget: the tokens kept for softmax attention (inf: all); MiB @1K / @32K: decode-cache memory (fp32) "
             f"at 1K / 32K tokens of context; ppl: perplexity on the {n_tokens} held-out tokens; load+ppl s: seconds "
             "to load the model and score the passage"]
    full, *others = rows
    lower = [r["model"] for r in others if r["ppl"] < full["ppl"]]
    if lower:
        notes.append(f"{', '.join(lower)}: perplexity below full attention's. The backbone is frozen, but the new "
                     "parameters were trained on books like this held-out one (the backbone was not), so on this "
                     "passage they can fit the text better; the suites' scores are the comparison, not this number")
    return notes




def mmlu_entry(category: str) -> dict:
    """The MMLU column's task: the whole benchmark or one category's group (still shown as MMLU)."""
    task = "golinear_mmlu" if category == "all" else f"golinear_mmlu_{category}"
    return {"task": task, "metric": "acc", "display": "MMLU", "num_fewshot": 5}


def fitting_long_tasks(suite: str, context_length: int, data_dir) -> tuple[list[str], list[str]]:
    """(tasks of a long-context suite whose samples fit the length, tasks that do not), by building one
    sample each as the runner would (cached, so the evaluation reuses it)."""
    from golinear.tasks.ruler import SUITES, build_samples
    fit, skipped = [], []
    for task in SUITES[suite]:
        try:
            build_samples(task, "smollm2-135m", max_seq_length=context_length, num_samples=1, seed=42,
                          data_dir=data_dir)
            fit.append(task)
        except ValueError as e:
            why = str(e).splitlines()[0]
            if "no sample fits" in why:
                why = (f"the {context_length}-token context is too short for any of its samples (even the "
                       f"shortest does not fit); a longer --context-length runs it")
            skipped.append(f"{task}: {why}")
    return fit, skipped


def jobs(args, suites: list[str]) -> list[tuple[str, list[str], dict]]:
    """(what, suites, run_matrix keywords) for each evaluation the demo runs."""
    from golinear.bench.run import runner
    data_dir = runner.check_data_dir(args.data_dir if args.data_dir is not None else runner.default_data_dir())
    out = []
    standard = [s for s in suites if s in ("cr", "lambada")]
    if standard:
        out.append((f"{'+'.join(standard)}: {args.limit} documents per task", standard, {"limit": args.limit}))
    if "mmlu" in suites:
        out.append((f"mmlu ({args.mmlu.replace('_', ' ')}): 1 question per subject, 5-shot", ["mmlu"],
                    {"limit": 1, "extra_suites": {"mmlu": [mmlu_entry(args.mmlu)]},
                     "batch_size": min(args.batch_size, MMLU_BATCH)}))
    long = [s for s in suites if s in runner.LONG_SUITES]
    if long and data_dir is None:
        print(f"skipped {', '.join(long)}: their haystacks and questions are read from a data folder (build one with "
              "`golinear data fetch --out DIR`, then --data-dir DIR)")
        long = []
    extra, skipped = {}, []
    if long:
        print(f"building one sample per long-context task at {args.context_length} tokens (do they fit?)", flush=True)
    for suite in long:
        fit, skip = fitting_long_tasks(suite, args.context_length, data_dir)
        extra[suite], skipped = fit, skipped + skip
    for task in skipped:
        print(f"skipped {task}")
    long = [s for s in long if extra[s]]
    if long:
        out.append((f"{'+'.join(long)}: {args.long_samples} sample(s) per task at {args.context_length} tokens", long,
                    {"limit": args.long_samples, "num_samples": args.long_samples,
                     "context_length": args.context_length, "extra_suites": {s: extra[s] for s in long}}))
    return out


def check_suite_data(args, suites: list[str]) -> None:
    """The evaluation's documents exist before any model loads: each file of the data folder (a partly fetched
    folder names what to fetch), or the Hub for the standard suites when there is no folder."""
    from golinear.bench.run import plan
    folder = chosen_data_dir(args.data_dir)
    standard = [s for s in suites if s not in plan.LONG_SUITES]
    if folder is None:
        if standard:
            require_hub(f"the demo's evaluation of {', '.join(standard)}",
                        "; `golinear demo --skip-eval` runs without either (no evaluation)")
        return
    folder = plan.check_data_dir(folder)
    plan.check_task_data(plan.resolve_suites(suites, {"mmlu": [mmlu_entry(args.mmlu)]}), folder)


def probe_environment_once():
    """lm-eval re-runs torch's environment probe (pip, conda and lscpu subprocesses: seconds) for every
    cell, for a report golinear does not keep (the runner records its own provenance); the environment
    does not change within a run, so the demo probes it once."""
    import functools

    from torch.utils import collect_env
    if not hasattr(collect_env.get_pretty_env_info, "cache_info"):
        collect_env.get_pretty_env_info = functools.cache(collect_env.get_pretty_env_info)


def quiet_progress_bars():
    """Weight-loading and dataset-mapping bars say nothing a demo user needs; the cell and request bars stay."""
    import datasets
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()


def main(args) -> int:
    checkpoint = args.checkpoint
    if checkpoint is None and (DEFAULT_CHECKPOINT / "config.json").exists():
        checkpoint = str(DEFAULT_CHECKPOINT)
    if checkpoint is not None:  # a missing or damaged checkpoint is refused before any weights load
        from golinear.models.spec import check_checkpoint_files
        check_checkpoint_files(checkpoint)
    for name in ("tokens", "limit", "long_samples", "batch_size"):
        if getattr(args, name) < (2 if name == "tokens" else 1):
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: "
                             f"need at least {2 if name == 'tokens' else 1}")
    from golinear.tasks.ruler import check_seq_length
    try:
        check_seq_length(args.context_length)
    except ValueError as e:
        raise ValueError(f"--context-length {args.context_length}: {e}") from None
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    from golinear.bench.boards import leaderboard
    from golinear.bench.run import runner
    bad = [s for s in suites if s not in runner.ALL_SUITES]
    if bad or not suites:
        raise ValueError(f"--suites {args.suites!r}; allowed: {', '.join(runner.ALL_SUITES)}")
    if not args.skip_eval:  # before any model loads
        check_suite_data(args, suites)
    quiet_progress_bars()
    rows = summary_rows(checkpoint, args.tokens, args.data_dir)
    print(summary_table(rows))
    print("\n".join(textwrap.fill(note, 100) for note in summary_notes(rows, args.tokens)))
    if args.skip_eval:
        return 0
    if checkpoint:  # a relative path keeps leaderboard labels short and clone-independent
        rel = os.path.relpath(checkpoint)
        checkpoint = rel if not rel.startswith("..") else checkpoint
    models = ["full", checkpoint or "gdn-default"]  # labelled as model_labels() names them
    probe_environment_once()
    from golinear.tasks.standard import task_manager
    # only golinear's tasks run here: lm-eval's thousands of built-in YAMLs need not be indexed
    tm = task_manager(runner.check_data_dir(args.data_dir if args.data_dir is not None else runner.default_data_dir()),
                      include_defaults=False)
    cells = []
    for what, job_suites, kwargs in jobs(args, suites):
        t0 = time.time()
        print(f"\n== {what}", flush=True)
        kwargs = {"batch_size": args.batch_size, **kwargs}
        s = runner.run_matrix(models, job_suites, args.store, data_dir=args.data_dir, task_manager=tm, **kwargs)
        cells += s.cells
        print(f"   {s.evaluated} cells evaluated, {s.skipped} already in the store, {time.time() - t0:.0f} s",
              flush=True)
    leaderboard.render(args.store, args.out)
    from golinear.bench.run.run_summary import noise_note, task_table
    print("\nThe demo's scores (accuracies and S-NIAH/RULER scores in percent; n: documents or samples a task):\n")
    print(task_table(cells))
    print(textwrap.fill(noise_note(cells), 100) + "\n")
    print(f"leaderboards written to {args.out}/ (cells in {args.store}; re-running skips finished cells)")
    print("A full run adds every document, all 57 MMLU subjects and 4K-token long context: see docs/demo.md.")
    return 0
