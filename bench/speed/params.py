"""`golinear params`: new-parameter counts per mechanism next to the paper's (Table 1, 3).

Counts are computed by linearizing the named configuration on the meta device (no memory).
"""
from __future__ import annotations

from tabulate import tabulate

from golinear.models.attention.linearize import LinearizeConfig, count_for_config

# Table 1 (no SWA, frozen q/k/v) and Table 3 (short conv), in millions, as the paper prints them.
PAPER = {
    ("llama-3.1-8b", "gla", False): 4.3, ("llama-3.1-8b", "kgla", False): 8.5,
    ("llama-3.1-8b", "gdn", False): 8.5, ("llama-3.1-8b", "hedgehog", False): 10.6,
    ("qwen3-8b", "gla", False): 4.7, ("qwen3-8b", "kgla", False): 9.6,
    ("qwen3-8b", "gdn", False): 9.6, ("qwen3-8b", "hedgehog", False): 11.9,
    ("llama-3.1-8b", "gla", True): 6.1, ("llama-3.1-8b", "kgla", True): 10.3, ("llama-3.1-8b", "gdn", True): 10.3,
    ("qwen3-8b", "gla", True): 6.9, ("qwen3-8b", "kgla", True): 11.6, ("qwen3-8b", "gdn", True): 11.6,
}
MECHANISMS = ("gla", "kgla", "gdn", "hedgehog")


def table(configs=("llama-3.1-8b", "qwen3-8b", "smollm2-135m")) -> list[dict]:
    rows = []
    for name in configs:
        for conv in (False, True):
            for mech in MECHANISMS:
                if conv and mech == "hedgehog":
                    continue
                n = count_for_config(name, LinearizeConfig(mechanism=mech, short_conv=conv))
                paper = PAPER.get((name, mech, conv))
                rows.append({"backbone": name, "mechanism": mech + (" + SC" if conv else ""),
                             "golinear (M)": round(n / 1e6, 3), "paper (M)": paper,
                             "diff (M)": None if paper is None else round(n / 1e6 - paper, 2)})
    return rows


def main(args) -> int:
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    print(tabulate(table(configs), headers="keys", tablefmt="github", missingval="-"))
    return 0
