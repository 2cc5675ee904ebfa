"""leaderboards/candidates.{md,csv}: every recipe tried at the paper's budget (window 56 + 8 sinks) and its controls,
with what a recipe is chosen on, off the test sets: held-out cross-entropy (`golinear train`'s, on the held-out books)
and the validation suite (`golinear run --suites validation`: LAMBADA's task on other held-out books), each beside the
default recipe as a paired difference, with the tokens and the training run's wall minutes on its GPU; recipes not trained yet are listed.

    python scripts/study/candidates.py --store STORE [--checkpoints checkpoints/smollm2-135m] [--out leaderboards/candidates]

STORE holds the validation cells (`golinear run --suites validation --models "full;CKPT/<name>;..."`); a cell belongs
to the candidate whose checkpoint folder has the candidate's name. Several stores may be given (one per device: a
store keeps one cell per model and task): a candidate gets a row per device it was evaluated on, and its paired
difference is taken against the default recipe's cell of the same device only (a CPU's and a GPU's float32 differ in
the last bits, and a near-tie between two words can flip).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from golinear.bench.boards.intervals import Z, paired

ROOT = Path(__file__).resolve().parents[2]

RECIPES = ROOT / "scripts" / "study" / "recipes.txt"
PATTERN = r"^(gdn-w56-s8|control-)"
DEFAULT = "gdn-w56-s8-sc"  # the paper's default recipe, which every candidate is compared with
TASK = "golinear_books_lastword"


def recipes(pattern: str = PATTERN) -> list[tuple[str, str]]:
    """(name, `golinear train` options) of recipes.txt's lines whose name matches `pattern`, in file order."""
    out = []
    for line in RECIPES.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, opts = line.strip().partition(" ")
            if re.search(pattern, name):
                out.append((name, " ".join(opts.split())))
    return out


def device(cell: dict) -> str:
    """Where a cell was evaluated: the GPU's name, else the device (cpu)."""
    hw = (cell.get("provenance") or {}).get("hardware") or {}
    return str(hw.get("gpu") or hw.get("device") or "cpu")


def validation_cells(stores: list[Path]) -> dict[tuple[str, str], dict]:
    """(name, device) -> the validation cell: the checkpoint folder's name, `full` for the untrained backbone."""
    out = {}
    for store in stores:
        for path in sorted(store.glob("cells/*/*.json")):
            cell = json.loads(path.read_text())
            if cell.get("task") != TASK:
                continue
            ckpt = (cell["model"].get("info") or {}).get("checkpoint")
            name = Path(ckpt).name if ckpt else ("full" if cell["model"].get("full_attention") else cell["model"]["label"])
            out[(name, device(cell))] = cell
    return out


def training(ckpt: Path) -> dict | None:
    """A finished `golinear train` run's record (train_config.json), or None."""
    path = ckpt / "train_config.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record if (record.get("summary") or {}).get("finished") else None


def rows(stores: Path | list[Path], checkpoints: Path, pattern: str = PATTERN) -> list[dict]:
    cells = validation_cells([stores] if isinstance(stores, Path) else list(stores))
    scores = {key: {k: 100 * v for k, v in (c.get("per_sample") or {}).items()} for key, c in cells.items()}

    def per_device(name, opts, record, ce, trained=None):  # a row per device the name was evaluated on (or one)
        devices = sorted(d for n, d in cells if n == name) or [None]
        return [row(name, opts, record, cells.get((name, d)), d, scores, ce, trained) for d in devices]

    out, full_ce = [], None
    for name, opts in recipes(pattern):
        record = training(checkpoints / name)
        results = (record or {}).get("results") or {}
        full_ce = full_ce or results.get("heldout_loss_full_attention")
        out += per_device(name, opts, record, results.get("heldout_loss_trained"))
    return per_device("full", "(the untrained backbone)", None, full_ce, trained=True) + out


