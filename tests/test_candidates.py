"""scripts/study/candidates.py: the recipe candidates' table from training records and validation cells written as
`golinear train` and `golinear run` write them: each row's held-out CE, validation accuracy with its interval, the
paired difference to the default recipe, and the recipes not trained yet."""
import json
from pathlib import Path

from _scripts import load_script


def write_run(ckpts: Path, name: str, ce: float, seq_len: int = 4096, finished: bool = True):
    (ckpts / name).mkdir(parents=True)
    (ckpts / name / "train_config.json").write_text(json.dumps({
        "summary": {"finished": finished, "tokens": 10_240_000, "train_wall_s": 150.0},
        "environment": {"gpu": "H200"}, "train": {"seq_len": seq_len},
        "results": {"heldout_loss_full_attention": 3.47, "heldout_loss_trained": ce}}))


def write_cell(store: Path, name: str, hits: list[int], ckpt: str | None, gpu: str | None = None):
    n = len(hits)
    acc = sum(hits) / n
    cell = {"task": "golinear_books_lastword", "n": n,
            "model": {"label": name, "full_attention": ckpt is None, "info": {"checkpoint": ckpt}},
            "metrics": {"acc,none": {"value": acc, "stderr": (acc * (1 - acc) / (n - 1)) ** 0.5},
                        "perplexity,none": {"value": 50.0, "stderr": 1.0}},
            "per_sample": {f"golinear_books_lastword/{i}/x": float(h) for i, h in enumerate(hits)},
            "provenance": {"hardware": {"device": "cuda:0", "gpu": gpu} if gpu else {"device": "cpu"}}}
    (store / "cells" / name).mkdir(parents=True)
    (store / "cells" / name / "c.json").write_text(json.dumps(cell))


def test_rows_and_render(tmp_path):
    cand = load_script("study/candidates.py")
    ckpts, store = tmp_path / "ckpt", tmp_path / "store"
    write_run(ckpts, "gdn-w56-s8-sc", 3.567)
    write_run(ckpts, "gdn-w56-s8-t1024", 3.732, seq_len=1024)
    write_run(ckpts, "gdn-w56-s8-lora", 3.5, finished=False)  # stopped early: not a candidate's result
    default = [1, 0] * 100
    write_cell(store, "full", [1] * 150 + [0] * 50, None)  # 75 % where the default recipe has 50 %
    write_cell(store, "gdn-w56-s8-sc", default, str(ckpts / "gdn-w56-s8-sc"))
    write_cell(store, "gdn-w56-s8-t1024", default, str(ckpts / "gdn-w56-s8-t1024"))
    table = {r["candidate"]: r for r in cand.rows(store, ckpts, r"^gdn-w56-s8-(sc|t1024|lora)$")}
    assert list(table)[0] == "full" and table["full"]["heldout_ce"] == 3.47
    assert table["full"]["vs_default"]["lo"] > 0  # the paired interval excludes 0
    assert table["gdn-w56-s8-t1024"]["vs_default"]["diff"] == 0 and table["gdn-w56-s8-sc"]["vs_default"] is None
    assert not table["gdn-w56-s8-lora"]["trained"]
    text = cand.render(list(table.values()))
    assert "| gdn-w56-s8-lora | `--mechanism gdn --window 56 --sinks 8 --no-short-conv --lora` | not trained yet |" in text
    assert "3.732 (on 1024-token sequences)" in text and "| 50.0 [43.1, 56.9] |" in text
    assert "| +25.0 [" in text


def test_a_missing_store_is_one_line(tmp_path, capsys):
    assert load_script("study/candidates.py").main(["--store", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_candidate_is_paired_with_the_default_of_its_own_device(tmp_path):
    """Cells from two stores (a CPU's and a GPU's): a row per device, each paired only within its device."""
    cand = load_script("study/candidates.py")
    ckpts, cpu, gpu = tmp_path / "ckpt", tmp_path / "cpu", tmp_path / "gpu"
    for name in ("gdn-w56-s8-sc", "gdn-w56-s8-sc-onorm"):
        write_run(ckpts, name, 3.5)
    write_cell(cpu, "gdn-w56-s8-sc", [1, 0] * 100, str(ckpts / "gdn-w56-s8-sc"))
    write_cell(cpu, "gdn-w56-s8-sc-onorm", [1, 1] * 100, str(ckpts / "gdn-w56-s8-sc-onorm"))
    write_cell(gpu, "gdn-w56-s8-sc-onorm", [0, 0] * 100, str(ckpts / "gdn-w56-s8-sc-onorm"), gpu="Some GPU")
    table = cand.rows([cpu, gpu], ckpts, r"^gdn-w56-s8-sc(-onorm)?$")
    onorm = {r["val_device"]: r for r in table if r["candidate"] == "gdn-w56-s8-sc-onorm"}
    assert set(onorm) == {"cpu", "Some GPU"}
    assert onorm["cpu"]["vs_default"]["diff"] == 50.0
    assert onorm["Some GPU"]["vs_default"] is None  # no default recipe evaluated on that GPU: no mixed pairing
    write_cell(gpu, "gdn-w56-s8-sc", [1, 0] * 100, str(ckpts / "gdn-w56-s8-sc"), gpu="Some GPU")
    table = cand.rows([cpu, gpu], ckpts, r"^gdn-w56-s8-sc(-onorm)?$")
    onorm = {r["val_device"]: r for r in table if r["candidate"] == "gdn-w56-s8-sc-onorm"}
    assert onorm["Some GPU"]["vs_default"]["diff"] == -50.0
    assert "| Some GPU | 0.0 [" in cand.render(table)
