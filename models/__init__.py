"""Backbones, mechanisms, the decode state, training and diagnostics."""
import os

# Set before any tokenizer runs, not at first use: with TOKENIZERS_PARALLELISM unset, the tokenizers library's fork
# handler rewrites the environment (and warns) in every child forked after a parallel encode. A user's choice is kept.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
# Triton's autotuner (FLA's chunk kernels, golinear's own) times every candidate configuration in each new process:
# most of the first cell of a linearized row. Its timings are kept in Triton's cache folder, so the next process on
# the machine picks the same configurations without timing them again. A user's choice is kept.
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
# torch >= 2.10 puts cuDNN first among SDPA's kernels on Hopper and Blackwell (cuDNN > 9.15), and cuDNN builds an
# attention plan for every new key length: each decode step of a growing cache (Hugging Face's DynamicCache: the
# `full` latency row, HF generate, lm-eval's generation, kvpress's reference path) and each new padded prompt length
# paid one, about 100 ms a step at Llama-3.1-8B dimensions on an H100 (docs/speed.md). Flash attention needs no
# plan. Read once per process, at the first SDPA call; a user's choice is kept.
os.environ.setdefault("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
