"""The split-K decode attention kernel (models/attention/ops/decode_attention_split_k.py) against its definition, the SDPA
reference (models/attention/ops/decode_attention.py): on the CPU under Triton's interpreter, on a GPU compiled. Rows of
different filled lengths (inside one key block, spanning splits, filling the whole buffer), GQA and MHA, head sizes
that are and are not powers of two, more splits than a short row has keys. Skipped where Triton is not installed."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from golinear.models.attention.ops.decode_attention import decode_attention, decode_attention_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":  # read when triton.language is first imported (its own functions are kernels too) and when a
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":  # kernel runs
        pytest.skip("triton was imported before this module could turn its interpreter on (TRITON_INTERPRET=1 "
                    "before it runs this file)", allow_module_level=True)
    os.environ["TRITON_INTERPRET"] = "1"  # no GPU here, so no compiled kernels to keep
pytest.importorskip("triton")
from golinear.models.attention.ops.decode_attention_split_k import decode_attention_split_k  # noqa: E402


def _case(B, Hq, Hkv, D, L, lengths, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=gen).to(DEVICE, dtype) for shape in ((B, Hq, D), (B, Hkv, L, D),
                                                                                  (B, Hkv, L, D)))
    return q, k, v, torch.tensor(lengths, device=DEVICE)


@pytest.mark.parametrize("B,Hq,Hkv,D,L,lengths,splits", [
    (3, 6, 2, 64, 200, [1, 70, 200], None),      # GQA (G = 3), one row filling the buffer, one of one key
    (2, 4, 4, 32, 130, [129, 5], 3),             # MHA, a remainder block, splits past a short row's prefix
    (2, 9, 3, 48, 96, [96, 33], 2),              # head size not a power of two
    (1, 8, 1, 64, 300, [257], 5),                # all query heads on one KV head (G = 8)
])
def test_split_k_equals_the_sdpa_reference(B, Hq, Hkv, D, L, lengths, splits):
    q, k, v, n = _case(B, Hq, Hkv, D, L, lengths)
    want = decode_attention_reference(q, k, v, n, scale=D ** -0.5)
    got = decode_attention_split_k(q, k, v, n, scale=D ** -0.5, splits=splits)
    assert got.shape == want.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_reads_only_the_filled_prefix():
    """Garbage (inf/nan) past each row's length changes nothing: the kernel never loads those slots."""
    q, k, v, n = _case(2, 4, 2, 32, 160, [40, 100])
    want = decode_attention_split_k(q, k, v, n, scale=0.2, splits=3)
    for b, m in enumerate(n.tolist()):
        k[b, :, m:] = float("nan")
        v[b, :, m:] = float("inf")
    torch.testing.assert_close(decode_attention_split_k(q, k, v, n, scale=0.2, splits=3), want)
    torch.testing.assert_close(want, decode_attention_reference(q, k.nan_to_num(0), v.nan_to_num(0, 0, 0), n, 0.2),
                               atol=2e-5, rtol=2e-5)


def test_bfloat16_inputs():
    q, k, v, n = _case(2, 4, 2, 64, 128, [128, 17], dtype=torch.bfloat16)
    want = decode_attention_reference(q.float(), k.float(), v.float(), n, scale=0.125)
    got = decode_attention_split_k(q, k, v, n, scale=0.125, splits=2)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


def test_reference_prefix_is_the_same_computation():
    """The eager CPU path's bound on the keys read (every row's length <= prefix) leaves the result unchanged."""
    q, k, v, n = _case(3, 6, 3, 16, 64, [5, 20, 9])
    full = decode_attention_reference(q, k, v, n, scale=0.25)
    torch.testing.assert_close(decode_attention(q, k, v, n, scale=0.25, prefix=20), full)


def test_holes_equal_attention_over_each_heads_kept_slots():
    """A head-adaptive press's cache: each KV head of a row skips slots [start, end) (static_decode's holes). The
    kernel and the reference equal attention over the compacted keys of each head alone; a hole covering whole key
    blocks (a split reading nothing but the hole) adds nothing, and garbage inside a hole is never read."""
    B, Hq, Hkv, D, L = 2, 6, 3, 32, 200
    q, k, v, n = _case(B, Hq, Hkv, D, L, [190, 150])
    holes = torch.tensor([[[10, 180], [120, 180], [180, 180]],   # a 170-slot hole spans key blocks and splits
                          [[0, 0], [60, 140], [5, 140]]], dtype=torch.int32, device=DEVICE)
    want = torch.empty(B, Hq, D, device=DEVICE)
    G = Hq // Hkv
    for b in range(B):
        for h in range(Hkv):
            slots = [s for s in range(int(n[b])) if not holes[b, h, 0] <= s < holes[b, h, 1]]
            kk, vv = k[b, h, slots], v[b, h, slots]
            w = torch.softmax(q[b, h * G:(h + 1) * G] @ kk.T * D ** -0.5, -1)
            want[b, h * G:(h + 1) * G] = w @ vv
    ref = decode_attention_reference(q, k, v, n, scale=D ** -0.5, holes=holes)
    torch.testing.assert_close(ref, want, atol=2e-5, rtol=2e-5)
    for b in range(B):
        for h in range(Hkv):
            k[b, h, holes[b, h, 0]:holes[b, h, 1]] = float("nan")
            v[b, h, holes[b, h, 0]:holes[b, h, 1]] = float("inf")
    for splits in (1, 4):
        got = decode_attention_split_k(q, k, v, n, scale=D ** -0.5, splits=splits, holes=holes)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
