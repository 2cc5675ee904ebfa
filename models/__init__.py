"""Backbones, mechanisms, the decode state, training and diagnostics."""
import os

# Set before any tokenizer runs, not at first use: with TOKENIZERS_PARALLELISM unset, the tokenizers library's fork
# handler rewrites the environment (and warns) in every child forked after a parallel encode. A user's choice is kept.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
