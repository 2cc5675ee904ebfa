"""LinearizedAttention: a drop-in replacement for a Llama/Mistral/Qwen2/Qwen3 attention module.

The frozen q/k/v/o projections (and Qwen3's q/k RMSNorm) are reused under their original names; RoPE
is applied to q/k of both paths. Positions are 0-indexed. At query t:
  - the softmax path sees I = {j < sinks} U {t - window < j <= t};
  - the linear path sees exactly the tokens s <= j <= t - w (w = 0: s <= j <= t);
  - GLA/kGLA/GDN: y = y_lin + y_swa (the paper's disjoint sum); Hedgehog: one shared normaliser.
The parallel pass runs the chunked op over tokens sinks..T-1-w with q shifted by `window`
(o_t = q_t^T S_{t-w}; earlier rows read a zero state and get no linear term).
Decoding (one implementation, two holders): `prefill(x, pe, state)` fills a models.decode_state.DecodeState
(sinks, a ring of the last w tokens, the conv state, the recurrent state; fixed shapes), either in one parallel
pass (HF generate through models.cache.LinearLayerCache) or chunk by chunk for a right-padded batch
(models.prefill, driven by models.fast_decode.FastDecoder); `step(x, pe, state, pos, rows)` decodes one token
per row in place with device-side indexing (no host sync, static shapes: FastDecoder captures it in a CUDA
graph), folding the token leaving the window into the state.
conv_on (models.spec.CONV_ON): "both" (the default, the paper's recipe) feeds one convolved q/k/v to both paths;
"linear" feeds the convolved q/k/v to the linear path and its conv state only, while the window + sinks (and the
decode ring's and sinks' K/V) read the frozen projections' q/k/v (a second projection without the conv: an
ablation, docs/study.md "Why the gap"). The chunked prefill and the fused decode step do not implement it
(models.prefill refuses it, fused_decode.applies leaves such a layer to `step`).
Launch overhead (tests/test_overhead.py counts kernels per layer): q/k/v are one matmul, the three short
convs one conv over [q|k|v], RoPE/l2norm run on q and k at once, window + sinks are one fused attention
call; GOLINEAR_COMPILE=1 compiles the elementwise regions (models.ops.compiled). The steady GDN decode step
runs models.ops.fused_decode on CUDA (GOLINEAR_FUSED_DECODE=auto, the default; `step` below stays the definition).
The opt-in output norm (out_norm; models.mechanisms.OutputNorm) follows the GLA/kGLA/GDN op inside `run`, the
one place every path (parallel pass, chunked prefill, decode step) gets the op's output from.
Retention slots (retain > 0, GDN with a window; docs/retention.md): the prompt runs models.ops.retention_prefill
(`prefill_rows`: a right-padded batch, models.ops.retention_prefill_rows) and decoding
models.ops.retention.retention_step on the fixed-size RetentionState held in DecodeState.retention (HF generate,
or models.retention_generate.RetentionDecoder: FastDecoder refuses such models). With retain_score=fitted the layer
scores each key itself (`op_score`, models.retention_scorer) and hands the op the scores as "given".
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from models import ops
from models.cache import LinearLayerCache
from models.decode_state import LIN_KEYS, DecodeState, gather_ring, put, ring_index
from models.mechanisms import MECHANISM_CLASSES, ShortConvs
from models.ops import fused_decode
from models.ops.retention import retention_step
from models.ops.retention_prefill import retention_prefill
from models.ops.retention_prefill_rows import retention_prefill_rows
from models.prefill import prefill_chunk
from models.projection import fused_qkv, matmul_dtype, project_qkv
from models.projection import _rope_formula, rope as _rope  # noqa: F401  (the names tests/test_overhead.py uses)
from models.retention_scorer import arrival_scores
from models.spec import CONV_ON, check_conv_on, parse_value

__all__ = ["LIN_KEYS", "LinearizedAttention", "step_attention"]


@ops.compiled
def _shared_normaliser(swa, num, den, window_logmass):
    """Hedgehog with a softmax path: (mass * y_swa + num) / (mass + den), mass = exp(window_logmass)."""
    mass = window_logmass.float().exp().view(1, 1, -1, 1)
    return (swa.float() * mass + num) / (mass + den.unsqueeze(-1))


def step_attention(q, keys, vals, allowed, scale):
    """One decode query per sequence against a few keys, in one fused SDPA call: q [B,1,Hq,D], keys/vals
    [B,L,Hkv,D], allowed [B, L] bool (per row) or None (all) -> out [B,1,Hq,D]. The G query heads of a KV
    head are G query rows of that head, so keys are not expanded."""
    B, _, Hq, D = q.shape
    Hkv = keys.shape[2]
    qg = q.reshape(B, Hkv, Hq // Hkv, D)
    mask = None if allowed is None else allowed.view(B, 1, 1, -1)
    o = F.scaled_dot_product_attention(qg, keys.transpose(1, 2), vals.transpose(1, 2), attn_mask=mask, scale=scale)
    return o.reshape(B, 1, Hq, vals.shape[-1])


class LinearizedAttention(nn.Module):
    def __init__(self, attn: nn.Module, config, layer_idx: int, mechanism: str, window: int = 0,
                 sinks: int = 0, short_conv: bool = False, conv_size: int = 4, gate_rank: int = 16,
                 feature_dim: int = 64, retain: int = 0, retain_score: str = "delta_error", out_norm: bool = False,
                 conv_on: str = CONV_ON[0], scorer: tuple | None = None):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = attn.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.groups = self.num_heads // self.num_kv_heads
        self.scaling = attn.scaling
        self.mechanism, self.window, self.sinks = mechanism, window, sinks
        self.retain, self.retain_score = retain, retain_score  # retention slots (models.ops.retention)
        if (retain_score == "fitted") != (scorer is not None):
            raise ValueError("retain_score=fitted needs a scorer (weight [Hkv, D/2], bias [Hkv]), and only it")
        self.conv_on = parse_value("conv_on", conv_on)
        check_conv_on(mechanism, short_conv, self.conv_on, retain)
        # frozen modules, same attribute names as the original attention => same state-dict keys
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
        self.q_norm = getattr(attn, "q_norm", None)
        self.k_norm = getattr(attn, "k_norm", None)
        hidden = config.hidden_size
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        dev = self.q_proj.weight.device
        if scorer is not None:  # not parameters: a checkpoint keeps the scorer file itself (models.checkpoint)
            self.register_buffer("score_weight", scorer[0].to(dev, torch.float32), persistent=False)
            self.register_buffer("score_bias", scorer[1].to(dev, torch.float32), persistent=False)
        with torch.device(dev):
            self.conv = ShortConvs(q_dim, kv_dim, conv_size) if short_conv else None
            self.lin = None
            if mechanism != "none":
                self.lin = MECHANISM_CLASSES[mechanism](hidden, self.num_heads, self.num_kv_heads, self.head_dim,
                                                        gate_rank=gate_rank, feature_dim=feature_dim,
                                                        windowed=(window + sinks) > 0, out_norm=out_norm)

    # ------------------------------------------------------------------ projections
    def conv_weight(self):
        """The short convs' weight over [q|k|v] [C, W] (None without short conv)."""
        return self.conv.weight() if self.conv is not None else None

    def project(self, x: torch.Tensor, position_embeddings, conv_state=None, use_conv: bool = True):
        """q [B,T,H,D], k/v [B,T,Hkv,D] after short conv, q/k norm and RoPE; new conv state ({"qkv": [B,D,W-1]})."""
        _, q, k, v, new = project_qkv(self, x, position_embeddings, self.conv_weight() if use_conv else None,
                                      conv_state.get("qkv") if conv_state else None)
        return q, k, v, (None if new is None else {"qkv": new})

    def softmax_qkv(self, x, position_embeddings, q, k, v):
        """The window + sinks path's q/k/v: the convolved q, k, v themselves (conv_on "both"), or with conv_on
        "linear" the frozen projections' (norm + RoPE, no conv), projected once more (when there is a softmax path)."""
        if not (self.conv_linear_only and self.has_softmax_path):
            return q, k, v
        return project_qkv(self, x, position_embeddings)[1:4]

    def linear_inputs(self, x, q, k, v, qk=None):
        """The mechanism's op inputs, keys/values expanded to the query heads (qk: q and k in one tensor)."""
        return self.lin.inputs(x, q, k, v, qk=qk)

    def full_attention(self, x: torch.Tensor, position_embeddings) -> torch.Tensor:
        """The frozen layer's own causal softmax attention, without the short convs (diagnostics).

        With LoRA, wrap the call in peft's `disable_adapter` to get the frozen projections."""
        return self.o_proj(self.full_attention_heads(x, position_embeddings).reshape(*x.shape[:2], -1).to(x.dtype))

    def full_attention_heads(self, x: torch.Tensor, position_embeddings) -> torch.Tensor:
        """full_attention before o_proj, per head [B, T, H, D] (the out_norm calibration's target size)."""
        q, k, v, _ = self.project(x, position_embeddings, use_conv=False)
        return ops.window_sink_attention(q, k, v, sinks=0, window=q.shape[1], scale=self.scaling)[0]

    # ------------------------------------------------------------------ linear path
    def run(self, lin: dict, q_for_state: torch.Tensor, initial_state, chunked: bool):
        """Run the mechanism's op; returns (o or (num, den), final state). The one place the op's output is
        made (parallel pass, chunked prefill, decode step), so the opt-in output norm (out_norm) sits here."""
        m = self.mechanism
        if m in ("gla", "kgla", "gdn"):
            if m == "gdn":
                o, state = (ops.gdn_chunk if chunked else ops.gdn_recurrent)(
                    q_for_state, lin["k"], lin["v"], lin["log_a"], lin["beta"], self.lin.scale,
                    initial_state=initial_state, output_final_state=True)
            else:
                o, state = (ops.gla_chunk if chunked else ops.gla_recurrent)(
                    q_for_state, lin["k"], lin["v"], lin["log_a"], self.lin.scale,
                    initial_state=initial_state, output_final_state=True)
            return (o if self.lin.out_norm is None else self.lin.out_norm(o)), state
        f = ops.linear_attn_chunk if chunked else ops.linear_attn_recurrent
        num, den, state = f(q_for_state, lin["phi_k"], lin["v"], initial_state=initial_state,
                            output_final_state=True)
        return (num, den), state

    def query(self, lin: dict) -> torch.Tensor:
        """The query the linear state is read with (Hedgehog: its feature map)."""
        return lin["phi_q"] if self.mechanism == "hedgehog" else lin["q"]

    def zero_output(self, qx, lin):
        """The linear output of rows that read a zero state."""
        B, T, H = qx.shape[:3]
        V = lin["v"].shape[-1]
        o = qx.new_zeros(B, T, H, V, dtype=torch.float32)
        return (o, qx.new_zeros(B, T, H, dtype=torch.float32)) if self.mechanism == "hedgehog" else o

    def zero_state(self, B: int, device):
        """The recurrent state before any token, fp32: [B, H, D, D] or Hedgehog's (S [B,H,F,D], Z [B,H,F])."""
        H, D = self.num_heads, self.head_dim
        if self.mechanism == "hedgehog":
            F2 = self.lin.phi_q.weight.shape[-1] * 2
            return torch.zeros(B, H, F2, D, device=device), torch.zeros(B, H, F2, device=device)
        return torch.zeros(B, H, D, D, device=device)

    _run, _query, _zero_output = run, query, zero_output  # (the names tests/test_models.py uses)

    def _linear_parallel(self, lin: dict, T: int):
        """(out, state, first): out holds q_t^T S_{t-w} for the rows t >= first (every earlier row reads a
        zero state), state is the state after token T-1-w (None if no token entered it).

        Tokens j < sinks never enter the linear state; the state before them is zero, so instead of zeroing
        their keys the op simply starts at token `sinks`: it runs over tokens s..T-1-w, read by the
        queries s+w..T-1."""
        w, s = self.window, min(self.sinks, T)
        qx = self.query(lin)
        n = T - w  # tokens s..n-1 enter the state
        if n - s <= 0:
            return self.zero_output(qx, lin), None, 0
        entering = {key: val[:, s:n] for key, val in lin.items()}
        out, state = self.run(entering, qx[:, w + s:], None, chunked=True)
        return out, state, w + s

    # ------------------------------------------------------------------ combination
    def combine(self, lin_out, swa_out, dtype, first: int = 0):
        """y = y_lin + y_swa (GLA/kGLA/GDN) or the shared-normaliser mix (Hedgehog); lin_out covers the rows
        t >= first (earlier rows read a zero state). The disjoint sum of two bf16 (or fp32) tensors is
        computed in fp32 and rounded once, as before, without fp32 copies."""
        if first and lin_out is not None:
            if self.mechanism != "hedgehog" and swa_out is not None and not torch.is_grad_enabled():
                y = swa_out  # fresh from the attention op: add in place into its rows >= first
                y[:, first:] += lin_out
                return y
            pad = lambda t: F.pad(t, (0, 0) * (t.dim() - 2) + (first, 0))  # noqa: E731
            lin_out = tuple(pad(o) for o in lin_out) if isinstance(lin_out, tuple) else pad(lin_out)
        if swa_out is None:
            if self.mechanism == "hedgehog":
                num, den = lin_out
                return num / den.clamp_min(1e-12).unsqueeze(-1)
            return lin_out
        if lin_out is None:
            return swa_out
        if self.mechanism == "hedgehog":
            return _shared_normaliser(swa_out, *lin_out, self.lin.window_logmass)
        if lin_out.dtype != swa_out.dtype:
            return lin_out.float() + swa_out.float()
        return lin_out + swa_out

    @property
    def has_softmax_path(self) -> bool:
        return self.window + self.sinks > 0

    @property
    def conv_linear_only(self) -> bool:
        """The short conv feeds the linear path only (conv_on "linear"): the one rule the decoders check."""
        return self.conv is not None and self.conv_on != CONV_ON[0]

    # ------------------------------------------------------------------ forward
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                cache=None, **kwargs):
        # transformers < 5.24 passes the cache as `past_key_values`, newer releases as `cache`
        past_key_values = cache if cache is not None else past_key_values
        if past_key_values is None:
            return self.prefill(hidden_states, position_embeddings), None
        cache = past_key_values.layers[self.layer_idx]
        if isinstance(cache, DynamicLayer) and not cache.is_initialized:
            # a stock DynamicCache (HF builds one when use_cache is on): take over this empty slot
            cache = past_key_values.layers[self.layer_idx] = LinearLayerCache()
        if not isinstance(cache, LinearLayerCache):
            raise TypeError(f"layer {self.layer_idx} is linearized but the cache holds {type(cache).__name__}; "
                            "generate with models.cache.LinearCache")
        if cache.seen == 0:
            state = DecodeState()
            out = self.prefill(hidden_states, position_embeddings, state)
            cache.filled(state, *hidden_states.shape[:2], hidden_states.device)
            return out, None
        outs = []  # token by token (T = 1 per generate step)
        cos, sin = position_embeddings
        for i in range(hidden_states.shape[1]):
            pe = (cos[:, i:i + 1], sin[:, i:i + 1])
            outs.append(self.step(hidden_states[:, i:i + 1], pe, cache.state, cache.pos, cache.rows,
                                  steady=cache.seen >= self.sinks + self.window))
            cache.advance()
        return (outs[0] if len(outs) == 1 else torch.cat(outs, 1)), None

    def prefill(self, x, position_embeddings, state: DecodeState | None = None, chunk=None, carry=None):
        """Attention output [B, T, hidden] of a prompt; given `state`, fills it for `step`.

        chunk None: the whole prompt at once, every row T tokens long (positions 0..T-1): the parallel pass.
        chunk (a models.prefill.ChunkEnds) and carry (a dict, one per layer, empty at the first chunk): one
        chunk of a right-padded variable-length batch (see models.prefill); `state` is complete after the
        last chunk."""
        if chunk is not None:
            if self.retain:
                raise ValueError("a chunked, right-padded prefill (models.prefill) has no retention slots "
                                 f"(retain={self.retain}); prefill the whole prompt (HF generate)")
            return prefill_chunk(self, x, position_embeddings, state, chunk, carry)
        B, T = x.shape[:2]
        y = self._parallel(x, position_embeddings, state)
        return self.o_proj(y.reshape(B, T, -1).to(matmul_dtype(x)))

    def _parallel(self, x, position_embeddings, state: DecodeState | None = None):
        """The parallel pass: y [B, T, H, D] before o_proj (filling `state` when given)."""
        T = x.shape[1]
        x = x.to(matmul_dtype(x))  # cast once under autocast (each projection would cast it again)
        qk, q, k, v, conv = project_qkv(self, x, position_embeddings, self.conv_weight(),
                                        want_conv_state=state is not None)
        if self.retain:
            return self._retention_parallel(x, qk, q, k, v, conv, state)
        sq, sk, sv = self.softmax_qkv(x, position_embeddings, q, k, v)
        swa = None
        if self.has_softmax_path:
            swa = ops.window_sink_softmax(sq, sk, sv, sinks=self.sinks, window=self.window, scale=self.scaling)
        lin_out = lin = lin_state = None
        first = 0
        if self.lin is not None:
            lin = self.linear_inputs(x, q, k, v, qk=qk)
            lin_out, lin_state, first = self._linear_parallel(lin, T)
        if state is not None:
            self._fill(state, sk, sv, lin, lin_state, conv)
        return self.combine(lin_out, swa, x.dtype, first)

    def _retention_parallel(self, x, qk, q, k, v, conv, state: DecodeState | None):
        """Sinks + window + retention slots + GDN state over the whole prompt (models.ops.retention_prefill).
        Training: plain autograd through the values on the chosen paths; which token takes a slot is a
        selection (argmin of the scores) and gets no gradient."""
        lin = self.linear_inputs(x, q, k, v, qk=qk)
        y, kept = retention_prefill(q, k, v, lin, self.scaling, self.lin.scale, self.sinks, self.window,
                                    self.retain, *self.op_score(k), want_state=state is not None)
        if state is not None:
            state.conv = None if conv is None else conv.clone(memory_format=torch.contiguous_format)
            state.retention = kept
        return y

    def prefill_rows(self, x, position_embeddings, lengths: list[int]):
        """Whole prompts of a right-padded batch with retention slots, in one pass (row b: its first lengths[b]
        tokens; models.ops.retention_prefill_rows): (attention output [B, T, hidden], meaningful at each row's
        real positions; a DecodeState per row stacked: the short conv's inputs before each row's last token and
        the RetentionRows batched decoding continues). position_embeddings: [1, T, D], shared by every row."""
        B, T = x.shape[:2]
        x, weight = x.to(matmul_dtype(x)), self.conv_weight()
        qk, q, k, v, _ = project_qkv(self, x, position_embeddings, weight, want_conv_state=False)
        lin = self.linear_inputs(x, q, k, v, qk=qk)
        score, scores = self.op_score(k)
        y, rows = retention_prefill_rows(q, k, v, lin, self.scaling, self.lin.scale, self.sinks, self.window,
                                         self.retain, score, lengths, scores)
        conv = None
        if weight is not None:  # the conv's inputs [q|k|v] of each row's last W - 1 tokens
            W1 = weight.shape[-1] - 1
            at = torch.tensor(lengths, device=x.device).view(B, 1) - W1 + torch.arange(W1, device=x.device)
            rows_x = x[torch.arange(B, device=x.device).view(B, 1), at.clamp(min=0)]  # [B, W1, hidden]
            conv = torch.where((at >= 0).unsqueeze(-1), fused_qkv(self, rows_x), 0).transpose(1, 2).contiguous()
        return self.o_proj(y.reshape(B, T, -1).to(x.dtype)), DecodeState(conv=conv, retention=rows)

    def _retention_step(self, x, position_embeddings, state: DecodeState, step=retention_step):
        """One decode token on the fixed-size retention state: every row at the same position (retention_step), or
        each at its own (models.ops.retention_rows.retention_rows_step, from models.retention_generate)."""
        qk, q, k, v, new_conv = project_qkv(self, x, position_embeddings, self.conv_weight(), state.conv)
        if new_conv is not None:
            state.conv.copy_(new_conv)
        lin = self.linear_inputs(x, q, k, v, qk=qk)
        y, state.retention = step(state.retention, q, k, v, lin, self.scaling, self.lin.scale, *self.op_score(k))
        return self.o_proj(y.reshape(x.shape[0], 1, -1).to(matmul_dtype(x)))

    def op_score(self, k: torch.Tensor) -> tuple[str, torch.Tensor | None]:
        """The retention op's (score, scores): a fitted scorer's arrival scores go in as "given" (computed here,
        from the same keys, by the prompt's pass and by each decode step alike)."""
        if self.retain_score != "fitted":
            return self.retain_score, None
        return "given", arrival_scores(k, self.score_weight, self.score_bias)

    def _fill(self, state: DecodeState, k, v, lin, lin_state, conv):
        """The decode state after a whole prompt (every row of length T) from the parallel pass's tensors (k, v:
        the softmax path's)."""
        B, T = k.shape[:2]
        s, w = self.sinks, self.window
        if s > 0:
            state.sink_k, state.sink_v = (F.pad(t[:, :s], (0, 0, 0, 0, 0, max(0, s - T))) for t in (k, v))
        if w > 0:
            idx, pos = ring_index(T, w, 0)
            rows = torch.arange(B, device=k.device)
            idx = torch.tensor(idx, device=k.device).expand(B, w)
            state.ring_pos = torch.tensor(pos, device=k.device).expand(B, w).contiguous()
            empty = any(p < 0 for p in pos)
            state.ring_k, state.ring_v = (gather_ring(t, rows, idx, state.ring_pos, empty) for t in (k, v))
            if lin is not None:
                state.ring_lin = {key: gather_ring(lin[key], rows, idx, state.ring_pos, empty)
                                  for key in LIN_KEYS if key in lin}
        state.conv = None if conv is None else conv.clone(memory_format=torch.contiguous_format)
        if self.lin is not None:
            st = lin_state if lin_state is not None else self.zero_state(B, k.device)
            state.state = tuple(t.float() for t in st) if isinstance(st, tuple) else st.float()

    # ------------------------------------------------------------------ decode step (static shapes)
    def step(self, x, position_embeddings, state: DecodeState, pos, rows, steady: bool = False):
        """One token per row [B, 1, hidden] at the row's own position pos [B] (ring slot pos % w, sink slot, masks
        per row; rows = arange(B)); updates `state` in place and returns the attention output [B, 1, hidden].
        steady (every row's pos >= sinks + window, known when the step is built): the sinks are written, every
        slot is a real token and the leaving one is not a sink, so no sink write, mask or validity check."""
        if self.retain:
            return self._retention_step(x, position_embeddings, state)
        if fused_decode.applies(self, x, steady):  # the same step in few kernels (CUDA by default)
            return fused_decode.fused_step(self, x, position_embeddings, state, pos)
        B = x.shape[0]
        s, w = self.sinks, self.window
        qk, q, k, v, new_conv = project_qkv(self, x, position_embeddings, self.conv_weight(), state.conv)
        if new_conv is not None:
            state.conv.copy_(new_conv)
        sq, sk, sv = self.softmax_qkv(x, position_embeddings, q, k, v)
        slot = pos % w if w > 0 else None
        lin_out = None
        if self.lin is not None:
            lin = self.linear_inputs(x, q, k, v, qk=qk)
            qx = self.query(lin)
            cur = {key: lin[key] for key in LIN_KEYS if key in lin}
            if w > 0:  # the token leaving the window (position pos - w) folds into the state
                leaving = {key: state.ring_lin[key][rows, slot].unsqueeze(1) for key in cur}
                for key, val in cur.items():
                    put(state.ring_lin[key], rows, slot, val[:, 0])
            else:
                leaving = cur
            if not steady:  # a sink or an empty slot (zeros) leaves nothing in the state: zero its inputs
                valid = state.ring_pos[rows, slot] >= s if w > 0 else pos >= s
                leaving = {key: val * valid.view(B, 1, *([1] * (val.dim() - 2))) for key, val in leaving.items()}
            lin_out, new = self.run(leaving, qx, state.state, chunked=False)
            if isinstance(new, tuple):
                state.state[0].copy_(new[0])
                state.state[1].copy_(new[1])
            else:
                state.state.copy_(new)
        if w > 0 and not steady:  # (read only by non-steady steps; a prefill rewrites it)
            put(state.ring_pos, rows, slot, pos)
        swa = None
        if self.has_softmax_path:
            keys, vals, allowed = [], [], []
            if s > 0 and not steady:  # a row still inside its first s tokens writes its sink slot
                idx = pos.clamp(max=s - 1)
                is_sink = (pos < s).view(B, 1, 1)
                for buf, new in ((state.sink_k, sk), (state.sink_v, sv)):
                    put(buf, rows, idx, torch.where(is_sink, new[:, 0], buf[rows, idx]))
                allowed.append(torch.arange(s, device=x.device).view(1, s) <= pos.view(B, 1))
            if s > 0:
                keys.append(state.sink_k)
                vals.append(state.sink_v)
            if w > 0:
                put(state.ring_k, rows, slot, sk[:, 0])
                put(state.ring_v, rows, slot, sv[:, 0])
                keys.append(state.ring_k)
                vals.append(state.ring_v)
                if not steady:
                    allowed.append(state.ring_pos >= s)
            cat = lambda xs: xs[0] if len(xs) == 1 else torch.cat(xs, 1)  # noqa: E731
            swa = step_attention(sq, cat(keys), cat(vals), None if steady else cat(allowed), self.scaling)
        y = self.combine(lin_out, swa, x.dtype)
        return self.o_proj(y.reshape(B, 1, -1).to(matmul_dtype(x)))
