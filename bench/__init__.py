"""The CLI, runners, store, sweeps, rendering and regression checks."""
import os

# lm-eval bootstraps a metric's stderr (LAMBADA's perplexity) in a multiprocessing Pool of cpu_count() workers,
# forked from a process whose torch and tokenizers threads are running: in `make test` one such worker sat on a
# futex and the run never ended. lm-eval's own switch draws the same seeded resamples in the process (~1 s).
os.environ.setdefault("DISABLE_MULTIPROC", "1")
