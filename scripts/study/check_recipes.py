"""Check every line of scripts/study/recipes.txt before it costs GPU time: `golinear train`'s own parser,
TrainConfig.validate and the linearize checks against the backbone's config (no weights, no data, no torch work).

    python scripts/study/check_recipes.py [--only NAME...] [--recipes FILE]

Prints one line per recipe (name, mechanism, window, sinks, conv, lora, lr, seq_len x steps); exits 1 on the
first line that fails, naming it.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
RECIPES = ROOT / "scripts" / "study" / "recipes.txt"


def recipes(path: Path = RECIPES) -> list[tuple[str, list[str]]]:
    """(name, options) of every non-comment line, as run_study.sh and train.sh read them."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, *opts = shlex.split(line)
            out.append((name, opts))
    return out


def check(name: str, opts: list[str]) -> str:
    from golinear.bench.cli import build_parser
    from golinear.models.spec.backbone_checks import check_linearize
    from golinear.models.training.train_cli import linearize_options, train_config_from_args
    args = build_parser("train").parse_args(["train", "--base", "smollm2-135m", *opts])
    cfg = train_config_from_args(args)
    cfg.validate()
    lin = linearize_options(args)
    check_linearize(lin, args.base)
    return (f"{name:26s} {lin['mechanism']:8s} w{lin['window']} s{lin['sinks']} conv={lin['short_conv']} "
            f"lora={lin['lora']} lr={cfg.lr:g} {cfg.seq_len}x{cfg.steps}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="*", default=None, help="recipe names to check (default: all)")
    p.add_argument("--recipes", type=Path, default=RECIPES, help="the recipe file (default: %(default)s)")
    args = p.parse_args(argv)
    lines = recipes(args.recipes)
    unknown = set(args.only or []) - {n for n, _ in lines}
    if unknown:
        raise SystemExit(f"--only {sorted(unknown)}: not in {args.recipes}")
    for name, opts in lines:
        if args.only and name not in args.only:
            continue
        try:
            print(check(name, opts))
        except (ValueError, SystemExit) as e:
            print(f"{name}: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
