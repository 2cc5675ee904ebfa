"""`golinear claims`: each claim of the paper beside our evidence at 135M, with a verdict computed by a rule.

Why: a user wants one table that says, claim by claim, whether the paper's findings hold on SmolLM2-135M,
with no number typed by hand. Every number comes from a file: the paper's from leaderboards/reference/*.csv,
ours from the result store (the paper's metrics) or, where the store has no row yet, from the checkpoints'
`train_config.json` (held-out cross-entropy on the held-out books: NOT the paper's metric, and labelled so).

A claim names roles (e.g. gdn, kgla, gla, hedgehog), where each role is found in the paper's tables and in our
recipes (scripts/study/recipes.txt names), and one rule that turns {role: score} into holds / does not hold.
The same rule is applied to the paper's own numbers, so a reader sees whether the rule is a fair reading.
A recipe's runs are its folders `<recipe>`, `<recipe>-10m`, `<recipe>-seedN`; the runs that reached their
requested steps are used, one per seed (mean +- sample std over them), else the longest one, labelled with its
steps. A checkpoint's store cells count only while they are of the folder's current files.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import pandas as pd

from bench.leaderboard import (CR_COLS, RULER_COLS, SNIAH_TASKS, load_reference, measured_frame, to_csv,
                               write_if_changed)
from bench.store import Store
from models.spec import checkpoint_identity


@dataclass(frozen=True)
class Metric:
    """How a score is read: unit, direction, and the two margins every rule uses."""
    name: str
    unit: str
    higher_better: bool
    near: float  # "~": within this many units
    far: float  # ">>": ahead by at least this many
    digits: int = 2


CE = Metric("held-out CE", "nats", False, 0.02, 0.5, 3)
METRICS = {m.name: m for m in (
    Metric("CR", "points", True, 1.0, 5.0), Metric("LAMBADA", "points", True, 1.0, 5.0),
    Metric("S-NIAH", "points", True, 1.0, 5.0), Metric("RULER", "points", True, 1.0, 5.0), CE)}
ISSUE_TARGETS = {"CR": 0.5, "LAMBADA": 4.0}  # golinear's targets: default recipe vs full attention, gap in points
DEFAULT_ROLE = "default"  # the retention rows are judged against this variant (the default recipe)
ISSUE17_TOLERANCE = 0.5  # retention slots' CR and LAMBADA stay within this many points of the default recipe
VERDICTS = ("holds", "does not hold", "holds on held-out CE only", "does not hold on held-out CE", "not measured")
RULER_AGG, RULER_RET = ["CWE", "FWE", "HQA", "SQA"], ["MK", "MQ", "MV", "VT"]
RUN_NAME = re.compile(r"^(?P<recipe>.+?)(?:-10m|-seed(?P<seed>\d+))?$")


def better(a: float, b: float, m: Metric) -> float:
    """How far a is ahead of b in m's direction (negative: behind)."""
    return a - b if m.higher_better else b - a


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


def issue_target(s: dict, m: Metric) -> tuple[bool | None, str]:
    """Every linearized row within the target gap of full attention (held-out CE: within '~')."""
    return close_gap(s, m, ISSUE_TARGETS.get(m.name))


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


def _per_variant(s: dict, budgets: str, ok, describe) -> tuple[bool | None, str]:
    """Roles '<variant>@<budget>' against 'default@<budget>' (retention slots): a variant meets the target when
    `ok(value, default, role, default_role)` holds at every one of `budgets`; the claim holds when some variant does.
    A variant short of a budget is not judged."""
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
    return (any(met.values()) if met else None), why


def retention_ahead(s: dict, m: Metric, budgets: str = "", spreads: dict | None = None) -> tuple[bool | None, str]:
    """Some way of adding retention slots is ahead of the default recipe at equal total budget, at each of {budgets}, by more than the seeds' spread.

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
    return _per_variant(s, budgets, ok, describe)


def retention_within(s: dict, m: Metric, budgets: str = "", tol: float = ISSUE17_TOLERANCE) -> tuple[bool | None, str]:
    """Some way of adding retention slots is within {tol} points of the default recipe (or ahead), at each of {budgets}.

    Held-out CE: within '~' instead. Roles as retention_ahead's."""
    tol = tol if m.unit == "points" else m.near
    return _per_variant(s, budgets, lambda r, d, *_: better(d, r, m) <= tol,
                        lambda r, d, *_: f"{better(r, d, m):+.2f}")


