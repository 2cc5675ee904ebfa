"""`golinear generation`: generation throughput on real S-NIAH-1 prompts, full attention against a linearized model.

The prompts are the suite's own (tasks/ruler, S-NIAH-1 at --context-length tokens, --samples of them, greedy);
every row runs them through the lm-eval backend's `generate_until` (HFLM's batching by length, tokenization,
post-processing), in one process. Equal work in every speed comparison: the timed rows generate exactly
--new-tokens tokens a sample (default 128; stop rules off: no EOS, no stop string), so samples/s and tokens/s
compare the same prompts and the same number of generated tokens:
  - full:             SmolLM2 full attention, lm-eval's own batched HF generate (left padding);
  - full-static:      the same backbone through the static-cache decoder (models/decoding/fast_decode.py), batched;
  - <linear>:         the linearized model (default: the shipped default recipe), batched on that decoder;
  - <linear>-sequential: the old path, HF generate one prompt at a time (the first --sequential-samples prompts);
  - <press> (asked for with --rows press): full attention with its KV cache compressed by each --presses spec
                      (golinear-press: each prompt compressed on its own, the batch decoded on the static decoder).
The as-evaluated rows (`full-static-evaluated`, `linear-evaluated`, `press-evaluated`; "(as evaluated)") run the task's own
settings (max_gen_toks 128, stop at EOS): they give the scores, and their speeds are not compared with any row (a
model that stops early does less work). The rows run linear, linear-sequential, full-static, full, then the
as-evaluated ones; the files list them full, full-static, linear, linear-sequential, full-static (as evaluated),
linear (as evaluated) whatever the run order. Each row is timed after an untimed warm-up batch of each batch size
it uses (kernel compilation, graph capture). An as-evaluated row's tokens_per_s counts the returned text
re-tokenized; a timed row's is samples x --new-tokens. --parity N also compares, on the first N samples, the
batched outputs of the linear model with each prompt generated alone (batch size 1, same decoder): the fraction of
identical generations; the sequential row's outputs are compared with the batched ones too.

Rows merge by key into <out-dir>/generation.csv (parity into generation_parity.csv); generation.md is rendered
from both.
"""
from __future__ import annotations

import gc
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from golinear.bench.cli_args import DEFAULT_LINEAR, GENERATION_ROWS

TASK = "golinear_sniah_1"
KEY = ["model", "config", "device", "dtype", "context_length", "batch_size"]
COLUMNS = KEY + ["generation", "stop_rules", "tokens_per_sample", "samples", "samples_per_s", "tokens_per_s",
                 "wall_s", "new_tokens", "score", "status", "commit", "date", "note"]
EVALUATED = " (as evaluated)"  # the label suffix of a row run with the task's stop rules
PARITY_KEY = ["model", "reference", "device", "dtype", "context_length", "batch_size"]
PARITY_COLUMNS = PARITY_KEY + ["samples", "identical", "fraction", "commit", "date"]
RUN_ORDER = ("linear", "linear-sequential", "full-static", "full", "press", "linear-evaluated", "full-static-evaluated",
             "press-evaluated")


