"""Retention slots (models/retention/ops.py): the chunked prefill and the decode step against the
per-token definition, retain=0 against the default recipe (reference ops and LinearizedAttention itself),
token accounting, a fixed-size cache, and which tokens the slots keep. Then the wiring: the layer with
retain > 0 against the definition, HF-generate decoding against the full forward, a fixed-size LinearCache,
checkpoints that keep the option, and the refusals."""
import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

from golinear.models.training.diagnostics import projection_residual
from golinear.models.attention.layers import LinearizedAttention
from golinear.models.attention.ops import _one_thread
from golinear.models.attention.ops import reference as R
from golinear.models.retention.ops import RetentionState, entry_scores, retention_recurrent, retention_step
from golinear.models.retention.prefill import retention_prefill, retention_prefill_walk
from golinear.models.retention.static import fold_steps
from _gpu import TOL as GPU_TOL

SCALE, LIN_SCALE = 0.41, 0.37
TOL = 1e-10  # fp64 throughout


@pytest.fixture(autouse=True)
def one_thread():
    """Small ops on a shared 2-core machine: one OpenMP thread (as models.attention.ops runs the reference ops)."""
    with _one_thread():
        yield


def make(T=29, B=2, H=4, Hkv=2, D=6, seed=0, dtype=torch.float64):
    """Inputs as the layer builds them: lin q/k l2-normalised, lin k/v the KV heads expanded (GQA)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g, dtype=dtype)
    k = torch.randn(B, T, Hkv, D, generator=g, dtype=dtype)
    v = torch.randn(B, T, Hkv, D, generator=g, dtype=dtype)
    G = H // Hkv
    lin = dict(q=F.normalize(q, dim=-1), k=F.normalize(k, dim=-1).repeat_interleave(G, 2),
               v=v.repeat_interleave(G, 2),
               log_a=F.logsigmoid(torch.randn(B, T, H, generator=g, dtype=dtype) + 2),
               beta=torch.rand(B, T, H, generator=g, dtype=dtype))
    scores = torch.randn(B, T, Hkv, generator=g, dtype=dtype)
    return q, k, v, lin, scores


def decode_all(q, k, v, lin, s, w, r, score, scores=None, state=None, start=0):
    """retention_step over tokens start..T-1 (from an empty state unless given)."""
    B, T, H, D = q.shape
    if state is None:
        state = RetentionState.empty(B, H, k.shape[2], D, lin["k"].shape[-1], lin["v"].shape[-1], s, w, r, q.dtype)
    ys, states = [], []
    for t in range(start, T):
        one = lambda x: x[:, t:t + 1]  # noqa: E731
        y, state = retention_step(state, one(q), one(k), one(v), {key: one(x) for key, x in lin.items()},
                                  SCALE, LIN_SCALE, score=score, scores=None if scores is None else one(scores))
        ys.append(y)
        states.append(state)
    return torch.cat(ys, 1), state, states


def retained_sets(ret_pos):
    return [[sorted(p for p in row.tolist() if p >= 0) for row in rows] for rows in ret_pos]


def sorted_sets(lists):
    return [[sorted(x) for x in rows] for rows in lists]


def assert_close(a, b, tol=TOL):
    err = (a - b).abs().max().item() if a.numel() else 0.0
    assert err <= tol * max(1.0, b.abs().max().item() if b.numel() else 0.0), f"max error {err:.3g}"


CASES = [  # (T, sinks, window, retain)
    (29, 2, 4, 3),
    (29, 0, 5, 2),
    (29, 3, 0, 2),  # no window: a token leaves at once, retention alone decides
    (20, 2, 4, 0),
    (12, 1, 3, 20),  # more slots than tokens ever leaving: nothing folds
    (5, 8, 4, 2),  # a prompt shorter than the sinks
]


@pytest.mark.parametrize("score", ["delta_error", "proj_residual", "given"])
@pytest.mark.parametrize("case", CASES)
def test_prefill_matches_definition(case, score):
    T, s, w, r = case
    q, k, v, lin, scores = make(T)
    y_ref, info = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, s, w, r, score=score, scores=scores)
    runs = [(retention_prefill_walk, chunk) for chunk in sorted({1, 2, max(w, 1), w + 3, 64})]  # vs the window
    for prefill, chunk in runs + [(retention_prefill, 64)]:  # the walk, then the layer's path for this score
        y, st = prefill(q, k, v, lin, SCALE, LIN_SCALE, s, w, r, score=score, scores=scores, chunk_size=chunk)
        assert_close(y, y_ref)
        assert_close(st.S, info["S"])
        assert retained_sets(st.ret_pos) == sorted_sets(info["retained"]), f"chunk {chunk}"
        assert st.folded.tolist() == [[len(f) for f in rows] for rows in info["folded"]]


FAST_CASES = [  # (T, B, H, Hkv, sinks, window, retain): several query blocks (64), windows longer than a block
    (150, 2, 4, 2, 3, 7, 5),
    (200, 3, 6, 2, 0, 70, 9),
    (130, 1, 4, 1, 2, 1, 64),
    (90, 2, 2, 2, 4, 3, 200),  # more slots than tokens ever leaving
    (70, 2, 4, 2, 8, 56, 8),  # the study's split at a short length
]


def tied(scores):
    """Scores with many ties (a handful of values): the tie rule decides most slots."""
    return scores.mul(1.5).round().clamp(-2, 2)


@pytest.mark.parametrize("score", ["proj_residual", "given", "given-ties", "delta_error"])
@pytest.mark.parametrize("case", FAST_CASES)
def test_fast_path_is_the_walk(case, score):
    """The layer's path (decisions first: fold steps from arrival-time scores, or the walk without autograd for
    delta_error; then one GDN op over the fold sequence and one masked attention) = the walk with autograd
    through it: values, final state, slots and gradients."""
    T, B, H, Hkv, s, w, r = case
    q, k, v, lin, scores = make(T, B=B, H=H, Hkv=Hkv, seed=T)
    if score == "given-ties":
        score, scores = "given", tied(scores)
    leaves = [q, k, v, *lin.values()]
    for x in leaves:
        x.requires_grad_(True)
    weight = torch.randn(B, T, H, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = {}
    for name, prefill in (("walk", retention_prefill_walk), ("fast", retention_prefill)):
        y, st = prefill(q, k, v, lin, SCALE, LIN_SCALE, s, w, r, score=score, scores=scores, chunk_size=16)
        out[name] = (y, st, torch.autograd.grad((y * weight).sum(), leaves))
    (y_w, st_w, g_w), (y_f, st_f, g_f) = out["walk"], out["fast"]
    assert_close(y_f, y_w)
    assert_close(st_f.S, st_w.S)
    assert torch.equal(st_f.ret_pos.sort(-1).values, st_w.ret_pos.sort(-1).values)
    assert torch.equal(st_f.ret["score"].sort(-1).values, st_w.ret["score"].sort(-1).values)
    assert torch.equal(st_f.folded, st_w.folded)
    for a, b in zip(g_f, g_w):
        assert_close(a, b)


def test_fast_path_blocks_do_not_matter(monkeypatch):
    """The softmax path's query blocks are a memory bound only: tiny blocks (queries 8 at a time, windows longer
    than a block) give the walk's result."""
    from golinear.models.retention import static as retention_static
    q, k, v, lin, scores = make(50, seed=14)
    y_walk, st_walk = retention_prefill_walk(q, k, v, lin, SCALE, LIN_SCALE, 2, 11, 4, score="given",
                                             scores=tied(scores))
    monkeypatch.setattr(retention_static, "QUERY_BLOCK", 8)
    y, st = retention_prefill(q, k, v, lin, SCALE, LIN_SCALE, 2, 11, 4, score="given", scores=tied(scores))
    assert_close(y, y_walk)
    assert torch.equal(st.ret_pos.sort(-1).values, st_walk.ret_pos.sort(-1).values)


