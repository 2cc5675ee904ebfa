"""`golinear latency`: prefill / decode latency and peak memory against prompt length (paper Fig. 2a).

For each batch size of `--batch` (e.g. 1,8: the interactive case and the paper's) and each prompt length:
prefill the prompt (logits of the last position only), then `--new-tokens` greedy decode steps. Full
attention is the backbone itself (HF model, SDPA, its own dynamic KV cache, eager); `full-static` the backbone
through models.decoding.fast_decode (each row reads its filled KV prefix: the split-K kernel on CUDA), `full-static-sdpa`
that decoder with SDPA over the whole KV buffer (one run measures both steps). Linearized configurations
run through models.decoding.fast_decode (chunked prefill, static cache, decode captured in a CUDA graph on GPU); those
with retention slots (retain > 0) through models.retention.generate.RetentionDecoder (each prompt prefilled
alone and whole, eager decode: rows with prefill_chunk 0 and cuda_graph False). KV-cache compression rows
(`press=<name>,kv_budget=<entries>[,prefill_chunk=<tokens>]`) run through bench/speed/latency_press.py: full-attention
prefill compressed to the budget by a kvpress press, then HF's DynamicCache decode over the compressed entries.
Weights are random by default (speed does not depend on trained values): `--model` names a configuration in
models.backbones.backbone.NAMED_CONFIGS; with `--weights real` the model is loaded (embedded SmolLM2, a folder or a hub id).

Peak memory: CUDA's max_memory_allocated; on the CPU the process's peak resident set (bench/speed/process_memory.py).

Each row also carries the decode bandwidth bound (bench/speed/decode_bound.py): the bytes one decode step moves for
that model, configuration, batch and length, the copy bandwidth measured once per run on the same device, the
bound in ms/token and the measured decode time over it.

Rows (one per model [weights, dtype], configuration, length, batch, device) are merged by that key into
`<out-dir>/latency.csv`; `latency.md` and `latency.png` are rendered from the whole CSV
(bench/speed/latency_render.py, with the issue's target checks from bench/speed/latency_targets.py). An
out-of-memory run is recorded with status OOM and the sweep goes on.
"""
from __future__ import annotations

import gc
import math
from datetime import datetime, timezone
from pathlib import Path

import torch

from golinear.bench.speed import process_memory
from golinear.bench.cli_args import LATENCY_CPU_BATCHES, LATENCY_GPU_BATCHES
from golinear.bench.speed.latency_press import PressRun, check_press_spec
from golinear.bench.speed.latency_render import render
from golinear.bench.speed.latency_runs import run_fast, run_full
from golinear.bench.speed.latency_targets import STATIC_FULL, STATIC_FULL_SDPA, checks_markdown
from golinear.models.util.atomic import atomic_path

KEY = ["model", "weights", "dtype", "config", "length", "batch", "device"]  # weights/dtype: part of "model"
BOUND_COLUMNS = ["decode_bytes_per_step", "copy_gb_per_s", "decode_bound_ms", "decode_vs_bound"]
DEFAULT_OUT = "runs/latency"  # never the tracked leaderboards/ unless asked (--out-dir leaderboards)
COLUMNS = KEY + ["new_tokens", "prefill_s", "decode_ms_per_token", "e2e_s", "peak_gib", "status", *BOUND_COLUMNS,
                 "prefill_chunk", "cuda_graph", "press", "kv_budget", "torch", "fla", "date", "note"]
