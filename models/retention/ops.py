"""GDN + sinks + sliding window + content-aware retention slots: the pure-PyTorch reference.

The cache budget per KV head is `sinks + window + retain` softmax slots. Token j (j >= sinks) leaves the
window at step t = j + window. It then competes with the tokens in the `retain` slots: the candidate with
the LOWEST score (ties: the earliest position; an empty slot counts as score -inf, position -1) folds
into the GDN state, the others keep (or take) a slot. So every token is in exactly one of sinks, window,
retained slots or state, and at most one token folds per step. Scores are fixed once: `delta_error` when
the token leaves the window, `proj_residual` / `given` when it arrives (see `entry_scores`).

Fold-time choice: a token folds with its OWN gate and beta, at the step it folds:
    S <- exp(log_a_f) S;  u = beta_f (v_f - S^T k_f);  S <- S + k_f u^T.
This is what the default recipe already does (there the state's decay at step t is the gate of token
t - window, the token folding in), so every token's decay is applied exactly once, when it folds; a
retained token's decay is deferred with it. With retain=0 the fold order is the position order and the
op is the default recipe exactly (tests/test_retention.py). The decision is made per KV head (the
softmax slots are KV slots); the linear state stays per query head, a token folds into all G query heads
of its group, and `delta_error` is the mean over those G heads.

Output at query t: y_t = lin_scale * q_t^T S_t (S after step t's fold) + softmax over sinks + window +
retained (GDN's disjoint sum, as LinearizedAttention._combine).

Inputs (layout of models/attention/ops/reference.py): q [B, T, H, D], k, v [B, T, Hkv, D] (the softmax path, GQA);
`lin` = the layer's linear-input dict: q, k [B, T, H, K] (l2-normalised, k expanded to query heads),
v [B, T, H, V] (V = D), log_a, beta [B, T, H]; `scores` [B, T, Hkv] for score="given" (a learned scorer's
output, or a test's construction). Higher score = more worth a softmax slot.
Here: the definition (`retention_recurrent`, Python lists), the fixed-size decode state and step.
The chunked prefill is in models/retention/prefill.py.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from golinear.models.attention.ops.key_stats import normalize_keys, running_mean
from golinear.models.attention.ops.reference import compute_dtype, masked_softmax

SCORES = ("delta_error", "proj_residual", "given")
EPS = 1e-6  # models.training.diagnostics' eps
KV_KEYS = ("k", "v", "score")  # a cached token's per-KV-head fields
Q_KEYS = ("lk", "lv", "log_a", "beta")  # its per-query-head linear inputs (what it folds with)
LIN = {"lk": "k", "lv": "v", "log_a": "log_a", "beta": "beta"}  # Q_KEYS -> keys of the layer's lin dict


# ---------------------------------------------------------------------------------------------- scores
def residual(kt: torch.Tensor, kbar: torch.Tensor) -> torch.Tensor:
    """models.training.diagnostics.projection_residual's R = |P k~ - kbar| from normalised keys and their running
    mean (kept in the input dtype; diagnostics casts to fp32)."""
    coef = (kt * kbar).sum(-1, keepdim=True) / (kbar.pow(2).sum(-1, keepdim=True) + EPS)
    return (coef * kbar - kbar).norm(dim=-1)


def entry_scores(k: torch.Tensor, score: str, scores=None) -> torch.Tensor | None:
    """Scores fixed when a token arrives, [B, T, Hkv] in k's dtype: proj_residual (R_j of the keys <= j, high =
    hard for a linear state) or the given ones; None for delta_error (scored when the token leaves)."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if score == "given":
        if scores is None or tuple(scores.shape) != tuple(k.shape[:3]):
            raise ValueError(f"score='given' needs scores [B, T, Hkv] = {tuple(k.shape[:3])}")
        return scores.to(k.dtype)
    if score == "proj_residual":
        kt = normalize_keys(k, EPS)
        return residual(kt, running_mean(kt, dim=1))
    return None