def test_fast_path_takes_an_empty_prompt():
    q, k, v, lin, scores = make(0)
    y, st = retention_prefill(q, k, v, lin, SCALE, LIN_SCALE, 2, 3, 2, score="proj_residual")
    assert y.shape == (2, 0, 4, 6) and (st.ret_pos == -1).all() and (st.folded == 0).all() and st.seen == 0


def test_fast_path_is_the_definition_with_ties():
    """Against the token-by-token definition too (tied given scores, several query blocks, GQA, B = 2)."""
    q, k, v, lin, scores = make(140, seed=12)
    y_ref, info = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, 2, 9, 6, score="given", scores=tied(scores))
    y, st = retention_prefill(q, k, v, lin, SCALE, LIN_SCALE, 2, 9, 6, score="given", scores=tied(scores))
    assert_close(y, y_ref)
    assert_close(st.S, info["S"])
    assert retained_sets(st.ret_pos) == sorted_sets(info["retained"])


def test_fold_steps_fold_one_token_a_step_in_the_definitions_order():
    """fold_steps gives the definition's fold order exactly, at most one token a step, never a sink."""
    T, s, w, r = 60, 3, 5, 4
    q, k, v, lin, scores = make(T, seed=13)
    for sc in (scores, tied(scores)):
        _, info = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, s, w, r, score="given", scores=sc)
        fold = fold_steps(sc, s, w, r)
        for b in range(2):
            for h in range(2):
                folded = [j for j in range(T) if fold[b, h, j] < T]
                assert sorted(folded, key=lambda j: fold[b, h, j].item()) == info["folded"][b][h]
                assert all(fold[b, h, j] >= T for j in range(s))


