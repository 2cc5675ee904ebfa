"""A target with several parts: it holds only when ONE variant meets every part.

Why: read part by part, a target can look met when each part is met by a different variant (one scorer ahead on
S-NIAH, another keeping CR), a result no single model delivers. Each part is judged per variant (rules'
`variants_ahead` / `variants_within`); a variant judged on every part meets the target when it meets each; the
target holds when some variant does, is not measured while no variant is judged on every part, else does not hold.
"""
from __future__ import annotations

from golinear.bench.claims.caveats import CAVEATS, caveats, cell
from golinear.bench.claims.evidence import Evidence
from golinear.bench.claims.roles import DEFAULT_ROLE
from golinear.bench.claims.rules import rule_text
from golinear.bench.claims.scoring import decide, not_measured


def variant_caveats(sc, variant: str) -> set:
    """The caveats of one variant's reading of a part: its roles and the default recipe's beside them."""
    roles = [r for r in sc.targets if r.rsplit("@", 1)[0] in (variant, DEFAULT_ROLE)]
    return caveats(sc.metric.name, {r: sc.targets[r] for r in roles}, sc.seeds)


def one_variant(results: dict) -> tuple[bool | None, list, list]:
    """results: part name -> {variant: met} ({} where the part is decided for no variant). (verdict, the variants
    meeting every part, the variants judged on every part)."""
    variants = list(dict.fromkeys(v for met in results.values() for v in met))
    judged = [v for v in variants if all(v in met for met in results.values())]
    meeting = [v for v in judged if all(met[v] for met in results.values())]
    return (bool(meeting) if judged else None), meeting, judged


def status(met: dict, variant: str) -> str:
    return "met" if met.get(variant) else ("not met" if variant in met else "not judged")


def judge_parts(parts: tuple, ev: Evidence) -> dict:
    """The row's cells for a several-part target (catalog's `Part`s): ours per part, the seeds, the one-variant
    verdict, why."""
    results, read, ours, seeds, whys = {}, {}, [], [], []
    for p in parts:
        answer, sc, missing = decide(p.rule, p.seeded, p.ours, p.metrics, ev)
        results[p.name], read[p.name] = (answer[0] if answer else {}), sc
        ours.append(f"{p.name}: " + (sc.ours() if sc else "not measured"))
        seeds += [f"{p.name}: " + "; ".join(sc.spreads)] if sc and sc.spreads else []
        lacking = missing.get(sc.metric.name) if sc else [t for ts in missing.values() for t in ts]
        whys.append(f"{p.name}: " + (answer[1] if answer else "no variant judged")
                    + (f"; not measured: {not_measured(lacking)}" if lacking else ""))
    ok, meeting, judged = one_variant(results)
    of = {v: set().union(*(variant_caveats(read[n], v) for n in results if read[n] and v in results[n]))
          for v in dict.fromkeys(v for met in results.values() for v in met)}
    found = [of[v] for v in (meeting or judged)]
    # holds: the caveats every meeting variant carries; does not hold: any judged variant's
    named = set.intersection(*found) if ok and found else set().union(*found)
    per_variant = "; ".join(f"{v}" + (f" ({'; '.join(c for c in CAVEATS if c in of[v])})" if of[v] else "") + ": "
                            + ", ".join(f"{n} {status(results[n], v)}" for n in results) for v in of)
    head = (f"met every part: {', '.join(meeting)}" if meeting else
            "no variant meets every part" if judged else "no variant judged on every part")
    return {"rule": "one variant meets every part: " + "; ".join(f"{p.name}: {rule_text(p.rule)}" for p in parts),
            "ours at 135M": "; ".join(ours), "seeds": ". ".join(seeds) or "1 seed",
            "verdict": cell(ok, named), "why": f"{head}. By variant: {per_variant}. By part: " + ". ".join(whys)}