def _check(args):
    """Fill the device-dependent defaults and validate every option before any loading."""
    from golinear.bench.backends.lm_backend import check_device, default_device
    from golinear.tasks.ruler import check_seq_length
    args.device = check_device(args.device or default_device())
    cuda = args.device.startswith("cuda")
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    if args.dtype not in ("bfloat16", "float32", "float16"):
        raise ValueError(f"--dtype {args.dtype!r}; allowed: bfloat16, float32, float16")
    try:
        args.context_length = check_seq_length(args.context_length or (4096 if cuda else 2048))
    except ValueError as e:
        raise ValueError(f"--context-length {args.context_length}: {e}") from None
    if args.seed < 0:
        raise ValueError(f"--seed {args.seed}: expected a non-negative integer")
    args.samples = args.samples if args.samples is not None else (200 if cuda else 20)
    args.sequential_samples = (args.sequential_samples if args.sequential_samples is not None else (20 if cuda else 5))
    if args.new_tokens < 1:
        raise ValueError(f"--new-tokens {args.new_tokens}: must be >= 1 (the tokens every timed row generates a "
                         "sample)")
    if args.samples < 1 or args.sequential_samples < 0 or args.parity < 0:
        raise ValueError(f"--samples {args.samples} must be >= 1, --sequential-samples {args.sequential_samples} and "
                         f"--parity {args.parity} >= 0")
    bs = str(args.batch_size or (32 if cuda else 4))
    if bs != "auto" and not (bs.isdigit() and int(bs) >= 1):
        raise ValueError(f"--batch-size {args.batch_size!r}; allowed: a positive integer or auto")
    args.batch_size = bs if bs == "auto" else int(bs)
    args.rows = [r.strip() for r in args.rows.split(";") if r.strip()]
    bad = [r for r in args.rows if r not in GENERATION_ROWS]
    if bad or not args.rows:
        raise ValueError(f"--rows {bad or args.rows}: allowed {list(GENERATION_ROWS)}")
    from golinear.bench.run.specs import parse_model_spec
    args.linear_spec = parse_model_spec(args.linear)
    if args.linear_spec.is_full_attention:
        raise ValueError(f"--linear {args.linear!r} is full attention; give a linearized spec or checkpoint")
    args.press_specs = []
    if any(r.startswith("press") for r in args.rows):
        for text in [t.strip() for t in args.presses.split(";") if t.strip()]:
            spec = parse_model_spec(text)
            if spec.press is None or not spec.kv_budget:
                raise ValueError(f"--presses {text!r}: expected press=<name>,kv_budget=<entries>")
            args.press_specs.append(spec)
        if not args.press_specs:
            raise ValueError(f"--presses {args.presses!r}: no press spec")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise FileNotFoundError(f"--data-dir {args.data_dir!r} does not exist")
    from golinear.models.util.data_dir import existing_data_dir  # the haystacks, before any model loads
    existing_data_dir(args.data_dir, needs="S-NIAH-1's prompts (paul_graham_essays/)")
    from golinear.bench.backends.lm_backend import check_model_args
    for label, backend, margs, *_ in _plan(args):
        try:  # e.g. a model with retention slots has no batched row
            check_model_args(backend, {**margs, "device": args.device})
        except ValueError as e:
            raise ValueError(f"row {label!r} (--rows): {e}") from None


def _requests(args, tokenizer):
    from lm_eval.api.instance import Instance
    from golinear.tasks.ruler.cache import cached_samples
    rows = cached_samples(TASK, tokenizer, max_seq_length=args.context_length, num_samples=args.samples,
                          seed=args.seed, data_dir=args.data_dir)
    reqs = [Instance("generate_until", row, (row["prompt"], {"until": [], "max_gen_toks": row["max_gen_toks"],
                                                             "do_sample": False, "temperature": 0.0}), i,
                     metadata=(TASK, i, 1))  # the task's name: a press splits the prompt at its question
            for i, row in enumerate(rows)]
    return rows, reqs


def fixed_length(reqs, new_tokens: int):
    """The same requests with stop rules off: exactly new_tokens tokens a sample (no stop string; min_new_tokens keeps
    HF generate from stopping at EOS, and the batched decoder then stops at nothing)."""
    from lm_eval.api.instance import Instance
    return [Instance("generate_until", r.doc, (r.args[0], {**r.args[1], "until": [], "max_gen_toks": new_tokens,
                                                           "min_new_tokens": new_tokens}), r.idx,
                     metadata=(r.task_name, r.doc_id, r.repeats)) for r in reqs]