@pytest.mark.parametrize("block_rows", [None, 3])
def test_fold_steps_is_the_pairwise_rule(monkeypatch, block_rows):
    """fold_steps (a wavelet matrix, O(T log T)) gives fold_steps_pairwise's steps (every pair compared, in row
    blocks of any size) for ties, sinks up to the whole prompt, r above the prompt's length, lengths that are and
    are not powers of two."""
    from golinear.models.retention import static as retention_static
    gen = torch.Generator().manual_seed(21)
    cases = 0
    for T in (1, 2, 7, 8, 9, 64, 131):
        if block_rows:
            monkeypatch.setattr(retention_static, "PAIR_BLOCK", 2 * 3 * T * block_rows)
        for s, w, r in ((0, 0, 1), (0, 3, 2), (2, 5, 4), (3, 2, 200), (T, 1, 2), (1, 0, T)):
            for sc in (torch.randn(2, T, 3, generator=gen), torch.randint(0, 3, (2, T, 3), generator=gen).float()):
                fast = fold_steps(sc, s, w, r)
                assert torch.equal(fast, retention_static.fold_steps_pairwise(sc, s, w, r)), (T, s, w, r)
                cases += 1
    assert cases == 84


@pytest.mark.parametrize("score", ["delta_error", "proj_residual"])
@pytest.mark.parametrize("case", CASES[:4])
def test_decode_after_prefill_matches_definition(case, score):
    T, s, w, r = case
    q, k, v, lin, _ = make(T, seed=1)
    y_ref, info = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, s, w, r, score=score)
    for T0 in (0, 1, s + w + 1, T - 3):  # 0: decode from the empty state
        if T0:
            y0, st = retention_prefill(q[:, :T0], k[:, :T0], v[:, :T0], {key: x[:, :T0] for key, x in lin.items()},
                                       SCALE, LIN_SCALE, s, w, r, score=score, chunk_size=5)
            assert_close(y0, y_ref[:, :T0])
        else:
            st = None
        y, st, _ = decode_all(q, k, v, lin, s, w, r, score, state=st, start=T0)
        assert_close(y, y_ref[:, T0:])
        assert_close(st.S, info["S"])
        assert retained_sets(st.ret_pos) == sorted_sets(info["retained"])


@pytest.mark.parametrize("score", ["delta_error", "proj_residual"])
def test_gradients_agree(score):
    """Plain autograd through all three forms (the slot choice itself is a selection, not differentiated)."""
    q, k, v, lin, _ = make(15, seed=9)
    leaves = [q, k, v, *lin.values()]
    for x in leaves:
        x.requires_grad_(True)
    w = torch.randn(2, 15, 4, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def grads(y):
        return torch.autograd.grad((y * w).sum(), leaves)
    g_ref = grads(retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, 2, 3, 2, score=score)[0])
    g_pre = grads(retention_prefill(q, k, v, lin, SCALE, LIN_SCALE, 2, 3, 2, score=score, chunk_size=4)[0])
    g_dec = grads(decode_all(q, k, v, lin, 2, 3, 2, score)[0])
    for a, b, c in zip(g_ref, g_pre, g_dec):
        assert_close(b, a)
        assert_close(c, a)


def default_recipe(q, k, v, lin, s, w):
    """GDN + window + sinks as LinearizedAttention builds it from the reference ops: the softmax over sinks +
    window, plus q_t^T S_{t-w} with S over tokens s..t-w (the op run on q shifted by w)."""
    T = q.shape[1]
    y = R.window_sink_attention(q, k, v, s, w, SCALE)[0].clone()
    S = torch.zeros(q.shape[0], q.shape[2], lin["k"].shape[-1], lin["v"].shape[-1], dtype=q.dtype)
    if T - w - s > 0:
        ent = {key: lin[key][:, s:T - w] for key in ("k", "v", "log_a", "beta")}
        out, S = R.gdn_recurrent(lin["q"][:, w + s:], ent["k"], ent["v"], ent["log_a"], ent["beta"], LIN_SCALE,
                                 output_final_state=True)
        y[:, w + s:] += out
    return y, S


