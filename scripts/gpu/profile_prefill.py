"""Where batched generation spends its time on the GPU (SmolLM2-135M sizes, random bf16 weights, S-NIAH-like
batches: 32 prompts of 3,900-4,096 tokens): per-batch wall time of generate_batch for full-static and
gdn-default, the prefill alone, a plain HF forward for scale, and torch.profiler's top kernels/ops of one
prefill. Run on the device: python3 scripts/gpu/profile_prefill.py (PROFILE_CONFIGS, PROFILE_BATCHES env).
A name ending in "-plain" runs that config with GOLINEAR_FAST_PREFILL=0 (the prefill without FLA's conv, rotary
and l2norm kernels), so before/after is one call: PROFILE_CONFIGS=gdn-default-plain,gdn-default."""
from __future__ import annotations

import os
import random
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
from models.backbone import random_backbone  # noqa: E402
from models.batch_generate import generate_batch  # noqa: E402
from models.fast_decode import FastDecoder  # noqa: E402
from models.linearize import LinearizeConfig, linearize  # noqa: E402

CONFIGS = {"full-static": None, "gdn-default": LinearizeConfig(mechanism="gdn", window=56, sinks=8, short_conv=True),
           "gdn": LinearizeConfig(mechanism="gdn")}
B = int(os.environ.get("PROFILE_BATCH", "32"))


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


LO, HI = (int(x) for x in os.environ.get("PROFILE_LENS", "3900,4096").split(","))


def prompts(rng, n=B):
    return [[rng.randrange(1, 49000) for _ in range(rng.randrange(LO, HI + 1))] for _ in range(n)]


def main():
    rng = random.Random(0)
    for name in os.environ.get("PROFILE_CONFIGS", "full-static,gdn-default-plain,gdn-default").split(","):
        plain = name.endswith("-plain")
        os.environ["GOLINEAR_FAST_PREFILL"] = "0" if plain else "1"
        config = CONFIGS[name.removesuffix("-plain")]
        model = random_backbone("smollm2-135m", dtype=torch.bfloat16, device="cuda")
        if config is not None:
            linearize(model, config)
            model.to(device="cuda", dtype=torch.bfloat16)
        new = 5 if config is not None else 40
        dec = FastDecoder(model)
        dec.max_len = 5120
        for pad in (int(x) for x in os.environ.get("PROFILE_PAD", "64").split(",")):
            for i in range(int(os.environ.get("PROFILE_BATCHES", "5"))):
                n = int(os.environ.get("PROFILE_LAST", B)) if i == int(os.environ.get("PROFILE_BATCHES", "5")) - 1 else B
                ps = prompts(rng, n)
                w = -(-max(map(len, ps)) // pad) * pad
                d = dec if n == B else FastDecoder(model)
                d.max_len = 5120
                t, _ = timed(lambda: generate_batch(d, ps, new, pad_to=pad))
                print(f"{name}: pad_to {pad} batch {i} rows {n} width {w}: generate_batch {t:.3f} s "
                      f"({n / t:.1f} samples/s)", flush=True)
        ps = prompts(rng)
        ids = torch.zeros(B, 4096, dtype=torch.long, device="cuda")
        for b, p in enumerate(ps):
            ids[b, :len(p)] = torch.tensor(p)
        lens = [len(p) for p in ps]
        for label, ln in (("varlen", lens), ("uniform", None)):
            timed(lambda: dec.prefill(ids, ln))
            t, _ = timed(lambda: dec.prefill(ids, ln))
            print(f"{name}: prefill {label} [{B}, 4096] {t * 1e3:.1f} ms", flush=True)
        t, _ = timed(lambda: dec.decode(4))
        print(f"{name}: decode 4 steps {t * 1e3:.1f} ms", flush=True)
        with torch.no_grad():
            t, _ = timed(lambda: model.model(input_ids=ids[:8]))
            t, _ = timed(lambda: model.model(input_ids=ids[:8]))
        print(f"{name}: model.model forward [8, 4096] {t * 1e3:.1f} ms", flush=True)
        if os.environ.get("PROFILE_SKIP_PROF"):
            continue
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            dec.prefill(ids, lens)
            torch.cuda.synchronize()
        ev = prof.key_averages()
        kernels = [e for e in ev if str(getattr(e, "device_type", "")).endswith("CUDA")]
        print(f"{name}: profiled prefill: GPU busy {sum(e.self_device_time_total for e in kernels) / 1e3:.1f} ms, "
              f"{sum(e.count for e in kernels)} kernels")
        print(ev.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=80))
        print(ev.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=80))
        del dec, model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
