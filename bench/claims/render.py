"""`golinear claims`: claims.md/.csv, seeds.md/.csv, tables.md/.csv and retention.md/.csv/.png, and the README's
claims table, from one read of the store, the checkpoints and the paper's reference rows.
"""
from __future__ import annotations

from pathlib import Path

from golinear.bench.claims import paper_tables, retention_plot, retention_table, seeds
from golinear.bench.claims.evidence import evidence
from golinear.bench.claims.page import readme_with_table, to_markdown
from golinear.bench.claims.verdicts import claims_table
from golinear.bench.boards.needle_types import section as needle_types_section
from golinear.bench.boards.readme_results import has_sources, readme_with_results
from golinear.bench.boards.leaderboard import load_reference, to_csv, write_if_changed
from golinear.bench.results.store import Store


def render(store, checkpoints, out_dir, reference_dir, readme: Path | None = None) -> list[Path]:
    store = store if isinstance(store, Store) else Store(store)
    for what, p in (("result store", store.root), ("checkpoints folder", Path(checkpoints)),
                    ("reference folder", Path(reference_dir))):
        if not Path(p).is_dir():
            raise FileNotFoundError(f"{what} {str(p)!r} does not exist")
    for name in ("standard", "sniah", "ruler"):
        if not (Path(reference_dir) / f"paper_{name}.csv").is_file():
            raise FileNotFoundError(f"reference file {str(Path(reference_dir) / f'paper_{name}.csv')!r} is missing")
    ev, ref = evidence(store, Path(checkpoints)), load_reference(reference_dir)  # read once for every output
    table = claims_table(store, Path(checkpoints), reference_dir, ev, ref)
    values = seeds.table_values(ev)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ((out_dir / "claims.md", to_markdown(table)), (out_dir / "claims.csv", to_csv(table)),
             (out_dir / "seeds.md", seeds.to_markdown(ev, values)),
             (out_dir / "seeds.csv", to_csv(seeds.long_table(ev, values))))
    tables = paper_tables.frame(ev, ref)
    files += ((out_dir / "tables.md", paper_tables.to_markdown(tables)), (out_dir / "tables.csv", to_csv(tables)))
    retention = retention_table.long_table(ev)
    files += ((out_dir / "retention.md", retention_table.to_markdown(retention) + needle_types_section(store.cells())),
              (out_dir / "retention.csv", to_csv(retention)))
    png = retention_plot.plot(retention)
    files += ((out_dir / "retention.png", png),) if png else ()
    changed = [p for p, data in files if write_if_changed(p, data)]
    if readme is not None and Path(readme).is_file():  # its claims table; its results table when out_dir has all
        text = readme_with_table(Path(readme).read_text(), table)  # the leaderboards that table reads
        text = readme_with_results(text, out_dir) if has_sources(out_dir) else text
        changed += [Path(readme)] if write_if_changed(Path(readme), text) else []
    return changed


def main(args) -> int:
    changed = render(args.store, args.checkpoints, args.out, args.reference_dir, args.readme or None)
    print(f"golinear claims: {len(changed)} file(s) changed ({args.out}: claims.md/.csv, seeds.md/.csv, "
          f"tables.md/.csv, retention.md/.csv/.png; the table in {args.readme or 'no README'})")
    return 0