GPU_LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768]
# full attention through the static-cache decoder: the config label -> FastDecoder's full_decode
STATIC_DECODES = {STATIC_FULL: "split-k", STATIC_FULL_SDPA: "sdpa"}
CPU_LENGTHS = [64, 128, 256]


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def parse_positive_ints(flag: str, text: str) -> list[int]:
    """'1,8' -> [1, 8]: the one form of --lengths and --batch (comma-separated positive integers, each once)."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(n < 1 for n in out) or len(set(out)) != len(out):
        raise ValueError(f"{flag} {text!r}: expected comma-separated distinct positive integers, e.g. 1,8")
    return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


# ----------------------------------------------------------------------------------------------- runs
def _reset_memory(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    else:
        process_memory.reset_peak()


def _peak_gib(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return process_memory.peak_gib()  # no allocator statistics on the CPU: the process's peak resident set


def _load(args, device, dtype):
    from golinear.models.backbones.backbone import NAMED_CONFIGS, load_backbone, random_backbone
    if args.weights == "random":
        if args.model not in NAMED_CONFIGS:
            raise ValueError(f"--model {args.model!r} with random weights must be a named configuration; "
                             f"allowed: {sorted(NAMED_CONFIGS)}")
        model = random_backbone(args.model, dtype=dtype, device=device, seed=args.seed)
    else:
        model, _ = load_backbone(args.model, dtype=dtype, device=device)
    n = model.config.num_hidden_layers
    if args.layers is not None:
        if not 1 <= args.layers <= n:
            raise ValueError(f"--layers {args.layers}: the model has {n} decoder layers (allowed 1..{n})")
        model.model.layers = model.model.layers[:args.layers]
        model.config.num_hidden_layers = args.layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:args.layers]
    return model


def _linearize(model, spec, dtype):
    """Linearize in place (new parameters in the run dtype); return a function that undoes it."""
    from golinear.models.decoding.fast_decode import decoder_layers
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    if spec.checkpoint:
        raise ValueError(f"config {spec.label!r}: latency runs linearize the backbone afresh (speed does not "
                         "depend on trained values); give the configuration instead of a checkpoint")
    layers = decoder_layers(model)
    original = [layer.self_attn for layer in layers]
    # every option the spec gives (conv_on, out_norm, ... included); hybrids keep layers uniformly: which layers
    # stay full attention does not change the speed, and a hardness selection needs a scores file
    cfg = LinearizeConfig.from_dict({**spec.linearize_options(), "select": "uniform", "layer_scores": None})
    linearize(model, cfg)
    for layer in layers:
        layer.self_attn.to(dtype)

    def undo():
        for layer, attn in zip(layers, original):
            layer.self_attn = attn
    return undo


def _runner(args, model, spec, dtype, device, max_len):
    """(run(ids) -> (prefill s, decode s), row fields, decoder or None, undo or None) for one configuration."""
    from golinear.models.decoding.batch_generate import decoder_for
    from golinear.models.decoding.fast_decode import FastDecoder
    use_graph = not args.no_graph and device.type == "cuda"
    if isinstance(spec, str):  # full attention through the same static-cache / CUDA-graph decoder as ours
        decoder = FastDecoder(model, prefill_chunk=0, use_graph=use_graph, max_len=max_len,
                              full_decode=STATIC_DECODES[spec])
        return (lambda ids: run_fast(decoder, ids, args.new_tokens),
                dict(prefill_chunk=0, cuda_graph=decoder.use_graph), decoder, None)
    if spec.is_full_attention:
        return lambda ids: run_full(model, ids, args.new_tokens), dict(prefill_chunk=0, cuda_graph=False), None, None
    if spec.press is not None:  # full attention with its KV cache compressed (bench/speed/latency_press.py)
        run = PressRun(model, spec, args.new_tokens, decoder=args.press_decoder, use_graph=use_graph)
        return (run, dict(prefill_chunk=spec.prefill_chunk, cuda_graph=run.static is not None and use_graph,
                          press=spec.press, kv_budget=spec.kv_budget), None, None)
    undo = _linearize(model, spec, dtype)
    # FastDecoder, or for retention slots (retain > 0) RetentionDecoder: each prompt prefilled alone and
    # whole (prefill_chunk 0), eager decode (use_graph False)
    decoder = decoder_for(model, prefill_chunk=args.prefill_chunk, use_graph=use_graph, max_len=max_len)
    return (lambda ids: run_fast(decoder, ids, args.new_tokens),
            dict(prefill_chunk=decoder.prefill_chunk, cuda_graph=decoder.use_graph), decoder, undo)


def bound_fields(model, states, batch: int, length: int, new_tokens: int, copy_bytes_per_s: float,
                 decode_ms: float) -> dict:
    """The row's decode bandwidth bound: bytes per step (bench/speed/decode_bound.py), the copy bandwidth, the bound
    in ms/token and measured / bound. `length`: the KV entries per layer the decode starts from (the prompt's
    length; a press row's compressed count)."""
    from golinear.bench.speed.decode_bound import decode_bytes, mean_context
    nbytes = sum(decode_bytes(model, states, batch, mean_context(length, new_tokens)).values())
    bound_ms = 1000 * nbytes / copy_bytes_per_s
    return dict(decode_bytes_per_step=nbytes, copy_gb_per_s=copy_bytes_per_s / 1e9, decode_bound_ms=bound_ms,
                decode_vs_bound=decode_ms / bound_ms)


def sweep(args) -> list[dict]:
    """Every configuration x batch x length of `args`; rows merged into args.csv_path (if set) as they come."""
    args.csv_path = getattr(args, "csv_path", None)
    from golinear.bench.speed.decode_bound import copy_bandwidth
    from golinear.bench.run.specs import parse_model_spec
    device = torch.device(args.device)
    dtype = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
             "fp32": torch.float32, "float16": torch.float16}.get(args.dtype)
    if dtype is None:
        raise ValueError(f"--dtype {args.dtype!r}; allowed: bfloat16, float32, float16")
    labels = list(dict.fromkeys(t.strip() for t in args.configs.split(";") if t.strip()))
    if not labels:
        raise ValueError("--configs is empty; e.g. 'full;gdn-default'")
    specs = [t if t in STATIC_DECODES else parse_model_spec(t) for t in labels]
    for spec in specs:
        if not isinstance(spec, str) and spec.press is not None:
            check_press_spec(spec, args.lengths)
    require_kernels(labels, specs, device)
    copy_bps = copy_bandwidth(device)  # once per run, before the model takes the memory
    print(f"copy bandwidth on {device_name(device)}: {copy_bps / 1e9:.1f} GB/s (read + written)", flush=True)
    _reset_memory(device)
    model = _load(args, device, dtype)
    vocab = model.config.vocab_size
    max_len = max(args.lengths) + args.new_tokens + 1
    gen = torch.Generator().manual_seed(args.seed)
    name = args.model if args.layers is None else f"{args.model}[{args.layers} layers]"
    info = dict(model=name, weights=args.weights, device=device_name(device),
                dtype=str(dtype).replace("torch.", ""), new_tokens=args.new_tokens, torch=torch.__version__,
                fla=_fla_version(device), date=datetime.now(timezone.utc).strftime("%Y-%m-%d"))
    rows = []
    for label, spec in zip(labels, specs):
        run, extra, decoder, undo = _runner(args, model, spec, dtype, device, max_len)
        for batch in args.batch:
            warm = True  # per batch size: kernels are tuned and graphs captured per shape
            seen = set()  # prefill chunk shapes already run at this batch size (FLA compiles/autotunes per shape)
            for length in args.lengths:
                ids = torch.randint(0, vocab, (batch, length), generator=gen).to(device)
                if isinstance(spec, str):  # static KV buffer sized for this length (not for the longest prompt)
                    decoder.max_len = length + args.new_tokens + 1
                config = label if isinstance(spec, str) else run.config_label if isinstance(run, PressRun) else spec.label
                row = dict(info, config=config, length=length, batch=batch, **extra)
                try:
                    if warm:  # compile / autotune / graph capture outside the timings
                        _warm_up(run, ids, None if undo is None else decoder)  # (full-static: one chunk)
                        warm = False
                    elif isinstance(spec, str):  # a static full decoder's buffer and graph are sized per length:
                        run(ids)  # their first use at this length is untimed, like a linearized decoder's new chunks
                    if undo is not None and not chunk_shapes(length, decoder.prefill_chunk) <= seen:
                        c = decoder.prefill_chunk or length  # untimed, the same chunks (2 suffice, bar a remainder)
                        b = 1 if decoder.handles_retention else batch  # (it prefills each row alone)
                        run(ids[:b] if length % c else ids[:b, :min(length, 2 * c)])
                        seen |= chunk_shapes(length, decoder.prefill_chunk)
                    if isinstance(run, PressRun) and not run.compressed:
                        run(ids)  # untimed, until one run has compressed (the press's own kernels loaded)
                    _reset_memory(device)
                    prefill_s, decode_s = run(ids)
                    decode_ms = 1000 * decode_s / max(args.new_tokens, 1)
                    row.update(prefill_s=prefill_s, decode_ms_per_token=decode_ms, e2e_s=prefill_s + decode_s,
                               peak_gib=_peak_gib(device), status="ok")
                    if isinstance(run, PressRun):  # decode reads the compressed cache, not the prompt's
                        row.update(run.row_fields())
                    row.update(bound_fields(model, None if decoder is None else decoder.states, batch,
                                            run.entries if isinstance(run, PressRun) else length, args.new_tokens,
                                            copy_bps, decode_ms))
                except torch.OutOfMemoryError:
                    row.update(prefill_s=math.nan, decode_ms_per_token=math.nan, e2e_s=math.nan,
                               peak_gib=math.nan, status="OOM", copy_gb_per_s=copy_bps / 1e9)
                del ids
                _reset_memory(device)
                rows.append(row)
                print(_row_line(row), flush=True)
                if args.csv_path is not None:  # merged row by row: a killed sweep keeps what it measured
                    merge_rows(args.csv_path, [row])
        del decoder, run
        if undo is not None:
            undo()
        _reset_memory(device)
    return rows


