"""One row of the claims table: the paper's numbers and the rule on them, then ours under the first metric the
rule can decide, and the verdict with its caveats.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from golinear.bench.claims.caveats import caveats, cell
from golinear.bench.claims.catalog import CLAIMS, Claim
from golinear.bench.claims.evidence import Evidence, evidence
from golinear.bench.claims.metrics import METRICS, VERDICTS, verdict
from golinear.bench.claims.rules import rule_text
from golinear.bench.claims.scoring import decide, not_measured
from golinear.bench.claims.targets import judge_parts
from golinear.bench.boards.leaderboard import load_reference
from golinear.bench.results.store import Store


def judge(claim: Claim, ref: dict, ev: Evidence) -> dict:
    """One row: the paper's numbers and the rule on them, then ours under the first metric the rule can decide."""
    pm = METRICS[claim.paper_metric]
    paper = claim.paper(ref)
    paper_txt = "; ".join(f"{bb}: " + ", ".join(f"{r} {v:.2f}" for r, v in s.items()) for bb, s in paper.items())
    paper_txt = f"{pm.name} ({pm.unit}): {paper_txt}" if paper_txt else ""
    paper_rule = "; ".join(f"{bb}: {verdict(claim.rule(s, pm)[0])}" for bb, s in paper.items())
    row = {"claim": claim.text, "rule": rule_text(claim.rule) if claim.rule else "", "paper source": claim.source,
           "paper's numbers": paper_txt or claim.note,
           "rule on the paper's numbers": paper_rule or "no numbers", "ours at 135M": "", "seeds": "",
           "verdict": VERDICTS[2], "why": ""}
    if claim.parts:
        return row | judge_parts(claim.parts, ev)
    answer, sc, missing = decide(claim.rule, claim.seeded, claim.ours, claim.metrics, ev)
    if answer is not None:
        ok, why = answer
        m = sc.metric.name
        row |= {"ours at 135M": sc.ours(), "seeds": "; ".join(sc.spreads) or "1 seed",
                "verdict": cell(ok, caveats(m, sc.targets, sc.seeds)),
                "why": why + (f"; not measured: {not_measured(missing[m])}" if m in missing else "")}
    else:
        row["why"] = "missing: " + "; ".join(f"{k}: {not_measured(v)}" for k, v in missing.items())
    if claim.note and paper_txt:
        row["why"] = f"{row['why']}; {claim.note}".strip("; ")
    return row


def claims_table(store: Store, checkpoints: Path, reference_dir, ev: Evidence | None = None,
                 ref: dict | None = None) -> pd.DataFrame:
    ev = ev or evidence(store, checkpoints)
    ref = ref or load_reference(reference_dir)
    return pd.DataFrame([judge(c, ref, ev) for c in CLAIMS])
