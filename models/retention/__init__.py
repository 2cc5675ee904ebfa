"""Retention slots, together: the ops (ops.py the definition; static.py, rows.py, prefill.py, prefill_rows.py the
static-shape, per-row and prefill forms), the fitted scorers' files (scorer.py) and the decoder that serves them
(generate.py). The policies that choose what a slot keeps are models/cache/policies/, one a file."""