def chunk_shapes(length: int, chunk: int) -> set:
    """The (first?, tokens) chunk shapes a chunked prefill of `length` tokens runs (chunk 0: the whole prompt);
    a linearized configuration's kernels are compiled and autotuned for each on first use."""
    c = chunk or length
    shapes = {(True, min(c, length))}
    if length > c:
        shapes.add((False, c) if length >= 2 * c else (False, length - c))
        if length % c and length > 2 * c:
            shapes.add((False, length % c))
    return shapes


def _warm_up(run, ids, decoder=None):
    """One untimed run before timing. Without a chunked decoder: the first timed prompt itself (the shortest), so
    the first row pays no one-time start-up cost. A fast decoder prefills a short prompt in two chunks so the kernels
    of both the first chunk and the continuation chunks (initial state on) are compiled before timing."""
    n = min(ids.shape[1], 512)
    if decoder is None or n < 2:
        run(ids)
        return
    chunk = decoder.prefill_chunk
    decoder.prefill_chunk = n // 2
    try:
        run(ids[:, :n])
    finally:
        decoder.prefill_chunk = chunk


def require_kernels(labels, specs, device):
    """A linearized row on CUDA without FLA would time the pure-PyTorch reference path (slower, more memory) under
    the name of the fast one: refused before any model loads."""
    import importlib.util
    linear = [label for label, spec in zip(labels, specs)
              if not isinstance(spec, str) and spec.press is None and not spec.is_full_attention]
    if device.type == "cuda" and linear and importlib.util.find_spec("fla") is None:
        raise ValueError(f"--configs {';'.join(linear)} on CUDA need flash-linear-attention (pip install "
                         f"'golinear[gpu]'); without it the PyTorch reference would be timed as the fast path")