@pytest.mark.parametrize("s,w", [(2, 4), (0, 5), (3, 0), (8, 56)])
def test_retain0_is_the_default_recipe(s, w):
    q, k, v, lin, _ = make(30, seed=2)
    y_def, S_def = default_recipe(q, k, v, lin, s, w)
    y_ref, info = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, s, w, 0)
    y_pre, st = retention_prefill(q, k, v, lin, SCALE, LIN_SCALE, s, w, 0, chunk_size=4)
    y_dec, st_dec, _ = decode_all(q, k, v, lin, s, w, 0, "delta_error")
    for y, S in ((y_ref, info["S"]), (y_pre, st.S), (y_dec, st_dec.S)):
        assert_close(y, y_def)
        assert_close(S, S_def)
    # and with slots, the outputs differ (the comparison can fail)
    y_r, _ = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, s, w, 2)
    assert (y_r - y_def).abs().max() > 1e-3 or 30 - w - s <= 0


def tiny_layer(**options):
    """A LinearizedAttention (gdn) on a tiny Llama attention with o_proj the identity, run on random x:
    (layer, its output [2, 26, 4, 6], and the q, k, v, lin it computed them from)."""
    cfg = transformers.LlamaConfig(hidden_size=24, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=32, num_hidden_layers=1, vocab_size=10)
    torch.manual_seed(0)
    layer = LinearizedAttention(LlamaAttention(cfg, layer_idx=0), cfg, 0, "gdn", **options)
    with torch.no_grad():
        layer.o_proj.weight.copy_(torch.eye(24))
        x = torch.randn(2, 26, 24)
        pe = LlamaRotaryEmbedding(cfg)(x, torch.arange(26).unsqueeze(0))
        y_layer = layer(x, position_embeddings=pe)[0].view(2, 26, 4, 6)
        q, k, v, _ = layer.project(x, pe)
        lin = layer.linear_inputs(x, q, k, v)
    return layer, y_layer, (q, k, v, lin), (x, pe)


def test_retain0_is_linearized_attention():
    """The same tie through the layer itself: LinearizedAttention (gdn, window 5, sinks 2) on a tiny Llama
    attention, o_proj set to the identity, equals the retention op with retain=0 on its own q/k/v/lin
    (fp32: the layer's l2norm sums in fp32)."""
    layer, y_layer, (q, k, v, lin), _ = tiny_layer(window=5, sinks=2)
    with torch.no_grad():
        y, _ = retention_recurrent(q, k, v, lin, layer.scaling, layer.lin.scale, 2, 5, 0)
        y_pre, _ = retention_prefill(q, k, v, lin, layer.scaling, layer.lin.scale, 2, 5, 0, chunk_size=8)
    assert_close(y, y_layer, 1e-5)
    assert_close(y_pre, y_layer, 1e-5)


@pytest.mark.parametrize("case", CASES)
def test_every_token_is_accounted_once(case):
    T, s, w, r = case
    q, k, v, lin, _ = make(T, seed=3)
    _, info = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, s, w, r)
    for b in range(q.shape[0]):
        for h in range(k.shape[2]):
            sinks = list(range(min(s, T)))
            window = list(range(max(s, T - w), T))
            parts = sinks + window + info["retained"][b][h] + info["folded"][b][h]
            assert sorted(parts) == list(range(T)), (b, h)
            assert len(info["retained"][b][h]) <= r
    _, _, states = decode_all(q, k, v, lin, s, w, r, "delta_error")
    for t, st in enumerate(states, 1):  # at every step: sinks + window + slots + state == tokens seen
        count = min(s, t) + int((st.win_pos >= 0).sum()) + (st.ret_pos >= 0).sum(-1) + st.folded
        assert (count == t).all(), t
        in_window = sorted(p for p in st.win_pos.tolist() if p >= 0)
        assert in_window == list(range(max(s, t - w), t))


def test_decode_state_shapes_do_not_grow():
    q, k, v, lin, _ = make(40, seed=4)
    _, _, states = decode_all(q, k, v, lin, 2, 4, 3, "proj_residual")
    assert all(st.shapes() == states[0].shapes() for st in states)
    _, st_short = retention_prefill(q[:, :7], k[:, :7], v[:, :7], {key: x[:, :7] for key, x in lin.items()},
                                    SCALE, LIN_SCALE, 2, 4, 3, score="proj_residual", chunk_size=3)
    _, st_long = retention_prefill(q, k, v, lin, SCALE, LIN_SCALE, 2, 4, 3, score="proj_residual", chunk_size=3)
    assert st_short.shapes() == st_long.shapes() == states[0].shapes()


