"""Where the standard suites' documents come from: the local data folder, or the Hub as lm-eval does.

Every task YAML in this folder names this module's `load` as its `custom_dataset`, with
`dataset_kwargs: {builtin: <path of lm-eval's own task YAML>}`. lm-eval calls it as
`load(**metadata, **dataset_kwargs)`; the TaskManager from `tasks.standard.task_manager` puts the
data folder into the metadata as `golinear_data_dir`.

- Local folder: the files listed in its README are read into `datasets.Dataset`s with exactly the
  Hub schema the built-in task expects (same field names and types, Hub order), one split each.
- No folder (or `golinear_data_dir=hub`): `datasets.load_dataset` is called with the built-in
  task's own `dataset_path` / `dataset_name` / `dataset_kwargs`, i.e. the call lm-eval itself makes.

lm-eval imports this file by path (not as `tasks.standard.local_data`), so it only uses absolute
imports of installed packages.
"""
from __future__ import annotations

import functools
import gzip
import json
import os
from pathlib import Path

import datasets

HUB = "hub"


def default_data_dir() -> str | None:
    """The data folder a command uses when none is given ($GOLINEAR_DATA, else <repo>/../shared/data when it
    exists), None for the Hub; the one place of this rule."""
    d = resolve_data_dir(None)
    return None if d == HUB else d


def builtin_tasks_dir() -> Path:
    import lm_eval.tasks
    return Path(lm_eval.tasks.__file__).parent


def builtin_config(builtin: str) -> dict:
    """lm-eval's own resolved task config (includes followed, `!function`s imported)."""
    from lm_eval.tasks._yaml_loader import load_yaml
    path = builtin_tasks_dir() / builtin
    if not path.exists():
        raise FileNotFoundError(f"lm-eval task config {builtin!r} not found in {builtin_tasks_dir()}")
    return load_yaml(path, resolve_func=True)


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> str:
    """The data folder as an absolute path, or "hub".

    Order (golinear.models.util.data_dir): the explicit value, then $GOLINEAR_DATA, then <repo>/../shared/data when it
    exists, then the Hub. An explicitly named folder that does not exist is an error, not a silent Hub fallback.
    """
    from golinear.models.util.data_dir import chosen_data_dir, existing_data_dir
    chosen = chosen_data_dir(data_dir)
    if chosen is None or str(chosen).lower() == HUB:
        return HUB
    return str(existing_data_dir(chosen).resolve())


# --- local readers: (dataset_path, dataset_name) of the Hub copy -> files and a reader ---------------

