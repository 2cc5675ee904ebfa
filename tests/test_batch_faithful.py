"""models/kv_compression/batch_faithful.py: on a call of 3 rows, each row keeps what kvpress's own press keeps for
that row alone (random keys, values and hidden states on a small random Llama, float32 on the CPU)."""
from __future__ import annotations

import pytest

pytest.importorskip("kvpress")
import kvpress  # noqa: E402
import torch  # noqa: E402
from kvpress.presses.leverage_press import LeverageScorePress  # noqa: E402
from test_batched_press_prefill import small_llama  # noqa: E402

from golinear.models.kv_compression import batch_faithful as BF  # noqa: E402
from golinear.models.kv_compression.presses import ExactBudget, build_press  # noqa: E402

N, KEEP = 120, 30


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def layer():
    model = small_llama(64, 4, torch.float32, device="cpu")
    attn = model.model.layers[1].self_attn
    attn.rotary_emb = model.model.rotary_emb  # kvpress's presses read the layer's RoPE there
    return model, attn


def rows(model, b=3):
    """b rows of random hidden states, keys and values, each row at its own scale (so batch-wide statistics differ
    from a row's own), and the kwargs a press reads."""
    g = torch.Generator().manual_seed(2)
    heads, dim = model.config.num_key_value_heads, model.config.head_dim
    scale = torch.tensor([1.0, 3.0, 0.3][:b])
    h = torch.randn(b, N, model.config.hidden_size, generator=g) * scale[:, None, None]
    k = torch.randn(b, heads, N, dim, generator=g) * scale[:, None, None, None]
    v = torch.randn(b, heads, N, dim, generator=g) / scale[:, None, None, None]
    pos = torch.arange(N)
    cos, sin = model.model.rotary_emb(h, pos[None])
    return h, k, v, {"position_embeddings": (cos, sin), "cache_position": pos}


def kept_indices(keys, kept):
    """Each row's kept positions, sorted: where each kept key sits among the row's keys (random keys: no two equal)."""
    hit = (kept[:, :, :, None, :] == keys[:, :, None, :, :]).all(-1)  # [B, H, kept, N]
    assert (hit.sum(-1) == 1).all()
    return hit.float().argmax(-1).sort(-1).values


def evicted(masks, row):
    batch, head, pos = masks
    return {(int(h), int(p)) for b, h, p in zip(batch, head, pos) if int(b) == row}


def alone(press, attn, h, k, v, kw, j):
    return press.compress(attn, h[j:j + 1], k[j:j + 1], v[j:j + 1], kw)


def test_compactor_rows_keep_what_kvpress_keeps_alone(layer):
    model, attn = layer
    h, k, v, kw = rows(model)
    press, theirs = build_press("compactor", KEEP), ExactBudget(kvpress.CompactorPress(), KEEP, seeded=True)
    assert isinstance(press.press, BF.RowwiseCompactorPress)
    got = kept_indices(k, press.compress(attn, h, k, v, kw)[0])
    for j in range(3):
        want = kept_indices(k[j:j + 1], alone(theirs, attn, h, k, v, kw, j)[0])
        assert torch.equal(got[j], want[0]), j
        ours = alone(press, attn, h, k, v, kw, j)[0]  # one row: kvpress's press, to the bit
        assert torch.equal(ours, alone(theirs, attn, h, k, v, kw, j)[0]), j


@pytest.mark.parametrize("name", ["Compactor", "SnapKV", "ExpectedAttention"])
def test_scores_per_row_equal_kvpress_alone(layer, name):
    """The scores themselves, not only the top-k they choose: Compactor's sketch, z-scores and sink pads; the pads of
    SnapKV's window and Expected Attention's sinks (CriticalAdaKV multiplies them by the values' projected norm)."""
    model, attn = layer
    h, k, v, kw = rows(model)
    # a ratio above 0: Compactor weighs its leverage scores by it
    ours, theirs = (cls(compression_ratio=0.5) for cls in (getattr(BF, f"Rowwise{name}Press"),
                                                             getattr(kvpress, f"{name}Press")))
    torch.manual_seed(0)
    got = ours.score(attn, h, k, v, None, kw)
    for j in range(3):
        torch.manual_seed(0)
        want = theirs.score(attn, h[j:j + 1], k[j:j + 1], v[j:j + 1], None, kw)
        torch.testing.assert_close(got[j:j + 1], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["criticalkv_snapkv", "criticalkv_expected_attention"])
def test_criticalkv_rows_evict_what_kvpress_evicts_alone(layer, name):
    """Head budgets per row; with KEEP under SnapKV's window (64 entries padded with one value) its stage 1 picks
    among tied entries, so this also runs _raise_top's rows that rerun kvpress's own top-k."""
    model, attn = layer
    h, k, v, kw = rows(model)
    press = build_press(name, KEEP)
    assert isinstance(press.press, BF.RowwiseCriticalAdaKVPress)
    scorer = {"criticalkv_snapkv": kvpress.SnapKVPress, "criticalkv_expected_attention": kvpress.ExpectedAttentionPress}
    theirs = ExactBudget(kvpress.CriticalAdaKVPress(press=scorer[name]()), KEEP)
    keys, _ = press.compress(attn, h, k, v, kw)
    assert keys is k  # head-adaptive: every entry kept, the evicted ones masked
    got, counts = attn.masked_key_indices, set()
    for j in range(3):
        alone(theirs, attn, h, k, v, kw, j)
        want = attn.masked_key_indices
        assert evicted(got, j) == evicted(want, 0), (name, j)
        alone(press, attn, h, k, v, kw, j)  # one row: kvpress's press, to the index
        assert all(torch.equal(a, b) for a, b in zip(attn.masked_key_indices, want)), (name, j)
        counts.add(tuple(int((want[1] == head).sum()) for head in range(k.shape[1])))
    attn.masked_key_indices = None
    assert len(counts) > 1, "the rows' head budgets should differ, else pooling them over the batch changes nothing"


def test_cholesky_jitter_is_per_row():
    """A row whose Cholesky fails at the first jitter takes a larger one; the other rows keep theirs (kvpress would
    retry them all)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 2, 6, 6, generator=g)
    G = a @ a.transpose(-1, -2) + torch.eye(6)
    G[1, 1] = -0.5 * torch.eye(6)  # fails at jitter 1e-2 and 1e-1, factors at 1
    got = BF.RowwiseLeverageScorePress.chol_with_jitter(G, jitter=1e-2)
    for j in range(3):
        want = LeverageScorePress.chol_with_jitter(G[j:j + 1], jitter=1e-2)
        assert torch.equal(got[j:j + 1], want), j
    with pytest.raises(RuntimeError, match="Cholesky failed"):
        BF.RowwiseLeverageScorePress.chol_with_jitter(G - 1e3 * torch.eye(6), jitter=1e-2)