# ----------------------------------------------------------------------------- claims
@dataclass(frozen=True)
class Claim:
    """One claim: roles -> paper rows (per backbone) and our recipes, the metrics to try, the rule."""
    text: str
    source: str
    paper: Callable[[dict], dict]  # reference tables -> {backbone: {role: score}}
    ours: dict  # role -> recipe | 'full' | 'none@<budget>', or (that, columns averaged)
    rule: Callable
    metrics: tuple = ("CR", CE.name)
    paper_metric: str = "CR"
    note: str = ""
    seeded: bool = False  # the rule takes `spreads` (role -> sample std over its seeds) and judges against it


def std_rows(ref, table: int, roles: dict, col: str = "cr", backbone: str | None = None) -> dict:
    """{backbone: {role: value}} from paper_standard.csv; roles: role -> (model, setting or None); CR is the
    mean of the five tasks where the paper prints none (Table 10)."""
    t = ref["standard"]
    t = t[(t["table"] == table) & ((t["backbone"] == backbone) if backbone else True)]
    out = {}
    for bb, g in t.groupby("backbone", sort=False):
        for role, (model, setting) in roles.items():
            r = g[(g["model"] == model) & (g["setting"].fillna("") == (setting or ""))]
            if len(r):
                r = r.iloc[0]
                v = r[col] if pd.notna(r[col]) or col != "cr" else sum(r[c] for c in REF_CR) / len(REF_CR)
                out.setdefault(bb, {})[role] = float(v)
    return out


REF_CR = ["piqa", "arc_easy", "arc_challenge", "hellaswag", "winogrande"]
STRICT = "no SWA, frozen Q/K/V"
SWA, SW64, SC, LORA = "SWA 56 + sink 8", "SWA 64", "SWA 56 + sink 8 + short conv", "SWA 56 + sink 8 + LoRA"
MECHS = {"gla": "GLA", "kgla": "kGLA", "gdn": "GDN"}
SMALLEST = "Qwen3-0.6B-Base"  # Table 10's smallest backbone, the nearest to 135M


def sniah_rows(ref, roles: dict) -> dict:
    """roles: role -> (model, budget): mean over S-NIAH-1/2/3."""
    t = ref["sniah"]
    out = {}
    for role, (model, budget) in roles.items():
        r = t[(t["model"] == model) & (t["budget"].astype(str) == str(budget))]
        if set(r["task"]) == set(SNIAH_TASKS):
            out.setdefault(r["backbone"].iloc[0], {})[role] = float(r["value"].mean())
    return out


def ruler_rows(ref) -> dict:
    t = ref["ruler"]
    g = t[t["model"] == "GDN (paper)"]
    sizes = sorted(g["budget"].astype(int))
    out = {}
    for size, b in (("small", sizes[0]), ("large", sizes[-1])):
        r = g[g["budget"].astype(int) == b].iloc[0]
        out |= {f"agg@{size}": float(r[RULER_AGG].mean()), f"ret@{size}": float(r[RULER_RET].mean()),
                f"avg@{size}": float(r["avg"])}
    return {g["backbone"].iloc[0]: out}


def pairs(keys, sides: dict, fn) -> dict:
    """The roles `beats` compares: 'X:side' -> fn(X, sides[side]) for every X and both sides."""
    return {f"{x}:{name}": fn(x, v) for x in keys for name, v in sides.items()}


def beats_sides(sides: dict):
    a, b = sides
    return partial(beats, a=a, b=b)


