"""kvpress presses that couple the rows of a batch, made batch-faithful: a row's result is the one it gets alone.

Batched prefill (models.kv_compression.batched_prefill) compresses each run of rows with the same length and budget
with one call of a press's `compress`. Most kvpress presses score and keep per row, so each row keeps what it keeps
alone. Two that golinear runs do not:
- CompactorPress draws its Gaussian sketch with the batch's shape (row j of a batch gets other numbers than the row
  alone), z-scores both of its scores over the whole batch, raises the Cholesky jitter of every row when any row
  fails, and pads its sink tokens with the batch's highest score;
- CriticalAdaKVPress counts its head budgets over the whole batch (one budget per head for all rows), and weighs
  its scorer's values: SnapKV and Expected Attention pad the entries they always keep (the observation window, the
  sinks) with the batch's highest score + 1.
The classes here are kvpress's own, overriding only what couples the rows; on one row they compute what kvpress's
press computes, so the single-row path (compressed_prefill, static decoding) uses them too. Equality with a row
alone holds up to rounding: a batched matmul or reduction may round differently from one row, which can flip a
near-tie (tests/test_batch_faithful.py compares on the CPU in float32; the GPU test of batched prefill in float64).
"""
from __future__ import annotations

import math

import torch
from kvpress import CompactorPress, CriticalAdaKVPress, ExpectedAttentionPress, SnapKVPress
from kvpress.presses.criticalkv_press import CriticalKVPress
from kvpress.presses.leverage_press import LeverageScorePress
from kvpress.presses.non_causal_attention_press import NonCausalAttnPress
from kvpress.utils import compute_n_kept, get_prerope_key_states, get_prerope_query_states
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import repeat_kv, rotate_half


def _z_per_row(scores: torch.Tensor) -> torch.Tensor:
    """kvpress's z-score of a [B, H, S] score (`(s - s.mean()) / s.std()`), over each row's own heads and positions
    instead of the whole batch."""
    dims = tuple(range(1, scores.dim()))
    return (scores - scores.mean(dim=dims, keepdim=True)) / scores.std(dim=dims, keepdim=True).clamp_min(1e-6)


class RowwiseLeverageScorePress(LeverageScorePress):
    """LeverageScorePress per row: one sketch drawn as a row alone draws it, the jitter and the z-score per row."""

    @staticmethod
    def chol_with_jitter(G: torch.Tensor, jitter: float = 0.0, max_tries: int = 5) -> torch.Tensor:
        """kvpress's Cholesky with adaptive jitter, per row of G [B, ...]: each row keeps the factor of the first
        jitter at which all its heads factor, as alone (kvpress retries every row when any row fails). One host
        sync per try, as kvpress."""
        identity = torch.eye(G.shape[-1], device=G.device, dtype=G.dtype)
        cur, L, done = float(jitter), None, None
        for _ in range(max_tries):
            factor, info = torch.linalg.cholesky_ex(G + cur * identity, upper=False)
            ok = (info == 0).reshape(G.shape[0], -1).all(dim=1)
            if L is None:
                L, done = factor, ok
            else:
                L = torch.where((ok & ~done).view(-1, *[1] * (L.dim() - 1)), factor, L)
                done = done | ok
            if bool(done.all()):
                return L
            cur = max(1e-8, (1e-2 if cur == 0.0 else 10.0 * cur))
        raise RuntimeError(f"Cholesky failed after {max_tries} tries.")

    @staticmethod
    def compute_leverage_scores(key_states: torch.Tensor, sketch_dimension: int) -> torch.Tensor:
        """kvpress's, but the sketch is drawn once with one row's shape (1, H, d, k) and shared by the batch: the
        numbers a row alone draws from the same generator state (kvpress draws (B, H, d, k))."""
        d, k = key_states.shape[-1], sketch_dimension
        Phi = torch.randn(1, key_states.shape[1], d, k, device=key_states.device, dtype=key_states.dtype) * (
            1 / math.sqrt(k))
        X = key_states - key_states.mean(dim=-2, keepdim=True)
        X = torch.matmul(X, Phi).to(torch.float32)  # (B,H,S,k)
        XT = X.transpose(-2, -1)
        G = XT @ X
        L = RowwiseLeverageScorePress.chol_with_jitter(0.5 * (G + G.transpose(-2, -1)), jitter=1e-2, max_tries=5)
        inv_Xt = torch.cholesky_solve(XT, L, upper=False)
        return (X * inv_Xt.transpose(-2, -1)).sum(dim=-1).clamp_min(0)  # (B,H,S)

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        """kvpress's, z-scored per row."""
        assert keys.shape[-2] == hidden_states.shape[-2], "LeverageScorePress only supports prefill "
        pre_rope_keys = get_prerope_key_states(module, hidden_states)
        return _z_per_row(self.compute_leverage_scores(pre_rope_keys, self.sketch_dimension))


