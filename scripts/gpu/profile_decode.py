"""Where a decode step's time goes, per row of the static-cache decoder (docs/speed.md, "Decode step profile"):
the step's CUDA kernels under torch.profiler, grouped by what they do, beside the step's time when replayed from its
CUDA graph and the row's bandwidth bound. Random weights at a named configuration (speed does not depend on them).

    python scripts/gpu/profile_decode.py --configs 'full-static;gdn-default;press=snapkv,kv_budget=1024' \
        --length 4096 --batch 1 --out OUT_DIR/profile.md
"""
from __future__ import annotations

import argparse
import collections
import re
import time
from pathlib import Path

import torch

# kernel name -> group (first match wins); the rest is "other"
GROUPS = [
    ("attention (split-K)", r"split_k|_split_k_partials"),
    ("attention (SDPA/flash)", r"flash|fmha|attention|sdpa|efficient"),
    ("linear state update", r"fused_recurrent|recurrent|gated_delta|gdn|chunk_|fused_step|step_kernel|delta"),
    ("GEMV/GEMM", r"gemv|gemm|cutlass|sm90_xmma|xmma|ampere|nvjet|cublas|Kernel2|splitKreduce|matmul"),
    ("short conv", r"conv"),
    ("norm", r"norm|rms"),
    ("rotary", r"rotary|rope"),
    ("softmax/argmax/reduce", r"softmax|argmax|reduce|max_|sum"),
    ("copy/cat/index", r"copy|cat|index|scatter|gather|fill|slice|Memcpy|Memset|direct_copy"),
    ("elementwise", r"elementwise|vectorized|unrolled|triton_poi|mul|add|silu|sigmoid|exp"),
]


def group(name: str) -> str:
    for label, pattern in GROUPS:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def build(spec_text: str, model, length: int, batch: int, device, dtype):
    """(decoder, bound dict) for one row, built as `golinear latency` builds it."""
    from argparse import Namespace

    from golinear.bench.run.specs import parse_model_spec
    from golinear.bench.speed.latency import STATIC_DECODES, _runner
    spec = spec_text if spec_text in STATIC_DECODES else parse_model_spec(spec_text)
    args = Namespace(no_graph=False, new_tokens=16, press_decoder="static", prefill_chunk=8192)
    run, fields, decoder, undo = _runner(args, model, spec, dtype, device, max_len=length + 512)
    ids = torch.randint(0, model.config.vocab_size, (batch, length), device=device,
                        generator=torch.Generator(device=device).manual_seed(0))
    run(ids)  # prefill + 16 decode steps (captures the graph)
    if decoder is None:  # a press row: its static decoder
        decoder = getattr(run, "static", None)
    return decoder, undo


@torch.no_grad()
def profile_step(decoder, steps: int) -> tuple[dict, float, float]:
    """(group -> (us per step, launches per step), graph replay ms per step, eager ms per step)."""
    from torch.profiler import ProfilerActivity, profile
    # every block below starts from the same cache, its positions moved back by steps + 1 (a press row's buffers hold
    # its kept entries and the new tokens run() made, nothing more; the step reads the same number of entries)
    io = decoder.io
    back = min(steps + 1, int(io["pos"].min()))
    io["pos"].sub_(back)
    io["pos_ids"].sub_(back)
    bufs = decoder._buffers()
    saved = [b.clone() for b in bufs]

    def reset():
        for b, c in zip(bufs, saved):
            b.copy_(c)
    decoder.capture()
    reset()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        decoder.graph.replay()
    torch.cuda.synchronize()
    graph_ms = (time.perf_counter() - t0) * 1e3 / steps
    step = lambda: decoder._step(steady=True, prefix=None)  # noqa: E731  the graph's step, eagerly
    reset()
    step()
    reset()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    eager_ms = (time.perf_counter() - t0) * 1e3 / steps
    reset()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    table = collections.defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            g = table[group(ev.name)]
            g[0] += ev.device_time / steps
            g[1] += 1 / steps
    return dict(table), graph_ms, eager_ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--configs", default="full-static;gdn-default;press=snapkv,kv_budget=1024")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from golinear.models.backbones.backbone import random_backbone
    device, dtype = torch.device("cuda"), torch.bfloat16
    model = random_backbone(args.model, dtype=dtype, device=device, seed=0)
    rows, groups = [], collections.OrderedDict((g, None) for g, _ in GROUPS)
    groups["other"] = None
    for spec in args.configs.split(";"):
        decoder, undo = build(spec, model, args.length, args.batch, device, dtype)
        table, graph_ms, eager_ms = profile_step(decoder, args.steps)
        rows.append((spec, table, graph_ms, eager_ms))
        print(f"{spec}: graph {graph_ms:.2f} ms/step, eager {eager_ms:.2f} ms/step, "
              f"{sum(v[1] for v in table.values()):.0f} kernels/step")
        del decoder
        if undo:
            undo()
        torch.cuda.empty_cache()
        text = render(rows, groups, args)  # written after every row: a run stopped early keeps the rows it profiled
        args.out.write_text(text)
    print(text)
    return 0


def render(rows: list, groups, args) -> str:
    head = ["row", "graph ms/step", "eager ms/step", "kernels/step", "kernel ms/step",
            *[f"{g} ms (n)" for g in groups]]
    lines = [f"Decode step at {args.model} dimensions (random bf16 weights), prompt {args.length}, batch "
             f"{args.batch}, {torch.cuda.get_device_name()}, torch {torch.__version__}; kernel times from "
             f"torch.profiler over {args.steps} eager steps (the graph replays the same kernels without the launch "
             "gaps).", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for spec, table, graph_ms, eager_ms in rows:
        lines.append("| " + " | ".join([spec, f"{graph_ms:.2f}", f"{eager_ms:.2f}", *kernel_cells(table, groups)]) + " |")
    return "\n".join(lines) + "\n"


def kernel_cells(table: dict, groups) -> list[str]:
    """One row's kernel columns: the kernel count, their ms, then each group's 'ms (count)' ('-': none)."""
    kern = sum(v[0] for v in table.values()) / 1e3
    n = sum(v[1] for v in table.values())
    return [f"{n:.0f}", f"{kern:.2f}"] + [f"{table[g][0] / 1e3:.2f} ({table[g][1]:.0f})" if g in table else "-"
                                          for g in groups]


if __name__ == "__main__":
    raise SystemExit(main())
