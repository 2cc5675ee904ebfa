"""golinear's lm-eval backends (`golinear-hf`, `linearized`, `golinear-press`) and lm-eval's own command line
with them registered (`golinear lm-eval`)."""