class RowwiseNonCausalAttnPress(NonCausalAttnPress):
    """NonCausalAttnPress z-scored per row (kvpress z-scores the whole batch; the rest of its score is per row)."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        """kvpress's, z-scored per row."""
        assert keys.shape[-2] == hidden_states.shape[-2], "NonCausalAttnPress only supports prefill"
        cos, sin = kwargs["position_embeddings"]
        q = get_prerope_query_states(module, hidden_states)  # (B, H_q, S, d)
        q_len = q.shape[-2]
        q = (q * cos[:, -q_len:, :].unsqueeze(1)) + (rotate_half(q) * sin[:, -q_len:, :].unsqueeze(1))
        A = self.non_causal_chunked_attn(q, repeat_kv(keys, q.shape[1] // values.shape[1]), self.chunk_size)
        A = A.view(A.shape[0], values.shape[1], -1, A.shape[-1]).mean(dim=-2)  # (B, H_kv, S)
        scores = F.avg_pool1d(A * values.norm(dim=-1), kernel_size=3, padding=1, stride=1)
        return _z_per_row(scores)


class RowwiseCompactorPress(CompactorPress):
    """CompactorPress built on the per-row scorers above, its sink tokens padded with each row's highest score
    (kvpress pads them with the batch's)."""

    def __post_init__(self):
        super().__post_init__()
        self._leverage_press = RowwiseLeverageScorePress(
            compression_ratio=self.compression_ratio, sketch_dimension=self.sketch_dimension)
        self._non_causal_press = RowwiseNonCausalAttnPress(
            compression_ratio=self.compression_ratio, chunk_size=self.chunk_size)

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        scores = super().score(module, hidden_states, keys, values, attentions, kwargs)
        n = hidden_states.shape[-2]  # kvpress's sink counts
        left = min(self.sink_size_start, n)
        return _pad_per_row(scores, left, n - min(self.sink_size_end, max(0, n - left)), 0)


class RowwiseSnapKVPress(SnapKVPress):
    """SnapKVPress with its observation window padded with each row's highest score + 1 (kvpress: the batch's).
    Only the values change, and only where a wrapper weighs them (CriticalAdaKV's stage 2 multiplies them by the
    values' projected norm): a plain top-k keeps the window either way."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        scores = super().score(module, hidden_states, keys, values, attentions, kwargs)
        return _pad_per_row(scores, 0, keys.shape[2] - self.window_size, 1)


class RowwiseExpectedAttentionPress(ExpectedAttentionPress):
    """ExpectedAttentionPress with its sink tokens padded with each row's highest score + 1 (kvpress: the batch's);
    as RowwiseSnapKVPress, it matters under CriticalAdaKV only."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        scores = super().score(module, hidden_states, keys, values, attentions, kwargs)
        return _pad_per_row(scores, self.n_sink, keys.shape[2], 1)


def _pad_per_row(scores: torch.Tensor, start: int, stop: int, plus: float) -> torch.Tensor:
    """`scores` [B, H, S] with the positions outside [start, stop) set, in place, to each row's highest score inside
    it + `plus`: kvpress's `F.pad(s, ..., value=s.max() (+ 1))` took the whole batch's (in double, as its `.item()`)."""
    top = (scores[..., start:stop].detach().amax(dim=(-2, -1), keepdim=True).double() + plus).to(scores.dtype)
    scores[..., :start] = top
    scores[..., stop:] = top
    return scores


class RowwiseCriticalAdaKVPress(CriticalAdaKVPress):
    """CriticalAdaKVPress with head budgets per row, [B, H] (kvpress counts one budget per head over the batch)."""

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """kvpress's compress; its per-head scatters of stage 1 and 2 run for every row and head at once
        (_raise_top), and its host syncs (`.tolist()`, `max(head_budgets)`, a budget per head) become one
        `.tolist()` of each row's largest budgets and one tie check per stage."""
        if self.compression_ratio == 0:
            return keys, values
        assert module.config._attn_implementation != "eager", "eager mode not supported"
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
        bsz, num_key_value_heads, k_len = scores.shape
        top = torch.finfo(scores.dtype).max

        n_kept = compute_n_kept(k_len, self.compression_ratio)
        n_safe = int(n_kept * self.alpha_safeguard)
        if self.alpha_safeguard > 0:
            n_safe = max(1, n_safe) if n_kept > 0 else 0
        top_indices = torch.topk(scores, n_safe, dim=-1).indices
        scores.scatter_(-1, top_indices, top)

        # budget allocation, per row
        budget_scores = scores.scatter(-1, top_indices, top).reshape(bsz, -1)
        head_of = torch.topk(budget_scores, n_kept * num_key_value_heads, dim=-1).indices // k_len
        head_budgets = torch.zeros(bsz, num_key_value_heads, device=keys.device, dtype=torch.int64)
        head_budgets.scatter_add_(1, head_of, torch.ones_like(head_of))
        first_budgets = (head_budgets * self.first_stage_ratio).to(torch.int64)
        row_first, row_most = torch.stack([first_budgets.amax(dim=1), head_budgets.amax(dim=1)]).tolist()

        _raise_top(scores, first_budgets, row_first, top)  # stage 1
        projected_norm = CriticalKVPress.vwl1norm(values, module)  # stage 2
        scores = (scores + self.epsilon) * projected_norm
        _raise_top(scores, head_budgets, row_most, top)

        # bottom-k across heads, per row (as kvpress)
        n_pruned = num_key_value_heads * (k_len - n_kept)
        indices = torch.topk(-scores.reshape(bsz, -1), n_pruned, dim=1).indices.flatten()
        batch_indices = torch.arange(bsz).repeat_interleave(n_pruned)
        module.masked_key_indices = (batch_indices, indices // k_len, indices % k_len)
        return keys, values


def _raise_top(scores: torch.Tensor, budgets: torch.Tensor, row_k: list[int], value: float) -> None:
    """Set each row's and head's `budgets[b, h]` highest scores to `value`, in place, as kvpress does for a row alone:
    `scores[:, h].scatter_(-1, topk(scores, k).indices[:, h, :budgets[h]], value)` per head, k the row's largest
    budget (`row_k[b]`). One top-k of the call's largest budget + 1 serves every row whose chosen set is unique (no
    tie across a head's budget boundary: rank mask `arange < budget`). Where a tie crosses it, which of the tied
    entries kvpress raises depends on topk's k (torch does not specify how topk orders equal values: SnapKV pads its
    whole window with one value, so its window ties under small budgets), so those rows rerun kvpress's top-k of
    their own k, one call per distinct k. A tie of entries already at `value` changes nothing and is not one. This
    holds where topk picks among ties per row as it does alone (the CPU; CUDA's may depend on the batch)."""
    if max(row_k) == 0:
        return
    k = min(max(row_k) + 1, scores.shape[-1])
    found = torch.topk(scores, k, sorted=True, dim=-1)
    hit = torch.zeros_like(scores, dtype=torch.bool)
    hit.scatter_(-1, found.indices, torch.arange(k, device=scores.device) < budgets[..., None])
    tied = []
    if k > 1:  # else every budget is 0 or the whole row
        at = budgets.clamp(1, k - 1)[..., None]
        last, after = found.values.gather(-1, at - 1), found.values.gather(-1, at)
        tie = (budgets[..., None] >= 1) & (budgets[..., None] < k) & (last == after) & (last != value)
        tied = tie.flatten(1).any(dim=1).nonzero().flatten().tolist()
    for own in sorted({row_k[b] for b in tied}):
        rows = [b for b in tied if row_k[b] == own]
        index = torch.topk(scores[rows], own, sorted=True, dim=-1).indices
        ranked = torch.arange(own, device=scores.device) < budgets[rows][..., None]
        hit[rows] = torch.zeros_like(hit[rows]).scatter_(-1, index, ranked)
    scores.masked_fill_(hit, value)
