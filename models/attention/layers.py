"""LinearizedAttention, the paper's layer: the core every option plugs into (its docstring says how)."""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from golinear.models.attention import ops
from golinear.models.cache.hf_cache import LinearLayerCache
from golinear.models.attention.conv_on import conv_feed
from golinear.models.cache.decode_state import LIN_KEYS, DecodeState
from golinear.models.attention.mechanisms import MECHANISM_CLASSES, ShortConvs, normed_output
from golinear.models.cache.policies import make_policy
from golinear.models.cache.policies.window_sinks import step_attention
from golinear.models.attention.projection import matmul_dtype, project_qkv, rope, rope_formula
from golinear.models.spec import CONV_ON, check_option_pairs, parse_value

_rope_formula, _rope = rope_formula, rope  # (the names tests/test_overhead.py uses)

__all__ = ["LIN_KEYS", "LinearizedAttention", "step_attention"]


@ops.compiled
def _shared_normaliser(swa, num, den, window_logmass):
    """Hedgehog with a softmax path: (mass * y_swa + num) / (mass + den), mass = exp(window_logmass)."""
    mass = window_logmass.float().exp().view(1, 1, -1, 1)
    return (swa.float() * mass + num) / (mass + den.unsqueeze(-1))


@contextlib.contextmanager
def lora_disabled(module):
    """Temporarily switch off PEFT LoRA adapters inside `module` (the frozen projections: diagnostics' and the
    distillation teacher's full attention)."""
    layers = [m for m in module.modules() if hasattr(m, "enable_adapters") and hasattr(m, "lora_A")]
    states = [getattr(m, "disable_adapters", False) for m in layers]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m, was_disabled in zip(layers, states):
            m.enable_adapters(not was_disabled)


