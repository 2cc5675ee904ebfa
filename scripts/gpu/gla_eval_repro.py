"""The GLA-family lm-eval crash on the H200 ("CUDA error: misaligned address", 2026-12-01), case by case.

`golinear run --suites cr --batch-size 64` died for every gla/kgla checkpoint at the first PIQA batch whose linear
path had 17..32 tokens by our count of PIQA's tokens (strict: after 1603 of 3676 requests, batch 26, padded length
32; window 56 + sinks 8: after 128, batch 3, length ~93, 29 linear tokens), i.e. the first call in which FLA's
chunk_gla picks chunk size 32 (after 25 / 2 batches at chunk 64); GDN and Hedgehog (always chunk 64) were fine.
models.ops.fla_backend now pads chunk_gla's inputs to GLA_MIN_T = 64 tokens (the fix; 0: off).

One H200 call, the FLA wheels carried:  run(command="python3 scripts/gpu/gla_eval_repro.py", carry=[".whl"])
Each case runs in its own process with CUDA_LAUNCH_BLOCKING=1 (a fault names its kernel and, inside autotuning,
the Triton config), with the padding off or on; one line per case on stdout and in $OUT/gla_eval_repro.txt.
  op    fla_backend.gla_chunk on random bf16 inputs (H 9, D 64), checked against the reference
  model a random SmolLM2-135M in bf16 (30 layers, 9/3 heads), linearized, one no-grad forward at batch 64
Hypotheses the cases separate (chunk = FLA's chunk size for the linear tokens):
  H1 chunk 32 faults: off fails at op T 17/32, model T 17 (strict) and T 90 (w56-s8: 26 linear tokens); on passes
  H2 chunk 16 faults too: off fails at op T 15, model T 1 (strict) and T 80 (w56-s8: 16 linear tokens)
  H3 it needs the eval shape: op b2h4 (the passing GPU tests' batch 2 x 4 heads) against b64h9 at T 32
  H4 it needs bf16: op fp32 at T 32
  H5 something else in the layer (window, sinks, conv, kgla's gate): model cases fail at chunk 64 (T 65/300/var)
Result (2026-12-01, one H200; the model stage was cut by the budget, then five fp32 op cases in a second call):
H4 reversed: fp32 inputs fault at chunk 32 (op T 17 and 32: chunk_gla_fwd_kernel_o, BK 64, BV 64, 8 warps, 2 stages),
bf16 runs at T 15/17/32/300 (so H1-H3 do not hold in bf16, and the bf16 model cases at T 17/80/90 ran); fp32 runs at
T 15 (chunk 16) and 300; with the padding on, fp32 T 17 and 32 run and match the reference (o rel err 8.7e-4, 1.1e-3).
lm-eval's backends run fp32 by default, which is why every GLA-family evaluation died. The bf16 GPU test
tests/test_gpu.py -k gla_family passed; its fp32 arm (added after) is the one that can fail without the padding.
Budget: ~4 min on a fresh machine (compile and autotune ~1-2 min per chunk size, compiled in parallel first).
Env: BUDGET_S (default 225), JOBS (parallel cases, default 12). The GPU test of the fix can follow in the same call,
on the kernels compiled here: TRITON_CACHE_DIR=/tmp/golinear-gla/triton-cache PYTHONPATH=/tmp/golinear-gla/site:$PWD
python3 -m pytest -q -s tests/test_gpu.py -k gla_family
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

OUT = os.environ.get("OUT", "/tmp/gla-repro-out")
SITE = "/tmp/golinear-gla/site"
MECHS = {"gla": dict(mechanism="gla"), "kgla": dict(mechanism="kgla"),
         "gla-w56-s8-sc": dict(mechanism="gla", window=56, sinks=8, short_conv=True),
         "kgla-w56-s8-sc": dict(mechanism="kgla", window=56, sinks=8, short_conv=True)}

# stage 1: op cases, one per chunk size and shape (they compile FLA's kernels, in parallel)
OP_CASES = [dict(kind="op", B=64, H=9, T=T, dtype="bf16", fix=fix)
            for T, fix in [(32, "off"), (17, "off"), (15, "off"), (300, "off"), (32, "on"), (15, "on")]]
OP_CASES += [dict(kind="op", B=2, H=4, T=32, dtype="bf16", fix="off"),
             dict(kind="op", B=64, H=9, T=32, dtype="fp32", fix="off")]
# stage 2: model cases; w56-s8 has no linear path below T = 65. The discriminating lengths come first.
STRICT_T, WINDOW_T = [17, 1, "var", 64, 65, 300], [90, 80, "var", 65, 300]


def model_cases() -> list[dict]:
    """Round i: the i-th length of each recipe, padding off then on (a budget cut drops the last rounds)."""
    cases = []
    for i in range(max(len(STRICT_T), len(WINDOW_T))):
        for fix in ("off", "on"):
            for mech in MECHS:
                lengths = WINDOW_T if "-w" in mech else STRICT_T
                if i < len(lengths):
                    cases.append(dict(kind="model", mech=mech, T=lengths[i], fix=fix))
    return cases


def name(case: dict) -> str:
    if case["kind"] == "op":
        return f"op b{case['B']}h{case['H']} {case['dtype']} T={case['T']} pad={case['fix']}"
    return f"model {case['mech']} B=64 T={case['T']} pad={case['fix']}"


# ----------------------------------------------------------------------------------------------- one case (child)
def describe(e: BaseException) -> str:
    """The error's first line, the last Triton kernel and autotune config on the stack, the last FLA function."""
    kernel = config = fla_fn = None
    tb = e.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        if "triton" in frame.f_code.co_filename and owner is not None:  # JITFunction, Autotuner, Heuristics
            kernel = getattr(owner, "__name__", None) or getattr(getattr(owner, "fn", None), "__name__", None) or kernel
        if frame.f_code.co_name == "_bench" and "config" in frame.f_locals:
            config = str(frame.f_locals["config"])
        if "/fla/" in frame.f_code.co_filename:
            fla_fn = frame.f_code.co_name
        tb = tb.tb_next
    first = (str(e).strip().splitlines() or [""])[0][:160]
    return f"{type(e).__name__}: {first} | fla {fla_fn} | kernel {kernel} | config {config}"