def row(name, opts, record, cell, dev, scores, ce, trained=None) -> dict:
    summary = (record or {}).get("summary") or {}
    env = (record or {}).get("environment") or {}
    acc = ppl = lo = hi = None
    if cell:
        acc, se = 100 * cell["metrics"]["acc,none"]["value"], 100 * cell["metrics"]["acc,none"]["stderr"]
        lo, hi = acc - Z * se, acc + Z * se
        ppl = cell["metrics"]["perplexity,none"]["value"]
    mine, base = (name, dev), (DEFAULT, dev)  # paired only with the default recipe's cell of the same device
    vs = paired(scores[mine], scores[base]) if name != DEFAULT and mine in scores and base in scores else None
    seq_len = ((record or {}).get("train") or {}).get("seq_len")
    return {"candidate": name, "options": opts, "trained": record is not None if trained is None else trained,
            "ce_seq_len": seq_len,
            "tokens_m": summary.get("tokens", 0) / 1e6 if record else None,
            "gpu_min": summary["train_wall_s"] / 60 if record and "train_wall_s" in summary else None,
            "card": env.get("gpu") or env.get("device"), "heldout_ce": ce, "val_device": dev,
            "val_acc": acc, "val_lo": lo, "val_hi": hi,
            "val_ppl": ppl, "vs_default": vs}


def fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


CE_SEQ_LEN = 4096  # the held-out CE's sequence length at `golinear train`'s defaults


def ce(r: dict) -> str:
    """Held-out CE, marked where it was scored on sequences of another length (not comparable: less context)."""
    text = fmt(r["heldout_ce"], ".3f")
    return text if r.get("ce_seq_len") in (None, CE_SEQ_LEN) else f"{text} (on {r['ce_seq_len']}-token sequences)"


def render(table: list[dict]) -> str:
    lines = ["# Recipe candidates at the paper's budget", "",
             "Generated by `python scripts/study/candidates.py --store STORE` from the checkpoints' training records and "
             "the validation suite's cells (docs/study.md, \"Choosing a recipe\"). Held-out CE: `golinear train`'s "
             "next-token cross-entropy on the held-out books (lower is better); Books last word: the validation suite "
             "(500 passages of other held-out books, greedy accuracy with its 95 % interval, and perplexity); vs "
             f"{DEFAULT}: the paired difference in accuracy points over the same passages, with its 95 % interval. "
             "Nothing here is a test set.", "",
             "| candidate | `golinear train` options | tokens (M) | training wall min | card | held-out CE | validated on "
             f"| Books last word acc [95 % CI] | ppl | vs {DEFAULT} |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        if not r["trained"]:
            lines.append(f"| {r['candidate']} | `{r['options']}` | not trained yet | | | | | | | |")
            continue
        acc = "-" if r["val_acc"] is None else f"{r['val_acc']:.1f} [{r['val_lo']:.1f}, {r['val_hi']:.1f}]"
        vs = r["vs_default"]
        vs = "-" if vs is None else f"{vs['diff']:+.1f} [{vs['lo']:+.1f}, {vs['hi']:+.1f}]"
        lines.append(f"| {r['candidate']} | `{r['options']}` | {fmt(r['tokens_m'], '.2f')} | {fmt(r['gpu_min'], '.1f')} "
                     f"| {r['card'] or '-'} | {ce(r)} | {r['val_device'] or '-'} | {acc} | {fmt(r['val_ppl'], '.1f')} | {vs} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, nargs="+", required=True, help="validation stores (one per device)")
    ap.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints" / "smollm2-135m")
    ap.add_argument("--pattern", default=PATTERN, help=f"recipes.txt names to list (a regex; default {PATTERN!r})")
    ap.add_argument("--out", type=Path, default=ROOT / "leaderboards" / "candidates")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.store if not p.is_dir()]
    if missing:
        print(f"candidates.py: store {missing[0]!r} is not a folder", file=sys.stderr)
        return 2
    table = rows(args.store, args.checkpoints, args.pattern)
    args.out.with_suffix(".md").write_text(render(table))
    import pandas as pd
    flat = [{**{k: v for k, v in r.items() if k != "vs_default"},
             **{f"vs_default_{k}": (r["vs_default"] or {}).get(k) for k in ("diff", "lo", "hi", "n")}} for r in table]
    pd.DataFrame(flat).to_csv(args.out.with_suffix(".csv"), index=False)
    print(render(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