class LinearizedAttention(nn.Module):
    """A drop-in replacement for a Llama/Mistral/Qwen2/Qwen3 attention module (the paper's layer).

    The frozen q/k/v/o projections (and Qwen3's q/k norm) keep their names; RoPE is applied to q/k of both paths.
    At query t (0-indexed) the softmax path sees the first `sinks` tokens and the last `window`, the linear path
    exactly the others before it (GLA/kGLA/GDN: y = y_lin + y_swa; Hedgehog: one shared normaliser). The parallel
    pass runs the chunked op over tokens sinks..T-1-w with q shifted by `window` (earlier rows read a zero state).
    The layer composes its options, each documented where it lives: the cache policy (what the softmax path keeps;
    models.cache.policies: window + sinks, or retention slots), which path the short conv feeds (models.attention.conv_on), the
    mechanism and its opt-in output norm (models.attention.mechanisms). `prefill` fills a models.cache.decode_state.DecodeState
    (whole prompt: HF generate via models.cache.hf_cache; chunk by chunk: models.decoding.prefill, from golinear.models.decoding.fast_decode) and
    `step` decodes one token per row in place; both hand over to the policy.
    """
    teacher = False  # True: forward runs the frozen softmax attention instead (models.training.distill)
    transfer = None  # a list: forward returns the frozen attention and appends its own output's error to it

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
        self.retain_score, self.scorer = retain_score, scorer
        self.conv_on = parse_value("conv_on", conv_on)
        check_option_pairs({"mechanism": mechanism, "window": window, "sinks": sinks, "short_conv": short_conv,
                            "retain": retain, "retain_score": retain_score, "out_norm": out_norm,
                            "conv_on": self.conv_on, "scorer": scorer})  # (built alone, as tests do)
        self.conv_feed = conv_feed(self.conv_on, short_conv)
        # frozen modules, same attribute names as the original attention => same state-dict keys
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
        self.q_norm = getattr(attn, "q_norm", None)
        self.k_norm = getattr(attn, "k_norm", None)
        hidden = config.hidden_size
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        dev = self.q_proj.weight.device
        self.retain = retain  # the cache policy (models.cache.policies), rebuilt when retain is set
        with torch.device(dev):
            self.conv = ShortConvs(q_dim, kv_dim, conv_size) if short_conv else None
            self.lin = None
            if mechanism != "none":
                self.lin = MECHANISM_CLASSES[mechanism](hidden, self.num_heads, self.num_kv_heads, self.head_dim,
                                                        gate_rank=gate_rank, feature_dim=feature_dim,
                                                        windowed=(window + sinks) > 0, out_norm=out_norm)

    @property
    def retain(self) -> int:
        """Retention slots per KV head beside sinks + window (0: the window + sinks policy)."""
        return self.cache_policy.slots

    @retain.setter
    def retain(self, slots: int):
        self.cache_policy = make_policy(slots, self.retain_score, self.scorer).to(self.q_proj.weight.device)

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
        """The window + sinks path's q/k/v (models.attention.conv_on: the convolved ones, or the frozen projections')."""
        return self.conv_feed.softmax_qkv(self, x, position_embeddings, q, k, v)

    def project_step(self, x, position_embeddings, state: DecodeState):
        """project_qkv for one decode token, moving the conv state on in place: (qk, q, k, v, new conv state)."""
        qk, q, k, v, new_conv = project_qkv(self, x, position_embeddings, self.conv_weight(), state.conv)
        if new_conv is not None:
            state.conv.copy_(new_conv)
        return qk, q, k, v, new_conv

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
            return normed_output(self.lin, o), state  # the opt-in output norm (models.attention.mechanisms.OutputNorm)
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

    def linear_parallel(self, lin: dict, T: int):
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

    # (the names tests/test_models.py and scripts/study/gap_probe.py use)
    _run, _query, _zero_output, _linear_parallel = run, query, zero_output, linear_parallel

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
        return self.conv_feed.linear_only

    # ------------------------------------------------------------------ forward
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                cache=None, **kwargs):
        if self.teacher:  # the frozen layer's own attention (models.training.distill.frozen_teacher)
            return self.full_attention(hidden_states, position_embeddings), None
        if self.transfer is not None:  # attention transfer (models.training.distill.attention_transfer)
            with torch.no_grad(), lora_disabled(self):
                y_full = self.full_attention(hidden_states, position_embeddings).float()
            y = self.prefill(hidden_states, position_embeddings).float()
            self.transfer.append((y - y_full).pow(2).sum() / y_full.pow(2).sum().clamp_min(1e-12))
            return y_full.to(hidden_states.dtype), None
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
                            "generate with golinear.models.cache.hf_cache.LinearCache")
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
        chunk (a models.decoding.prefill.ChunkEnds) and carry (a dict, one per layer, empty at the first chunk): one
        chunk of a right-padded variable-length batch (see models.decoding.prefill); `state` is complete after the
        last chunk."""
        if chunk is not None:
            return self.cache_policy.prefill_chunk(self, x, position_embeddings, state, chunk, carry)
        B, T = x.shape[:2]
        y = self._parallel(x, position_embeddings, state)
        return self.o_proj(y.reshape(B, T, -1).to(matmul_dtype(x)))

    def _parallel(self, x, position_embeddings, state: DecodeState | None = None):
        """The parallel pass: y [B, T, H, D] before o_proj (filling `state` when given), through the cache policy."""
        x = x.to(matmul_dtype(x))  # cast once under autocast (each projection would cast it again)
        qk, q, k, v, conv = project_qkv(self, x, position_embeddings, self.conv_weight(),
                                        want_conv_state=state is not None)
        return self.cache_policy.parallel(self, x, position_embeddings, qk, q, k, v, conv, state)

    def prefill_rows(self, x, position_embeddings, lengths: list[int]):
        """Whole prompts of a right-padded batch in one pass (row b: its first lengths[b] tokens), where the cache
        policy has one (retention slots): (attention output [B, T, hidden], the rows' DecodeState stacked)."""
        return self.cache_policy.prefill_rows(self, x, position_embeddings, lengths)

    # ------------------------------------------------------------------ decode step (static shapes)
    def step(self, x, position_embeddings, state: DecodeState, pos, rows, steady: bool = False):
        """One token per row [B, 1, hidden] at the row's own position pos [B] (rows = arange(B)); updates `state`
        in place and returns the attention output [B, 1, hidden]. steady: every row's pos >= sinks + window (known
        when the step is built). The cache policy's step (models.cache.policies)."""
        return self.cache_policy.step(self, x, position_embeddings, state, pos, rows, steady)
