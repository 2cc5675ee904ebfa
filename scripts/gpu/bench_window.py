"""Window (56) + sink (8) softmax attention on the H200: which kernel for the prefill's softmax path.

Llama-3.1-8B attention shape (32 query heads, 8 KV heads, head dim 128), batch 8, bf16, one layer,
forward only (the prefill). Candidates: the layer's choice, one SDPA call over 64-query blocks that each
see the sinks plus the window keys they can reach (`fla_backend.window_sink_softmax`); FLA's parallel_attn
window kernel + a separate sink softmax merged by log-sum-exp (`window_sink_attention` without grad); the
older blocked PyTorch form (window part + sink part + merge); SDPA with a dense window|sink boolean mask;
FlexAttention with a block mask (compiled); full causal SDPA (flash) as the reference cost. Then forward +
backward at the training shape (SmolLM2: B=1, T=4096, 9 query / 3 KV heads, D=64). Medians of
triton.testing.do_bench, milliseconds.
"""
import math
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.getcwd())
from models.ops import fla_backend, reference, window  # noqa: E402

B, HQ, HKV, D, S, W = 8, 32, 8, 128, 8, 56
LENGTHS = [int(x) for x in os.environ.get("BENCH_LENGTHS", "4096,32768").split(",")]
FLEX = os.environ.get("BENCH_FLEX", "1") == "1"
scale = D ** -0.5


def bench(fn):
    try:
        return triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median")
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return float("nan")


def blocked(q, k, v):
    o_w, l_w = window.window_part_blocked(q, k, v, W, scale)
    o_s, l_s = window.sink_part(q, k[:, :S], v[:, :S], W, scale, torch.arange(q.shape[1], device=q.device))
    return window.merge_attention(o_w, l_w, o_s, l_s)


def sdpa_masked(q, k, v):
    T = q.shape[1]
    t = torch.arange(T, device=q.device)
    mask = (t[None] <= t[:, None]) & ((t[None] < S) | (t[None] > t[:, None] - W))
    return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                            attn_mask=mask, scale=scale, enable_gqa=True)


def sdpa_causal(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                            is_causal=True, scale=scale, enable_gqa=True)


def main():
    print(f"B={B} Hq={HQ} Hkv={HKV} D={D} sinks={S} window={W} bf16, forward, ms (median)")
    flex = None
    if FLEX:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)
    for T in LENGTHS:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, T, HQ, D, device="cuda", generator=g, dtype=torch.bfloat16)
        k = torch.randn(B, T, HKV, D, device="cuda", generator=g, dtype=torch.bfloat16)
        v = torch.randn(B, T, HKV, D, device="cuda", generator=g, dtype=torch.bfloat16)
        with torch.no_grad():
            ref, _ = reference.window_sink_attention(q[:1, :, :4].float(), k[:1, :, :1].float(), v[:1, :, :1].float(),
                                                     S, W, scale)
            got, _ = fla_backend.window_sink_attention(q[:1, :, :4], k[:1, :, :1], v[:1, :, :1], S, W, scale)
            err = ((got.float() - ref).norm() / ref.norm()).item()
            res = {"fused SDPA blocks (the layer's choice)": bench(
                       lambda: fla_backend.window_sink_softmax(q, k, v, S, W, scale)),
                   "fla parallel_attn + sinks": bench(lambda: fla_backend.window_sink_attention(q, k, v, S, W, scale)),
                   "blocked torch": bench(lambda: blocked(q, k, v)),
                   "sdpa dense mask": bench(lambda: sdpa_masked(q, k, v)) if T <= 8192 else float("nan"),
                   "sdpa causal (full attention)": bench(lambda: sdpa_causal(q, k, v))}
            if flex is not None:
                def mask_mod(b, h, qi, kv):
                    return (kv <= qi) & ((kv < S) | (kv > qi - W))
                t0 = time.perf_counter()
                bm = create_block_mask(mask_mod, None, None, T, T, device="cuda")
                qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                flex(qt, kt, vt, block_mask=bm, scale=scale, enable_gqa=True)
                torch.cuda.synchronize()
                res["flex (compiled; first call s=%.0f)" % (time.perf_counter() - t0)] = bench(
                    lambda: flex(qt, kt, vt, block_mask=bm, scale=scale, enable_gqa=True))
        print(f"T={T}: fla path rel err vs reference {err:.1e}")
        for name, ms in res.items():
            print(f"  {name:40s} {ms:9.3f} ms")
        del q, k, v
        torch.cuda.empty_cache()
    train_shape()


def train_shape(B=1, T=4096, hq=9, hkv=3, d=64):
    """Forward + backward, bf16, the training step's window/sink attention per layer."""
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(B, T, h, d, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
               for h in (hq, hkv, hkv))
    cot = torch.randn(B, T, hq, d, device="cuda", generator=g, dtype=torch.bfloat16)
    sc = d ** -0.5

    def fwd_bwd(fn):
        def run():
            out = fn()
            torch.autograd.grad(out, (q, k, v), cot)
        return run

    def old_blocked():
        o_w, l_w = window.window_part_blocked(q, k, v, W, sc)
        o_s, l_s = window.sink_part(q, k[:, :S], v[:, :S], W, sc, torch.arange(T, device="cuda"))
        return window.merge_attention(o_w, l_w, o_s, l_s)[0].to(q.dtype)

    res = {"fused SDPA blocks (the layer's choice)": bench(fwd_bwd(
               lambda: fla_backend.window_sink_softmax(q, k, v, S, W, sc))),
           "older blocked form + sink merge": bench(fwd_bwd(old_blocked)),
           "sdpa causal (full attention)": bench(fwd_bwd(lambda: sdpa_causal(q, k, v).transpose(1, 2)))}
    print(f"forward + backward, B={B} T={T} Hq={hq} Hkv={hkv} D={d} bf16, ms (median)")
    for name, ms in res.items():
        print(f"  {name:40s} {ms:9.3f} ms")


if __name__ == "__main__":
    main()
