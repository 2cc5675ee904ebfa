"""The host's share of `golinear generation`'s batched row: the real LinearizedLM.generate_until on real S-NIAH-1
requests (built as bench/generation.py builds them), with the decoder replaced by a stand-in that answers at once,
so only host work is timed (lm-eval's Collator, tokenization, padding, unpadding, stop checks, decoding the
continuations). The stand-in answers what the trained default recipe does at 4K: a few tokens, then EOS.

    .venv/bin/python scripts/gpu/profile_host.py --samples 96 --batch-size 32 --context-length 4096

prints the host seconds per batch (best of --repeats, after one untimed pass), the share of it that is the
up-front tokenization (and what that takes with the tokenizer's parallelism off), and cProfile's top costs.
--device cuda (on the GPU host) puts the batches on the GPU as `golinear generation` does, so the device copies
and syncs of the host path are in the timing; the model is loaded there but never run.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.getcwd())
import models.fast_decode  # noqa: E402
from bench.cli_args import DEFAULT_LINEAR  # noqa: E402
from bench.generation import _requests  # noqa: E402
from bench.lm_backend import make_lm  # noqa: E402
from bench.specs import parse_model_spec  # noqa: E402

ANSWER = " The special magic number is"  # the stand-in's tokens before EOS (the default recipe stops after ~4)


class InstantDecoder:
    """FastDecoder's interface for models.batch_generate, no model work: every row emits ANSWER's tokens, then
    EOS. use_graph=True: the host checks the tokens every 16 steps, as on CUDA."""

    use_graph = True

    def __init__(self, model, tokens: list[int]):
        self.device, self.max_len, self.tokens, self.made = model.device, 0, tokens, 0

    def _next(self, batch: int, n: int) -> torch.Tensor:
        cols = [self.tokens[min(self.made + i, len(self.tokens) - 1)] for i in range(n)]
        self.made += n
        return torch.tensor(cols, dtype=torch.long, device=self.device).expand(batch, n).contiguous()

    def prefill(self, ids, lengths):
        self.batch, self.made = ids.shape[0], 0
        return self._next(self.batch, 1)

    def decode(self, n: int):
        return self._next(self.batch, n)


def _set_env(name: str, value):
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--context-length", type=int, default=4096)
    p.add_argument("--linear", default=DEFAULT_LINEAR)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    spec = parse_model_spec(a.linear)
    lm = make_lm("linearized", **spec.model_args(), generation="batched", dtype="float32", device=a.device,
                 batch_size=a.batch_size)
    tokens = lm.tokenizer(ANSWER, add_special_tokens=False)["input_ids"] + [lm.tokenizer.eos_token_id]
    models.fast_decode.FastDecoder = lambda model: InstantDecoder(model, tokens)  # the backend imports it per call
    _, reqs = _requests(SimpleNamespace(context_length=a.context_length, samples=a.samples, seed=a.seed,
                                        data_dir=a.data_dir), lm.tokenizer)
    batches = -(-len(reqs) // a.batch_size)
    outs = lm.generate_until(reqs, disable_tqdm=True)  # untimed: first-call costs (imports, caches)
    assert all(o == ANSWER for o in outs), outs[:3]
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        lm.generate_until(reqs, disable_tqdm=True)
        times.append(time.perf_counter() - t0)
    best = min(times)
    contexts = [r.args[0] for r in reqs]
    tok, given = {}, os.environ.get("TOKENIZERS_PARALLELISM")
    for label, value in (("parallel", given), ("one thread", "false")):
        _set_env("TOKENIZERS_PARALLELISM", value)
        t0 = time.perf_counter()
        lm._encode_strings(contexts)
        tok[label] = time.perf_counter() - t0
    _set_env("TOKENIZERS_PARALLELISM", given)
    print(f"host only ({a.device}): {len(reqs)} requests of {a.context_length} tokens, batch {a.batch_size} "
          f"({batches} batches): best {best:.3f} s of {[round(t, 3) for t in times]} -> {best / batches:.3f} s per "
          f"batch, of which the up-front tokenization {tok['parallel'] / batches:.3f} s per batch "
          f"({tok['one thread'] / batches:.3f} s with TOKENIZERS_PARALLELISM=false); {os.cpu_count()} CPUs, torch "
          f"threads {torch.get_num_threads()}, TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM')}",
          flush=True)
    prof = cProfile.Profile()
    prof.runcall(lm.generate_until, reqs, disable_tqdm=True)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(a.top)
    pstats.Stats(prof).sort_stats("tottime").print_stats(a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
