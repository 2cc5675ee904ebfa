"""Running evaluations: the plan of cells, one cell through lm-eval, its provenance and request cache, and the
table a run ends with (`golinear run`)."""