def delta_error(y: torch.Tensor, lv: torch.Tensor, log_a: torch.Tensor, groups: int) -> torch.Tensor:
    """||v - a S^T k|| (y = S^T k, [..., H, V]): the delta rule's own correction u/beta had the token folded
    now, i.e. how badly the (decayed) state already stores it; mean over each KV head's G query heads."""
    err = (lv - torch.exp(log_a).unsqueeze(-1) * y).norm(dim=-1)
    return err.unflatten(-1, (-1, groups)).mean(-1)


def evict(slot_score, slot_pos, new_score, new_pos) -> torch.Tensor:
    """Index in 0..r (r = the leaving token) of the candidate that folds: the lowest score, ties to the
    earliest position. slot_* [B, Hkv, r], new_score [B, Hkv], new_pos an int or per row [B, Hkv]."""
    sc = torch.cat([slot_score, new_score.unsqueeze(-1)], -1)
    new_pos = torch.as_tensor(new_pos, dtype=slot_pos.dtype, device=slot_pos.device).expand(new_score.shape)
    return lowest(sc, torch.cat([slot_pos, new_pos.unsqueeze(-1)], -1))


def lowest(score: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Index along the last dim of the candidate that folds: the lowest score, ties to the earliest position."""
    low = score == score.amin(-1, keepdim=True)
    return torch.where(low, pos, torch.full_like(pos, 1 << 62)).argmin(-1)


def gdn_fold(S, k, v, log_a, beta):
    """One delta-rule update with the folding token's own gate and beta (models.attention.ops.reference.gdn_recurrent)."""
    S = S * torch.exp(log_a)[..., None, None]
    u = beta.unsqueeze(-1) * (v - torch.einsum("...kv,...k->...v", S, k))
    return S + k.unsqueeze(-1) * u.unsqueeze(-2)


def check_inputs(q, k, v, lin, sinks, window, retain):
    B, T, H, D = q.shape
    if k.shape[:2] != (B, T) or v.shape[:3] != k.shape[:3] or H % k.shape[2]:
        raise ValueError(f"q [B,T,H,D], k/v [B,T,Hkv,D] with H % Hkv == 0; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    for key, rank in (("q", 4), ("k", 4), ("v", 4), ("log_a", 3), ("beta", 3)):
        if lin[key].dim() != rank or lin[key].shape[:3] != (B, T, H):
            raise ValueError(f"lin[{key!r}] must start with [B, T, H] = {(B, T, H)}, got {tuple(lin[key].shape)}")
    if lin["v"].shape[-1] != v.shape[-1]:
        raise ValueError("the linear and softmax values must have the same width (y = y_lin + y_swa)")
    if min(sinks, window, retain) < 0:
        raise ValueError(f"sinks, window, retain must be >= 0; got {sinks}, {window}, {retain}")


# ---------------------------------------------------------------------------------------------- definition
def retention_recurrent(q, k, v, lin, scale, lin_scale, sinks, window, retain, score="delta_error", scores=None):
    """The definition, token by token with Python lists per (row, KV head). Returns (y [B, T, H, V], info):
    info["S"] the final state, "retained"/"folded" [b][h] lists of positions (folded in fold order),
    "exit_score" [B, T, Hkv] (nan for tokens that never left the window)."""
    check_inputs(q, k, v, lin, sinks, window, retain)
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    dt = compute_dtype(q)
    q, k, v = (x.to(dt) for x in (q, k, v))
    lq, lk, lv, la, be = (lin[key].to(dt) for key in ("q", "k", "v", "log_a", "beta"))
    static = entry_scores(k, score, scores)
    S = [[q.new_zeros(G, lk.shape[-1], lv.shape[-1]) for _ in range(Hkv)] for _ in range(B)]  # per group
    rows = []  # y per step; lists rather than in-place writes keep plain autograd working
    retained = [[[] for _ in range(Hkv)] for _ in range(B)]
    folded = [[[] for _ in range(Hkv)] for _ in range(B)]
    exit_score = torch.full((B, T, Hkv), math.nan, dtype=dt)
    for t in range(T):
        j = t - window  # the token leaving the window at this step
        row = []
        for b in range(B):
            for h in range(Hkv):
                g = slice(h * G, (h + 1) * G)
                ret = retained[b][h]
                if j >= sinks:
                    if static is None:
                        Sk = torch.einsum("gkv,gk->gv", S[b][h], lk[b, j, g])
                        exit_score[b, j, h] = delta_error(Sk, lv[b, j, g], la[b, j, g], G)[0].detach()
                    else:
                        exit_score[b, j, h] = static[b, j, h].detach()
                    out = j
                    if len(ret) < retain:
                        ret.append(j)
                        out = None
                    elif ret:
                        out = min(ret + [j], key=lambda p: (exit_score[b, p, h].item(), p))
                        if out != j:
                            ret.remove(out)
                            ret.append(j)
                    if out is not None:
                        S[b][h] = gdn_fold(S[b][h], lk[b, out, g], lv[b, out, g], la[b, out, g], be[b, out, g])
                        folded[b][h].append(out)
                seen = list(range(min(sinks, t + 1))) + list(range(max(sinks, t - window + 1), t + 1)) + ret
                yt = lin_scale * torch.einsum("gk,gkv->gv", lq[b, t, g], S[b][h])
                if seen:
                    p = torch.softmax(q[b, t, g] @ k[b, seen, h].T * scale, dim=-1)
                    yt = yt + p @ v[b, seen, h]
                row.append(yt)
        rows.append(torch.stack(row).view(B, H, -1))
    y = torch.stack(rows, 1) if rows else q.new_zeros(B, 0, H, lv.shape[-1])
    S = torch.stack([torch.cat(S_b) for S_b in S])
    return y, {"S": S, "retained": retained, "folded": folded, "exit_score": exit_score}


# ---------------------------------------------------------------------------------------------- decode state
@dataclasses.dataclass
class RetentionState:
    """The decode cache: every tensor has a fixed shape, whatever the sequence length.

    S [B, H, K, V]; sink_k/v [B, Hkv, s, D]; win = ring of the window tokens (slot (j - s) % w) and ret =
    the retention slots, each a dict: KV_KEYS [B, Hkv, n, *] (softmax K/V and the token's score), Q_KEYS
    [B, H, n, *] (what it folds with); win_pos [w] (same for every row) and ret_pos [B, Hkv, r] are the
    absolute positions, -1 = empty (ret score -inf); ksum [B, Hkv, D] sums the normalised keys
    (proj_residual's running mean); folded [B, Hkv] counts the tokens in S; seen = tokens so far."""
    S: torch.Tensor
    sink_k: torch.Tensor
    sink_v: torch.Tensor
    win: dict
    win_pos: torch.Tensor
    ret: dict
    ret_pos: torch.Tensor
    ksum: torch.Tensor
    folded: torch.Tensor
    seen: int = 0

    @classmethod
    def empty(cls, B, H, Hkv, D, K, V, sinks, window, retain, dtype=torch.float32, device=None):
        z = lambda *shape: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731

        def slots(n):
            return {"k": z(B, Hkv, n, D), "v": z(B, Hkv, n, V), "score": z(B, Hkv, n), "lk": z(B, H, n, K),
                    "lv": z(B, H, n, V), "log_a": z(B, H, n), "beta": z(B, H, n)}
        ret = slots(retain)
        ret["score"] = torch.full_like(ret["score"], -math.inf)
        return cls(S=z(B, H, K, V), sink_k=z(B, Hkv, sinks, D), sink_v=z(B, Hkv, sinks, V), win=slots(window),
                   win_pos=torch.full((window,), -1, dtype=torch.long, device=device), ret=ret,
                   ret_pos=torch.full((B, Hkv, retain), -1, dtype=torch.long, device=device),
                   ksum=z(B, Hkv, D), folded=torch.zeros(B, Hkv, dtype=torch.long, device=device))

    def tensors(self) -> list:
        """Every tensor, in a fixed order (memory accounting: models.cache.decode_state.DecodeState.tensors)."""
        return ([self.S, self.sink_k, self.sink_v, self.win_pos, self.ret_pos, self.ksum, self.folded]
                + list(self.win.values()) + list(self.ret.values()))

    def select(self, index: torch.Tensor) -> "RetentionState":
        """The rows `index` (reordered, repeated: beam search, batch expansion); win_pos is shared by all rows."""
        def pick(x):
            return x.index_select(0, index.to(x.device))
        return dataclasses.replace(self, S=pick(self.S), sink_k=pick(self.sink_k), sink_v=pick(self.sink_v),
                                   win={key: pick(x) for key, x in self.win.items()}, ret_pos=pick(self.ret_pos),
                                   ret={key: pick(x) for key, x in self.ret.items()}, ksum=pick(self.ksum),
                                   folded=pick(self.folded))

    def shapes(self) -> dict:
        """Every tensor's shape (the test that the cache does not grow compares these)."""
        out = {f: tuple(getattr(self, f).shape) for f in ("S", "sink_k", "sink_v", "win_pos", "ret_pos", "ksum",
                                                           "folded")}
        out.update({f"win.{key}": tuple(x.shape) for key, x in self.win.items()})
        out.update({f"ret.{key}": tuple(x.shape) for key, x in self.ret.items()})
        return out


def take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, Hx, N, *rest] at idx [B, Hx, *m] along dim 2 -> [B, Hx, *m, *rest]. An index past the end reads
    the last slot (zeros when N == 0): the callers mask those reads (the candidate r = the leaving token)."""
    B, Hx = x.shape[:2]
    rest, m = tuple(x.shape[3:]), tuple(idx.shape[2:])
    if x.shape[2] == 0:
        return x.new_zeros((B, Hx) + m + rest)
    flat = idx.reshape(B, Hx, -1).clamp(max=x.shape[2] - 1)
    flat = flat.view(B, Hx, flat.shape[-1], *([1] * len(rest))).expand(B, Hx, flat.shape[-1], *rest)
    return torch.gather(x, 2, flat).view((B, Hx) + m + rest)


def _fold_and_place(state_ret, ret_pos, S, leaving, pos, score, G):
    """The leaving token (dict of KV_KEYS/Q_KEYS without the slot dim; its position `pos`, an int or per row
    [B, 1]) competes with the slots; the loser folds (a no-op update for an empty slot). Returns (ret, ret_pos,
    S, folded_now [B, Hkv])."""
    r = ret_pos.shape[-1]
    pos = torch.as_tensor(pos, dtype=ret_pos.dtype, device=ret_pos.device).expand(score.shape)  # [B, Hkv]
    e = evict(state_ret["score"], ret_pos, score, pos)  # [B, Hkv]
    valid = (e == r) | (take(ret_pos, e) >= 0)
    eq, vq = e.repeat_interleave(G, 1), valid.repeat_interleave(G, 1)
    f = {key: torch.where((eq == r).view(eq.shape + (1,) * (leaving[key].dim() - 2)), leaving[key],
                          take(state_ret[key], eq)) for key in Q_KEYS}
    la = torch.where(vq, f["log_a"], torch.zeros_like(f["log_a"]))
    be = torch.where(vq, f["beta"], torch.zeros_like(f["beta"]))
    S = gdn_fold(S, f["lk"], f["lv"], la, be)
    ret = {}
    for key, x in state_ret.items():
        hot = (torch.arange(r, device=e.device) == (eq if key in Q_KEYS else e).unsqueeze(-1))
        hot = hot.view(hot.shape + (1,) * (x.dim() - 3))
        ret[key] = torch.where(hot, leaving[key].unsqueeze(2), x)
    ret_pos = torch.where(torch.arange(r, device=e.device) == e.unsqueeze(-1), pos.unsqueeze(-1), ret_pos)
    return ret, ret_pos, S, valid


def retention_step(state: RetentionState, q, k, v, lin, scale, lin_scale, score="delta_error", scores=None):
    """One decoding step (T == 1) on the fixed-size state; shapes as retention_recurrent. Per-row decisions go
    through torch.where/gather; the only Python branches depend on the step t, the same for every row.
    Returns (y [B, 1, H, V], new state); the input state is not modified."""
    t, s, w, r = state.seen, state.sink_k.shape[2], state.win_pos.shape[0], state.ret_pos.shape[-1]
    check_inputs(q, k, v, lin, s, w, r)
    if q.shape[1] != 1:
        raise ValueError(f"retention_step takes one token, got T={q.shape[1]}")
    B, _, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    dt = state.S.dtype
    q1, k1, v1 = (x[:, 0].to(dt) for x in (q, k, v))
    new = {"k": k1, "v": v1, **{key: lin[LIN[key]][:, 0].to(dt) for key in Q_KEYS}}
    kt = normalize_keys(k1, EPS)
    ksum = state.ksum + kt
    if score == "delta_error":
        new["score"] = torch.zeros(B, Hkv, dtype=dt, device=k1.device)
    elif score == "proj_residual":
        new["score"] = residual(kt, ksum / (t + 1))
    else:
        new["score"] = entry_scores(k, score, scores)[:, 0].to(dt)
    st = dataclasses.replace(state, ksum=ksum, seen=t + 1, win=dict(state.win))
    leaving = None
    if t < s:
        at = torch.tensor([t], device=k1.device)
        st.sink_k = state.sink_k.index_copy(2, at, k1.unsqueeze(2))
        st.sink_v = state.sink_v.index_copy(2, at, v1.unsqueeze(2))
    elif w == 0:
        leaving = new
    else:
        slot = (t - s) % w
        if t - w >= s:
            leaving = {key: x[:, :, slot] for key, x in state.win.items()}
        at = torch.tensor([slot], device=k1.device)
        st.win = {key: x.index_copy(2, at, new[key].unsqueeze(2)) for key, x in state.win.items()}
        st.win_pos = state.win_pos.index_copy(0, at, torch.tensor([t], device=at.device))
    if leaving is not None:
        if score == "delta_error":
            Sk = torch.einsum("bhkv,bhk->bhv", state.S, leaving["lk"])
            leaving["score"] = delta_error(Sk, leaving["lv"], leaving["log_a"], G)
        st.ret, st.ret_pos, st.S, now = _fold_and_place(state.ret, state.ret_pos, state.S, leaving, t - w,
                                                        leaving["score"], G)
        st.folded = state.folded + now.long()
    y = lin_scale * torch.einsum("bhk,bhkv->bhv", lin["q"][:, 0].to(dt), st.S)
    keys = torch.cat([st.sink_k, st.win["k"], st.ret["k"]], 2)  # [B, Hkv, s + w + r, D]
    vals = torch.cat([st.sink_v, st.win["v"], st.ret["v"]], 2)
    ok = torch.cat([(torch.arange(s, device=k1.device) <= t).expand(B, Hkv, s),
                    (st.win_pos >= 0).expand(B, Hkv, w), st.ret_pos >= 0], -1)
    sc = torch.einsum("bhgd,bhld->bhgl", q1.view(B, Hkv, G, D), keys) * scale
    p, _ = masked_softmax(sc, ok.unsqueeze(2))
    y = y + torch.einsum("bhgl,bhld->bhgd", p, vals).reshape(B, H, -1)
    return y.unsqueeze(1).to(q.dtype), st
