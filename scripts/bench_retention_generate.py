"""Batched decoding of a model with retention slots (models.retention.generate) against HF generate one prompt at a
time: wall time of each phase and how many generations are identical. Prompts are random token ids of slightly
different lengths; no EOS. Default model: an untrained SmolLM2 linearization (gdn, sinks 8, window 48, retain 8,
short conv); `--checkpoint` + `--window/--retain` time a trained one with slots instead (the study's S-NIAH rows).

    .venv/bin/python scripts/bench_retention_generate.py --score proj_residual --batch 4 --length 256 --new 32
    python3 scripts/bench_retention_generate.py --device cuda --dtype bfloat16 --checkpoint \
        checkpoints/smollm2-135m/gdn-w248-s8-sc --window 124 --retain 124 --batch 8 --length 4096 --new 16 --no-alone

Phases printed: the prefill (one right-padded pass for proj_residual, `--each` or delta_error: each prompt
alone), the first decode call (torch.compile and the CUDA-graph capture
happen there on CUDA), then the steady decode (ms per step); each twice (two batches) so that one-time costs show.
GOLINEAR_FUSED_DECODE=0 turns the compiled step off (the eager in-place step, still in the graph).
"""
from __future__ import annotations

import argparse
import faulthandler
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from golinear.models.decoding.batch_generate import decoder_for, generate_batch, pad_rows  # noqa: E402
from golinear.models.load import load_model  # noqa: E402
from golinear.models.spec import RETAIN_SCORES  # noqa: E402


def sync(device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


def phases(model, prompts, new: int, device: str, each: bool = False) -> str:
    """One batch through RetentionDecoder, timed by phase (each: every prompt prefilled alone)."""
    dec = decoder_for(model)
    dec.one_pass = not each
    ids, _ = pad_rows(prompts, 0)
    ids = ids.to(model.device)
    t0 = sync(device)
    dec.prefill(ids, [len(p) for p in prompts])
    t1 = sync(device)
    dec.decode(1)
    t2 = sync(device)
    dec.decode(new - 1)
    t3 = sync(device)
    return (f"prefill ({dec.prefill_mode}) {t1 - t0:.2f} s ({(t1 - t0) / len(prompts):.3f} s a prompt), "
            f"first step {t2 - t1:.2f} s, "
            f"then {1e3 * (t3 - t2) / max(1, new - 1):.1f} ms/step")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--score", default="proj_residual", choices=RETAIN_SCORES)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=256, help="the longest prompt; row b has length - 7 b tokens")
    p.add_argument("--new", type=int, default=32, help="greedy tokens per prompt")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--checkpoint", help="a trained checkpoint folder, given --window and --retain as cache options")
    p.add_argument("--window", type=int, default=48)
    p.add_argument("--retain", type=int, default=8)
    p.add_argument("--no-alone", action="store_true", help="time the batched phases only (no HF generate)")
    p.add_argument("--each", action="store_true", help="also time the phases with each prompt prefilled alone")
    p.add_argument("--dump-every", type=float, default=0,
                   help="print every thread's stack every this many seconds (a stalled phase shows where)")
    a = p.parse_args(argv)
    if a.dump_every > 0:
        faulthandler.dump_traceback_later(a.dump_every, repeat=True)
    if a.length - 7 * (a.batch - 1) < 1:
        raise SystemExit(f"--length {a.length} leaves no tokens for row {a.batch - 1}; use >= {7 * a.batch - 6}")
    cache = dict(window=a.window, retain=a.retain, retain_score=a.score)
    if a.checkpoint:
        model, _, _ = load_model(checkpoint=a.checkpoint, dtype=a.dtype, device=a.device, **cache)
    else:
        model, _, _ = load_model(mechanism="gdn", sinks=8, short_conv=True, dtype=a.dtype, device=a.device, seed=0,
                                 **cache)
    model.generation_config.eos_token_id = None  # every row generates --new tokens on both paths
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (a.length - 7 * b,), generator=g).tolist() for b in range(a.batch)]
    head = f"score={a.score} window={a.window} retain={a.retain} batch={a.batch} length<={a.length} new={a.new} " \
           f"{a.device} {a.dtype}"
    with torch.no_grad():
        for each in (False, True) if a.each else (False,):
            for i in (1, 2):
                print(f"{head}, batch {i}: {phases(model, prompts, a.new, a.device, each)}", flush=True)
        if a.no_alone:
            return
        t0 = sync(a.device)
        batched = generate_batch(decoder_for(model), prompts, a.new)
        t_batched = sync(a.device) - t0
        t0 = sync(a.device)
        alone = [model.generate(torch.tensor([q], device=model.device), max_new_tokens=a.new, do_sample=False,
                                pad_token_id=0)[0, len(q):].tolist() for q in prompts]
        t_alone = sync(a.device) - t0
    same = sum(x == y for x, y in zip(batched, alone))
    print(f"{head}: batched {t_batched:.1f} s, one at a time {t_alone:.1f} s ({t_alone / t_batched:.2f}x), "
          f"identical {same}/{a.batch}")


if __name__ == "__main__":
    main()