def _read_jsonl(path: Path) -> list[dict]:
    """Parsed once per process and file version (the 57 MMLU subjects share two files)."""
    return _read_jsonl_cached(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _read_jsonl_cached(path: str, mtime_ns: int) -> list[dict]:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _piqa(root: Path, name):
    docs = _read_jsonl(root / "piqa/valid.jsonl")
    labels = (root / "piqa/valid-labels.lst").read_text().split()
    if len(labels) != len(docs):
        raise ValueError(f"piqa: {len(docs)} documents but {len(labels)} labels in valid-labels.lst")
    rows = [{"goal": d["goal"], "sol1": d["sol1"], "sol2": d["sol2"], "label": int(y)}
            for d, y in zip(docs, labels)]
    return {"validation": rows}


def _arc(root: Path, name):
    rows = _read_jsonl(root / f"arc/{name}-test.jsonl")
    return {"test": [{"id": d["id"], "question": d["question"],
                      "choices": {"text": d["choices"]["text"], "label": d["choices"]["label"]},
                      "answerKey": d["answerKey"]} for d in rows]}


def _hellaswag(root: Path, name):
    fields = ("ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "source_id", "split",
              "split_type", "label")
    rows = _read_jsonl(root / "hellaswag/hellaswag_validation.jsonl.gz")
    return {"validation": [{k: (str(d[k]) if k == "label" else d[k]) for k in fields} for d in rows]}


def _winogrande(root: Path, name):
    rows = _read_jsonl(root / "winogrande/dev.jsonl")
    return {"validation": [{"sentence": d["sentence"], "option1": d["option1"], "option2": d["option2"],
                            "answer": str(d["answer"])} for d in rows]}


def _mmlu(root: Path, subject):
    def pick(path):
        return [{"question": d["question"], "subject": d["subject"], "choices": d["choices"],
                 "answer": int(d["answer"])} for d in _read_jsonl(path) if d["subject"] == subject]
    splits = {"test": pick(root / "mmlu/mmlu_test.jsonl.gz"), "dev": pick(root / "mmlu/mmlu_dev.jsonl.gz")}
    if not splits["test"] or not splits["dev"]:
        raise ValueError(f"mmlu: no documents for subject {subject!r} in {root / 'mmlu'}")
    return splits


def _lambada(root: Path, name):
    return {"test": [{"text": d["text"]} for d in _read_jsonl(root / "lambada_openai/lambada_test.jsonl")]}


# dataset_path -> (reader, files it reads; "{name}" is the Hub dataset_name)
LOCAL = {
    "baber/piqa": (_piqa, ["piqa/valid.jsonl", "piqa/valid-labels.lst"]),
    "allenai/ai2_arc": (_arc, ["arc/{name}-test.jsonl"]),
    "Rowan/hellaswag": (_hellaswag, ["hellaswag/hellaswag_validation.jsonl.gz"]),
    "allenai/winogrande": (_winogrande, ["winogrande/dev.jsonl"]),
    "cais/mmlu": (_mmlu, ["mmlu/mmlu_test.jsonl.gz", "mmlu/mmlu_dev.jsonl.gz"]),
    "EleutherAI/lambada_openai": (_lambada, ["lambada_openai/lambada_test.jsonl"]),
}


def local_files(builtin: str, data_dir: str) -> list[Path]:
    """The files a task reads from `data_dir`; raises FileNotFoundError naming the first one missing."""
    cfg = builtin_config(builtin)
    path, name = cfg["dataset_path"], cfg.get("dataset_name")
    if path not in LOCAL:
        raise ValueError(f"no local copy is known for Hub dataset {path!r}; known: {sorted(LOCAL)}")
    from golinear.models.util.data_dir import missing_data
    rels = [f.format(name=name) for f in LOCAL[path][1]]
    for rel in rels:
        if not (Path(data_dir) / rel).is_file():
            raise missing_data(data_dir, rel, f"lm-eval task {cfg['task']!r}")
    return [Path(data_dir) / rel for rel in rels]


def load(builtin: str, golinear_data_dir: str | None = None, **_metadata) -> datasets.DatasetDict:
    """The DatasetDict that lm-eval's built-in task `builtin` would download, from local files or the Hub."""
    cfg = builtin_config(builtin)
    data_dir = resolve_data_dir(golinear_data_dir)
    if data_dir == HUB:
        return datasets.load_dataset(path=cfg["dataset_path"], name=cfg.get("dataset_name"),
                                     **(cfg.get("dataset_kwargs") or {}))
    local_files(builtin, data_dir)  # clear error before reading
    reader = LOCAL[cfg["dataset_path"]][0]
    out = datasets.DatasetDict({split: datasets.Dataset.from_list(rows)
                                for split, rows in reader(Path(data_dir), cfg.get("dataset_name")).items()})
    # Splits the built-in task declares but the folder does not ship (e.g. ARC's train) are empty:
    # zero-shot never reads them, and a few-shot run fails instead of drawing shots from eval docs.
    features = next(iter(out.values())).features
    for key in ("training_split", "validation_split", "test_split", "fewshot_split"):
        if cfg.get(key) and cfg[key] not in out:
            out[cfg[key]] = datasets.Dataset.from_dict({k: [] for k in features}, features=features)
    return out