def test_slots_keep_the_top_k_given_scores():
    """Static scores: the slots hold the r best of the tokens that have left the window, ties to the latest."""
    T, s, w, r = 30, 2, 4, 3
    q, k, v, lin, _ = make(T, B=1, H=2, Hkv=1, seed=5)
    scores = torch.zeros(1, T, 1, dtype=torch.float64)
    scores[0, [5, 9, 13, 20, 25], 0] = torch.tensor([3.0, 1.0, 5.0, 4.0, 9.0], dtype=torch.float64)
    _, info = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, s, w, r, score="given", scores=scores)
    assert sorted(info["retained"][0][0]) == [13, 20, 25]  # token 25 left the window (T - w = 26 > 25)
    y, st = retention_prefill(q, k, v, lin, SCALE, LIN_SCALE, s, w, r, score="given", scores=scores, chunk_size=4)
    assert retained_sets(st.ret_pos) == [[[13, 20, 25]]]
    # all scores equal: the earliest folds first, so the slots hold the r latest tokens to leave the window
    flat = torch.ones(1, T, 1, dtype=torch.float64)
    _, info = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, s, w, r, score="given", scores=flat)
    assert sorted(info["retained"][0][0]) == [T - w - 3, T - w - 2, T - w - 1]


def test_delta_error_folds_what_the_state_already_stores():
    """window 1, one slot, a = beta = 1, orthonormal keys: token 0 takes the slot, token 1 (larger v) takes it
    over and token 0 folds, so S = k0 v0^T exactly; token 2 repeats token 0 (error 0) and folds, not token 1."""
    B, T, H, D = 1, 4, 1, 4
    k = torch.eye(D, dtype=torch.float64)[[0, 1, 0, 2]].view(B, T, H, D)
    v = torch.tensor([[1.0, 0, 0, 0], [0, 3.0, 0, 0], [1.0, 0, 0, 0], [0, 0, 1.0, 0]], dtype=torch.float64)
    v = v.view(B, T, H, D)
    q = torch.randn(B, T, H, D, dtype=torch.float64)
    lin = dict(q=q, k=k, v=v, log_a=torch.zeros(B, T, H, dtype=torch.float64),
               beta=torch.ones(B, T, H, dtype=torch.float64))
    _, info = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, 0, 1, 1)
    assert info["exit_score"][0, :3, 0].tolist() == [1.0, 3.0, 0.0]
    assert info["retained"][0][0] == [1] and info["folded"][0][0] == [0, 2]
    _, st = retention_prefill(q, k, v, lin, SCALE, LIN_SCALE, 0, 1, 1, chunk_size=2)
    assert st.ret_pos.tolist() == [[[1]]] and st.folded.tolist() == [[2]]
    # proj_residual keeps another token here: the choice is the score's
    _, info_r = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, 0, 1, 1, score="proj_residual")
    assert info_r["retained"][0][0] != [1]


@pytest.mark.parametrize("score", ["delta_error", "proj_residual"])
def test_slots_hold_the_best_exit_scores(score):
    """Scores are fixed once, so after any prefix the slots hold the r best exit scores seen so far."""
    T, s, w, r = 40, 2, 4, 3
    q, k, v, lin, _ = make(T, seed=6)
    _, info = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, s, w, r, score=score)
    ex = info["exit_score"]
    for b in range(2):
        for h in range(2):
            left = [j for j in range(T) if not math.isnan(ex[b, j, h].item())]
            best = sorted(left, key=lambda j: (ex[b, j, h].item(), j))[-r:]
            assert sorted(info["retained"][b][h]) == sorted(best)
    if score == "delta_error":  # the first token to leave meets an empty state: its error is |v|
        assert_close(ex[:, s, :], lin["v"][:, s].norm(dim=-1).view(2, 2, 2).mean(-1))


def test_delta_error_is_the_delta_rule_residual():
    """retain=0: token j's score is |v_j - a_j S^T k_j| with S the GDN state over tokens s..j-1 (mean over the
    group), the state built independently by reference.gdn_recurrent."""
    T, s, w = 16, 2, 3
    q, k, v, lin, _ = make(T, seed=8)
    _, info = retention_recurrent(q, k, v, lin, SCALE, LIN_SCALE, s, w, 0)
    for j in (s + 1, s + 5, T - w - 1):
        ent = {key: lin[key][:, s:j] for key in ("q", "k", "v", "log_a", "beta")}
        _, S = R.gdn_recurrent(ent["q"], ent["k"], ent["v"], ent["log_a"], ent["beta"], 1.0, output_final_state=True)
        pred = torch.exp(lin["log_a"][:, j]).unsqueeze(-1) * torch.einsum("bhkv,bhk->bhv", S, lin["k"][:, j])
        want = (lin["v"][:, j] - pred).norm(dim=-1).view(2, 2, 2).mean(-1)
        assert_close(info["exit_score"][:, j], want)


def test_proj_residual_is_the_diagnose_formula():
    _, k, _, _, _ = make(33, seed=7, dtype=torch.float32)
    assert torch.allclose(entry_scores(k, "proj_residual"), projection_residual(k), atol=1e-6)