STRICT_MECHS = {"gdn": "GDN", "kgla": "kGLA", "gla": "GLA", "hedgehog": "Hedgehog"}
SINKS_VS_WINDOW = {"56+8": (SWA, "-w56-s8"), "64": (SW64, "-w64")}
CONV_VS_LORA = {"conv": (SC, "-w56-s8-sc"), "LoRA": (LORA, "-w56-s8-lora")}
HYBRIDS = {"hardness": "hardness", "uniform": "uniform"}
TRAINED_VS_WINDOW = {"GDN": "GDN (paper)", "window": "Sliding-window attention (no linear state)"}
FITTED_SCORER = "value.safetensors"  # checkpoints/smollm2-135m/scorers/ (docs/retention.md "A fitted scorer")
NUMBERS_SCORER = "numbers.safetensors"  # the same fit on number-valued tokens (matched to RULER's number needles)
BUDGETS = {128: "gdn-w120-s8-sc", 256: "gdn-w248-s8-sc", 512: "gdn-w504-s8-sc", 1024: "gdn-w1016-s8-sc"}
DEFAULT = {"full": ("Full attention", None), "gdn": ("GDN", SC)}


def retention_roles(budgets, cols=None) -> dict:
    """The retention rows at each total budget B (8 sinks): the default recipe (window B - 8) against retention slots
    added seven ways: trained with half the window as slots, trained with a quarter (proj_residual), trained with
    half chosen by the fitted scorer, and the default-recipe checkpoint evaluated with half its window as slots,
    training-free, with each score and both scorer files (scripts/study/recipes.txt names the trained ones; a scorer
    file by its name, as bench.specs.label_of writes it)."""
    out = {}
    for b in budgets:
        half, quarter = (b - 8) // 2, (b - 8) // 4
        free = f"{BUDGETS[b]},window={half},retain={half},retain_score="
        for variant, target in {DEFAULT_ROLE: BUDGETS[b], "trained, half as slots": f"gdn-w{half}-s8-r{half}-pr-sc",
                                "trained, a quarter as slots": f"gdn-w{b - 8 - quarter}-s8-r{quarter}-pr-sc",
                                "trained, half as slots, fitted scorer": f"gdn-w{half}-s8-r{half}-fit-sc",
                                "training-free, half as slots": free + "proj_residual",
                                "training-free, half as slots, delta_error": free + "delta_error",
                                "training-free, half as slots, fitted scorer":
                                    free + f"fitted,scorer={FITTED_SCORER}",
                                "training-free, half as slots, numbers scorer":
                                    free + f"fitted,scorer={NUMBERS_SCORER}"}.items():
            out[f"{variant}@{b}"] = (target, cols) if cols else target
    return out


ALL_BUDGETS = ", ".join(map(str, BUDGETS))
RETENTION_SOURCE = "beyond the paper (retention slots)"
ISSUE17_SEEDED = ("beyond the paper (retention slots): ahead by more than the two rows' seed stds added (the seeds column); a"
                  " row with one seed has no spread and does not meet it")


def default_recipe(col: str):
    return lambda ref: std_rows(ref, 7, DEFAULT, col) | std_rows(ref, 10, DEFAULT, col, SMALLEST)


def no_conv(col: str):
    """The paper's GDN with window 56 + 8 sinks and no conv (Table 2) against its full attention."""
    return lambda ref: std_rows(ref, 6, {"full": DEFAULT["full"], "gdn": ("GDN", SWA)}, col)


