"""The golinear_* tasks give the documents, prompts and targets lm-eval's own built-in tasks give.

The Hub is unreachable here, so the built-in side is lm-eval's installed task config (its YAML,
templates and process_docs) run over a DatasetDict that this test builds from the local files in the
Hub schema (written independently of tasks/standard/local_data.py), and compared with our tasks
loaded through tasks.standard.task_manager().
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import datasets  # noqa: E402

import golinear.tasks.standard as ts  # noqa: E402
from golinear.tasks.standard import generate_mmlu, local_data  # noqa: E402

DATA = Path(local_data.resolve_data_dir(None)) if local_data.resolve_data_dir(None) != "hub" else None
needs_data = pytest.mark.skipif(DATA is None, reason="no local data folder (../shared/data or $GOLINEAR_DATA)")
BUILTIN = local_data.builtin_tasks_dir()
CR_AND_LAMBADA = [t for s in ("cr", "lambada") for t in ts.suite_tasks(s)]
DATA_KEYS = {"task", "tag", "custom_dataset", "dataset_kwargs"}  # what our YAMLs may change


# ------------------------------------------------------------------ independent Hub-schema reader
def _jsonl(rel):
    path = DATA / rel
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        return [json.loads(line) for line in f]


def hub_schema(builtin_yaml: str) -> datasets.DatasetDict:
    """The Hub copy's eval split (plus MMLU's dev) as the dataset cards describe it."""
    cfg = local_data.builtin_config(builtin_yaml)
    path, name = cfg["dataset_path"], cfg.get("dataset_name")
    if path == "baber/piqa":
        labels = (DATA / "piqa/valid-labels.lst").read_text().splitlines()
        rows = {"validation": [dict(d, label=int(y)) for d, y in zip(_jsonl("piqa/valid.jsonl"), labels)]}
    elif path == "allenai/ai2_arc":
        rows = {"test": _jsonl(f"arc/{name}-test.jsonl")}
    elif path == "Rowan/hellaswag":
        rows = {"validation": _jsonl("hellaswag/hellaswag_validation.jsonl.gz")}
    elif path == "allenai/winogrande":
        rows = {"validation": [{k: d[k] for k in ("sentence", "option1", "option2", "answer")}
                               for d in _jsonl("winogrande/dev.jsonl")]}
    elif path == "EleutherAI/lambada_openai":
        rows = {"test": _jsonl("lambada_openai/lambada_test.jsonl")}
    elif path == "cais/mmlu":
        rows = {split: [d for d in _jsonl(f"mmlu/mmlu_{split}.jsonl.gz") if d["subject"] == name]
                for split in ("test", "dev")}
    else:
        raise AssertionError(path)
    dd = datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in rows.items()})
    for key in ("training_split", "validation_split", "test_split"):  # splits the folder does not ship
        if cfg.get(key) and cfg[key] not in dd:
            dd[cfg[key]] = datasets.Dataset.from_dict({c: [] for c in dd[next(iter(rows))].features},
                                                      features=dd[next(iter(rows))].features)
    return dd


def builtin_task(builtin_yaml: str, num_fewshot: int = 0):
    """lm-eval's own built-in task, fed the Hub-schema copy instead of downloading."""
    from lm_eval.api.task import ConfigurableTask
    cfg = dict(local_data.builtin_config(builtin_yaml))
    data = hub_schema(builtin_yaml)
    cfg["custom_dataset"] = lambda **_: data
    cfg.pop("tag", None)
    task = ConfigurableTask(config=cfg)
    task.set_config("num_fewshot", num_fewshot)
    task.set_fewshot_seed(1234)
    return task


@pytest.fixture(scope="module")
def manager():
    return ts.task_manager(DATA)


@pytest.fixture(scope="module")
def our_tasks(manager):
    """Our CR + LAMBADA tasks and one MMLU subject, loaded once (HellaSwag's process_docs takes seconds)."""
    return manager.load(CR_AND_LAMBADA + ["golinear_mmlu_abstract_algebra"])["tasks"]


