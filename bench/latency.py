"""`golinear latency`: prefill / decode latency and peak memory against prompt length (paper Fig. 2a).

For each prompt length: prefill the prompt (batch `--batch`, logits of the last position only), then
`--new-tokens` greedy decode steps. Full attention is the backbone itself (HF model, SDPA, its own
dynamic KV cache, eager). Linearized configurations run through models.fast_decode (chunked prefill,
static cache, decode captured in a CUDA graph on GPU). Weights are random by default (speed does not
depend on trained values): `--model` names a configuration in models.backbone.NAMED_CONFIGS; with
`--weights real` the model is loaded (embedded SmolLM2, a folder or a hub id).

Rows (one per model [weights, dtype], configuration, length, batch, device) are merged by that key into
`<out-dir>/latency.csv`; `latency.md` and `latency.png` are rendered from the whole CSV
(bench/latency_render.py). An
out-of-memory run is recorded with status OOM and the sweep goes on.
"""
from __future__ import annotations

import gc
import math
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from bench.latency_render import STATIC_FULL, render
from models.atomic import atomic_path

KEY = ["model", "weights", "dtype", "config", "length", "batch", "device"]  # weights/dtype: part of "model"
COLUMNS = KEY + ["new_tokens", "prefill_s", "decode_ms_per_token", "e2e_s", "peak_gib",
                 "status", "prefill_chunk", "cuda_graph", "torch", "fla", "date", "note"]
GPU_LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768]
CPU_LENGTHS = [64, 128, 256]


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def _parse_lengths(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--lengths {text!r}: expected comma-separated positive integers") from None
    if not out or any(n < 1 for n in out):
        raise ValueError(f"--lengths {text!r}: expected comma-separated positive integers")
    return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


# ----------------------------------------------------------------------------------------------- runs
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_memory(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return float("nan")  # no allocator statistics on CPU


@torch.no_grad()
def run_full(model, ids, new_tokens):
    """HF's own model: prefill with logits of the last position, then greedy steps on its DynamicCache."""
    device = ids.device
    _sync(device)
    t0 = time.perf_counter()
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1:].argmax(-1)
    past = getattr(out, "cache", None) or out.past_key_values  # `cache` from transformers 5.24
    _sync(device)
    t1 = time.perf_counter()
    for _ in range(new_tokens):
        out = model(input_ids=nxt, past_key_values=past, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
    _sync(device)
    t2 = time.perf_counter()
    del out, past
    return t1 - t0, t2 - t1


@torch.no_grad()
def run_fast(decoder, ids, new_tokens):
    device = ids.device
    _sync(device)
    t0 = time.perf_counter()
    decoder.prefill(ids)
    _sync(device)
    t1 = time.perf_counter()
    decoder.capture()  # only when the buffers were re-allocated (full-static: per length); not timed
    _sync(device)
    t2 = time.perf_counter()
    decoder.decode(new_tokens)
    _sync(device)
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2


def _load(args, device, dtype):
    from models.backbone import NAMED_CONFIGS, load_backbone, random_backbone
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
    from models.fast_decode import decoder_layers
    from models.linearize import LinearizeConfig, linearize
    a = spec.full
    if a["checkpoint"]:
        raise ValueError(f"config {spec.label!r}: latency runs linearize the backbone afresh (speed does not "
                         "depend on trained values); give the configuration instead of a checkpoint")
    layers = decoder_layers(model)
    original = [layer.self_attn for layer in layers]
    cfg = LinearizeConfig(mechanism=a["mechanism"], window=a["window"], sinks=a["sinks"],
                          short_conv=a["short_conv"], lora=a["lora"],
                          full_layers=list(a["full_layers"]) if a["full_layers"] else None,
                          keep_full=a["keep_full"], select="uniform")
    linearize(model, cfg)
    for layer in layers:
        layer.self_attn.to(dtype)

    def undo():
        for layer, attn in zip(layers, original):
            layer.self_attn = attn
    return undo


def sweep(args) -> list[dict]:
    args.csv_path = getattr(args, "csv_path", None)
    from bench.specs import parse_model_spec
    from models.fast_decode import FastDecoder
    device = torch.device(args.device)
    dtype = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
             "fp32": torch.float32, "float16": torch.float16}.get(args.dtype)
    if dtype is None:
        raise ValueError(f"--dtype {args.dtype!r}; allowed: bfloat16, float32, float16")
    labels = list(dict.fromkeys(t.strip() for t in args.configs.split(";") if t.strip()))
    if not labels:
        raise ValueError("--configs is empty; e.g. 'full;gdn-default'")
    specs = [None if t == STATIC_FULL else parse_model_spec(t) for t in labels]
    model = _load(args, device, dtype)
    vocab = model.config.vocab_size
    max_len = max(args.lengths) + args.new_tokens + 1
    gen = torch.Generator().manual_seed(args.seed)
    name = args.model if args.layers is None else f"{args.model}[{args.layers} layers]"
    info = dict(model=name, weights=args.weights, batch=args.batch, device=device_name(device),
                dtype=str(dtype).replace("torch.", ""), new_tokens=args.new_tokens, torch=torch.__version__,
                fla=_fla_version(device), date=datetime.now(timezone.utc).strftime("%Y-%m-%d"))
    rows = []
    for label, spec in zip(labels, specs):
        undo = decoder = None
        use_graph = not args.no_graph and device.type == "cuda"
        if spec is None:  # full attention through the same static-cache / CUDA-graph decoder as ours
            decoder = FastDecoder(model, prefill_chunk=0, use_graph=use_graph, max_len=max_len)
            run = lambda ids: run_fast(decoder, ids, args.new_tokens)  # noqa: E731
            extra = dict(prefill_chunk=0, cuda_graph=decoder.use_graph)
        elif spec.is_full_attention:
            run = lambda ids: run_full(model, ids, args.new_tokens)  # noqa: E731
            extra = dict(prefill_chunk=0, cuda_graph=False)
        else:
            undo = _linearize(model, spec, dtype)
            decoder = FastDecoder(model, prefill_chunk=args.prefill_chunk, use_graph=use_graph, max_len=max_len)
            run = lambda ids: run_fast(decoder, ids, args.new_tokens)  # noqa: E731
            extra = dict(prefill_chunk=args.prefill_chunk, cuda_graph=decoder.use_graph)
        warm = True
        for length in args.lengths:
            ids = torch.randint(0, vocab, (args.batch, length), generator=gen).to(device)
            if spec is None:  # static KV buffer sized for this length (not for the longest prompt)
                decoder.max_len = length + args.new_tokens + 1
            row = dict(info, config=label if spec is None else spec.label, length=length, **extra)
            try:
                if warm:  # compile / autotune / graph capture outside the timings
                    _warm_up(run, ids, None if undo is None else decoder)  # (full-static: one chunk)
                    warm = False
                _reset_memory(device)
                prefill_s, decode_s = run(ids)
                row.update(prefill_s=prefill_s, decode_ms_per_token=1000 * decode_s / max(args.new_tokens, 1),
                           e2e_s=prefill_s + decode_s, peak_gib=_peak_gib(device), status="ok")
            except torch.OutOfMemoryError:
                row.update(prefill_s=math.nan, decode_ms_per_token=math.nan, e2e_s=math.nan,
                           peak_gib=math.nan, status="OOM")
            del ids
            _reset_memory(device)
            rows.append(row)
            print(_row_line(row), flush=True)
            if args.csv_path is not None:  # merged row by row: a killed sweep keeps what it measured
                merge_rows(args.csv_path, [row])
        del decoder
        if undo is not None:
            undo()
        _reset_memory(device)
    return rows


def _warm_up(run, ids, decoder=None):
    """One untimed run on a short prompt; a fast decoder prefills it in two chunks so the kernels of both
    the first chunk and the continuation chunks (initial state on) are compiled before timing."""
    n = min(ids.shape[1], 512)
    if decoder is None or n < 2:
        run(ids[:, :n])
        return
    chunk = decoder.prefill_chunk
    decoder.prefill_chunk = n // 2
    try:
        run(ids[:, :n])
    finally:
        decoder.prefill_chunk = chunk


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
            f"decode {r['decode_ms_per_token']:.2f} ms/token  e2e {r['e2e_s']:.3f} s  peak {r['peak_gib']:.1f} GiB")