CLAIMS = [
    Claim("Strict ordering GDN > kGLA ~ GLA >> Hedgehog", "Table 1 (5)",
          lambda ref: std_rows(ref, 5, {r: (n, STRICT) for r, n in STRICT_MECHS.items()}),
          {r: r for r in STRICT_MECHS}, ordering),
    Claim("Strict ordering, GDN with the output RMSNorm (`gdn-onorm`, our addition; not in the paper)",
          "Table 1 (5)", lambda ref: std_rows(ref, 5, {r: (n, STRICT) for r, n in STRICT_MECHS.items()}),
          {r: r for r in STRICT_MECHS} | {"gdn": "gdn-onorm"}, ordering),
    Claim("SWA 56 + 8 sinks closes the CR gap to full attention", "Table 2 (6)",
          lambda ref: std_rows(ref, 6, {"full": DEFAULT["full"]} | {r: (n, SWA) for r, n in MECHS.items()}),
          {"full": "full"} | {r: f"{r}-w56-s8" for r in MECHS}, close_gap),
    Claim("Sinks beat a plain 64-token window at the same budget (56 + 8 vs 64)", "Table 2 (6)",
          lambda ref: std_rows(ref, 6, pairs(MECHS, SINKS_VS_WINDOW, lambda x, v: (MECHS[x], v[0]))),
          pairs(MECHS, SINKS_VS_WINDOW, lambda x, v: x + v[1]), beats_sides(SINKS_VS_WINDOW)),
    Claim("With the short conv the delta-rule gap almost disappears (GLA ~ kGLA ~ GDN)", "Table 3 (7)",
          lambda ref: std_rows(ref, 7, {r: (n, SC) for r, n in MECHS.items()}),
          {r: f"{r}-w56-s8-sc" for r in MECHS}, near_best),
    Claim("Short conv beats LoRA (same window + sinks)", "Table 3 (7)",
          lambda ref: std_rows(ref, 7, pairs(MECHS, CONV_VS_LORA, lambda x, v: (MECHS[x], v[0]))),
          pairs(MECHS, CONV_VS_LORA, lambda x, v: x + v[1]), beats_sides(CONV_VS_LORA),
          note="the paper: 'for most benchmarks'; LoRA had a lower learning rate (5e-4), as here"),
    Claim(f"Default recipe vs full attention: CR gap <= {ISSUE_TARGETS['CR']:g} (golinear's target)",
          "Tables 7, 10", default_recipe("cr"), {"full": "full", "gdn": "gdn-w56-s8-sc"}, issue_target),
    Claim(f"Default recipe vs full attention: LAMBADA gap <= {ISSUE_TARGETS['LAMBADA']:g} (golinear's target)",
          "Tables 7, 10", default_recipe("lambada"), {"full": "full", "gdn": "gdn-w56-s8-sc"}, issue_target,
          ("LAMBADA", CE.name), "LAMBADA"),
    Claim(f"Without the short conv (`gdn-w56-s8`, our ablation of the default recipe) vs full attention: CR gap <= "
          f"{ISSUE_TARGETS['CR']:g} (golinear's target)", "Table 2 (6)", no_conv("cr"),
          {"full": "full", "gdn": "gdn-w56-s8"}, issue_target),
    Claim(f"Without the short conv (`gdn-w56-s8`, our ablation of the default recipe) vs full attention: LAMBADA "
          f"gap <= {ISSUE_TARGETS['LAMBADA']:g} (golinear's target)", "Table 2 (6)", no_conv("lambada"),
          {"full": "full", "gdn": "gdn-w56-s8"}, issue_target, ("LAMBADA", CE.name), "LAMBADA"),
    Claim(f"The short conv on the linear path only (`gdn-w56-s8-sc-convlin`, our ablation of the default recipe) vs "
          f"full attention: CR gap <= {ISSUE_TARGETS['CR']:g} (golinear's target)", "Tables 7, 10",
          default_recipe("cr"), {"full": "full", "gdn": "gdn-w56-s8-sc-convlin"}, issue_target),
    Claim(f"The short conv on the linear path only (`gdn-w56-s8-sc-convlin`, our ablation of the default recipe) vs "
          f"full attention: LAMBADA gap <= {ISSUE_TARGETS['LAMBADA']:g} (golinear's target)", "Tables 7, 10",
          default_recipe("lambada"), {"full": "full", "gdn": "gdn-w56-s8-sc-convlin"}, issue_target,
          ("LAMBADA", CE.name), "LAMBADA"),
    Claim("Hardness-selected hybrids beat uniform ones at 10 % and 20 % full layers (LAMBADA)", "Figure 5",
          lambda ref: {}, pairs(("10%", "20%"), HYBRIDS, lambda x, v: f"gdn-full{x[:-1]}-{v}"),
          beats_sides(HYBRIDS), ("LAMBADA", CE.name), "LAMBADA",
          "Figure 5 is a plot: no numbers transcribed in leaderboards/reference"),
    Claim("S-NIAH (mean of 1/2/3, 4K) rises with the cache budget", "Table 8",
          lambda ref: sniah_rows(ref, {f"b{b}": ("GDN (paper)", b) for b in BUDGETS}),
          {f"b{b}": rec for b, rec in BUDGETS.items()}, rises, ("S-NIAH", CE.name), "S-NIAH"),
    Claim("S-NIAH above the untrained window + sinks at the same budget", "Table 8",
          lambda ref: sniah_rows(ref, pairs((128, 256, 512), TRAINED_VS_WINDOW, lambda b, model: (model, b))),
          pairs(BUDGETS, TRAINED_VS_WINDOW, lambda b, v: BUDGETS[b] if v == "GDN (paper)" else f"none@{b}"),
          beats_sides(TRAINED_VS_WINDOW), ("S-NIAH",), "S-NIAH"),
    Claim("RULER profile: aggregation/QA (CWE, FWE, HQA, SQA) >> retrieval (MK, MQ, MV, VT), average rising "
          "with the budget", "Table 9", ruler_rows,
          {f"{k}@{size}": (BUDGETS[b], cols) for size, b in (("small", 128), ("large", 1024))
           for k, cols in (("agg", RULER_AGG), ("ret", RULER_RET), ("avg", RULER_COLS))},
          ruler_profile, ("RULER",), "RULER", "the paper's budgets 128 and 896; ours 128 and 1024"),
    Claim("Retention slots beat the default recipe's S-NIAH mean at equal total budget 256 and 512 (golinear's "
          "target)", "beyond the paper", lambda ref: {}, retention_roles((256, 512)),
          partial(retention_ahead, budgets="256, 512"), ("S-NIAH",), "S-NIAH", ISSUE17_SEEDED, seeded=True),
    Claim("Retention slots beat the default recipe's MQ/MV/VT mean at equal total budget 1024 (golinear's target)",
          "beyond the paper", lambda ref: {}, retention_roles((1024,), ["MQ", "MV", "VT"]),
          partial(retention_ahead, budgets="1024"), ("RULER",), "RULER", ISSUE17_SEEDED, seeded=True),
    Claim(f"Retention slots keep CR within {ISSUE17_TOLERANCE:g} points of the default recipe at equal total budget "
          "(golinear's target)", "beyond the paper", lambda ref: {}, retention_roles(BUDGETS),
          partial(retention_within, budgets=ALL_BUDGETS, tol=ISSUE17_TOLERANCE), ("CR", CE.name), "CR", RETENTION_SOURCE),
    Claim(f"Retention slots keep LAMBADA within {ISSUE17_TOLERANCE:g} points of the default recipe at equal total "
          "budget (golinear's target)", "beyond the paper", lambda ref: {}, retention_roles(BUDGETS),
          partial(retention_within, budgets=ALL_BUDGETS, tol=ISSUE17_TOLERANCE), ("LAMBADA", CE.name), "LAMBADA",
          RETENTION_SOURCE),
]