# ---------------------------------------------------------------------------------------------- the wiring
def tiny_model(seed=0, **options):
    """A 3-layer Llama linearized with the given options, new parameters moved off their init."""
    from golinear.models.attention.linearize import LinearizeConfig, linearize, new_parameters
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg).eval()
    if options:
        linearize(model, LinearizeConfig(**options))
        with torch.no_grad():
            for p in new_parameters(model).values():
                p.add_(0.1 * torch.randn_like(p))
    return model


RECIPE = dict(mechanism="gdn", window=4, sinks=2, short_conv=True)  # budget 2 + 4 (+ retain)


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("score", ["delta_error", "proj_residual"])
def test_layer_with_slots_is_the_definition(score):
    """LinearizedAttention(retain=3) on a tiny Llama attention (o_proj = identity) = retention_recurrent on its
    own q/k/v/lin, and differs from the same layer without slots."""
    layer, y_layer, (q, k, v, lin), (x, pe) = tiny_layer(window=4, sinks=2, retain=3, retain_score=score)
    with torch.no_grad():
        y, _ = retention_recurrent(q, k, v, lin, layer.scaling, layer.lin.scale, 2, 4, 3, score=score)
        layer.retain = 0
        y_plain = layer(x, position_embeddings=pe)[0].view(2, 26, 4, 6)
    assert_close(y_layer, y, 1e-5)
    assert rel_err(y_plain, y) > 1e-3


@pytest.mark.parametrize("score", ["delta_error", "proj_residual"])
@pytest.mark.parametrize("prompt", [3, 8, 20])  # shorter than the sinks + window, than the budget 9, longer
def test_generate_cache_equals_the_full_forward(score, prompt):
    """Prefill through LinearCache, then one token per step (HF's own generate loop and a manual one, batch 2),
    equals the full forward on the whole sequence (fp32, 1e-5)."""
    from golinear.models.cache.hf_cache import LinearCache
    model = tiny_model(**RECIPE, retain=3, retain_score=score)
    ids = torch.randint(0, 97, (2, prompt), generator=torch.Generator().manual_seed(prompt))
    out = model.generate(ids, max_new_tokens=16, do_sample=False, return_dict_in_generate=True, output_logits=True,
                         pad_token_id=0)
    assert isinstance(out.past_key_values, LinearCache)
    with torch.no_grad():
        full = model(out.sequences).logits
        assert rel_err(torch.stack(out.logits, 1), full[:, prompt - 1:-1]) <= 1e-5
        cache = LinearCache.for_model(model)
        first = model(out.sequences[:, :prompt], past_key_values=cache, use_cache=True).logits
        steps = [model(out.sequences[:, t:t + 1], past_key_values=cache, use_cache=True).logits
                 for t in range(prompt, out.sequences.shape[1])]
    assert rel_err(torch.cat([first] + steps, 1), full) <= 1e-5


def test_generate_cache_has_a_fixed_size():
    """The LinearCache of a model with slots holds the same bytes after a prompt of 3 or 40 tokens and after
    every decode step; the slots are in it (more bytes than without)."""
    from golinear.models.cache.hf_cache import LinearCache
    model = tiny_model(**RECIPE, retain=3)
    sizes = []
    with torch.no_grad():
        for T in (3, 40):
            cache = LinearCache.for_model(model)
            model(torch.randint(0, 97, (2, T)), past_key_values=cache, use_cache=True)
            sizes.append(cache.nbytes())
            for _ in range(5):
                model(torch.randint(0, 97, (2, 1)), past_key_values=cache, use_cache=True)
                sizes.append(cache.nbytes())
        plain = LinearCache.for_model(tiny_model(**RECIPE))
        tiny_model(**RECIPE)(torch.randint(0, 97, (2, 40)), past_key_values=plain, use_cache=True)
    assert len(set(sizes)) == 1 and sizes[0] > plain.nbytes()


def test_beam_reorder_keeps_each_rows_slots():
    """Reordering the cache's rows (beam search) reorders the retention state with them."""
    from golinear.models.cache.hf_cache import LinearCache
    model = tiny_model(**RECIPE, retain=3)
    ids = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = LinearCache.for_model(model)
        model(ids[:, :15], past_key_values=cache, use_cache=True)
        cache.reorder_cache(torch.tensor([1, 1]))
        steps = [model(ids[[1, 1], t:t + 1], past_key_values=cache, use_cache=True).logits for t in range(15, 20)]
        full = model(ids[[1, 1]]).logits
    assert rel_err(torch.cat(steps, 1), full[:, 15:]) <= 1e-5