def _sync(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(lm, reqs, device):
    _sync(device)
    t0 = time.perf_counter()
    outs = lm.generate_until(reqs, disable_tqdm=True)
    _sync(device)
    return outs, time.perf_counter() - t0


def warm_sizes(n: int, batch_size: int) -> list[int]:
    """The batch sizes HFLM splits n requests into: full batches, then what is left."""
    return sorted({min(batch_size, n), n % batch_size} - {0})


def _warm(lm, reqs, device):
    """An untimed batch of each size the timed run of `reqs` uses (the last batch is smaller when the batch size
    does not divide the sample count), with a few new tokens: compiles the kernels and captures the decode graph
    of each shape (the backend keeps one decoder per batch size), so the timed run pays for none of them."""
    from lm_eval.api.instance import Instance
    bs = lm.batch_size if isinstance(lm.batch_size, int) else 1
    for size in warm_sizes(len(reqs), bs):
        fixed = {"min_new_tokens": 4} if "min_new_tokens" in reqs[0].args[1] else {}
        warm = [Instance("generate_until", r.doc, (r.args[0], {**r.args[1], "max_gen_toks": 4, **fixed}), r.idx,
                         metadata=(r.task_name, r.doc_id, r.repeats)) for r in reqs[:size]]
        _timed(lm, warm, device)


def _plan(args):
    """(row label, backend, model args, samples, timed: stop rules off) per requested row."""
    lin = args.linear_spec
    name = lin.label or Path(args.linear).name
    if args.linear == DEFAULT_LINEAR:
        name = f"gdn-default ({name})"
    batched = {**lin.model_args(), "generation": "batched"}
    plan = {"full": ("full", "golinear-hf", {"generation": "hf"}, args.samples, True),
            "full-static": ("full-static", "golinear-hf", {"generation": "batched"}, args.samples, True),
            "linear": (name, "linearized", batched, args.samples, True),
            "linear-sequential": (f"{name}-sequential", "linearized", {**lin.model_args(), "generation": "sequential"},
                                  min(args.sequential_samples, args.samples), True),
            "full-static-evaluated": ("full-static" + EVALUATED, "golinear-hf", {"generation": "batched"},
                                      args.samples, False),
            "linear-evaluated": (name + EVALUATED, "linearized", batched, args.samples, False)}
    out = []
    for r in sorted(args.rows, key=RUN_ORDER.index):
        if r.startswith("press"):  # one row per press spec
            out += [(p.label + (EVALUATED if r.endswith("-evaluated") else ""), "golinear-press",
                     {**p.model_args(), "generation": "static"}, args.samples, not r.endswith("-evaluated"))
                    for p in args.press_specs]
        elif plan[r][3] > 0:
            out.append(plan[r])
    return out


def run(args, publish) -> tuple[list[dict], list[dict]]:
    """Every row, then the batch-size-1 parity; publish(rows, parity) after each, so a run stopped by a time limit
    keeps what it measured."""
    from golinear.bench.backends.lm_backend import make_lm
    from golinear.bench.run.provenance import git_state
    from golinear.tasks.ruler import score
    commit = git_state().get("commit") or ""
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    device_label = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    # the up-front encode of every prompt is timed: say whether it may use every core
    print(f"host: {os.cpu_count()} CPUs, TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', 'unset')} "
          f"(the batched encode is parallel unless it is false)", flush=True)
    rows, parity = [], []
    data_rows = reqs = linear = None
    for label, backend, margs, n, timed in _plan(args):
        if backend == "golinear-press":  # extends golinear-hf: its own module builds it
            from golinear.bench.backends.press_backend import PressLM
            lm = PressLM(**margs, dtype=args.dtype, device=args.device, batch_size=args.batch_size)
        else:
            lm = make_lm(backend, **margs, dtype=args.dtype, device=args.device, batch_size=args.batch_size)
        if reqs is None:
            data_rows, reqs = _requests(args, lm.tokenizer)
        row_reqs = fixed_length(reqs[:n], args.new_tokens) if timed else reqs[:n]
        row = dict(model="smollm2-135m", config=label, device=device_label, dtype=args.dtype,
                   context_length=args.context_length, batch_size=args.batch_size, generation=margs["generation"],
                   stop_rules="off" if timed else "task", tokens_per_sample=args.new_tokens if timed else None,
                   samples=n, commit=commit, date=date,
                   note=f"one prompt at a time (old path), the first {n} prompts"
                   if margs["generation"] == "sequential" else "")
        try:
            _warm(lm, row_reqs, args.device)
            outs, wall = _timed(lm, row_reqs, args.device)
        except (torch.OutOfMemoryError, ValueError) as e:  # a batch that does not fit: recorded, the rest goes on
            row.update(status=f"failed: {str(e).splitlines()[0][:200]}")
            rows.append(row)
            print(f"{label}: {row['status']}", flush=True)
            publish(rows, parity)
            del lm
            _free(args.device)
            continue
        if timed:  # exactly new_tokens a sample (stop rules off); the text is scored only as evaluated
            tokens, got = n * args.new_tokens, None
        else:
            tokens = sum(len(lm.tokenizer(o, add_special_tokens=False)["input_ids"]) for o in outs)
            got = score(TASK, outs, [r["outputs"] for r in data_rows[:n]])
        row.update(samples_per_s=n / wall, tokens_per_s=tokens / wall, wall_s=wall, new_tokens=tokens, score=got,
                   status="ok")
        rows.append(row)
        print(f"{label}: {n} samples in {wall:.1f} s ({n / wall:.2f} samples/s, {tokens / wall:.1f} tokens/s), "
              f"score {row['score']}", flush=True)
        if backend == "linearized" and margs["generation"] == "batched" and timed:
            linear = (lm, row, outs)  # kept for the parity runs
        elif margs["generation"] == "sequential" and linear is not None:
            parity.append(_parity_row(row, "one at a time (old path: HF generate)", linear[2][:n], outs))
        publish(rows, parity)
        del lm
        _free(args.device)
    if linear is not None and args.parity:
        lm, row, outs = linear
        m = min(args.parity, len(outs))
        lm.batch_size_per_gpu = 1  # each prompt alone, same decoder
        alone, _ = _timed(lm, fixed_length(reqs[:m], args.new_tokens), args.device)
        parity.append(_parity_row(row, f"batch size 1 (same decoder), {m} samples", outs[:m], alone))
        publish(rows, parity)
    return rows, parity


def _parity_row(row, reference, got, want) -> dict:
    same = sum(a == b for a, b in zip(got, want))
    out = {k: row[k] for k in ("model", "device", "dtype", "context_length", "batch_size", "commit", "date")}
    print(f"parity vs {reference}: {same}/{len(got)} identical", flush=True)
    for i, (a, b) in enumerate(zip(got, want)):  # where each differing pair parts (for the explanation)
        if a != b:
            n = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"  sample {i} differs from character {n}: batched {a[max(0, n - 40):n + 40]!r} | "
                  f"reference {b[max(0, n - 40):n + 40]!r}", flush=True)
    return dict(out, reference=reference, samples=len(got), identical=same, fraction=same / len(got))