# ----------------------------------------------------------------------------- our evidence
@dataclass
class Run:
    name: str
    steps: int
    requested: int
    heldout: float | None
    full_attention_heldout: float | None
    seed: int = 0
    files: str = ""  # the folder's files hash, as store keys name it (`checkpoint_files=`)

    @property
    def finished(self) -> bool:
        return self.steps >= self.requested


@dataclass
class Evidence:
    """Our numbers: the checkpoints' runs by recipe and the store's long frame."""
    runs: dict = field(default_factory=dict)  # recipe -> [Run]
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)


def load_runs(checkpoints: Path) -> dict:
    """recipe -> its runs, from every `<folder>/train_config.json`."""
    runs = {}
    for cfg in sorted(Path(checkpoints).glob("*/train_config.json")):
        try:
            c = json.loads(cfg.read_text())
            res, s = c.get("results", {}), c.get("summary", {})
            run = Run(cfg.parent.name, int(s.get("step", 0)), int(c["train"]["steps"]),
                      res.get("heldout_loss_trained"), res.get("heldout_loss_full_attention"),
                      int(c["train"].get("seed", 0)), checkpoint_identity(cfg.parent) or "")
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{cfg}: not a `golinear train` record ({type(e).__name__}: {e})") from None
        runs.setdefault(RUN_NAME.match(run.name)["recipe"], []).append(run)
    return runs


