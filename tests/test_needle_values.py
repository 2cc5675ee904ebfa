"""S-NIAH by needle value type (tasks.ruler's value-type variants) and the seeds kept apart from the evaluation:
RULER's formats for numbers, words and UUIDs, determinism, disjoint tuning and evaluation prompts, store keys of the
existing tasks unchanged."""
from __future__ import annotations

import re
import uuid

import pytest

import golinear.tasks.ruler as ruler
from golinear.models.backbones.backbone import load_tokenizer
from golinear.tasks.ruler.api import EVALUATION_SEED, TUNING_SEED, check_tuning_seed, resolve_task
from golinear.tasks.ruler.constants import NOISE

VALUE_TASKS = {"golinear_sniah_words_1": ("noise", "words"), "golinear_sniah_uuids_1": ("noise", "uuids"),
               "golinear_sniah_words_2": ("essay", "words")}
FORMATS = {"numbers": r"[1-9]\d{6}", "words": r"[a-z]+(?:-[a-z]+)+",
           "uuids": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"}


@pytest.fixture(scope="module", autouse=True)
def no_disk_cache():
    mp = pytest.MonkeyPatch()
    mp.setenv("GOLINEAR_RULER_CACHE", "0")  # every test generates for real
    yield
    mp.undo()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def build(tok, task, seed, n=3):
    return ruler.build_samples(task, tok, max_seq_length=1024, num_samples=n, seed=seed)


def test_every_sniah_task_has_a_value_type_and_the_variants_keep_rulers_recipe_otherwise():
    types = {t: resolve_task(t).value_type for t in ruler.SUITES["sniah"] + ruler.SUITES["sniah_values"]}
    assert types == {"golinear_sniah_1": "numbers", "golinear_sniah_2": "numbers", "golinear_sniah_3": "uuids",
                     "golinear_sniah_words_1": "words", "golinear_sniah_uuids_1": "uuids",
                     "golinear_sniah_words_2": "words"}
    for task, (haystack, value) in VALUE_TASKS.items():
        spec = resolve_task(task)
        base = resolve_task(spec.ruler)  # RULER's own task of that name is the original, listed first
        assert base.needle_value is None and spec.display.startswith(base.display)
        assert spec.recipe[1] == {**base.recipe[1], "type_needle_v": value}
        assert spec.recipe[1]["type_haystack"] == haystack
    assert resolve_task("niah_single_1").name == "golinear_sniah_1"  # RULER names still mean RULER's tasks


@pytest.mark.parametrize("task", list(VALUE_TASKS))
def test_value_formats_are_rulers(tok, task):
    haystack, value = VALUE_TASKS[task]
    singular = value[:-1]
    for row in build(tok, task, TUNING_SEED):
        (answer,) = row["outputs"]
        assert re.fullmatch(FORMATS[value], answer), answer
        if value == "uuids":
            assert str(uuid.UUID(answer)) == answer and uuid.UUID(answer).version == 4
        key = re.search(rf"special magic {singular} for (\S+) mentioned", row["answer_prefix"]).group(1)
        assert re.fullmatch(FORMATS["words"], key)  # RULER's keys are adjective-noun words in every S-NIAH
        needle = f"One of the special magic {value} for {key} is: {answer}."  # RULER's needle, plural kept
        assert row["needles"] == [needle] and row["prompt"].count(needle) == 1
        assert row["prompt"].startswith(f"A special magic {singular} is hidden within the following text. "
                                         f"Make sure to memorize it. I will quiz you about the {singular} afterwards.")
        assert (NOISE in row["prompt"]) == (haystack == "noise")
        assert ruler.score(task, [f" {answer}."], [row["outputs"]]) == 100.0


def test_generation_is_deterministic_and_tuning_prompts_are_disjoint_from_the_evaluations(tok):
    for task in VALUE_TASKS:
        first, again = build(tok, task, EVALUATION_SEED), build(tok, task, EVALUATION_SEED)
        assert [r["prompt"] for r in first] == [r["prompt"] for r in again]
        tuning = build(tok, task, TUNING_SEED)
        assert not {r["prompt"] for r in tuning} & {r["prompt"] for r in first}
        assert not {a for r in tuning for a in r["outputs"]} & {a for r in first for a in r["outputs"]}
    assert TUNING_SEED != EVALUATION_SEED == ruler.api.DEFAULT_SEED
    assert check_tuning_seed(TUNING_SEED, "--seed") == TUNING_SEED
    with pytest.raises(ValueError, match=r"^--seed 42 is the evaluation prompts' seed; fit and probe on another "
                                         r"seed \(default 1\)$"):
        check_tuning_seed(42, "--seed")


def test_existing_tasks_samples_and_store_keys_are_unchanged(tok):
    from golinear.bench.run.plan import resolve_suites, task_config_files
    essay_uuids = build(tok, "golinear_sniah_3", EVALUATION_SEED, n=2)
    numbers = build(tok, "golinear_sniah_1", EVALUATION_SEED, n=2)
    assert all(re.fullmatch(FORMATS["numbers"], r["outputs"][0]) for r in numbers)
    assert all(re.fullmatch(FORMATS["uuids"], r["outputs"][0]) for r in essay_uuids)
    for task in ruler.SUITES["sniah"]:  # a cell's key hashes its YAMLs: the new ones must not join the old tasks'
        assert [p.name for p in task_config_files(task)] == sorted([f"{task}.yaml", "_template_yaml"])
    entries = resolve_suites(["sniah_values"])
    assert [e.display for e in entries] == ["S-NIAH-1 words", "S-NIAH-1 UUIDs", "S-NIAH-2 words"]
    assert [e.data for e in entries] == [(), (), ("paul_graham_essays",)]
    for task in VALUE_TASKS:
        text = (ruler.api.__file__.rsplit("/", 1)[0] + f"/{task}.yaml")
        assert f"task: {task}\n" in open(text).read() and f"hooks.{task}\n" in open(text).read()
