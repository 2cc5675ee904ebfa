"""Our values for a claim's roles under one metric, and the rule under the first metric it can decide.

Why apart from the verdicts: a single claim and each part of a several-part target read their roles the same way
(mean over seeds, the seeds' spread, the roles not measured yet), then differ only in how the rule's answers combine.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from golinear.bench.claims.evidence import Evidence, role_scores, spread
from golinear.bench.claims.metrics import CE, METRICS, Metric


@dataclass
class Scored:
    """One metric's reading of a claim's roles."""
    metric: Metric
    scores: dict = field(default_factory=dict)  # role -> mean over its seeds
    stds: dict = field(default_factory=dict)  # role -> sample std, for roles with two seeds or more
    seeds: dict = field(default_factory=dict)  # role -> number of seeds
    targets: dict = field(default_factory=dict)  # role -> its target (recipe, cache options), for scored roles
    texts: list = field(default_factory=list)  # "role value [runs]"
    spreads: list = field(default_factory=list)  # "role: mean +- std (n seeds)"
    missing: list = field(default_factory=list)  # targets without a value

    def ours(self) -> str:
        m = self.metric
        direction = "higher" if m.higher_better else "lower"
        return (f"{m.name} ({m.unit}, {direction} is better" + ("; not the paper's metric" if m.name == CE.name else "")
                + "): " + ", ".join(self.texts))


def score(ours: dict, metric: str, ev: Evidence) -> Scored:
    """Every role of `ours` (role -> target or (target, columns)) under `metric`."""
    sc = Scored(METRICS[metric])
    for role, spec in ours.items():
        target, cols = spec if isinstance(spec, tuple) else (spec, None)
        vals, where = role_scores(ev, target, cols, metric)
        if not vals:
            sc.missing.append(target)
            continue
        sc.scores[role], sc.seeds[role], sc.targets[role] = statistics.mean(vals), len(vals), target
        sc.texts.append(f"{role} {sc.scores[role]:.{sc.metric.digits}f}" + (f" [{where}]" if where else ""))
        if len(vals) > 1:
            sc.spreads.append(f"{role}: {spread(vals)}")
            sc.stds[role] = statistics.stdev(vals)
    return sc


def decide(rule, seeded: bool, ours: dict, metrics: tuple, ev: Evidence):
    """(the rule's answer, the Scored it read, {metric: targets missing}) under the first metric the rule decides:
    an answer (ok, why) decides unless ok is None; a per-variant answer ({variant: met}, why) when a variant is
    judged. Nothing decides: (None, None, missing)."""
    missing = {}
    for metric in metrics:
        sc = score(ours, metric, ev)
        if sc.missing:
            missing[metric] = sc.missing
        answer = rule(sc.scores, sc.metric, spreads=sc.stds) if seeded else rule(sc.scores, sc.metric)
        if (bool(answer[0]) if isinstance(answer[0], dict) else answer[0] is not None):
            return answer, sc, missing
    return None, None, missing


def not_measured(targets) -> str:
    return ", ".join(f"`{t}`" for t in dict.fromkeys(targets))
