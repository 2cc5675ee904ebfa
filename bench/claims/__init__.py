"""`golinear claims`: each claim of the paper beside our evidence at 135M, with a verdict computed by a rule.

Every number comes from a file: the paper's from leaderboards/reference/*.csv, ours from the result store (the
paper's metrics) or, where the store has no row yet, from the checkpoints' `train_config.json` (held-out
cross-entropy on the held-out books: NOT the paper's metric, and labelled so). A claim names roles (gdn, kgla, ...),
found in the paper's tables and in our recipes, and one rule that turns {role: score} into a verdict; the same rule
is applied to the paper's own numbers, so a reader sees whether the rule is a fair reading.

One-way layers: metrics and roles (names) -> rules -> the claims (catalog) and the paper's rows (paper_rows) ->
evidence (our runs and cells) -> scoring (a claim's roles under one metric) -> caveats and targets (a several-part
target: one variant must meet every part) -> verdicts -> renderers (page, seeds, paper_tables, retention_table,
retention_plot) -> render (`golinear claims`).
"""