def _free(device):
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------- outputs
def _read(path: Path):
    import pandas as pd
    return pd.read_csv(path) if path.exists() else None


def _merged(old, rows: list[dict], columns: list[str], key: list[str]):
    """old rows with the same key as a new one dropped, then the new rows."""
    import pandas as pd
    new = pd.DataFrame(rows, columns=columns)
    if old is None or not len(old):
        return new
    keys = set(map(tuple, new[key].astype(str).values))
    old = old[[tuple(r) not in keys for r in old[key].astype(str).values]]
    return pd.concat([old, new], ignore_index=True)


def row_kind(config: str) -> str:
    """Which of GENERATION_ROWS a row's config label is (the linear rows carry the model's name, the press rows the
    press spec's label, "... (kvpress...) @<budget>")."""
    if config.endswith(EVALUATED):
        base = config.removesuffix(EVALUATED)
        return ("full-static" if base == "full-static" else "press" if "(kvpress" in base else "linear") + "-evaluated"
    if config in ("full", "full-static"):
        return config
    if "(kvpress" in config:
        return "press"
    return "linear-sequential" if config.endswith("-sequential") else "linear"


def sorted_rows(df):
    """Each (device, dtype, context length) table's rows in GENERATION_ROWS order (stable otherwise), the tables in
    the order they first appear: the files do not depend on the order the rows ran in."""
    table = df.groupby(["device", "dtype", "context_length"], sort=False).ngroup()
    kind = df.config.map(lambda c: GENERATION_ROWS.index(row_kind(c)))
    order = df.assign(_table=table, _kind=kind).sort_values(["_table", "_kind"], kind="stable").index
    return df.loc[order].reset_index(drop=True)


def _write_csv(path: Path, df):
    from golinear.models.util.atomic import atomic_write
    atomic_write(path, df.to_csv(index=False))


def merge(csv_path: Path, rows: list[dict], columns: list[str], key: list[str]):
    """Merge generation rows into a CSV by key (existing rows with the same key are replaced), in sorted_rows'
    order; returns the table."""
    df = sorted_rows(_merged(_read(csv_path), rows, columns, key))
    _write_csv(csv_path, df)
    return df


def equal_work(r) -> int | None:
    """The fixed number of new tokens a sample a row was timed at (stop rules off), else None: rows recorded with
    the task's stop rules (or before the column existed) generate what each model chooses to, so no ratio."""
    stop = r.get("stop_rules") if hasattr(r, "get") else None
    n = r.get("tokens_per_sample") if hasattr(r, "get") else None
    return int(n) if stop == "off" and n == n and n is not None else None


