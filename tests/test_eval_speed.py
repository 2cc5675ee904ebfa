"""scripts/gpu/eval_speed.py on cells written as `golinear run` writes them: samples/s per row over all its cells and
without the cell that paid the compile, the kinds of row, and the matrix's minutes at the slowest row of each kind."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("eval_speed", ROOT / "scripts" / "gpu" / "eval_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_cell(store: Path, name: str, label: str, args: dict, n: int, wall: float, full: bool = False):
    cell = {"suite": "sniah", "n": n, "wall_time_s": wall, "key": {"config": {"context_length": 4096}},
            "model": {"label": label, "args": args, "full_attention": full},
            "provenance": {"hardware": {"device": "cuda:0", "gpu": "H100", "dtype": "torch.bfloat16",
                                        "generation": "batched"}, "git": {"commit": "abcdef0123", "dirty": full}}}
    path = store / "cells" / label.replace(" ", "_") / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cell))


def test_rows_kinds_and_the_matrix_estimate(tmp_path):
    es = load_script()
    store = tmp_path / "store"
    for task, wall in (("s1", 60.0), ("s2", 10.0), ("s3", 10.0)):  # the first cell paid 50 s of compile
        write_cell(store, task, "gdn-w56-s8-sc", {"checkpoint": "gdn-w56-s8-sc"}, 500, wall)
    write_cell(store, "s1", "snapkv (kvpress) @1024", {"press": "snapkv", "kv_budget": 1024}, 500, 100.0)
    write_cell(store, "s1", "full", {}, 500, 20.0, full=True)
    table = {r["row"]: r for r in es.rows([store])}
    gdn = table["gdn-w56-s8-sc"]
    assert gdn["kind"] == "linearized" and gdn["cells"] == 3 and gdn["samples"] == 1500
    assert abs(gdn["per_s"] - 1500 / 80) < 1e-9 and abs(gdn["later_per_s"] - 50.0) < 1e-9
    assert table["snapkv (kvpress) @1024"]["kind"] == "press (single pass)"
    assert table["full"]["kind"] == "full attention" and table["full"]["later_per_s"] is None
    text = es.render(list(table.values()))
    assert ("| gdn-w56-s8-sc | linearized | H100 | bfloat16 | batched | 4096 | abcdef0 | 3 | 1500 | 80.0 | 18.8 | 60.0 "
            "| 50.0 | 60 | no |") in text
    assert ("| full | full attention | H100 | bfloat16 | batched | 4096 | abcdef0+ | 1 | 500 | 20.0 | 25.0 | 20.0 | - | 25 "
            "| yes |") in text
    assert f"| press (single pass) | {es.MATRIX['press (single pass)']} | 5.0 |" in text
    assert f"| retention slots | {es.MATRIX['retention slots']} | not measured | - |" in text


def test_the_matrix_counts_every_row_of_the_kv_compression_script_once():
    """MATRIX's prompt-answers are the rows kv_compression.sh's sniah and sniah512 stages evaluate, by kind."""
    es = load_script()
    assert sum(es.MATRIX.values()) == (1 + 13 * 2 + 3 + 2 * 4 + 3) * 1500  # full, 13 presses at 256/1024, 3 at 512,
    assert es.MATRIX["press (KVzip)"] == 3 * 1500  # 4 linearized rows at 256/1024 and the window + 2 at 512


def test_parity_counts_differing_samples_and_names_an_uninformative_row(tmp_path):
    spec = importlib.util.spec_from_file_location("parity", ROOT / "scripts" / "gpu" / "parity.py")
    parity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parity)
    for store, gen, flip in (("fast", "batched", 100.0), ("ref", "hf", 0.0)):
        write_cell(tmp_path / store, "s1", "full", {}, 3, 1.0, full=True)
        write_cell(tmp_path / store, "s1", "gdn-w56-s8-sc", {}, 3, 1.0)
        for label, scores in (("full", [100.0, flip, 100.0]), ("gdn-w56-s8-sc", [0.0, 0.0, 0.0])):
            path = tmp_path / store / "cells" / label / "s1.json"
            cell = json.loads(path.read_text())
            cell["provenance"]["hardware"]["generation"] = gen
            cell.update(task="golinear_sniah_1", value=sum(scores) / 3,
                        per_sample={f"golinear_sniah_1/{i}/h": s for i, s in enumerate(scores)})
            path.write_text(json.dumps(cell))
    df = parity.compare(parity.cells(tmp_path / "fast"), parity.cells(tmp_path / "ref")).set_index("row")
    assert df.loc["full", "differ"] == 1 and df.loc["full", "differing_samples"] == "1"
    assert df.loc["full", "note"] == "" and df.loc["full", "reference"] == "hf"
    assert df.loc["gdn-w56-s8-sc", "differ"] == 0
    assert df.loc["gdn-w56-s8-sc", "note"] == "every sample scores 0 on both paths: scores cannot show a flip"


def test_one_runs_cells_are_picked_out_of_a_merged_store_by_commit(tmp_path):
    es = load_script()
    store = tmp_path / "store"
    write_cell(store, "s1", "full", {}, 500, 20.0, full=True)
    old = store / "cells" / "full" / "s0.json"
    cell = json.loads((store / "cells" / "full" / "s1.json").read_text())
    cell["provenance"]["git"]["commit"] = "1234567"
    old.write_text(json.dumps(cell))
    assert es.rows([store])[0]["cells"] == 2
    (row,) = es.rows([store], ("abcdef0",))
    assert row["cells"] == 1 and row["code"] == "abcdef0+"
    assert es.rows([store], ("7654321",)) == []
    out = tmp_path / "speed.md"
    es.main([str(store), "--commit", "abcdef0", "--out", str(out)])
    assert f"Generated by `python scripts/gpu/eval_speed.py {store} --commit abcdef0 --out {out}`" in out.read_text()
