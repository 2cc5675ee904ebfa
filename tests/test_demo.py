"""`golinear demo`'s plan (bench/demo.py): the quick subset of every suite, and its input checks."""
from __future__ import annotations

import argparse

import pytest

from golinear.bench import cli_args, demo
from golinear.bench.cli import main as cli


def _args(**kw):
    p = argparse.ArgumentParser()
    cli_args.demo(p)
    args = p.parse_args([])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


def test_default_plan_covers_every_suite_and_skips_only_what_cannot_fit(capsys):
    plan = demo.jobs(_args(), ["cr", "mmlu", "lambada", "sniah", "ruler"])
    assert [suites for _, suites, _ in plan] == [["cr", "lambada"], ["mmlu"], ["sniah", "ruler"]]
    standard, mmlu, long = (kw for _, _, kw in plan)
    assert standard == {"limit": 4}
    assert mmlu["limit"] == 1 and mmlu["extra_suites"]["mmlu"][0]["task"] == "golinear_mmlu_social_sciences"
    assert mmlu["batch_size"] == demo.MMLU_BATCH
    assert long["context_length"] == 1024 and long["num_samples"] == long["limit"] == 1
    from golinear.tasks.ruler import SUITES
    assert long["extra_suites"]["sniah"] == SUITES["sniah"]
    skipped = {"golinear_ruler_hqa", "golinear_ruler_sqa"}  # their documents need 2K tokens with SmolLM2
    assert long["extra_suites"]["ruler"] == [t for t in SUITES["ruler"] if t not in skipped]
    out = capsys.readouterr().out
    assert all(f"skipped {t}: the 1024-token context is too short for any of its samples" in out for t in skipped)


def test_at_2k_every_long_task_runs(capsys):
    from golinear.tasks.ruler import SUITES
    (_, _, long), = demo.jobs(_args(context_length=2048), ["ruler"])
    assert long["extra_suites"] == {"ruler": SUITES["ruler"]} and "skipped" not in capsys.readouterr().out


def test_mmlu_choice_names_a_registered_group_shown_as_mmlu():
    """...in the demo's task manager, which indexes golinear's tasks only."""
    from golinear.bench.run.runner import default_data_dir, resolve_suites
    from golinear.tasks.standard import task_manager
    known = set(task_manager(default_data_dir(), include_defaults=False).all_tasks)
    assert "golinear_mmlu" in known and "hellaswag" not in known  # lm-eval's own tasks are not indexed
    for category in demo.MMLU_CATEGORIES:
        entry = demo.mmlu_entry(category)
        assert entry["task"] in known
        (resolved,) = resolve_suites(["mmlu"], {"mmlu": [entry]})
        assert (resolved.display, resolved.num_fewshot, resolved.suite) == ("MMLU", 5, "mmlu")


@pytest.mark.parametrize("argv, needle", [
    (["--context-length", "100"], "--context-length 100"),
    (["--suites", "cr,foo"], "--suites 'cr,foo'"),
    (["--limit", "0"], "--limit 0"),
    (["--mmlu", "law"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    try:
        rc = cli(["demo", "--skip-eval", *argv])
    except SystemExit as e:  # argparse's own choices check
        rc = e.code
    assert rc == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_bad_checkpoint_is_refused_before_any_weights_load(tmp_path, monkeypatch, capsys, damage):
    import shutil
    from pathlib import Path
    import golinear.models.backbones.backbone
    monkeypatch.setattr(golinear.models.backbones.backbone, "load_backbone", lambda *a, **k: pytest.fail("weights loaded"))
    folder = tmp_path / "ckpt"
    if damage == "truncated":
        shipped = Path(demo.__file__).resolve().parent.parent / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"
        shutil.copytree(shipped, folder)
        weights = folder / "new_params.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    assert cli(["demo", "--checkpoint", str(folder), "--store", str(tmp_path / "s"), "--out", str(tmp_path / "o")]) == 2
    assert str(folder) in capsys.readouterr().err
    assert not (tmp_path / "s").exists() and not (tmp_path / "o").exists()


@pytest.fixture
def no_data_folder(monkeypatch, tmp_path):
    from golinear.models.util import data_dir
    monkeypatch.setattr(data_dir, "DEFAULT_DATA_DIR", tmp_path / "no-such-folder")
    monkeypatch.delenv("GOLINEAR_DATA", raising=False)


def test_without_a_data_folder_the_long_suites_are_skipped_with_the_way_to_get_them(no_data_folder, capsys):
    plan = demo.jobs(_args(), ["cr", "lambada", "sniah", "ruler"])
    assert [suites for _, suites, _ in plan] == [["cr", "lambada"]]
    assert "skipped sniah, ruler: their haystacks and questions are read from a data folder (build one with " \
           "`golinear data fetch --out DIR`" in capsys.readouterr().out


@pytest.mark.slow
def test_without_a_data_folder_the_passage_is_the_shipped_one(no_data_folder):
    from golinear.models.load import load_model
    _, tok, _ = load_model()
    ids, name = demo.heldout_passage(tok, 512)
    assert name == demo.SHIPPED_NAME and ids.shape == (1, 512)
    assert tok.decode(ids[0, :12]).startswith("The Book of Ruth")
    with pytest.raises(ValueError, match=r"--tokens 100000: the passage 'Ruth 1-4.*' has \d+ tokens"):
        demo.heldout_passage(tok, 100000)
