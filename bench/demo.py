"""`golinear demo`, the README's main job on the embedded default (SmolLM2-135M-Instruct).

1. Converts the backbone and prints, for full attention and the default recipe (GDN + 56-token window +
   8 sinks + short conv): new parameters, cache budget, decode-cache memory, and perplexity on a held-out
   passage of the books corpus (the recipe is labelled untrained unless a checkpoint is given).
2. Evaluates both on a quick subset of every suite (`golinear run` cells in `--store`) and renders the
   leaderboard into `--out`.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
from tabulate import tabulate

from models.linearize import DEFAULT_RECIPE, decode_state_bytes, load_model

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"


def heldout_passage(tokenizer, n_tokens: int, data_dir=None) -> torch.Tensor:
    """The first n tokens of the first held-out book (never trained on: models.data's held-out rule)."""
    from models import data
    docs = dict(data.read_jsonl_docs(data.book_files(data_dir)))
    book = data.heldout_ids(docs, 8)[0]
    ids = tokenizer(docs[book][:20 * n_tokens], return_tensors="pt").input_ids[:, :n_tokens]
    return ids, book


@torch.no_grad()
def perplexity(model, ids: torch.Tensor) -> float:
    return math.exp(model(ids, labels=ids).loss.item())


def cache_bytes(model, info, context: int) -> int:
    if info["linearize"] is None:  # full attention: K and V of every layer for every token, fp32
        c = model.config
        return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * context * 4
    return decode_state_bytes(model, context=context)


def summary_rows(checkpoint: str | None, n_tokens: int, data_dir=None) -> list[dict]:
    rows = []
    recipe = {"checkpoint": checkpoint} if checkpoint else {
        "mechanism": DEFAULT_RECIPE.mechanism, "window": DEFAULT_RECIPE.window, "sinks": DEFAULT_RECIPE.sinks,
        "short_conv": DEFAULT_RECIPE.short_conv}
    ids = book = None
    for label, kwargs in (("full attention", {}), ("GDN + w56 + s8 + SC", recipe)):
        t0 = time.time()
        model, tok, info = load_model(**kwargs)
        if ids is None:
            ids, book = heldout_passage(tok, n_tokens, data_dir)
        ppl = perplexity(model, ids)
        trained = info["linearize"] is None or info.get("trained")
        rows.append({
            "model": label + ("" if trained else " (untrained)"),
            "new params": f"{info['new_parameters']:,}",
            "cache budget": "inf" if info["linearize"] is None else info["cache_budget"],
            "decode cache @1K (MiB)": round(cache_bytes(model, info, 1024) / 2 ** 20, 2),
            "decode cache @32K (MiB)": round(cache_bytes(model, info, 32768) / 2 ** 20, 2),
            f"ppl ({ids.shape[1]} held-out tokens)": round(ppl, 2),
            "seconds": round(time.time() - t0, 1),
        })
        del model
    print(f"held-out passage: book {book!r}, {ids.shape[1]} tokens (SmolLM2 tokenizer); fp32 on CPU")
    return rows


def add_arguments(p):
    p.add_argument("--checkpoint", default=None,
                   help="trained checkpoint of the default recipe (default: the shipped one if present, "
                        "else an untrained conversion)")
    p.add_argument("--tokens", type=int, default=512, help="held-out passage length for perplexity")
    p.add_argument("--limit", type=int, default=8, help="documents per standard task (MMLU: per subject, 1)")
    p.add_argument("--long-samples", type=int, default=2, help="samples per S-NIAH/RULER task")
    p.add_argument("--context-length", type=int, default=2048,
                   help="S-NIAH/RULER context length (HQA needs >= 2048 with SmolLM2)")
    p.add_argument("--suites", default="cr,mmlu,lambada,sniah,ruler")
    p.add_argument("--store", default="runs/demo/store")
    p.add_argument("--out", default="runs/demo/leaderboards")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--batch-size", type=int, default=8, help="lm-eval batch size (scores do not depend on it)")
    p.add_argument("--skip-eval", action="store_true", help="only the model summary (step 1)")


def main(args) -> int:
    checkpoint = args.checkpoint
    if checkpoint is None and (DEFAULT_CHECKPOINT / "config.json").exists():
        checkpoint = str(DEFAULT_CHECKPOINT)
    if args.tokens < 2:
        raise ValueError(f"--tokens {args.tokens}: need at least 2 tokens")
    print(tabulate(summary_rows(checkpoint, args.tokens, args.data_dir), headers="keys", tablefmt="github"))
    if args.skip_eval:
        return 0
    from bench import leaderboard, runner
    if checkpoint:  # a relative path keeps leaderboard labels short and clone-independent
        rel = os.path.relpath(checkpoint)
        checkpoint = rel if not rel.startswith("..") else checkpoint
    recipe = f"checkpoint={checkpoint}" if checkpoint else "gdn-default"
    models = ["full", recipe]
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    standard = [s for s in suites if s in runner.STANDARD_SUITES and s != "mmlu"]
    long = [s for s in suites if s in runner.LONG_SUITES]
    jobs = [(standard, args.limit, {}), (["mmlu"] if "mmlu" in suites else [], 1, {}),
            (long, args.long_samples, {"context_length": args.context_length, "num_samples": args.long_samples})]
    for job_suites, limit, extra in jobs:
        if job_suites:
            runner.run_matrix(models, job_suites, args.store, limit=limit, data_dir=args.data_dir,
                              batch_size=args.batch_size, **extra)
    leaderboard.render(args.store, args.out)
    for name in ("standard.md", "sniah.md", "ruler.md"):  # the measured rows (reported ones are in the files)
        md = Path(args.out) / name
        if md.exists():
            lines = md.read_text().splitlines()
            table = [ln for ln in lines if ln.startswith("|") and ("measured" in ln or ln.startswith("| status")
                                                                   or ln.startswith("|:"))]
            print("\n".join([lines[0], *table, ""]))
    print(f"leaderboards written to {args.out}/ (cells in {args.store}; re-running skips finished cells)")
    return 0