def pick(runs: list[Run]) -> list[Run]:
    """The finished runs, one per seed (the first folder name of a seed: `<recipe>` before `<recipe>-10m`),
    else the longest run."""
    done = list({r.seed: r for r in sorted(runs, key=lambda r: r.name, reverse=True) if r.finished}.values())
    return sorted(done, key=lambda r: r.name) or sorted(runs, key=lambda r: -r.steps)[:1]


def store_value(frame: pd.DataFrame, target: str, metric: str, cols, run: Run | None = None) -> float | None:
    """Mean of `cols` for one model in the store, None unless every column is there (full sets only; a
    checkpoint's cells only when they are of the folder's current files)."""
    if frame.empty:
        return None
    cols = cols or {"CR": CR_COLS, "LAMBADA": ["LAMBADA"], "S-NIAH": SNIAH_TASKS, "RULER": RULER_COLS}[metric]
    f = frame[frame["limit"].isna()]
    if target == "full":
        f = f[f["full_attention"]]
    elif target.startswith("none@"):
        f = f[f["model_key"].str.contains("mechanism=none") & (f["budget"] == target[5:])]
    else:  # cache options after the recipe (a training-free row) are part of the family name
        opts = target[len(recipe_of(target)):]
        f = f[f["model_key"].str.contains(f"checkpoint_files={run.files}", regex=False)
              & (f["family"] == run.name + opts)]
    vals = f.groupby("column")["value"].mean()
    return float(vals[cols].mean()) if all(c in vals for c in cols) else None


def recipe_of(target: str) -> str:
    """A role's recipe: the target before any cache options (`gdn-w248-s8-sc,window=124,retain=124`)."""
    return target.split(",")[0]


def role_scores(ev: Evidence, target: str, cols, metric: str) -> tuple[list[float], str]:
    """Our values for one role under one metric (one per seed) and a label of where they come from."""
    recipe = recipe_of(target)
    if metric == CE.name:
        if recipe != target:  # cache options change no parameter: the folder's held-out CE is not this row's
            return [], ""
        if target == "full":
            vals = sorted({r.full_attention_heldout for rs in ev.runs.values() for r in rs} - {None})
            return vals[:1], "frozen full attention"
        runs = [r for r in pick(ev.runs.get(target, [])) if r.heldout is not None]
        return [r.heldout for r in runs], label(runs)
    if target == "full" or target.startswith("none@"):
        v = store_value(ev.frame, target, metric, cols)
        return ([] if v is None else [v]), ""
    runs = pick([r for r in ev.runs.get(recipe, []) if store_value(ev.frame, target, metric, cols, r) is not None])
    waiting = [r for r in pick(ev.runs.get(recipe, [])) if r.finished and r not in runs]
    return ([store_value(ev.frame, target, metric, cols, r) for r in runs],
            label(runs) + (f"; not yet evaluated: {label(waiting)}" if runs and waiting else ""))


def label(runs: list[Run]) -> str:
    if len(runs) == 1 and not runs[0].finished:
        return f"`{runs[0].name}`, {runs[0].steps} of {runs[0].requested} steps"
    return ", ".join(f"`{r.name}`" for r in runs)


def spread(vals: list[float]) -> str:
    if len(vals) < 2:
        return ""
    return f"{statistics.mean(vals):.4f} +- {statistics.stdev(vals):.4f} ({len(vals)} seeds)"


# ----------------------------------------------------------------------------- the table
def verdict(ok: bool | None, metric: str) -> str:
    if ok is None:
        return VERDICTS[4]
    return VERDICTS[(0 if ok else 1) + (2 if metric == CE.name else 0)]


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


def evidence(store: Store, checkpoints: Path) -> Evidence:
    return Evidence(load_runs(checkpoints), measured_frame(store.cells()))


def claims_table(store: Store, checkpoints: Path, reference_dir, ev: Evidence | None = None,
                 ref: dict | None = None) -> pd.DataFrame:
    ev = ev or evidence(store, checkpoints)
    ref = ref or load_reference(reference_dir)
    return pd.DataFrame([judge(c, ref, ev) for c in CLAIMS])


def rule_text(rule) -> str:
    """The rule's docstring's first line, naming the pair it compares when it is a partial of `beats`."""
    func = getattr(rule, "func", rule)
    pair = getattr(rule, "keywords", {})
    doc = (func.__doc__ or func.__name__).strip().splitlines()[0]
    return doc.format(**pair) if pair else doc