def _fn_id(v):
    return f"{v.__module__}.{v.__qualname__}" if callable(v) else v


def _comparable(cfg: dict) -> dict:
    return {k: _fn_id(v) for k, v in cfg.items() if k not in DATA_KEYS}


# ------------------------------------------------------------------ configs mirror the built-ins
def our_yamls():
    here = Path(ts.__file__).parent
    out = {p.stem: p for p in here.glob("golinear_*.yaml") if p.stem != "golinear_books_lastword"}  # ours alone
    out |= {p.stem: p for p in (here / "mmlu").glob("golinear_mmlu_*.yaml")}
    return out


def test_configs_mirror_builtins_except_data_source():
    from lm_eval.tasks._yaml_loader import load_yaml
    yamls = our_yamls()
    assert len(yamls) == 6 + 57
    for name, path in yamls.items():
        ours = load_yaml(path, resolve_func=True)
        builtin_rel = ours["dataset_kwargs"]["builtin"]
        theirs = local_data.builtin_config(builtin_rel)
        assert ours["task"] == "golinear_" + theirs["task"], name
        assert ours["custom_dataset"].__name__ == "load"
        if theirs["task"].startswith("mmlu_"):  # 5-shot is the suite's setting, not lm-eval's default
            assert ours.pop("num_fewshot") == 5
            assert ours.pop("tag") == "golinear_" + theirs["tag"]
        assert _comparable(ours) == _comparable(theirs), name


def test_mmlu_groups_mirror_builtins():
    from lm_eval.tasks._yaml_loader import load_yaml
    for path in sorted((Path(ts.__file__).parent / "mmlu").glob("_golinear_mmlu*.yaml")):
        ours = load_yaml(path)
        theirs = load_yaml(BUILTIN / "mmlu/default" / path.name[len("_golinear"):])
        assert ours["group"] == "golinear_" + theirs["group"]
        assert ours["task"] == ["golinear_" + t for t in theirs["task"]]
        assert {k: v for k, v in ours.items() if k not in ("group", "task")} == \
               {k: v for k, v in theirs.items() if k not in ("group", "task")}


def test_generated_mmlu_files_are_current():
    here = Path(ts.__file__).parent / "mmlu"
    rendered = generate_mmlu.render()
    assert sorted(rendered) == sorted(p.name for p in here.glob("*.yaml"))
    for name, text in rendered.items():
        assert (here / name).read_text() == text, f"{name} is stale: run python -m golinear.tasks.standard.generate_mmlu"


