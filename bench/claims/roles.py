"""The names a claim uses: the paper's settings, our recipes' folder names, and the roles built from them.

Why its own module: the claims, the paper tables and the retention table name the same rows (the default recipe at
each cache budget, the seven ways of adding retention slots); one list, read by all of them.
"""
from __future__ import annotations

from golinear.bench.boards.fitted_format import fitted_label, fitted_value_type, needle_value_types
from golinear.bench.boards.measured import RULER_COLS, SNIAH_TASKS

DEFAULT_ROLE = "default"  # the retention rows are judged against this variant (the default recipe)
RULER_AGG, RULER_RET = ["CWE", "FWE", "HQA", "SQA"], ["MK", "MQ", "MV", "VT"]
REF_CR = ["piqa", "arc_easy", "arc_challenge", "hellaswag", "winogrande"]
STRICT = "no SWA, frozen Q/K/V"
SWA, SW64, SC, LORA = "SWA 56 + sink 8", "SWA 64", "SWA 56 + sink 8 + short conv", "SWA 56 + sink 8 + LoRA"
MECHS = {"gla": "GLA", "kgla": "kGLA", "gdn": "GDN"}
SMALLEST = "Qwen3-0.6B-Base"  # Table 10's smallest backbone, the nearest to 135M


def pairs(keys, sides: dict, fn) -> dict:
    """The roles `beats` compares: 'X:side' -> fn(X, sides[side]) for every X and both sides."""
    return {f"{x}:{name}": fn(x, v) for x in keys for name, v in sides.items()}


STRICT_MECHS = {"gdn": "GDN", "kgla": "kGLA", "gla": "GLA", "hedgehog": "Hedgehog"}
SINKS_VS_WINDOW = {"56+8": (SWA, "-w56-s8"), "64": (SW64, "-w64")}
CONV_VS_LORA = {"conv": (SC, "-w56-s8-sc"), "LoRA": (LORA, "-w56-s8-lora")}
HYBRIDS = {"hardness": "hardness", "uniform": "uniform"}
TRAINED_VS_WINDOW = {"GDN": "GDN (paper)", "window": "Sliding-window attention (no linear state)"}
FITTED_SCORER = "value.safetensors"  # checkpoints/smollm2-135m/scorers/ (docs/retention.md "A fitted scorer")
NUMBERS_SCORER = "numbers.safetensors"  # the same fit on number-valued tokens (matched to RULER's number needles)
RETENTION_VALUE_TYPES = SNIAH_TASKS + RULER_COLS  # the tasks the retention rows are tested on (their needles)
BUDGETS = {128: "gdn-w120-s8-sc", 256: "gdn-w248-s8-sc", 512: "gdn-w504-s8-sc", 1024: "gdn-w1016-s8-sc"}
DEFAULT = {"full": ("Full attention", None), "gdn": ("GDN", SC)}


def retention_roles(budgets, cols=None) -> dict:
    """The retention rows at each total budget B (8 sinks): the default recipe (window B - 8) against retention slots
    added seven ways: trained with half the window as slots, trained with a quarter (proj_residual), trained with
    half chosen by the fitted scorer, and the default-recipe checkpoint evaluated with half its window as slots,
    training-free, with each score and both scorer files (scripts/study/recipes.txt names the trained ones; a scorer
    file by its name, as bench.run.specs.label_of writes it)."""
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
            label = fitted_label(variant, fitted_value_type(target), needle_value_types(RETENTION_VALUE_TYPES))
            out[f"{label}@{b}"] = (target, cols) if cols else target
    return out


ALL_BUDGETS = ", ".join(map(str, BUDGETS))
FITTED_TO_TEST = (NUMBERS_SCORER,)  # scorers fitted on values of the test's needle format (7-digit numbers)


def fitted_to_test(target: str) -> bool:
    """A role whose retention scorer was fitted on the needle values' own format (its verdict says so)."""
    return any(f"scorer={name}" in target for name in FITTED_TO_TEST)
