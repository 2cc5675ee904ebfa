"""The rules: each turns {role: score} into (holds / does not hold / None when a role is missing, why).

Why apart from the claims: a rule is applied to the paper's numbers and to ours alike, and the rendered table quotes
its docstring's first line (`rule_text`) as the rule a reader sees.
"""
from __future__ import annotations

from functools import partial

from golinear.bench.claims.metrics import Metric, better
from golinear.bench.claims.roles import DEFAULT_ROLE

GAP_TARGETS = {"CR": 0.5, "LAMBADA": 4.0}  # the study's targets: default recipe vs full attention, gap in points
RETENTION_TOLERANCE = 0.5  # retention slots keep CR and LAMBADA stay within this many points of the default recipe


# ----------------------------------------------------------------------------- rules: {role: score} -> verdict
def ordering(s: dict, m: Metric) -> tuple[bool | None, str]:
    """GDN ahead of kGLA, GLA and Hedgehog; kGLA ~ GLA; both >> Hedgehog."""
    if not all(r in s for r in ("gdn", "kgla", "gla", "hedgehog")):
        return None, ""
    parts = {"GDN best": all(better(s["gdn"], s[r], m) > 0 for r in ("kgla", "gla", "hedgehog")),
             "kGLA ~ GLA": abs(s["kgla"] - s["gla"]) <= m.near,
             "both >> Hedgehog": min(better(s[r], s["hedgehog"], m) for r in ("kgla", "gla")) >= m.far}
    return all(parts.values()), "; ".join(f"{k}: {'yes' if v else 'no'}" for k, v in parts.items())


def close_gap(s: dict, m: Metric, tol: float | None = None) -> tuple[bool | None, str]:
    """Every linearized row within '~' (or the given tolerance) of full attention."""
    tol = m.near if tol is None else tol
    lin = {r: v for r, v in s.items() if r != "full"}
    if "full" not in s or not lin:
        return None, ""
    gaps = {r: better(s["full"], v, m) for r, v in lin.items()}
    return all(g <= tol for g in gaps.values()), ", ".join(f"{r} gap {g:.3f}" for r, g in gaps.items()) + \
        f" (allowed {tol:g} {m.unit})"


def gap_target(s: dict, m: Metric) -> tuple[bool | None, str]:
    """Every linearized row within the study's target gap of full attention (held-out CE: within '~')."""
    return close_gap(s, m, GAP_TARGETS.get(m.name))


def beats(s: dict, m: Metric, a: str, b: str) -> tuple[bool | None, str]:
    """{a} ahead of {b} wherever both are measured (roles 'X:{a}', 'X:{b}')."""
    pairs = [p for p in dict.fromkeys(r.split(":")[0] for r in s) if f"{p}:{a}" in s and f"{p}:{b}" in s]
    if not pairs:
        return None, ""
    d = {p: better(s[f"{p}:{a}"], s[f"{p}:{b}"], m) for p in pairs}
    return all(v > 0 for v in d.values()), ", ".join(f"{p}: {a} {'ahead' if v > 0 else 'behind'} by {abs(v):.3f}"
                                                     for p, v in d.items())


def near_best(s: dict, m: Metric) -> tuple[bool | None, str]:
    """Every row within '~' of GDN, or ahead of it."""
    if "gdn" not in s or len(s) < 2:
        return None, ""
    d = {r: better(s["gdn"], v, m) for r, v in s.items() if r != "gdn"}
    return all(v <= m.near for v in d.values()), ", ".join(f"{r} behind GDN by {v:.3f}" for r, v in d.items())


def rises(s: dict, m: Metric) -> tuple[bool | None, str]:
    """Better at every larger cache budget (roles b<budget>)."""
    b = sorted((int(r[1:]), v) for r, v in s.items())
    if len(b) < 2:
        return None, ""
    steps = [better(v2, v1, m) for (_, v1), (_, v2) in zip(b, b[1:])]
    return all(x > 0 for x in steps), " -> ".join(f"{k}: {v:.3f}" for k, v in b)


def ruler_profile(s: dict, m: Metric) -> tuple[bool | None, str]:
    """Aggregation/QA ahead of retrieval by >> at both budgets, and the average rising with the budget."""
    need = [f"{k}@{b}" for k in ("agg", "ret", "avg") for b in ("small", "large")]
    if not all(r in s for r in need):
        return None, ""
    gap = {b: better(s[f"agg@{b}"], s[f"ret@{b}"], m) for b in ("small", "large")}
    ok = all(g >= m.far for g in gap.values()) and better(s["avg@large"], s["avg@small"], m) > 0
    return ok, (f"agg-ret {gap['small']:.1f} (small), {gap['large']:.1f} (large); avg {s['avg@small']:.1f} -> "
                f"{s['avg@large']:.1f}")