# ------------------------------------------------------------------ same documents, prompts, targets
@needs_data
@pytest.mark.parametrize("task_name", CR_AND_LAMBADA)
@pytest.mark.slow
def test_local_docs_prompts_targets_equal_builtin(our_tasks, task_name):
    builtin_yaml = ts.builtin_yamls(task_name)[0]
    ours = our_tasks[task_name]
    theirs = builtin_task(builtin_yaml)
    a, b = list(ours.eval_docs), list(theirs.eval_docs)
    assert len(a) == len(b) > 1000
    assert a == b
    mc = ours.config.output_type == "multiple_choice"
    for doc in a[:: max(1, len(a) // 250)]:  # all documents are equal (above); render ~250 of them
        assert ours.doc_to_text(doc) == theirs.doc_to_text(doc)
        assert ours.doc_to_target(doc) == theirs.doc_to_target(doc)
        if mc:
            assert ours.doc_to_choice(doc) == theirs.doc_to_choice(doc)
    for t in (ours, theirs):
        t.build_all_requests(limit=20)
    assert [(i.doc_id, i.idx, i.args) for i in ours.instances] == \
           [(i.doc_id, i.idx, i.args) for i in theirs.instances]


@needs_data
@pytest.mark.slow
def test_local_mmlu_equals_builtin_5shot(manager):
    loaded = manager.load(["golinear_mmlu"])
    tasks = loaded["tasks"]
    assert len(tasks) == 57 and "golinear_mmlu_stem" in loaded["groups"]
    assert sum(len(t.eval_docs) for t in tasks.values()) == 14042
    for name in ("golinear_mmlu_abstract_algebra", "golinear_mmlu_world_religions", "golinear_mmlu_virology"):
        ours = tasks[name]
        ours.set_fewshot_seed(1234)
        theirs = builtin_task(f"mmlu/default/{name[len('golinear_'):]}.yaml", num_fewshot=5)
        assert ours.config.num_fewshot == 5
        assert list(ours.eval_docs) == list(theirs.eval_docs)
        assert list(ours.fewshot_docs()) == list(theirs.fewshot_docs())
        for t in (ours, theirs):
            t.build_all_requests(limit=4)
        assert [i.args for i in ours.instances] == [i.args for i in theirs.instances]
        assert ours.instances[0].args[0].startswith(ours.config.description)
        assert ours.instances[0].args[0].count("\nAnswer:") == 6  # five shots + the question


# ------------------------------------------------------------------ hand-checked documents
@needs_data
@pytest.mark.slow
def test_known_documents(our_tasks):
    t = our_tasks
    first = {n: t[n].eval_docs[0] for n in t}
    piqa = t["golinear_piqa"]
    assert piqa.doc_to_text(first["golinear_piqa"]) == \
        "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    assert piqa.doc_to_target(first["golinear_piqa"]) == 0 and len(piqa.eval_docs) == 1838
    arc = t["golinear_arc_easy"]
    assert first["golinear_arc_easy"]["id"] == "Mercury_417466"
    assert arc.doc_to_text(first["golinear_arc_easy"]) == ("Question: Which statement best explains why "
                                                          "photosynthesis is the foundation of most food webs?\nAnswer:")
    assert arc.doc_to_target(first["golinear_arc_easy"]) == 0 and len(arc.eval_docs) == 2376
    assert first["golinear_arc_challenge"]["id"] == "Mercury_7175875"
    assert t["golinear_arc_challenge"].doc_to_target(first["golinear_arc_challenge"]) == 2
    hs = t["golinear_hellaswag"]
    assert hs.doc_to_text(first["golinear_hellaswag"]) == "Roof shingle removal: A man is sitting on a roof. He"
    assert hs.doc_to_target(first["golinear_hellaswag"]) == 3 and len(hs.eval_docs) == 10042
    wg = t["golinear_winogrande"]
    doc = first["golinear_winogrande"]
    assert doc["sentence"] == "Sarah was a much better surgeon than Maria so _ always got the easier cases."
    assert wg.doc_to_text(doc) == 1 and doc["answer"] == "2" and len(wg.eval_docs) == 1267
    lam = t["golinear_lambada_openai"]
    assert lam.doc_to_text(first["golinear_lambada_openai"]).startswith("In my palm is a clear stone")
    assert lam.doc_to_target(first["golinear_lambada_openai"]) == " signs" and len(lam.eval_docs) == 5153
    mmlu = t["golinear_mmlu_abstract_algebra"]
    doc = first["golinear_mmlu_abstract_algebra"]
    assert mmlu.doc_to_text(doc) == ("Find the degree for the given field extension Q(sqrt(2), sqrt(3), "
                                     "sqrt(18)) over Q.\nA. 0\nB. 4\nC. 2\nD. 6\nAnswer:")
    assert mmlu.doc_to_target(doc) == 1
    assert mmlu.fewshot_docs()[0]["question"] == "Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field."


# ------------------------------------------------------------------ Hub fallback and bad input
def test_hub_fallback_makes_the_builtin_call(monkeypatch):
    """Without a folder, the loader calls load_dataset exactly as lm-eval's built-in download() does."""
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda **kw: calls.append(kw) or "dataset")
    for entry in [e for s in ts.SUITES.values() for e in s if e["builtin_yaml"]] + \
                 [{"builtin_yaml": "mmlu/default/mmlu_anatomy.yaml"}]:
        cfg = local_data.builtin_config(entry["builtin_yaml"])
        assert local_data.load(entry["builtin_yaml"], golinear_data_dir="hub") == "dataset"
        assert calls[-1] == {"path": cfg["dataset_path"], "name": cfg.get("dataset_name"),
                             **(cfg.get("dataset_kwargs") or {})}
    assert {c["path"] for c in calls} == {"baber/piqa", "allenai/ai2_arc", "Rowan/hellaswag",
                                           "allenai/winogrande", "EleutherAI/lambada_openai", "cais/mmlu"}


def test_hub_fallback_offline_names_the_hub_dataset():
    with pytest.raises(Exception, match="baber/piqa"):
        local_data.load("piqa/piqa.yaml", golinear_data_dir="hub")


def test_data_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("GOLINEAR_DATA", raising=False)
    assert ts.resolve_data_dir("hub") == "hub"
    assert ts.resolve_data_dir(tmp_path) == str(tmp_path.resolve())
    monkeypatch.setenv("GOLINEAR_DATA", str(tmp_path))
    assert ts.resolve_data_dir(None) == str(tmp_path.resolve())
    with pytest.raises(FileNotFoundError, match="no_such_folder"):
        ts.resolve_data_dir(tmp_path / "no_such_folder")
    monkeypatch.setenv("GOLINEAR_DATA", str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match="gone"):
        ts.task_manager()  # before any indexing


@needs_data
def test_missing_data_file_is_named_before_loading(tmp_path):
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa/valid.jsonl").write_text((DATA / "piqa/valid.jsonl").read_text())
    with pytest.raises(FileNotFoundError, match="valid-labels.lst"):
        ts.check_data(["golinear_piqa"], tmp_path)
    with pytest.raises(FileNotFoundError, match="mmlu_test.jsonl.gz"):
        ts.check_data(["golinear_mmlu"], tmp_path)
    with pytest.raises(FileNotFoundError, match="valid-labels.lst"):
        local_data.load("piqa/piqa.yaml", golinear_data_dir=str(tmp_path))
    assert ts.check_data(ts.suite_tasks("cr"), DATA) == str(DATA)


@pytest.mark.slow
def test_unknown_names(manager):
    with pytest.raises(ValueError, match="unknown suite 'nope'"):
        ts.suite_tasks("nope")
    with pytest.raises(ValueError, match="golinear_piqq.*golinear_piqa"):
        ts.validate_tasks(["golinear_piqa", "golinear_piqq"], manager)
    assert ts.validate_tasks(["golinear_mmlu", "golinear_piqa", "piqa"], manager)


@pytest.mark.slow
def test_suites_shape():
    assert [e["display"] for e in ts.SUITES["cr"]] == ["PIQA", "ARC-e", "ARC-c", "HellaSwag", "WinoGrande"]
    assert [e["metric"] for e in ts.SUITES["cr"]] == ["acc", "acc", "acc_norm", "acc_norm", "acc"]
    assert ts.SUITES["mmlu"][0]["num_fewshot"] == 5
    assert {e["metric"] for e in ts.SUITES["lambada"]} == {"acc", "perplexity"}
    assert ts.task_manager() is ts.task_manager()  # built once


@needs_data
@pytest.mark.slow
def test_templates_compiled_once_render_the_same_prompts(manager, monkeypatch):
    """tasks.standard compiles each Jinja template once (lm-eval recompiles it per document); the requests
    built that way equal those built with lm-eval's own apply_template."""
    from lm_eval import utils
    assert getattr(utils.apply_template, "golinear_cached", False)  # installed by task_manager()
    built = {}
    for mode in ("cached", "lm-eval"):
        if mode == "lm-eval":
            monkeypatch.setattr(utils, "apply_template", utils.apply_template.uncached)
        task = manager.load(["golinear_mmlu_virology"])["tasks"]["golinear_mmlu_virology"]
        task.set_fewshot_seed(1234)
        task.build_all_requests(limit=6)
        built[mode] = [(i.doc_id, i.idx, i.args) for i in task.instances]
    assert built["cached"] == built["lm-eval"] and len(built["cached"]) == 24
