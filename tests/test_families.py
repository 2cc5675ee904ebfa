"""bench/boards/families.py: models given one by one become one S-NIAH/RULER row per family across budgets."""
from __future__ import annotations

import pandas as pd

from golinear.bench.boards.families import families, family_of
from golinear.bench.run.specs import WINDOW_ONLY_LABEL


def _model(label, window, trained, mechanism="gdn", family=None, **lin):
    return {"label": label, "family": family or label, "backbone": "smollm2-135m", "full_attention": False,
            "info": {"trained": trained, "linearize": {"mechanism": mechanism, "window": window, "sinks": 8, **lin}}}


def _frame(models_budgets):
    rows = []
    for key, (model, budget) in enumerate(models_budgets):
        fid, name = family_of(model)
        rows.append({"model": model["label"], "model_key": f"k{key}", "budget": budget, "column": "S-NIAH-1",
                     "family_id": fid, "family_name": name})
    return pd.DataFrame(rows)


def test_a_window_sweep_given_model_by_model_is_one_family():
    trained = [_model(f"gdn-w{b - 8}-s8-sc", b - 8, True, short_conv=True) for b in (128, 256)]
    untrained = [_model(f"mechanism=none,window={b - 8},sinks=8", b - 8, False, mechanism="none") for b in (128, 256)]
    frame = _frame([(m, b) for m, b in zip(trained + untrained, (128, 256, 128, 256))])
    assert list(families(frame)) == ["gdn + window + 8 sinks + short conv, trained at each budget"] * 2 \
        + [WINDOW_ONLY_LABEL] * 2
    assert family_of(_model("gdn-default @128", 120, False, family="gdn-default"))[1] == "gdn-default"  # a sweep's
    assert list(families(_frame([(trained[0], 128)]))) == ["gdn-w120-s8-sc"]  # alone: its own label


def test_the_untrained_window_has_one_name_however_a_run_named_it():
    """`swa-sink` (a sweep's name), a key=value spec alone at its budget, and an unnamed one: one readable row name."""
    named = _model("swa-sink", 248, False, mechanism="none", family="swa-sink")
    spec = _model("mechanism=none,window=248,sinks=8", 248, False, mechanism="none")
    for frame in (_frame([(named, 256)]), _frame([(spec, 256)]), _frame([(named, 256), (spec, 512)])):
        assert set(families(frame)) == {WINDOW_ONLY_LABEL} == {"untrained window + sinks"}


def test_two_models_of_one_family_at_one_budget_keep_their_labels():
    seeds = [_model(f"gdn-w56-s8-sc-seed{s}", 56, True, short_conv=True) for s in (1, 2)]
    other = _model("gdn-w120-s8-sc", 120, True, short_conv=True)
    assert list(families(_frame([(seeds[0], 64), (seeds[1], 64), (other, 128)]))) == \
        ["gdn-w56-s8-sc-seed1", "gdn-w56-s8-sc-seed2", "gdn-w120-s8-sc"]
    assert family_of(_model("x", 28, True, retain=28, retain_score="proj_residual"))[1] == \
        "gdn + window + 8 sinks + 50% of window + slots retained (proj_residual), trained at each budget"


def test_retention_slots_at_one_share_of_the_budget_are_one_family():
    """Checkpoints trained at each budget, half of each window given back as slots (cache options): one row; a
    quarter is another; a model trained with the slots (no cache option) another again."""
    def ret(b, r, free=True):
        m = _model(f"gdn-w{b - 8}-s8-sc,window={b - 8 - r},retain={r}", b - 8 - r, True, short_conv=True, retain=r,
                   retain_score="proj_residual")
        m["info"]["cache_options"] = {"window": b - 8 - r, "retain": r} if free else {}
        return m
    half = [(ret(b, (b - 8) // 2), b) for b in (256, 512, 1024)]
    name = ("gdn + window + 8 sinks + short conv + 50% of window + slots retained (proj_residual, slots added "
            "training-free), trained at each budget")
    assert list(families(_frame(half))) == [name] * 3
    quarter = [(ret(b, (b - 8) // 4), b) for b in (256, 512)]
    trained = [(ret(b, (b - 8) // 2, free=False), b) for b in (256, 512)]
    names = list(families(_frame(half + quarter + trained)))
    assert names[:3] == [name] * 3 and len(set(names)) == 3
    assert "25% of window + slots" in names[3] and "training-free" not in names[5]