def test_training_gradients_reach_the_new_parameters():
    """The forward with slots is differentiable: every new parameter gets a gradient."""
    from golinear.models.attention.linearize import new_parameters
    model = tiny_model(**RECIPE, retain=3)
    ids = torch.randint(0, 97, (2, 24))
    model(ids, labels=ids).loss.backward()
    params = new_parameters(model)
    assert params and all(p.grad is not None and p.grad.abs().sum() > 0 for p in params.values())


def test_checkpoint_keeps_the_option(tmp_path):
    import json
    from golinear.models.checkpoint.weights import apply_checkpoint, save_checkpoint
    model = tiny_model(**RECIPE, retain=3, retain_score="proj_residual")
    save_checkpoint(model, tmp_path / "ck")
    lin = json.loads((tmp_path / "ck" / "config.json").read_text())["linearize"]
    assert (lin["retain"], lin["retain_score"]) == (3, "proj_residual")
    fresh = apply_checkpoint(tiny_model(), tmp_path / "ck")
    assert all(layer.self_attn.retain == 3 and layer.self_attn.retain_score == "proj_residual"
               for layer in fresh.model.layers)
    ids = torch.randint(0, 97, (1, 30))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    save_checkpoint(tiny_model(**RECIPE), tmp_path / "plain")  # without slots: no retention keys at all
    assert "retain" not in json.loads((tmp_path / "plain" / "config.json").read_text())["linearize"]


@pytest.mark.parametrize("options,message", [
    (dict(mechanism="gla", window=4, retain=2), "retain=2 needs mechanism=gdn and window > 0; got mechanism=gla, window=4"),
    (dict(mechanism="gdn", sinks=2, retain=2), "retain=2 needs mechanism=gdn and window > 0; got mechanism=gdn, window=0"),
    (dict(mechanism="gdn", window=4, retain_score="attention"),
     "unknown retention score 'attention'; allowed: ['delta_error', 'proj_residual', 'fitted']"),
])
def test_linearize_refuses_bad_retention(options, message):
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    with pytest.raises(ValueError) as err:
        linearize(tiny_model(), LinearizeConfig(**options))
    assert str(err.value) == message


def test_fast_decoder_refuses_slots():
    from golinear.models.decoding.fast_decode import FastDecoder
    with pytest.raises(ValueError, match=r"^FastDecoder has no static cache for retention slots \(retain > 0\)"):
        FastDecoder(tiny_model(**RECIPE, retain=2), use_graph=False)
    layer = tiny_model(**RECIPE, retain=2).model.layers[0].self_attn  # nor does its chunked prefill
    with pytest.raises(ValueError, match=r"^a chunked, right-padded prefill \(golinear.models.decoding.prefill\) has no retention"):
        layer.prefill(torch.zeros(1, 4, 64), None, chunk=object(), carry={})


def test_trainer_learns_with_slots(tmp_path):
    """models.training.train.Trainer on a tiny random Llama with retention slots (seq 32 > budget 2 + 4 + 3): the held-out
    loss falls (a little: only the gates and convs train on a random backbone) and only the new parameters
    change."""
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from _tiny import tiny_llama, tiny_tokenizer, write_books
    from golinear.models.training import data as data_mod, train as train_mod
    from golinear.models.attention.linearize import LinearizeConfig, linearize, new_parameters
    tok = tiny_tokenizer()
    model = linearize(tiny_llama(len(tok)), LinearizeConfig(**RECIPE, retain=3, retain_score="proj_residual"))
    td = data_mod.prepare_books(tok, write_books(tmp_path / "data"), heldout_docs=2)
    seqs = data_mod.PackedSequences(td.train, 32, seed=0)
    held = data_mod.heldout_sequences(td.heldout, 32, 4)
    frozen = model.model.layers[1].mlp.up_proj.weight.clone()
    new_before = {n: p.detach().clone() for n, p in new_parameters(model).items()}
    cfg = train_mod.TrainConfig(seq_len=32, batch_size=2, steps=20, lr=1e-2, save_every=10**6, log_every=5,
                                eval_sequences=4)
    trainer = train_mod.Trainer(model, seqs, cfg, tmp_path / "run")
    before = trainer.evaluate(held)
    assert trainer.train()["finished"]
    assert trainer.evaluate(held) < before - 0.005
    assert torch.equal(frozen, model.model.layers[1].mlp.up_proj.weight)
    assert all(not torch.equal(p, new_before[n]) for n, p in new_parameters(model).items())


