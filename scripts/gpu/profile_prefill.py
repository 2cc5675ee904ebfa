"""Where a prefill's time goes, per row of the static-cache decoder (docs/speed.md, "Where a decode step's time
goes" and the prefill gap): the prompt batch's kernels under torch.profiler, grouped as scripts/gpu/profile_decode.py
groups a decode step's, beside the prefill's wall time. Random weights at a named configuration (speed does not depend
on them); rows that prefill through the static decoder (full-static, the linearized rows, retention slots).

    python scripts/gpu/profile_prefill.py --model smollm2-135m --configs 'full-static;gdn-default;mechanism=gdn,\
window=1016,sinks=8,short_conv=true' --length 4096 --batch 64 --out OUT_DIR/prefill.md
    python scripts/gpu/profile_prefill.py --model smollm2-135m --configs 'mechanism=none,window=1016,sinks=8' \
--length 4096 --batch 64 --window-blocks 64,128,256,512 --out OUT_DIR/blocks.md   (the window's query block)
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import profile_decode as PD  # noqa: E402  (the rows are built and kernels grouped as the decode profile does)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def profile_prefill(decoder, ids, reps: int) -> tuple[dict, float]:
    """(group -> (us per prefill, kernels per prefill), wall ms per prefill) of decoder.prefill(ids), warm."""
    from torch.profiler import ProfilerActivity, profile
    device = ids.device
    decoder.prefill(ids)  # warm: compiles and plans for this shape
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        decoder.prefill(ids)
    sync(device)
    wall_ms = (time.perf_counter() - t0) * 1e3 / reps
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            decoder.prefill(ids)
        sync(device)
    table = collections.defaultdict(lambda: [0.0, 0])
    for ev in prof.events():  # CUDA: kernels; CPU (a check of the script): aten ops without aten children
        if cuda and ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if not cuda and (not ev.name.startswith("aten::") or any(c.name.startswith("aten::")
                                                                   for c in ev.cpu_children)):
            continue
        g = table[PD.group(ev.name)]
        g[0] += (ev.device_time if cuda else ev.self_cpu_time_total) / reps
        g[1] += 1 / reps
    return dict(table), wall_ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="full-static;gdn-default")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--window-blocks", default=None,
                    help="comma-separated query blocks of the prefill's window (window.PREFILL_BLOCK), each row "
                         "profiled at each: larger blocks copy the keys fewer times and attend to more masked ones")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    for name, value in (("--length", args.length), ("--batch", args.batch), ("--reps", args.reps)):
        if value < 1:
            ap.error(f"{name} {value}: allowed 1 or more")
    blocks = [None]
    if args.window_blocks is not None:
        try:
            blocks = [int(b) for b in args.window_blocks.split(",")]
        except ValueError:
            blocks = [0]
        if min(blocks) < 1 or any(b % 16 for b in blocks):
            ap.error(f"--window-blocks {args.window_blocks!r}: allowed positive multiples of 16, e.g. 64,256")
    from golinear.models.attention.ops import window
    from golinear.models.backbones.backbone import random_backbone
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_backbone(args.model, dtype=dtype, device=device, seed=0)
    groups = collections.OrderedDict((g, None) for g, _ in PD.GROUPS)
    groups["other"] = None
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.length), device=device,
                        generator=torch.Generator(device=device).manual_seed(1))
    rows = []
    try:
        for spec, block in ((spec, block) for spec in args.configs.split(";") for block in blocks):
            window.PREFILL_BLOCK = block or window.WINDOW_BLOCK
            decoder, undo = PD.build(spec, model, args.length, args.batch, device, dtype)
            if decoder is None:
                ap.error(f"--configs {spec!r}: a press row prefills through its press, not the static decoder")
            table, wall_ms = profile_prefill(decoder, ids, args.reps)
            label = spec if block is None else f"{spec} (window block {block})"
            rows.append((label, table, wall_ms))
            print(f"{label}: prefill {wall_ms:.2f} ms, {sum(v[1] for v in table.values()):.0f} kernels")
            del decoder
            if undo:
                undo()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            args.out.write_text(render(rows, groups, args, device, dtype))  # a run stopped early keeps its rows
    finally:  # the default again for whatever runs next in this process
        window.PREFILL_BLOCK = window.WINDOW_BLOCK
    print(args.out.read_text())
    return 0


def render(rows: list, groups, args, device, dtype) -> str:
    unit = "kernel" if device.type == "cuda" else "aten op"
    head = ["row", "prefill ms", f"{unit}s", f"{unit} ms", *[f"{g} ms (n)" for g in groups]]
    card = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    lines = [f"Prefill at {args.model} dimensions (random {str(dtype).replace('torch.', '')} weights), prompt "
             f"{args.length}, batch {args.batch}, {card}, torch {torch.__version__}; wall time and {unit} times from "
             f"torch.profiler, each the mean of {args.reps} prefills after a warm one.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for spec, table, wall_ms in rows:
        lines.append("| " + " | ".join([spec, f"{wall_ms:.2f}", *PD.kernel_cells(table, groups)]) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
