"""Where a default-recipe training step spends its time on the GPU (SmolLM2-135M sizes, random weights,
T=4096, bf16 autocast): torch.profiler over a few steps after warm-up; prints the step time, the GPU-busy
fraction and the top kernels / ops by self CUDA time. Run on the device: python3 scripts/gpu/profile_train_step.py
Env: WINDOW (default 56), RETAIN (retention slots, default 0; issue #17), RETAIN_SCORE (default proj_residual):
`WINDOW=60 RETAIN=60` against `WINDOW=120` compares a retention step with the default recipe's at budget 128.
"""
from __future__ import annotations

import os
import sys
import time

import torch
import transformers
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
from models.linearize import LinearizeConfig, linearize  # noqa: E402

STEPS = int(os.environ.get("PROFILE_STEPS", "3"))


def main():
    cfg = transformers.LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                                   num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True)
    torch.manual_seed(0)
    retain = int(os.environ.get("RETAIN", "0"))
    extra = dict(retain=retain, retain_score=os.environ.get("RETAIN_SCORE", "proj_residual")) if retain else {}
    model = linearize(transformers.LlamaForCausalLM(cfg), LinearizeConfig(
        mechanism="gdn", window=int(os.environ.get("WINDOW", "56")), sinks=8, short_conv=True, **extra)).cuda()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, 49152, (1, 4096), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(STEPS):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / STEPS
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]  # not the ops above them
    gpu_us = sum(e.self_device_time_total for e in kernels) / STEPS
    n_kernels = sum(e.count for e in kernels) / STEPS
    print(f"step {wall * 1e3:.1f} ms ({4096 / wall:,.0f} tokens/s); GPU busy {gpu_us / 1e3:.1f} ms per step "
          f"({gpu_us / 1e3 / (wall * 1e3):.0%}); ~{n_kernels:.0f} kernels per step; GOLINEAR_COMPILE="
          f"{os.environ.get('GOLINEAR_COMPILE', '0')}; window {os.environ.get('WINDOW', '56')}, retain {retain}")
    print(events.table(sort_by="self_cuda_time_total", row_limit=35, max_name_column_width=70))
    print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=70))


if __name__ == "__main__":
    main()
