"""`!function` helpers for the RULER YAML tasks: dataset builders (from lm-eval metadata) and scoring.

lm-eval calls `custom_dataset(**metadata)`; metadata is the task's own `metadata` merged with
TaskManager(metadata=...) / `--metadata` JSON and, when lm-eval builds the TaskManager itself,
`--model_args` (as its own `ruler` tasks expect). Keys read here (others are ignored):
  max_seq_length (or lm-eval's `max_seq_lengths` with one entry)  default 4096, 1024..32768
  num_samples  default 500 (HQA: at most 100, the questions available)
  seed         default 42
  data_dir     (or golinear_data_dir) default $GOLINEAR_DATA or <repo>/../shared/data
  tokenizer / pretrained / base   the evaluated model's tokenizer (name or path for
               models.backbones.backbone.load_tokenizer, or a tokenizer object); else the base named in a
               `checkpoint`'s config.json; default smollm2-135m
"""
from __future__ import annotations

import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:  # lm-eval imports this file by path; the packages live at the repo root
    sys.path.insert(0, str(_REPO))

import datasets  # noqa: E402

from golinear.tasks.ruler.api import (DEFAULT_NUM_SAMPLES, DEFAULT_SEED, DEFAULT_SEQ_LENGTH, TASKS,  # noqa: E402
                             check_seq_length, resolve_task)
from golinear.tasks.ruler.cache import cached_samples  # noqa: E402
from golinear.tasks.ruler.metrics import sample_score  # noqa: E402

TOKENIZER_KEYS = ("tokenizer", "pretrained", "base")
DEFAULT_TOKENIZER = "smollm2-135m"
DOC_FIELDS = ("index", "input", "answer_prefix", "outputs", "length", "max_length", "depths", "task")


def tokenizer_from_metadata(metadata: dict):
    """tokenizer / pretrained / base, else the base named by a `checkpoint`'s config, else SmolLM2."""
    for key in TOKENIZER_KEYS:
        value = metadata.get(key)
        if value is not None and value != "":
            return value
    if metadata.get("checkpoint"):
        from golinear.models.checkpoint.weights import read_config
        base = read_config(metadata["checkpoint"]).get("base")
        if base:
            return base
    return DEFAULT_TOKENIZER


def seq_length_from_metadata(metadata: dict) -> int:
    if metadata.get("max_seq_length") is not None:
        return check_seq_length(metadata["max_seq_length"])
    lengths = metadata.get("max_seq_lengths")
    if lengths is None:
        return DEFAULT_SEQ_LENGTH
    if isinstance(lengths, (int, str)):
        lengths = [lengths]
    if len(lengths) != 1:
        raise ValueError(f"max_seq_lengths {lengths!r}: one length per run (got {len(lengths)}); "
                         "run each context length separately or use max_seq_length")
    return check_seq_length(lengths[0])


def samples(task: str, **metadata) -> list[dict]:
    """The task's generated samples for this metadata (memoized: tasks/ruler/cache.py)."""
    return cached_samples(resolve_task(task).name, tokenizer_from_metadata(metadata),
                          max_seq_length=seq_length_from_metadata(metadata),
                          num_samples=metadata.get("num_samples", DEFAULT_NUM_SAMPLES),
                          seed=metadata.get("seed", DEFAULT_SEED),
                          data_dir=metadata.get("data_dir") or metadata.get("golinear_data_dir"))


def build_dataset(task: str, **metadata) -> dict[str, datasets.Dataset]:
    rows = samples(task, **metadata)
    docs = [{**{k: row[k] for k in DOC_FIELDS if k in row}, "max_length": row["max_seq_length"],
             "depths": [float(d) for d in row["depths"]]} for row in rows]
    return {"test": datasets.Dataset.from_list(docs, split=datasets.Split.TEST)}


def _builder(task: str):
    def build(**metadata):
        return build_dataset(task, **metadata)
    build.__name__ = task
    build.__doc__ = f"lm-eval custom_dataset for {task} ({TASKS[task].display}, RULER {TASKS[task].ruler})."
    return build


for _name in TASKS:
    globals()[_name] = _builder(_name)


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """The task's RULER metric (0-100 per sample, so the mean is RULER's score) plus `score`, the
    same number under one name for group averages."""
    metric = TASKS[doc["task"]].metric
    value = sample_score(metric, results[0], list(doc["outputs"]))
    return {metric: value, "score": value}