# ---------------------------------------------------------------------------------------------- GPU (skipped on CPU)
def cuda(test):
    """A test of the CUDA path: in the GPU test set (`-m gpu`), skipped without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test))


@cuda
def test_gpu_prefill_matches_cpu_and_times_it():
    """On the GPU (fp32): a SmolLM2-shaped layer's op (H 9, Hkv 3, D 64, sinks 8, window 48, retain 8, T 1024)
    equals the CPU result (delta_error) and the walk on the GPU (proj_residual's fast path); prints forward +
    backward wall time against the default recipe's ops (run with -s)."""
    import time
    from golinear.models.attention import ops
    q, k, v, lin, _ = make(1024, B=1, H=9, Hkv=3, D=64, seed=11, dtype=torch.float32)
    y_cpu, st_cpu = retention_prefill(q, k, v, lin, 0.125, 0.125, 8, 48, 8)
    dev = [x.cuda().requires_grad_(True) for x in (q, k, v, *lin.values())]
    qd, kd, vd, lind = dev[0], dev[1], dev[2], dict(zip(lin, dev[3:]))

    def timed(fn):
        fn()  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = fn()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        y.float().sum().backward()
        torch.cuda.synchronize()
        return y, t1 - t0, time.perf_counter() - t1

    for score in ("delta_error", "proj_residual"):
        y, fwd, bwd = timed(lambda: retention_prefill(qd, kd, vd, lind, 0.125, 0.125, 8, 48, 8, score)[0])
        print(f"\nretention_prefill T=1024 retain=8 {score}: forward {fwd * 1e3:.1f} ms, backward {bwd * 1e3:.1f} ms")
        if score == "delta_error":
            assert rel_err(y.detach().cpu(), y_cpu) <= 1e-4
            _, st = retention_prefill(qd, kd, vd, lind, 0.125, 0.125, 8, 48, 8)
            assert torch.equal(st.ret_pos.cpu(), st_cpu.ret_pos)
        else:  # the fast path (FLA's gdn_chunk, SDPA) against the walk on the same device (same scores)
            with torch.no_grad():
                y_walk, st_walk = retention_prefill_walk(qd, kd, vd, lind, 0.125, 0.125, 8, 48, 8, score)
                _, st = retention_prefill(qd, kd, vd, lind, 0.125, 0.125, 8, 48, 8, score)
            assert rel_err(y.detach(), y_walk) <= 1e-3
            assert torch.equal(st.ret_pos.sort(-1).values, st_walk.ret_pos.sort(-1).values)

    def default():
        ent = {key: lind[key][:, 8:1024 - 48] for key in ("k", "v", "log_a", "beta")}
        out, _ = ops.gdn_chunk(lind["q"][:, 56:], ent["k"], ent["v"], ent["log_a"], ent["beta"], 0.125,
                               output_final_state=True)
        return ops.window_sink_softmax(qd, kd, vd, sinks=8, window=48, scale=0.125)[:, 56:].float() + out
    _, fwd, bwd = timed(default)
    print(f"default recipe (gdn_chunk + window_sink_softmax): forward {fwd * 1e3:.1f} ms, backward {bwd * 1e3:.1f} ms")


@cuda
@pytest.mark.parametrize("score", ["proj_residual", "delta_error"])
def test_gpu_prefill_captures_in_a_cuda_graph(score):
    """`golinear train` captures the whole step in a CUDA graph on one GPU (models.training.train): the layer's retention
    path, forward and backward, must capture (no host sync) and replay to the eager result."""
    q, k, v, lin, _ = make(256, B=1, H=9, Hkv=3, D=64, seed=12, dtype=torch.float32)
    leaves = [x.cuda().requires_grad_(True) for x in (q, k, v, *lin.values())]
    qd, kd, vd, lind = leaves[0], leaves[1], leaves[2], dict(zip(lin, leaves[3:]))

    def step():
        y = retention_prefill(qd, kd, vd, lind, 0.125, 0.125, 8, 48, 8, score, want_state=False)[0].float()
        return (y,) + torch.autograd.grad(y.square().sum(), leaves)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream (FLA's autotuning, allocator)
        for _ in range(2):
            eager = step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, eager):
        assert rel_err(a, b) <= 1e-4


@cuda
@pytest.mark.parametrize("score", ["delta_error", "proj_residual"])
def test_gpu_generate_equals_the_full_forward(score):
    """fp32 on the GPU: the shared GPU tolerance (tests/_gpu.py), as every fp32 GPU parity test; FLA's kernels
    compute fp32 dot products in TF32 (measured on an H200: 1.5e-4 delta_error, 2.0e-4 proj_residual)."""
    model = tiny_model(**RECIPE, retain=3, retain_score=score).cuda()
    ids = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(0)).cuda()
    out = model.generate(ids, max_new_tokens=16, do_sample=False, return_dict_in_generate=True, output_logits=True,
                         pad_token_id=0)
    with torch.no_grad():
        full = model(out.sequences).logits[:, 19:-1]
    assert rel_err(torch.stack(out.logits, 1), full) <= GPU_TOL[torch.float32][0]
