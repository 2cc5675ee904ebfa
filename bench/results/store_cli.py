"""`golinear store merge|stale`: maintenance of a result store (bench.results.store_merge, bench.results.store_stale)."""
from __future__ import annotations


def main(args) -> int:
    if args.action == "merge":
        from golinear.bench.results.store_merge import merge
        return merge(args)
    from golinear.bench.results.store_stale import stale
    return stale(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit("use: golinear store merge|stale ...")
