"""RULER's metrics (scripts/eval/synthetic/constants.py) and prediction clean-up (scripts/eval/evaluate.py).

Scale: RULER's, 0-100 (mean over samples x 100). lm-eval's own port returns 0-1 and has a
string_match_part that averages instead of taking "any"; these follow RULER.
"""
from __future__ import annotations

import re

_NON_PRINTABLE = re.compile(r'[\x00-\x1f]')


def postprocess_pred(predict_str: str) -> str:
    predict_str = predict_str.strip()
    return _NON_PRINTABLE.sub('\n', predict_str).strip()


def string_match_part(preds: list[str], refs: list[list[str]]) -> float:
    score = sum([max([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) for pred, ref in zip(preds, refs)]) / len(preds) * 100
    return round(score, 2)


def string_match_all(preds: list[str], refs: list[list[str]]) -> float:
    score = sum([sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref) for pred, ref in zip(preds, refs)]) / len(preds) * 100
    return round(score, 2)


METRIC_FUNCTIONS = {'string_match_all': string_match_all, 'string_match_part': string_match_part}


def sample_score(metric: str, pred: str, ref: list[str]) -> float:
    """One sample's contribution on RULER's 0-100 scale (unrounded), after RULER's clean-up."""
    pred = postprocess_pred(pred)
    hits = [1.0 if r.lower() in pred.lower() else 0.0 for r in ref]
    if metric == 'string_match_all':
        return 100.0 * sum(hits) / len(ref)
    if metric == 'string_match_part':
        return 100.0 * max(hits)
    raise ValueError(f"unknown RULER metric {metric!r}; allowed: {sorted(METRIC_FUNCTIONS)}")