def _fla_version(device) -> str:
    """FLA (the optional `gpu` extra) serves CUDA runs only; the row says which version, or nothing."""
    from importlib.metadata import PackageNotFoundError, version
    if device.type != "cuda":
        return ""
    try:
        return version("fla-core")
    except PackageNotFoundError:
        return ""


def _row_line(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['config']:>18} T={r['length']:>6} B={r['batch']}: {r['status']}"
    return (f"{r['config']:>18} T={r['length']:>6} B={r['batch']}: prefill {r['prefill_s']:.3f} s  "
            f"decode {r['decode_ms_per_token']:.2f} ms/token (bound {r['decode_bound_ms']:.2f}, "
            f"{r['decode_vs_bound']:.2f}x)  e2e {r['e2e_s']:.3f} s  peak "
            + (f"{r['peak_gib']:.2f} GiB" if math.isfinite(r["peak_gib"]) else "n/a")
            + (" (process)" if r["device"] == "cpu" else ""))


# ----------------------------------------------------------------------------------------------- outputs
def merge_rows(csv_path: Path, rows: list[dict]):
    """Existing CSV rows with the same key are replaced; the file is rewritten atomically."""
    import pandas as pd
    new = pd.DataFrame(rows, columns=COLUMNS)
    if csv_path.exists():
        old = pd.read_csv(csv_path)
        keys = set(map(tuple, new[KEY].astype(str).values.tolist()))
        old = old[[tuple(r) not in keys for r in old[KEY].astype(str).values.tolist()]]
        new = pd.concat([old, new], ignore_index=True)  # rows from before a column get NaN in it
        new = new[COLUMNS + [c for c in new.columns if c not in COLUMNS]]
    new = new.sort_values(["device", "model", "batch", "config", "length"]).reset_index(drop=True)
    with atomic_path(csv_path) as tmp:
        new.to_csv(tmp, index=False, float_format="%.6g")
    return new


def main(args) -> int:
    if getattr(args, "render_only", False):
        import pandas as pd
        out_dir = Path(args.out_dir or DEFAULT_OUT)
        if not (out_dir / "latency.csv").exists():
            raise FileNotFoundError(f"--render-only: no latency.csv in {out_dir}")
        df = pd.read_csv(out_dir / "latency.csv")
        render(df, out_dir)
        print(f"rendered {out_dir / 'latency.md'} and latency.png from {len(df)} rows")
        return 0
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cuda", "cpu") and not args.device.startswith("cuda:"):
        raise ValueError(f"--device {args.device!r}; allowed: cuda, cpu")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda but CUDA is not available here")
    gpu = args.device.startswith("cuda")
    args.model = args.model or ("llama-3.1-8b" if gpu else "smollm2-135m")
    lengths = GPU_LENGTHS if gpu else CPU_LENGTHS
    args.lengths = parse_positive_ints("--lengths", args.lengths) if args.lengths else lengths
    args.batch = parse_positive_ints("--batch", args.batch or (LATENCY_GPU_BATCHES if gpu else LATENCY_CPU_BATCHES))
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    if args.new_tokens < 1:
        raise ValueError(f"--new-tokens {args.new_tokens}: must be >= 1")
    out_dir = Path(args.out_dir or DEFAULT_OUT)
    out_dir.mkdir(parents=True, exist_ok=True)
    args.csv_path = out_dir / "latency.csv"
    rows = sweep(args)
    df = merge_rows(args.csv_path, rows)
    render(df, out_dir)
    print("\n".join(checks_markdown(df)))
    print(f"wrote {out_dir / 'latency.csv'}, latency.md, latency.png ({len(rows)} new rows)")
    return 0


if __name__ == "__main__":  # `python -m golinear.bench.speed.latency ...` = `golinear latency ...`
    import sys

    from golinear.bench.cli import main as cli
    sys.exit(cli(["latency", *sys.argv[1:]]))
