"""Backbones, mechanisms, the decode state, training and diagnostics."""
import os

# Set before any tokenizer runs, not at first use: with TOKENIZERS_PARALLELISM unset, the tokenizers library's fork
# handler rewrites the environment (and warns) in every child forked after a parallel encode. A user's choice is kept.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
# Triton's autotuner (FLA's chunk kernels, golinear's own) times every candidate configuration in each new process:
# most of the first cell of a linearized row. Its timings are kept in Triton's cache folder, so the next process on
# the machine picks the same configurations without timing them again. A user's choice is kept.
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