def run_op(case, torch, fla_backend, reference):
    import torch.nn.functional as F
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[case["dtype"]]
    B, T, H, D = case["B"], case["T"], case["H"], 64
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    q, k, v = r(B, T, H, D).to(dt), (r(B, T, H, D) * D ** -0.5).to(dt), r(B, T, H, D).to(dt)
    log_a = F.logsigmoid(r(B, T, H, D) + 2) / 16
    with torch.no_grad():
        o, S = fla_backend.gla_chunk(q, k, v, log_a, D ** -0.5, output_final_state=True)
        torch.cuda.synchronize()
        ro, rS = reference.gla_chunk(q.float(), k.float(), v.float(), log_a, D ** -0.5, output_final_state=True)
    rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()  # noqa: E731
    return f"o rel err {rel(o, ro):.1e}, state {rel(S, rS):.1e}"


def run_model(case, torch):
    from models.backbone import random_backbone
    from models.linearize import LinearizeConfig, linearize
    model = random_backbone("smollm2-135m", dtype=torch.bfloat16, device="cuda")
    model = linearize(model, LinearizeConfig(**MECHS[case["mech"]])).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    if case["T"] == "var":  # lm-eval's batch: right-padded to its longest row, no attention mask
        lengths = torch.randint(20, 301, (64,), generator=gen)
        ids = torch.randint(1, model.config.vocab_size, (64, int(lengths.max())), generator=gen)
        ids[torch.arange(ids.shape[1]) >= lengths[:, None]] = 0
    else:
        ids = torch.randint(1, model.config.vocab_size, (64, case["T"]), generator=gen)
    with torch.no_grad():
        logits = model(ids.cuda(), use_cache=False).logits
        torch.cuda.synchronize()
    return f"T={ids.shape[1]}, logits finite: {bool(torch.isfinite(logits).all())}"


def child(case: dict) -> None:
    t0 = time.time()
    try:
        import torch
        from models.ops import fla_backend, reference
        fla_backend.load_fla()
        fla_backend.GLA_MIN_T = fla_backend.GLA_MIN_T if case["fix"] == "on" else 0
        detail = run_op(case, torch, fla_backend, reference) if case["kind"] == "op" else run_model(case, torch)
        print(f"RESULT ok ({detail}; {time.time() - t0:.0f}s)", flush=True)
    except BaseException as e:  # noqa: BLE001 - every failure is the result
        traceback.print_exc()
        print(f"RESULT FAIL {describe(e)} ({time.time() - t0:.0f}s)", flush=True)
    os._exit(0)  # a faulted CUDA context can hang at exit


# ----------------------------------------------------------------------------------------------- the cases (parent)
def install_wheels() -> None:
    if not os.path.exists(f"{SITE}/.done"):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", SITE] +
                       [os.path.join(".whl", f) for f in sorted(os.listdir(".whl")) if f.endswith(".whl")], check=True)
        open(f"{SITE}/.done", "w").close()


def run_case(case: dict, cap: float, deadline: float, env: dict) -> str:
    left = min(cap, deadline - time.time())
    if left < 20:
        return "skipped (budget)"
    log = os.path.join(OUT, "cases", name(case).replace(" ", "_").replace("=", "") + ".log")
    try:
        p = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)], env=env, capture_output=True,
                           text=True, timeout=left)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        open(log, "w").write(out)
        return f"TIMEOUT after {left:.0f}s"
    open(log, "w").write(p.stdout + p.stderr)
    lines = [ln[len("RESULT "):] for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    return lines[-1] if lines else f"no result (rc {p.returncode}): {(p.stderr.strip().splitlines() or [''])[-1][:200]}"


def main() -> None:
    t0 = time.time()
    deadline = t0 + float(os.environ.get("BUDGET_S", "225"))
    os.makedirs(os.path.join(OUT, "cases"), exist_ok=True)
    install_wheels()
    env = dict(os.environ, PYTHONPATH=f"{SITE}:{os.getcwd()}", CUDA_LAUNCH_BLOCKING="1", PYTHONUNBUFFERED="1",
               TRITON_CACHE_DIR=os.environ.get("TRITON_CACHE_DIR", "/tmp/golinear-gla/triton-cache"))
    jobs = int(os.environ.get("JOBS", "12"))
    subprocess.run([sys.executable, "-c", "import torch, triton, fla; print('torch', torch.__version__, 'triton', "
                    "triton.__version__, 'fla', fla.__version__, torch.cuda.get_device_name())"], env=env)
    report = open(os.path.join(OUT, "gla_eval_repro.txt"), "w")
    for stage, cap in ((OP_CASES, 150), (model_cases(), 90)):  # the op cases compile; the model cases find it done
        with ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(lambda c: run_case(c, cap, deadline, env), stage))
        for case, res in zip(stage, results):
            line = f"{name(case):<46} {res}"
            print(line, flush=True)
            report.write(line + "\n")
    print(f"done in {time.time() - t0:.0f}s; per-case logs in {OUT}/cases")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        child(json.loads(sys.argv[2]))
    else:
        main()
