"""A data folder with only some of its folders fetched (`golinear data fetch --folders arc,hellaswag,mmlu`), or none
at all without the Hub: every error names what is missing and the command that fetches it, before any model loads;
the demo's perplexity passage falls back to the shipped one when the books corpus is absent."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import golinear.models.checkpoint  # noqa: F401 - imported before any test patches the weight loader they take
import golinear.models.load  # noqa: F401
from golinear.bench.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "piqa").is_dir(), reason="needs the shared data folder")
FETCHED = ("arc", "hellaswag", "mmlu")


@pytest.fixture
def partial(tmp_path):
    """A data folder holding only arc, hellaswag and mmlu (links into the shared folder)."""
    folder = tmp_path / "data"
    folder.mkdir()
    for name in FETCHED:
        (folder / name).symlink_to(DATA / name, target_is_directory=True)
    return folder


@pytest.fixture
def no_weights(monkeypatch):
    import golinear.models.backbones.backbone as backbone
    monkeypatch.setattr(backbone, "load_backbone", lambda *a, **k: pytest.fail("weights loaded"))


@needs_data
@pytest.mark.parametrize("argv, folder", [
    (["run", "--models", "full", "--suites", "cr"], "piqa"),
    (["run", "--models", "full", "--suites", "lambada"], "lambada_openai"),
    (["run", "--models", "full", "--suites", "sniah"], "paul_graham_essays"),
    (["run", "--models", "full", "--suites", "ruler", "--tasks", "HQA"], "hotpotqa_sample100"),
    (["demo"], None),
])
def test_every_error_names_the_missing_folder_and_its_fetch_command(partial, tmp_path, no_weights, capsys, argv,
                                                                     folder):
    rc = cli([*argv, "--data-dir", str(partial), "--store", str(tmp_path / "store")]
             + (["--out", str(tmp_path / "out")] if argv == ["demo"] else []))
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    folders = err.split(f"`golinear data fetch --out {partial} --folders ")[1].split("`")[0].split(",")
    assert (folder is None or folder in folders) and not set(folders) & set(FETCHED), err
    assert not (tmp_path / "store").exists()


@needs_data
def test_everything_a_run_lacks_is_named_in_one_line_with_one_fetch_command(partial, tmp_path, no_weights, capsys):
    rc = cli(["run", "--models", "full", "--suites", "cr,lambada,sniah", "--data-dir", str(partial),
              "--store", str(tmp_path / "store")])
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    for part in ("paul_graham_essays (task S-NIAH-2, task S-NIAH-3)", "piqa/valid.jsonl", "winogrande/dev.jsonl",
                 "lambada_openai/lambada_test.jsonl"):
        assert part in err, err
    assert err.endswith(f"fetch them with `golinear data fetch --out {partial} --folders "
                        "paul_graham_essays,piqa,winogrande,lambada_openai`"), err


@needs_data
def test_the_books_corpus_error_names_its_fetch_command(partial):
    from golinear.models.training import data
    with pytest.raises(FileNotFoundError, match=r"--folders corpus_classic_books`"):
        data.book_files(partial)


@needs_data
def test_the_demo_without_the_books_corpus_reads_the_shipped_passage(partial, capsys):
    from golinear.bench import demo
    from golinear.models.backbones.backbone import load_tokenizer
    ids, name = demo.heldout_passage(load_tokenizer(), 64, partial)
    assert name == demo.SHIPPED_NAME and ids.shape == (1, 64)
    assert "--folders corpus_classic_books`" in capsys.readouterr().out


def test_without_data_or_hub_the_demo_answers_in_one_line_naming_both_ways_on(tmp_path):
    """A fresh clone (no ../shared/data), no GOLINEAR_DATA, the Hub switched off: `golinear demo` as `make demo`
    runs it."""
    clone = tmp_path / "clone"
    clone.mkdir()
    env = {k: v for k, v in __import__("os").environ.items() if k != "GOLINEAR_DATA"}
    env["HF_HUB_OFFLINE"] = "1"
    code = ("import sys; from golinear.models.util import data_dir; data_dir.DEFAULT_DATA_DIR = data_dir.Path(sys.argv[1]); "
            "from golinear.bench.cli import main; sys.exit(main(['demo', '--store', sys.argv[2], '--out', sys.argv[3]]))")
    proc = subprocess.run([sys.executable, "-c", code, str(clone / "no-data"), str(clone / "s"), str(clone / "o")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=clone)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "`golinear data fetch" in line and "`golinear demo --skip-eval`" in line and "--suites" not in line
    assert not (clone / "s").exists()


def test_data_fetch_says_already_present_only_when_there_were_others(tmp_path):
    """Two fetches of one folder from a local mirror (file://): the first writes all its files and names no
    others, the second writes none."""
    from golinear.bench.offline import data_fetch as F
    piqa = [f for f in F.DATA_FILES if f.folder == "piqa"]
    if not all((DATA / f.path).is_file() for f in piqa):
        pytest.skip("needs the shared data folder")
    mirror = tmp_path / "mirror"
    for f in piqa:
        (mirror / f.source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DATA / f.path, mirror / f.source)

    def fetch():
        return subprocess.run([sys.executable, "-m", "golinear.bench.cli", "data", "fetch", "--out",
                               str(tmp_path / "data"), "--folders", "piqa", "--mirror", mirror.as_uri(), "--quiet"],
                              capture_output=True, text=True, timeout=300)
    first, again = fetch(), fetch()
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.startswith(f"{len(piqa)} file(s) written;") and "already present" not in first.stdout
    assert again.stdout.startswith(f"0 file(s) written, {len(piqa)} already present;"), again.stdout


def test_the_default_data_folder_is_beside_the_repository():
    """`../shared/data` from the repository root, wherever the module that names it lives in the tree."""
    from golinear.models.util import data_dir
    root = Path(__file__).resolve().parents[1]
    assert data_dir.DEFAULT_DATA_DIR == root.parent / "shared" / "data"