# ----------------------------------------------------------------------------------------------- outputs
def merge_rows(csv_path: Path, rows: list[dict]):
    """Existing CSV rows with the same key are replaced; the file is rewritten atomically."""
    import pandas as pd
    new = pd.DataFrame(rows, columns=COLUMNS)
    if csv_path.exists():
        old = pd.read_csv(csv_path)
        keys = set(map(tuple, new[KEY].astype(str).values.tolist()))
        old = old[[tuple(r) not in keys for r in old[KEY].astype(str).values.tolist()]]
        new = pd.concat([old, new], ignore_index=True)
    new = new.sort_values(["device", "model", "batch", "config", "length"]).reset_index(drop=True)
    with atomic_path(csv_path) as tmp:
        new.to_csv(tmp, index=False, float_format="%.6g")
    return new


def main(args) -> int:
    if getattr(args, "render_only", False):
        import pandas as pd
        out_dir = Path(args.out_dir) if args.out_dir else _repo_root() / "leaderboards"
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
    args.lengths = _parse_lengths(args.lengths) if args.lengths else (GPU_LENGTHS if gpu else CPU_LENGTHS)
    args.batch = args.batch if args.batch is not None else (8 if gpu else 2)
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    if args.batch < 1 or args.new_tokens < 1:
        raise ValueError(f"--batch and --new-tokens must be >= 1, got {args.batch}, {args.new_tokens}")
    out_dir = Path(args.out_dir) if args.out_dir else _repo_root() / "leaderboards"
    args.csv_path = out_dir / "latency.csv"
    rows = sweep(args)
    df = merge_rows(args.csv_path, rows)
    render(df, out_dir)
    print(f"wrote {out_dir / 'latency.csv'}, latency.md, latency.png ({len(rows)} new rows)")
    return 0


if __name__ == "__main__":  # `python -m bench.latency ...` (scripts/gpu/run_all.sh) = `golinear latency ...`
    import sys

    from bench.cli import main as cli
    sys.exit(cli(["latency", *sys.argv[1:]]))
