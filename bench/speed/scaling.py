"""The scaling table: `leaderboards/scaling.{csv,md}` from training run folders and data-parallel
evaluation timings, merged by key into the committed CSV (a later run adds rows, never loses them).

    python -m golinear.bench.speed.scaling --runs RUN_DIR... --eval-timing TIMING.json... [--dp-store S --reference-store R]

A training row comes from a `golinear train` run folder (`train_config.json`: steady tokens/s after the
warm-up steps, processes, FSDP, sequence length, batch) and the per-rank peak-memory files that
scripts/scaling/train_peak.py writes beside it (`<run>.peak.rank<R>.json`). An evaluation row comes from a
timing files of the evaluation runs. Nothing here invents a figure: a missing one is left empty.
"""
from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import math
from pathlib import Path

from golinear.models.util.atomic import atomic_write

COLUMNS = ["mode", "gpus", "model_dims", "seq_len", "global_batch", "tokens_per_s", "peak_gib_per_gpu", "wall_s",
           "commit", "steps", "speedup_vs_1gpu", "note"]
KEY = ("mode", "gpus", "model_dims", "seq_len", "global_batch")
PAPER_TOKENS = 2500 * 4096  # the default recipe: 2,500 steps x 4,096 tokens = 10.24M ("10M tokens")
PAPER_HOURS = 1.0           # the paper: ~1 hour for an 8B model on one H100


def model_dims(base: str, spec: dict | None = None) -> str:
    """The named configuration of a random-weight folder (models.backbones.random_base: its marker, or `spec`, the copy
    the peak files carry when the folder stayed on the device), else the base as given."""
    marker = Path(base) / "golinear_random.json"
    spec = json.loads(marker.read_text()) if marker.is_file() else spec
    if spec:
        over = spec.get("overrides") or {}
        return spec["named_config"] + ("" if not over else "+" + ",".join(f"{k}={v}" for k, v in sorted(over.items())))
    return Path(base).name if Path(base).exists() else base


def train_row(run: str | Path, commit: str = "") -> dict:
    run = Path(run)
    rec = json.loads((run / "train_config.json").read_text())
    s, t, env = rec.get("summary") or {}, rec.get("train") or {}, rec.get("environment") or {}
    gpus = int(s.get("world_size") or env.get("processes") or 1)
    peaks = [json.loads(Path(f).read_text()) for f in sorted(glob.glob(f"{run}.peak.rank*.json"))]
    peak = [p.get("peak_allocated_gib") for p in peaks if p.get("peak_allocated_gib") is not None]
    mode = "fsdp2" if env.get("fsdp") else ("ddp" if gpus > 1 else "single")
    tps = s.get("steady_tokens_per_s") or s.get("tokens_per_s")
    notes = [f"run={run.name}"]
    if s.get("cuda_graph"):
        notes.append("cuda graph")
    if env.get("fsdp") and env["fsdp"].get("activation_checkpointing"):
        notes.append("activation checkpointing")
    if rec.get("note"):
        notes.append(str(rec["note"]))
    spec = next((p["random_spec"] for p in peaks if p.get("random_spec")), None)
    return {"mode": mode, "gpus": gpus, "model_dims": model_dims(rec.get("base", ""), spec), "seq_len": t.get("seq_len"),
            "global_batch": int(t.get("batch_size", 1)) * gpus, "tokens_per_s": tps,
            "peak_gib_per_gpu": max(peak) if peak else None, "wall_s": s.get("train_wall_s"), "commit": commit,
            "steps": s.get("step"), "note": "; ".join(notes)}


def eval_rows(timing: str | Path, commit: str = "") -> list[dict]:
    """Rows of a timing file: {"runs": [{"suite", "gpus", "models", "wall_s", "batch_size"}...]}."""
    data = json.loads(Path(timing).read_text())
    return [{"mode": f"eval-{r['suite']}", "gpus": int(r["gpus"]), "model_dims": "smollm2-135m", "seq_len": "",
             "global_batch": int(r.get("batch_size", 0)) * int(r["gpus"]), "tokens_per_s": None,
             "peak_gib_per_gpu": None, "wall_s": r.get("wall_s") if r.get("returncode") == 0 else None,
             "commit": commit or data.get("commit", ""), "steps": None,
             "note": f"models={r.get('models')}" + ("" if r.get("returncode") == 0 else
                                                     f"; FAILED or cut (rc={r.get('returncode')}): no wall time")}
            for r in data.get("runs", [])]