def per_variant(s: dict, budgets: str, ok, describe) -> tuple[dict, str]:
    """Roles '<variant>@<budget>' against 'default@<budget>': ({variant: met}, why). A variant meets the target when
    `ok(value, default, role, default_role)` holds at every one of `budgets`; a variant short of a budget is named
    in `why`, not judged (absent from the dict)."""
    budgets = [int(b) for b in str(budgets).split(",")]  # "256, 512" (the rule's text names them)
    rows = {}
    for role, v in s.items():
        variant, b = role.rsplit("@", 1)
        default = f"{DEFAULT_ROLE}@{b}"
        if variant != DEFAULT_ROLE and default in s:
            rows.setdefault(variant, {})[int(b)] = (v, s[default], role, default)
    whole = {k: r for k, r in rows.items() if set(budgets) <= set(r)}
    met = {k: all(ok(*r[b]) for b in budgets) for k, r in whole.items()}
    why = "; ".join(f"{k}: " + ", ".join(f"{b} {describe(*r[b])}" for b in sorted(r))
                    + (f" ({'met' if met[k] else 'not met'})" if k in met else " (not every budget measured)")
                    for k, r in rows.items())
    return met, why


def some_variant(met: dict) -> bool | None:
    """A single-part target holds when some judged variant meets it (None: no variant judged)."""
    return any(met.values()) if met else None


def variants_ahead(s: dict, m: Metric, budgets: str = "", spreads: dict | None = None) -> tuple[dict, str]:
    """ahead of the default recipe at equal total budget, at each of {budgets}, by more than the seeds' spread

    Roles '<variant>@<budget>' against 'default@<budget>'. `spreads` (role -> sample std over its seeds, for the
    roles with two seeds or more; `judge` passes it): the margin must exceed the two rows' stds added, and a row
    with one seed has no spread, so it does not meet the target. Without `spreads` (the paper's rows): ahead."""
    def need(role, default_role):  # the margin to beat; None: a row's spread is not measured
        if spreads is None:
            return 0.0
        return spreads[role] + spreads[default_role] if role in spreads and default_role in spreads else None

    def ok(r, d, role, default_role):
        n = need(role, default_role)
        return n is not None and better(r, d, m) > n

    def describe(r, d, role, default_role):
        n = need(role, default_role)
        spread = "" if spreads is None else (" (one seed: no spread)" if n is None else f" (seeds' spread {n:.2f})")
        return f"{'ahead' if better(r, d, m) > 0 else 'behind'} by {abs(better(r, d, m)):.2f}{spread}"
    return per_variant(s, budgets, ok, describe)


def variants_within(s: dict, m: Metric, budgets: str = "", tol: float = RETENTION_TOLERANCE) -> tuple[dict, str]:
    """within {tol} points of the default recipe (or ahead), at each of {budgets}

    Held-out CE: within '~' instead. Roles as variants_ahead's."""
    tol = tol if m.unit == "points" else m.near
    return per_variant(s, budgets, lambda r, d, *_: better(d, r, m) <= tol, lambda r, d, *_: f"{better(r, d, m):+.2f}")


def retention_ahead(s: dict, m: Metric, budgets: str = "", spreads: dict | None = None) -> tuple[bool | None, str]:
    """Some way of adding retention slots is ahead of the default recipe at equal total budget, at each of {budgets}, by more than the seeds' spread.

    `variants_ahead`, read as one target: some variant meets it."""
    met, why = variants_ahead(s, m, budgets, spreads)
    return some_variant(met), why


def retention_within(s: dict, m: Metric, budgets: str = "", tol: float = RETENTION_TOLERANCE) -> tuple[bool | None, str]:
    """Some way of adding retention slots is within {tol} points of the default recipe (or ahead), at each of {budgets}.

    `variants_within`, read as one target: some variant meets it."""
    met, why = variants_within(s, m, budgets, tol)
    return some_variant(met), why


def beats_sides(sides: dict):
    a, b = sides
    return partial(beats, a=a, b=b)


def rule_text(rule) -> str:
    """The rule's docstring's first line, naming the pair it compares when it is a partial of `beats`."""
    func = getattr(rule, "func", rule)
    pair = getattr(rule, "keywords", {})
    doc = (func.__doc__ or func.__name__).strip().splitlines()[0]
    return doc.format(**pair) if pair else doc
