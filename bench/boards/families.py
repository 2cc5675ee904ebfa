"""A cell's model family across cache budgets: the rows of the S-NIAH and RULER tables.

A budget sweep (`golinear run --budgets`) names its family when it runs. Models given one by one are named here:
what is left of a model once its window is taken away (and its retention slots, as a share of window + slots).
Then the default recipe trained at budgets 128 ... 1024 (four checkpoints) is one row with four budget columns,
and so is the untrained window + sinks at four windows, and those checkpoints with half the window as slots.
A model alone in its family keeps its own label, and so do two models of one family at the same budget (seeds,
learning rates), which would otherwise share a table cell; the untrained window + sinks is always named so
(WINDOW_ONLY_LABEL), whether a run called it `swa-sink`, `mechanism=none,window=248,sinks=8` or left it unnamed.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from golinear.bench.run.specs import WINDOW_ONLY_LABEL
from golinear.models.spec import SCORER  # a checkpoint's own copy: named by its folder, not by this


def family_of(model: dict) -> tuple[str, str]:
    """(identity, name) of a stored cell's model (the store's `model` field) without its window."""
    label = model.get("label") or ""
    info = model.get("info") or {}
    lin = dict(info.get("linearize") or {})
    if model.get("family") and model["family"] != label and lin.get("mechanism") != "none":  # named by its sweep
        return "named:" + model["family"], model["family"]
    if model.get("full_attention") or not lin:
        return "label:" + label, label
    window = lin.pop("window", None) or 0
    retain = lin.pop("retain", None) or 0
    if lin.get("scorer"):  # a path that differs by machine: the file's name (the store keys its contents)
        lin["scorer"] = Path(lin["scorer"]).name
    # retention slots: a sweep keeps their share of window + slots (the budget changes the absolute number),
    # and slots given as cache options to a checkpoint trained without them are added training-free
    share = round(retain / (window + retain), 3) if retain else 0
    free = bool(retain) and "retain" in (info.get("cache_options") or {})
    ident = json.dumps({"backbone": model.get("backbone"), "trained": bool(info.get("trained")), **lin,
                        "retain_share": share, "retain_free": free}, sort_keys=True)
    if lin.get("mechanism") == "none":
        return ident, WINDOW_ONLY_LABEL
    named = [(lin.get("sinks"), f"{lin.get('sinks')} sinks"),
             (lin.get("short_conv"), "short conv" + (" (linear path)" if lin.get("conv_on") == "linear" else "")),
             (lin.get("lora"), "LoRA"), (lin.get("out_norm"), "output norm"),
             (share, f"{share:.0%} of window + slots retained ({lin.get('retain_score')}"
                     + (f" {Path(lin['scorer']).stem}" if lin.get("scorer", SCORER) != SCORER else "")
                     + (", slots added training-free)" if free else ")")),
             (lin.get("full_layers") or lin.get("keep_full"), "some layers full")]
    parts = [lin["mechanism"], "window"] + [text for given, text in named if given]
    return ident, " + ".join(parts) + (", trained at each budget" if info.get("trained") else ", untrained")


def families(frame: pd.DataFrame) -> pd.Series:
    """The family name of each row of a measured frame (bench.boards.measured.measured_frame: columns family_id,
    family_name, model, model_key, budget, column); its label where it is alone in its family or where the family
    has two models at one budget."""
    if not len(frame):
        return pd.Series([], dtype=object)
    per_slot = frame.groupby(["family_id", "budget", "column"])["model_key"].nunique()
    crowded = {fid for (fid, _, _), n in per_slot.items() if n > 1}
    alone = {fid for fid, n in frame.groupby("family_id")["model_key"].nunique().items() if n == 1}
    fixed = set(frame.loc[frame["family_name"] == WINDOW_ONLY_LABEL, "family_id"])  # one name, however it was given
    keep = (crowded | (alone - {fid for fid in alone if fid.startswith("named:")})) - fixed
    return pd.Series([r["model"] if r["family_id"] in keep else r["family_name"] for _, r in frame.iterrows()],
                     index=frame.index, dtype=object)
