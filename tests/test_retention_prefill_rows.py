"""The right-padded retention prefill (models/retention/prefill_rows.py): every row of a batch of prompts of
different lengths, prefilled in one pass, gives what the row gives prefilled alone (retention_prefill at its own
length): the outputs at its real positions and every tensor of its decode state (fp64, the CPU reference ops)."""
from __future__ import annotations

import pytest
import torch

from golinear.models.retention.prefill import retention_prefill, ring_positions
from golinear.models.retention.prefill_rows import retention_prefill_rows
from golinear.models.retention.generate import RetentionDecoder
from test_batched_generate import tiny_model
from test_retention import LIN_SCALE, SCALE, assert_close, make, one_thread  # noqa: F401  (the fixture)

CASES = [  # (lengths, sinks, window, retain)
    ([29, 17, 23, 9], 2, 4, 3),
    ([150, 70, 131], 3, 7, 5),  # several query blocks, slots full
    ([40, 12, 5, 1], 8, 4, 2),  # rows shorter than sinks + window, and than the sinks
    ([30, 25], 0, 5, 2),
    ([26, 19], 3, 0, 2),  # no window: a token leaves at once
    ([18, 11], 1, 3, 20),  # more slots than tokens ever leaving
]


@pytest.mark.parametrize("score", ["proj_residual", "given", "delta_error"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-s{c[1]}w{c[2]}r{c[3]}")
def test_each_row_is_its_prompt_alone(case, score):
    lengths, s, w, r = case
    T = max(lengths)
    q, k, v, lin, scores = make(T, B=len(lengths), H=4, Hkv=2)
    y, rows = retention_prefill_rows(q, k, v, lin, SCALE, LIN_SCALE, s, w, r, score, lengths, scores=scores,
                                     chunk_size=16)  # delta_error's walk: chunks shorter than the rows
    assert rows.seen == lengths
    for b, n in enumerate(lengths):
        one = lambda x: x[b:b + 1, :n]  # noqa: E731
        y1, st1 = retention_prefill(one(q), one(k), one(v), {key: one(x) for key, x in lin.items()}, SCALE,
                                    LIN_SCALE, s, w, r, score=score, scores=one(scores))
        assert_close(y[b:b + 1, :n], y1)
        got = rows.row(b)
        assert got.win_pos.tolist() == st1.win_pos.tolist() and got.seen == n
        for field, a, e in zip(st1.shapes(), got.tensors(), st1.tensors()):
            assert a.shape == e.shape, field
            if a.dtype.is_floating_point:
                assert_close(a.nan_to_num(neginf=-1e30), e.nan_to_num(neginf=-1e30))
            else:
                assert torch.equal(a, e), (field, b)


def test_ring_positions_are_the_last_window_positions_by_slot():
    for n in range(1, 30):
        for s, w in ((0, 5), (2, 4), (8, 4), (3, 1)):
            want = [-1] * w
            for p in range(max(s, n - w), n):
                want[(p - s) % w] = p
            assert ring_positions(torch.tensor([n]), s, w).tolist() == [want], (n, s, w)


def test_refuses_bad_lengths():
    q, k, v, lin, _ = make(10, B=2)
    for bad in ([10], [10, 0], [11, 3]):
        with pytest.raises(ValueError, match=r"one length per row \(2 rows\), each 1\.\.10"):
            retention_prefill_rows(q, k, v, lin, SCALE, LIN_SCALE, 2, 4, 3, "proj_residual", bad)


@pytest.mark.parametrize("score", ["proj_residual", "delta_error"])
@pytest.mark.parametrize("one_pass", [True, False])
def test_decoder_prefills_in_one_pass_for_every_score(score, one_pass):
    """RetentionDecoder takes the one-pass prefill for every score (the model's forward is not called), and each
    prompt alone with one_pass = False; both give the same first tokens (tests/test_retention_generate.py checks
    the decoded tokens against HF generate)."""
    model = tiny_model("gdn", window=4, sinks=2, short_conv=True, retain=3, retain_score=score)
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    dec = RetentionDecoder(model, max_len=64)
    dec.one_pass = one_pass
    ids = torch.randint(1, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    first = dec.prefill(ids, [12, 9, 7])
    assert dec.prefill_mode == ("rows" if one_pass else "each") and len(calls) == (0 if one_pass else 3)
    if one_pass:
        dec.one_pass = False
        assert torch.equal(first, dec.prefill(ids, [12, 9, 7]))
