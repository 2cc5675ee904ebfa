"""One row of the claims table: the paper's numbers and the rule on them, then ours under the first metric the
rule can decide.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from bench.claims.catalog import CLAIMS, Claim
from bench.claims.evidence import Evidence, evidence, role_scores, spread
from bench.claims.metrics import CE, METRICS, VERDICTS, verdict
from bench.claims.rules import rule_text
from bench.leaderboard import load_reference
from bench.store import Store


def judge(claim: Claim, ref: dict, ev: Evidence) -> dict:
    """One row: the paper's numbers and the rule on them, then ours under the first metric the rule can decide."""
    pm = METRICS[claim.paper_metric]
    paper = claim.paper(ref)
    paper_txt = "; ".join(f"{bb}: " + ", ".join(f"{r} {v:.2f}" for r, v in s.items()) for bb, s in paper.items())
    paper_txt = f"{pm.name} ({pm.unit}): {paper_txt}" if paper_txt else ""
    paper_rule = "; ".join(f"{bb}: {verdict(claim.rule(s, pm)[0], pm.name)}" for bb, s in paper.items())
    row = {"claim": claim.text, "rule": rule_text(claim.rule), "paper source": claim.source,
           "paper's numbers": paper_txt or claim.note,
           "rule on the paper's numbers": paper_rule or "no numbers", "ours at 135M": "", "seeds": "",
           "verdict": VERDICTS[4], "why": ""}
    missing = {}
    for metric in claim.metrics:
        m = METRICS[metric]
        scores, stds, texts, seeds = {}, {}, [], []
        for role, spec in claim.ours.items():
            target, cols = spec if isinstance(spec, tuple) else (spec, None)
            vals, where = role_scores(ev, target, cols, metric)
            if not vals:
                missing.setdefault(metric, {})[target] = None
                continue
            scores[role] = statistics.mean(vals)
            texts.append(f"{role} {scores[role]:.{m.digits}f}" + (f" [{where}]" if where else ""))
            if len(vals) > 1:
                seeds.append(f"{role}: {spread(vals)}")
                stds[role] = statistics.stdev(vals)
        ok, why = claim.rule(scores, m, spreads=stds) if claim.seeded else claim.rule(scores, m)
        if ok is not None:
            direction = "higher" if m.higher_better else "lower"
            row |= {"ours at 135M": f"{metric} ({m.unit}, {direction} is better"
                    + ("; not the paper's metric" if metric == CE.name else "") + "): " + ", ".join(texts),
                    "seeds": "; ".join(seeds) or "1 seed", "verdict": verdict(ok, metric),
                    "why": why + (f"; not measured: {', '.join(f'`{t}`' for t in missing[metric])}"
                                  if metric in missing else "")}
            break
    else:
        row["why"] = "missing: " + "; ".join(f"{k}: {', '.join(f'`{t}`' for t in v)}" for k, v in missing.items())
    if claim.note and paper_txt:
        row["why"] = f"{row['why']}; {claim.note}".strip("; ")
    return row


def claims_table(store: Store, checkpoints: Path, reference_dir, ev: Evidence | None = None,
                 ref: dict | None = None) -> pd.DataFrame:
    ev = ev or evidence(store, checkpoints)
    ref = ref or load_reference(reference_dir)
    return pd.DataFrame([judge(c, ref, ev) for c in CLAIMS])