def _key(row: dict) -> tuple:
    return tuple(str(row.get(k, "")) for k in KEY)


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """Rows of `new` replace rows of `old` with the same key; speed-ups are recomputed against 1 GPU."""
    rows = {_key(r): dict(r) for r in old}
    rows.update({_key(r): dict(r) for r in new})
    out = sorted(rows.values(), key=lambda r: (str(r["mode"]).replace("single", "ddp"), str(r["model_dims"]),
                                                str(r["seq_len"]), int(r["gpus"])))
    for r in out:
        r["speedup_vs_1gpu"] = speedup(r, out)
    return out


def speedup(row: dict, rows: list[dict]):
    """tokens/s over the one-GPU row of the same model, sequence and global batch (training); one-GPU wall time
    over this wall time (evaluation). None without a one-GPU row."""
    if int(row["gpus"]) == 1:
        return None
    ev = str(row["mode"]).startswith("eval-")
    for base in rows:
        if int(base["gpus"]) != 1 or str(base["model_dims"]) != str(row["model_dims"]):
            continue
        if ev and base["mode"] == row["mode"] and _num(base["wall_s"]) and _num(row["wall_s"]):
            return round(_num(base["wall_s"]) / _num(row["wall_s"]), 3)
        if (not ev and not str(base["mode"]).startswith("eval-") and str(base["seq_len"]) == str(row["seq_len"])
                and str(base["global_batch"]) == str(row["global_batch"]) and _num(base["tokens_per_s"])
                and _num(row["tokens_per_s"])):
            return round(_num(row["tokens_per_s"]) / _num(base["tokens_per_s"]), 3)
    return None


def extrapolate(rows: list[dict], dims: str = "llama-3.1-8b", tokens: int = PAPER_TOKENS) -> list[dict] | None:
    """Hours to train `dims` on `tokens` tokens on 1 and 2 GPUs (measured tokens/s) and 8 (assumed: every GPU
    keeps the measured 2-GPU efficiency, tokens/s(8) = 8 x tokens/s(1) x tokens/s(2) / (2 x tokens/s(1)))."""
    train = [r for r in rows if str(r["model_dims"]) == dims and not str(r["mode"]).startswith("eval-")
             and _num(r["tokens_per_s"])]
    one = [r for r in train if int(r["gpus"]) == 1]
    two = [r for r in train if int(r["gpus"]) == 2 and r["mode"] == "ddp"]
    if not one:
        return None
    t1 = max(_num(r["tokens_per_s"]) for r in one)
    out = [{"gpus": 1, "tokens_per_s": t1, "hours": tokens / t1 / 3600, "how": "measured"}]
    if two:
        t2 = max(_num(r["tokens_per_s"]) for r in two)
        eff = t2 / (2 * t1)
        out.append({"gpus": 2, "tokens_per_s": t2, "hours": tokens / t2 / 3600, "how": "measured (DDP)"})
        t8 = 8 * t1 * eff
        out.append({"gpus": 8, "tokens_per_s": t8, "hours": tokens / t8 / 3600,
                    "how": f"extrapolated: 2-GPU efficiency {eff:.2f} kept at 8 GPUs"})
    return out


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [dict(r) for r in csv.DictReader(f)]


def write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in COLUMNS})
    atomic_write(path, buf.getvalue())


def _fmt(v) -> str:
    n = _num(v)
    if n is None:
        return "" if v in (None, "") else str(v)
    return f"{n:,.0f}" if abs(n) >= 100 else (f"{n:.3g}" if not float(n).is_integer() else f"{int(n)}")


