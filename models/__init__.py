"""Backbones, mechanisms, the decode state, training and diagnostics."""
import os

# Set before any tokenizer runs, not at first use: with TOKENIZERS_PARALLELISM unset, the tokenizers library's fork
# handler rewrites the environment in every child forked after a parallel encode (the git, pip and lscpu probes
# before their exec), and such children hung before their exec in two test runs. A user's own choice is kept.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
