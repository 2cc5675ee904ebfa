"""The StreamingLLM press against the untrained window + sinks, sample by sample, on S-NIAH.

At budget B both keep the same entries for decoding (the first 8 tokens and the last B - 8); they differ in
how those entries were computed: the press prefills with full attention and compresses afterwards, the window
model attends only to its window and sinks while reading the prompt too. This runs both on the same prompts
(the lm-eval tasks golinear evaluates, the task seed of `golinear run`) and counts where their answers agree.
"""
from __future__ import annotations

import csv
import datetime as dt
import io

from tabulate import tabulate

from golinear.bench.boards.markdown import csv_cell

SINKS = 8
COLUMNS = ("task", "samples", "press_score", "window_score", "same_answer", "both_right", "only_press_right",
           "only_window_right", "both_wrong")


def models(budget: int, base: str = "smollm2-135m", dtype: str = "float32"):
    """(press, window) specs at one budget: press=streaming_llm and window + sinks (mechanism=none)."""
    from golinear.bench.run import specs as S
    press = S.parse_model_spec(f"press=streaming_llm,base={base},dtype={dtype}").with_budget(budget, SINKS)
    window = S.window_only(S.parse_model_spec(f"base={base},dtype={dtype}"), budget, SINKS)
    return press, window


def per_sample(res: dict, task: str) -> list[dict]:
    """One row per document of an lm-eval result logged with samples: its id, answer (RULER's clean-up) and
    whether it is right (the task's own per-sample score is 100)."""
    from golinear.tasks.ruler.metrics import postprocess_pred
    rows = []
    for s in sorted(res["samples"][task], key=lambda s: s["doc_id"]):
        metric = next(k for k in ("string_match_all", "string_match_part") if k in s)
        rows.append({"doc_id": s["doc_id"], "answer": postprocess_pred(s["filtered_resps"][0]),
                     "score": float(s[metric]), "right": float(s[metric]) == 100.0})
    return rows


def agreement(task: str, press: list[dict], window: list[dict]) -> dict:
    """The counts of one task from the two models' per-sample rows (same documents, same order)."""
    if [r["doc_id"] for r in press] != [r["doc_id"] for r in window]:
        raise ValueError(f"{task}: the two models were scored on different documents")
    n = len(press)
    pairs = list(zip(press, window))
    return {"task": task, "samples": n,
            "press_score": round(sum(p["score"] for p in press) / n, 2),
            "window_score": round(sum(w["score"] for w in window) / n, 2),
            "same_answer": sum(p["answer"] == w["answer"] for p, w in pairs),
            "both_right": sum(p["right"] and w["right"] for p, w in pairs),
            "only_press_right": sum(p["right"] and not w["right"] for p, w in pairs),
            "only_window_right": sum(w["right"] and not p["right"] for p, w in pairs),
            "both_wrong": sum(not p["right"] and not w["right"] for p, w in pairs)}


def evaluate(lm, task: str, tm, context_length: int, samples: int, seed: int) -> dict:
    """One task through lm-eval with per-sample logs, prompts made as `golinear run` makes them."""
    import lm_eval

    from golinear.bench.run.execute import LM_EVAL_SEEDS, with_metadata
    meta = {"max_seq_lengths": [context_length], "seed": seed, "num_samples": samples, "tokenizer": "smollm2-135m"}
    return lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=with_metadata(tm, meta), log_samples=True,
                                   bootstrap_iters=0, **LM_EVAL_SEEDS)


def crosscheck(tasks, *, budget: int, context_length: int, samples: int, seed: int = 42, device: str = "cpu"):
    """(rows, samples by task, provenance): both models on each task's same prompts."""
    from golinear.bench.run.execute import build_lm, build_task_manager
    from golinear.bench.run.provenance import git_state, hardware
    press_spec, window_spec = models(budget)
    tm = build_task_manager(None, tasks=tasks)
    logged = {}
    for name, spec in (("press", press_spec), ("window", window_spec)):
        lm = build_lm(spec, device=device)
        logged[name] = {t: per_sample(evaluate(lm, t, tm, context_length, samples, seed), t) for t in tasks}
        hw = hardware(lm)
        del lm
    rows = [agreement(t, logged["press"][t], logged["window"][t]) for t in tasks]
    prov = {"commit": git_state().get("commit"), "device": hw["device"], "dtype": hw["dtype"],
            "context_length": context_length, "budget": budget, "sinks": SINKS, "samples": samples,
            "task_seed": seed, "press": press_spec.label, "window": window_spec.label,
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")}
    return rows, logged, prov


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows({k: csv_cell(v) for k, v in r.items()} for r in rows)
    return buf.getvalue()


def to_markdown(rows: list[dict], prov: dict) -> str:
    head = ["task", "samples", "StreamingLLM press", "window + sinks", "same answer", "both right",
            "only press right", "only window right", "both wrong"]
    table = tabulate([[r[c] for c in COLUMNS] for r in rows], headers=head, tablefmt="github")
    return ("# StreamingLLM press against window + sinks\n\n"
            "Generated by `scripts/press_crosscheck.py`; do not edit. Scores are RULER's (0-100); the other columns "
            "count samples. Same answer: the two generated answers are equal after RULER's clean-up.\n\n"
            f"{table}\n\n"
            f"Provenance: commit {prov['commit']}, device {prov['device']}, dtype {prov['dtype']}, context length "
            f"{prov['context_length']}, budget {prov['budget']} ({prov['sinks']} sinks), {prov['samples']} samples "
            f"per task (task seed {prov['task_seed']}), {prov['date']}.\n")


DOC_START = "<!-- generated by scripts/press_crosscheck.py from leaderboards/kv-crosscheck.csv -->"
DOC_END = "<!-- end generated -->"


def read_csv(text: str) -> list[dict]:
    return [{k: (v if k == "task" else float(v) if "score" in k else int(v)) for k, v in r.items()}
            for r in csv.DictReader(io.StringIO(text))]


def summary(rows: list[dict]) -> str:
    """The sentence docs/kv_compression.md shows between its markers, from the CSV's rows."""
    parts = [f"{r['task']}: same answer on {r['same_answer']} of {r['samples']} samples, both right on "
             f"{r['both_right']}, only the press right on {r['only_press_right']}, only window + sinks right on "
             f"{r['only_window_right']} (scores {r['press_score']} and {r['window_score']})" for r in rows]
    return "Measured (leaderboards/kv-crosscheck.md): " + "; ".join(parts) + "."


def with_summary(page: str, rows: list[dict]) -> str:
    """`page` with the text between the markers replaced by the summary of `rows`."""
    start, end = page.index(DOC_START) + len(DOC_START), page.index(DOC_END)
    return page[:start] + "\n" + summary(rows) + "\n" + page[end:]