def render_md(rows: list[dict], checks: list[str] | None = None) -> str:
    lines = ["# Scaling: data-parallel evaluation, DDP and FSDP2 training", "",
             "Generated by `python -m golinear.bench.speed.scaling` from the run records of `scripts/scaling/device_*.sh` "
             "([docs/scaling.md](../docs/scaling.md) has the commands and accelerate configs). Training tokens/s: "
             "steady (after the 3 warm-up steps); peak GiB: the largest `torch.cuda.max_memory_allocated` over "
             "the ranks; wall_s: training wall time, or the whole evaluation command.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r.get(k)) for k in COLUMNS) + " |" for r in rows]
    if not rows:
        lines.append("| not yet measured |" + " |" * (len(COLUMNS) - 1))
    lines += ["", "## The paper's scale on paper: an 8B model on 10.24M tokens", ""]
    ext = extrapolate(rows)
    if ext is None:
        lines.append("Not yet measured (needs a one-GPU row of llama-3.1-8b dimensions).")
    else:
        lines += ["| GPUs | tokens/s | hours | how |", "|---|---|---|---|"]
        lines += [f"| {e['gpus']} | {e['tokens_per_s']:,.0f} | {e['hours']:.2f} | {e['how']} |" for e in ext]
        lines += ["", f"The paper: ~{PAPER_HOURS:g} hour on one H100 (same dense bf16 rate as the H200, less "
                  "memory bandwidth). Random weights: the speed of a step does not depend on the values."]
    if checks:
        lines += ["", "## Checks", ""] + [f"- {c}" for c in checks]
    return "\n".join(lines) + "\n"


def loss_diff(run_a: str | Path, run_b: str | Path) -> str:
    """Max |loss difference| over the steps both training logs have (same global batch: same curve)."""
    def log(run):
        lines = (Path(run) / "train_log.jsonl").read_text().splitlines()
        return {r["step"]: r["loss"] for r in map(json.loads, filter(None, lines))}
    a, b = log(run_a), log(run_b)
    common = sorted(set(a) & set(b))
    if not common:
        return f"loss curves {Path(run_a).name} / {Path(run_b).name}: no common logged step"
    diff = max(abs(a[s] - b[s]) for s in common)
    return (f"loss curves {Path(run_a).name} vs {Path(run_b).name}: max |difference| {diff:.4g} over "
            f"{len(common)} logged steps (first {a[common[0]]:.4f} / {b[common[0]]:.4f}, last {a[common[-1]]:.4f} / "
            f"{b[common[-1]]:.4f})")


def compare_stores(dp_store: str | Path, reference: str | Path) -> list[str]:
    """One line per cell of the data-parallel store: its value and n against the one-GPU cell of the same key."""
    def cells(store):
        out = {}
        for f in glob.glob(str(Path(store) / "cells" / "*" / "*.json")):
            d = json.loads(Path(f).read_text())
            out[(Path(f).parent.name, Path(f).name)] = d
        return out
    ref, lines = cells(reference), []
    for key, d in sorted(cells(dp_store).items()):
        r = ref.get(key)
        if r is None:
            lines.append(f"{key[0]}/{d.get('task')}: no one-GPU cell to compare")
            continue
        same = d.get("n") == r.get("n") and d.get("value") == r.get("value")
        a, b = d.get("value"), r.get("value")
        delta = a - b if isinstance(a, (int, float)) and isinstance(b, (int, float)) else math.nan
        lines.append(f"{key[0]}/{d.get('task')}: {'identical' if same else 'DIFFERS'} (n {d.get('n')} vs "
                     f"{r.get('n')}, {d.get('metric')} {d.get('value')} vs {r.get('value')}, delta {delta:.3g}; "
                     f"world size {(d.get('provenance') or {}).get('world_size')})")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m golinear.bench.speed.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="*", default=[], help="training run folders")
    p.add_argument("--eval-timing", nargs="*", default=[], help="timing JSON files of the evaluation runs")
    p.add_argument("--compare", nargs=2, action="append", default=[], metavar=("DP_STORE", "REFERENCE_STORE"),
                   help="compare the cells of a data-parallel store with the one-GPU cells of another, by key")
    p.add_argument("--same-curve", nargs=2, action="append", default=[], metavar=("RUN_A", "RUN_B"),
                   help="two run folders whose loss curves must agree (same global batch)")
    p.add_argument("--checks", nargs="*", default=[], help="text files of further check lines (device scripts)")
    p.add_argument("--commit", default="", help="the commit that produced the figures")
    p.add_argument("--out", default="leaderboards", help="folder of scaling.csv and scaling.md")
    args = p.parse_args(argv)
    new = [train_row(r, args.commit) for r in args.runs]
    for t in args.eval_timing:
        new += eval_rows(t, args.commit)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = merge(read_csv(out / "scaling.csv"), new)
    checks = [loss_diff(a, b) for a, b in args.same_curve]
    for dp, ref in args.compare:
        checks += compare_stores(dp, ref)
    for f in args.checks:
        checks += [line for line in Path(f).read_text().splitlines() if line.strip()]
    kept = out / "scaling_checks.txt"  # the checks of earlier calls stay (one line each, no repeats)
    old = kept.read_text().splitlines() if kept.exists() else []
    checks = list(dict.fromkeys(old + checks))
    atomic_write(kept, "".join(c + "\n" for c in checks))
    write_csv(out / "scaling.csv", rows)
    atomic_write(out / "scaling.md", render_md(rows, checks))
    print(f"wrote {out / 'scaling.csv'} ({len(rows)} rows), {out / 'scaling.md'} and {kept}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