def md_table(table: pd.DataFrame) -> str:
    """A plain pipe table (no padding: the cells are long sentences)."""
    cell = lambda v: str(v).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in table.itertuples(index=False)])


def to_markdown(table: pd.DataFrame) -> str:
    rules = "\n".join(f"- {m.name}: '~' within {m.near:g} {m.unit}, '>>' ahead by at least {m.far:g} {m.unit}"
                      for m in METRICS.values())
    rules += ("\n- golinear's targets, default recipe vs full attention: "
              + ", ".join(f"{k} gap <= {v:g} points" for k, v in ISSUE_TARGETS.items())
              + "\n- the held-out CE margins are chosen here (the paper reports no loss); the default recipe's "
              "seeds differ by far less (its seeds column)")
    return ("# The paper's claims at 135M\n\n"
            "Generated by `golinear claims` (bench/claims.py) from leaderboards/reference/*.csv (the paper), the "
            "result store (the paper's metrics, full test sets) and checkpoints/smollm2-135m/*/train_config.json "
            "(held-out cross-entropy on 16 x 4096 tokens of held-out books: not the paper's metric, and a proxy "
            "that favours the trained rows, whose new parameters saw that domain while frozen full attention did "
            "not). Where a claim's metric is not in the store yet, the verdict says 'on held-out CE'. The rule "
            "is applied to the paper's numbers too. Seeds: mean +- sample std over the recipe's finished seed "
            "folders; a run short of its requested steps is named with its steps. `none@B`: the untrained "
            "window + sinks (mechanism=none) at cache budget B. Margins the rules use:\n\n" + rules + "\n\n"
            + md_table(table) + "\n")


README_BEGIN, README_END = "<!-- claims table: generated by golinear claims -->", "<!-- end of claims table -->"
README_COLS = {"claim": "claim", "rule on the paper's numbers": "the rule on the paper's numbers",
               "ours at 135M": "ours at 135M", "seeds": "seeds", "verdict": "verdict"}


def readme_with_table(readme: str, table: pd.DataFrame) -> str:
    """The README with the compact claims table between its two markers (a README without them: unchanged)."""
    if README_BEGIN not in readme or README_END not in readme:
        return readme
    head, rest = readme.split(README_BEGIN, 1)
    compact = table[list(README_COLS)].rename(columns=README_COLS)
    return head + README_BEGIN + "\n" + md_table(compact) + "\n" + README_END + rest.split(README_END, 1)[1]


def render(store, checkpoints, out_dir, reference_dir, readme: Path | None = None) -> list[Path]:
    store = store if isinstance(store, Store) else Store(store)
    for what, p in (("result store", store.root), ("checkpoints folder", Path(checkpoints)),
                    ("reference folder", Path(reference_dir))):
        if not Path(p).is_dir():
            raise FileNotFoundError(f"{what} {str(p)!r} does not exist")
    for name in ("standard", "sniah", "ruler"):
        if not (Path(reference_dir) / f"paper_{name}.csv").is_file():
            raise FileNotFoundError(f"reference file {str(Path(reference_dir) / f'paper_{name}.csv')!r} is missing")
    from bench import paper_tables, retention_plot, retention_table, seeds  # here: they import this module
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
    files += ((out_dir / "retention.md", retention_table.to_markdown(retention)),
              (out_dir / "retention.csv", to_csv(retention)))
    png = retention_plot.plot(retention)
    files += ((out_dir / "retention.png", png),) if png else ()
    if readme is not None and Path(readme).is_file():
        from bench.readme_results import readme_with_results  # the README's compact results table
        files += ((Path(readme), readme_with_results(readme_with_table(Path(readme).read_text(), table), out_dir)),)
    return [p for p, data in files if write_if_changed(p, data)]


def main(args) -> int:
    changed = render(args.store, args.checkpoints, args.out, args.reference_dir, args.readme or None)
    print(f"golinear claims: {len(changed)} file(s) changed ({args.out}: claims.md/.csv, seeds.md/.csv, "
          f"tables.md/.csv, retention.md/.csv/.png; the table in {args.readme or 'no README'})")
    return 0