def render(df, parity) -> str:
    """Markdown: one table per (device, dtype, context length); the linear row's speed-up over the rows timed at
    the same number of new tokens a sample (equal work), and over no other row."""
    lines = ["# Generation throughput (S-NIAH-1, `golinear generation`)", "",
             "Real S-NIAH-1 prompts through the lm-eval backends' `generate_until` (greedy), timed after a warm-up "
             "batch. Timed rows generate the same number of new tokens a sample (column `new tokens/sample`; stop "
             "rules off), so their samples/s and tokens/s compare equal work; rows marked \"(as evaluated)\" run the "
             "task's stop rules (EOS, 128 new tokens at most) and give the scores, and no ratio is computed from "
             "them. `full`: lm-eval's batched HF generate; `full-static`: the backbone through the static-cache "
             "decoder (models/decoding/fast_decode.py); the linear rows: batched on that decoder, or one prompt at a time "
             "through HF generate (`-sequential`, the first prompts only); the press rows (`... (kvpress) @<budget>`): "
             "full attention with its KV cache compressed to the budget by a kvpress press, each prompt compressed "
             "on its own (the press's scoring counted), the batch decoded on that same decoder. The speed-up is the "
             "linear row's tokens/s "
             "over the row's, at equal new tokens a sample. Produced by `golinear generation`; see "
             "docs/generation.md.", ""]
    num = (lambda v, f: "" if v is None or v != v else format(v, f))  # noqa: E731  (NaN -> blank)
    for (device, dtype, ctx), g in df.groupby(["device", "dtype", "context_length"], sort=False):
        ok = g[g.status == "ok"]
        lin = [r for _, r in ok.iterrows() if row_kind(r.config) == "linear" and equal_work(r)]
        base = lin[-1] if lin else None
        lines += [f"## {device}, {dtype}, {ctx} tokens", "",
                  "| config | generation | batch | samples | new tokens/sample | samples/s | tokens/s | wall s "
                  "| score | linear speed-up (equal work) | status | commit |",
                  "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|---|"]
        for _, r in g.iterrows():
            n = equal_work(r)
            comparable = (base is not None and n is not None and n == equal_work(base) and r.status == "ok"
                          and r.tokens_per_s > 0)
            up = f"{base.tokens_per_s / r.tokens_per_s:.2f}x" if comparable else ""
            each = str(n) if n is not None else "task stop rules (at most 128)"
            lines.append(f"| {r.config} | {r.generation} | {r.batch_size} | {r.samples} | {each} "
                         f"| {num(r.samples_per_s, '.3f')} "
                         f"| {num(r.tokens_per_s, '.1f')} | {num(r.wall_s, '.1f')} | {num(r.score, '.2f')} | {up} | "
                         f"{r.status} | {str(r.commit)[:7]} |")
        lines.append("")
    if parity is not None and len(parity):
        lines += ["## Parity: batched vs each prompt alone (identical generated text)", "",
                  "| device | dtype | context | batch | reference | samples | identical | fraction | commit |",
                  "|---|---|---:|---:|---|---:|---:|---:|---|"]
        for _, r in parity.iterrows():  # (r["dtype"]: a Series' .dtype is its own)
            lines.append(f"| {r['device']} | {r['dtype']} | {r['context_length']} | {r['batch_size']} "
                         f"| {r['reference']} "
                         f"| {r['samples']} | {r['identical']} | {r['fraction']:.3f} | {str(r['commit'])[:7]} |")
        lines.append("")
    return "\n".join(lines)


def main(args) -> int:
    _check(args)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    before = {name: _read(out_dir / name) for name in ("generation.csv", "generation_parity.csv")}

    def publish(rows, parity):  # the files as they were, plus this run's rows so far
        df = sorted_rows(_merged(before["generation.csv"], rows, COLUMNS, KEY))
        par = _merged(before["generation_parity.csv"], parity, PARITY_COLUMNS, PARITY_KEY)
        _write_csv(out_dir / "generation.csv", df)
        if len(par):
            _write_csv(out_dir / "generation_parity.csv", par)
        from golinear.models.util.atomic import atomic_write
        atomic_write(out_dir / "generation.md", render(df, par))

    rows, _ = run(args, publish)
    print(f"wrote {out_dir / 'generation.csv'} and generation.md", flush=True)
    return 0 if all(r["status"] == "ok" for r in rows) else 1
