"""The split-K decode attention kernel (models/attention/ops/decode_attention_split_k.py) against its definition, the SDPA
reference (models/attention/ops/decode_attention.py): on the CPU under Triton's interpreter, on a GPU compiled. Rows of
different filled lengths (inside one key block, spanning splits, filling the whole buffer), GQA and MHA, head sizes
that are and are not powers of two, more splits than a short row has keys. Skipped where Triton is not installed.

The exactness tests ask the kernel for IEEE float32 dot products (`exact=True`) and compare with the reference in
float64, so 2e-5 holds on a GPU as in the interpreter. The kernel's default on a GPU is TF32 for float32 dot products
(`tl.dot`'s default on the matrix units): `test_tf32_default_within_its_rounding` checks that form against its own
bound."""
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

pytestmark = pytest.mark.gpu  # compiled on a GPU (scripts/gpu/tests.sh), under the interpreter on the CPU

EXACT = dict(atol=2e-5, rtol=2e-5)  # float32 rounding over a softmax of <= 300 keys, IEEE dot products


def _want(q, k, v, n, scale, **kw):
    """The reference in float64 (on a GPU SDPA's float32 kernels may round differently), returned in q's dtype."""
    return decode_attention_reference(q.double(), k.double(), v.double(), n, scale, **kw).to(q.dtype)


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
    want = _want(q, k, v, n, scale=D ** -0.5)
    got = decode_attention_split_k(q, k, v, n, scale=D ** -0.5, splits=splits, exact=True)
    assert got.shape == want.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, want, **EXACT)


def test_tf32_default_within_its_rounding():
    """The default kernel (TF32 dot products on a GPU): TF32 keeps 10 mantissa bits, a unit roundoff of
    2^-11 = 4.9e-4 on each operand of q.k and p.v; with unit-variance inputs the logits reach about 4, so a logit
    moves by up to ~4e-3 and an output by about as much relative to its size. Bound: 5e-3 elementwise, 2e-3 in
    norm. A wrong key, split or mask moves outputs by O(1), far outside it."""
    q, k, v, n = _case(3, 6, 2, 64, 300, [1, 150, 300], seed=4)
    want = _want(q, k, v, n, scale=0.125)
    got = decode_attention_split_k(q, k, v, n, scale=0.125, splits=4)
    torch.testing.assert_close(got, want, atol=5e-3, rtol=5e-3)
    assert ((got - want).norm() / want.norm()).item() < 2e-3


def test_reads_only_the_filled_prefix():
    """Garbage (inf/nan) past each row's length changes nothing: the kernel never loads those slots."""
    q, k, v, n = _case(2, 4, 2, 32, 160, [40, 100])
    want = decode_attention_split_k(q, k, v, n, scale=0.2, splits=3, exact=True)
    for b, m in enumerate(n.tolist()):
        k[b, :, m:] = float("nan")
        v[b, :, m:] = float("inf")
    torch.testing.assert_close(decode_attention_split_k(q, k, v, n, scale=0.2, splits=3, exact=True), want)
    torch.testing.assert_close(want, _want(q, k.nan_to_num(0), v.nan_to_num(0, 0, 0), n, 0.2), **EXACT)


def test_bfloat16_inputs():
    q, k, v, n = _case(2, 4, 2, 64, 128, [128, 17], dtype=torch.bfloat16)
    want = decode_attention_reference(q.float(), k.float(), v.float(), n, scale=0.125)
    got = decode_attention_split_k(q, k, v, n, scale=0.125, splits=2)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


def test_reference_prefix_is_the_same_computation():
    """The eager CPU path's bound on the keys read (every row's length <= prefix) leaves the result unchanged (float64:
    the same sums in the same order, so equal to rounding on any device); decode_attention on the CPU takes it."""
    q, k, v, n = _case(3, 6, 3, 16, 64, [5, 20, 9], dtype=torch.float64)
    full = decode_attention_reference(q, k, v, n, scale=0.25)
    torch.testing.assert_close(decode_attention_reference(q, k, v, n, scale=0.25, prefix=20), full)
    if DEVICE == "cpu":
        torch.testing.assert_close(decode_attention(q, k, v, n, scale=0.25, prefix=20), full)


def test_holes_equal_attention_over_each_heads_kept_slots():
    """A head-adaptive press's cache: each KV head of a row skips slots [start, end) (static_decode's holes). The
    kernel and the reference equal attention over the compacted keys of each head alone; a hole covering whole key
    blocks (a split reading nothing but the hole) adds nothing, and garbage inside a hole is never read."""
    B, Hq, Hkv, D, L = 2, 6, 3, 32, 200
    q, k, v, n = _case(B, Hq, Hkv, D, L, [190, 150])
    holes = torch.tensor([[[10, 180], [120, 180], [180, 180]],   # a 170-slot hole spans key blocks and splits
                          [[0, 0], [60, 140], [5, 140]]], dtype=torch.int32, device=DEVICE)
    want = torch.empty(B, Hq, D, device=DEVICE, dtype=torch.float64)
    G = Hq // Hkv
    for b in range(B):
        for h in range(Hkv):
            slots = [s for s in range(int(n[b])) if not holes[b, h, 0] <= s < holes[b, h, 1]]
            kk, vv = k[b, h, slots].double(), v[b, h, slots].double()
            w = torch.softmax(q[b, h * G:(h + 1) * G].double() @ kk.T * D ** -0.5, -1)
            want[b, h * G:(h + 1) * G] = w @ vv
    want = want.float()
    torch.testing.assert_close(_want(q, k, v, n, scale=D ** -0.5, holes=holes), want, **EXACT)
    for b in range(B):
        for h in range(Hkv):
            k[b, h, holes[b, h, 0]:holes[b, h, 1]] = float("nan")
            v[b, h, holes[b, h, 0]:holes[b, h, 1]] = float("inf")
    for splits in (1, 4):
        got = decode_attention_split_k(q, k, v, n, scale=D ** -0.5, splits=splits, holes=holes, exact=True)
        torch.testing.assert_close(got, want, **EXACT)
