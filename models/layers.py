"""LinearizedAttention: a drop-in replacement for a Llama/Mistral/Qwen2/Qwen3 attention module.

The frozen q/k/v/o projections (and Qwen3's q/k RMSNorm) are reused under their original names; RoPE
is applied to q/k of both paths. Positions are 0-indexed. At query t:
  - the softmax path sees I = {j < sinks} U {t - window < j <= t};
  - the linear path sees exactly the tokens s <= j <= t - w (w = 0: s <= j <= t);
  - GLA/kGLA/GDN: y = y_lin + y_swa (the paper's disjoint sum); Hedgehog: one shared normaliser.
The parallel pass runs the chunked op over tokens sinks..T-1-w with q shifted by `window`
(o_t = q_t^T S_{t-w}; earlier rows read a zero state and get no linear term); decoding keeps
sinks, a rolling window and the state in `LinearLayerCache`, folding each token into the state when it
leaves the window.
Launch overhead (tests/test_overhead.py counts kernels per layer): q/k/v are one matmul, the three short
convs one conv over [q|k|v], RoPE/l2norm run on q and k at once, window + sinks are one fused attention
call; GOLINEAR_COMPILE=1 compiles the elementwise regions (models.ops.compiled).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, rotate_half

from transformers.cache_utils import DynamicLayer

from models import ops
from models.cache import LinearLayerCache
from models.mechanisms import MECHANISM_CLASSES, ShortConvs

LIN_KEYS = ("k", "v", "log_a", "beta", "phi_k")  # per-token inputs a window token carries into the state


def _matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the frozen projections compute in: autocast's when it is on (casting to it first is what
    the autocast linear does anyway), else x's."""
    if torch.is_autocast_enabled(x.device.type) and x.dtype == torch.float32:
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """apply_rotary_pos_emb's formula on [B, T, heads, D] (q and k heads at once), cast to dtype. Without
    autograd and compile: x*cos plus two in-place multiply-adds on the halves (3 passes over x instead of
    the formula's 6: rotate_half's neg and cat, two products, the sum)."""
    if torch.is_grad_enabled() or ops.compile_enabled():
        return _rope_formula(x, cos, sin, dtype)
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    h = x.shape[-1] // 2
    out = x * cos
    out[..., :h].addcmul_(x[..., h:], sin[..., :h], value=-1)
    out[..., h:].addcmul_(x[..., :h], sin[..., h:])
    return out.to(dtype)


@ops.compiled
def _rope_formula(x, cos, sin, dtype):
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return ((x * cos) + (rotate_half(x) * sin)).to(dtype)


@ops.compiled
def _shared_normaliser(swa, num, den, window_logmass):
    """Hedgehog with a softmax path: (mass * y_swa + num) / (mass + den), mass = exp(window_logmass)."""
    mass = window_logmass.float().exp().view(1, 1, -1, 1)
    return (swa.float() * mass + num) / (mass + den.unsqueeze(-1))


class LinearizedAttention(nn.Module):
    def __init__(self, attn: nn.Module, config, layer_idx: int, mechanism: str, window: int = 0,
                 sinks: int = 0, short_conv: bool = False, conv_size: int = 4, gate_rank: int = 16,
                 feature_dim: int = 64):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = attn.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.groups = self.num_heads // self.num_kv_heads
        self.scaling = attn.scaling
        self.mechanism, self.window, self.sinks = mechanism, window, sinks
        # frozen modules, same attribute names as the original attention => same state-dict keys
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
        self.q_norm = getattr(attn, "q_norm", None)
        self.k_norm = getattr(attn, "k_norm", None)
        hidden = config.hidden_size
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        dev = self.q_proj.weight.device
        with torch.device(dev):
            self.conv = ShortConvs(q_dim, kv_dim, conv_size) if short_conv else None
            self.lin = None
            if mechanism != "none":
                self.lin = MECHANISM_CLASSES[mechanism](hidden, self.num_heads, self.num_kv_heads, self.head_dim,
                                                        gate_rank=gate_rank, feature_dim=feature_dim,
                                                        windowed=(window + sinks) > 0)

    # ------------------------------------------------------------------ projections
    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        """[q|k|v] = x W^T in one matmul [B, T, (H+2Hkv)D] when the projections are plain nn.Linear (no LoRA,
        no hooks); else the three projections, concatenated. One token at a time (decoding) also takes the
        three projections: concatenating the weights would copy them on every step."""
        mods = (self.q_proj, self.k_proj, self.v_proj)
        plain = x.shape[1] > 1 and all(type(m) is nn.Linear and not m._forward_hooks and not m._forward_pre_hooks
                                       for m in mods)
        biases = [m.bias for m in mods]
        if plain and (all(b is None for b in biases) or all(b is not None for b in biases)):
            bias = None if biases[0] is None else torch.cat(biases)
            return F.linear(x, torch.cat([m.weight for m in mods]), bias)
        return torch.cat([m(x) for m in mods], -1)

    def _project(self, x: torch.Tensor, position_embeddings, conv_state=None, use_conv: bool = True,
                 want_conv_state: bool = True):
        """(qk, q, k, v, new conv state): q [B,T,H,D], k/v [B,T,Hkv,D] after the short conv (one depthwise
        conv over [q|k|v]), q/k norm and RoPE; qk [B,T,H+Hkv,D] is q and k in one tensor (q, k are its
        slices) when RoPE ran on both at once, else None."""
        B, T = x.shape[:2]
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self._qkv(x)
        new_conv = None
        if self.conv is not None and use_conv:
            state = conv_state.get("qkv") if conv_state else None
            qkv, new_state = ops.short_conv(qkv, self.conv.weight(), state=state, output_final_state=want_conv_state)
            new_conv = {"qkv": new_state} if want_conv_state else None
        # split (not slices): its backward is one cat instead of a zero-filled copy per slice
        qk, v = (t.unflatten(-1, (-1, D)) for t in qkv.split([(H + Hkv) * D, Hkv * D], -1))
        cos, sin = position_embeddings
        # under autocast RoPE's fp32 cos/sin promote q/k while v stays bf16: FLA kernels need one dtype
        if self.q_norm is None:  # RoPE on q and k at once (the same formula as apply_rotary_pos_emb)
            qk = _rope(qk, cos, sin, v.dtype)
            q, k = qk.split([H, Hkv], 2)
            return qk, q, k, v, new_conv
        q, k = qk.split([H, Hkv], 2)
        q, k = apply_rotary_pos_emb(self.q_norm(q), self.k_norm(k), cos, sin, unsqueeze_dim=2)
        return None, q.to(v.dtype), k.to(v.dtype), v, new_conv

    def project(self, x: torch.Tensor, position_embeddings, conv_state=None, use_conv: bool = True):
        """q [B,T,H,D], k/v [B,T,Hkv,D] after short conv, q/k norm and RoPE; new conv state ({"qkv": [B,D,W-1]})."""
        _, q, k, v, new_conv = self._project(x, position_embeddings, conv_state, use_conv)
        return q, k, v, new_conv

    def linear_inputs(self, x, q, k, v, qk=None):
        """The mechanism's op inputs, keys/values expanded to the query heads (qk: q and k in one tensor)."""
        return self.lin.inputs(x, q, k, v, qk=qk)

    def full_attention(self, x: torch.Tensor, position_embeddings) -> torch.Tensor:
        """The frozen layer's own causal softmax attention, without the short convs (diagnostics).

        With LoRA, wrap the call in peft's `disable_adapter` to get the frozen projections."""
        q, k, v, _ = self.project(x, position_embeddings, use_conv=False)
        out, _ = ops.window_sink_attention(q, k, v, sinks=0, window=q.shape[1], scale=self.scaling)
        return self.o_proj(out.reshape(*x.shape[:2], -1).to(x.dtype))

    # ------------------------------------------------------------------ linear path
    def _run(self, lin: dict, q_for_state: torch.Tensor, initial_state, chunked: bool):
        """Run the mechanism's op; returns (o or (num, den), final state)."""
        m = self.mechanism
        if m in ("gla", "kgla"):
            f = ops.gla_chunk if chunked else ops.gla_recurrent
            return f(q_for_state, lin["k"], lin["v"], lin["log_a"], self.lin.scale,
                     initial_state=initial_state, output_final_state=True)
        if m == "gdn":
            f = ops.gdn_chunk if chunked else ops.gdn_recurrent
            return f(q_for_state, lin["k"], lin["v"], lin["log_a"], lin["beta"], self.lin.scale,
                     initial_state=initial_state, output_final_state=True)
        f = ops.linear_attn_chunk if chunked else ops.linear_attn_recurrent
        num, den, state = f(q_for_state, lin["phi_k"], lin["v"], initial_state=initial_state,
                            output_final_state=True)
        return (num, den), state

    def _query(self, lin: dict) -> torch.Tensor:
        return lin["phi_q"] if self.mechanism == "hedgehog" else lin["q"]

    def _linear_parallel(self, lin: dict, T: int):
        """(out, state, first): out holds q_t^T S_{t-w} for the rows t >= first (every earlier row reads a
        zero state), state is the state after token T-1-w (None if no token entered it).

        Tokens j < sinks never enter the linear state; the state before them is zero, so instead of zeroing
        their keys the op simply starts at token `sinks`: it runs over tokens s..T-1-w, read by the
        queries s+w..T-1."""
        w, s = self.window, min(self.sinks, T)
        qx = self._query(lin)
        n = T - w  # tokens s..n-1 enter the state
        if n - s <= 0:
            return self._zero_output(qx, lin), None, 0
        entering = {key: val[:, s:n] for key, val in lin.items()}
        out, state = self._run(entering, qx[:, w + s:], None, chunked=True)
        return out, state, w + s

    def _zero_output(self, qx, lin):
        B, T, H = qx.shape[:3]
        V = lin["v"].shape[-1]
        o = qx.new_zeros(B, T, H, V, dtype=torch.float32)
        return (o, qx.new_zeros(B, T, H, dtype=torch.float32)) if self.mechanism == "hedgehog" else o

    # ------------------------------------------------------------------ combination
    def _combine(self, lin_out, swa_out, dtype, first: int = 0):
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

    # ------------------------------------------------------------------ forward
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                cache=None, **kwargs):
        # transformers < 5.24 passes the cache as `past_key_values`, newer releases as `cache`
        past_key_values = cache if cache is not None else past_key_values
        cache = None
        if past_key_values is not None:
            cache = past_key_values.layers[self.layer_idx]
            if isinstance(cache, DynamicLayer) and not cache.is_initialized:
                # a stock DynamicCache (HF builds one when use_cache is on): take over this empty slot
                cache = past_key_values.layers[self.layer_idx] = LinearLayerCache()
            if not isinstance(cache, LinearLayerCache):
                raise TypeError(f"layer {self.layer_idx} is linearized but the cache holds {type(cache).__name__}; "
                                "generate with models.cache.LinearCache")
        if cache is not None and cache.seen > 0:
            y = self._decode(hidden_states, position_embeddings, cache)
        else:
            y = self._parallel(hidden_states, position_embeddings, cache)
        B, T = hidden_states.shape[:2]
        return self.o_proj(y.reshape(B, T, -1).to(_matmul_dtype(hidden_states))), None

    def _parallel(self, x, position_embeddings, cache):
        T = x.shape[1]
        x = x.to(_matmul_dtype(x))  # cast once under autocast (each projection would cast it again)
        qk, q, k, v, conv_state = self._project(x, position_embeddings, want_conv_state=cache is not None)
        swa = None
        if self.has_softmax_path:
            swa = ops.window_sink_softmax(q, k, v, sinks=self.sinks, window=self.window, scale=self.scaling)
        lin_out = state = None
        first = 0
        if self.lin is not None:
            lin = self.linear_inputs(x, q, k, v, qk=qk)
            lin_out, state, first = self._linear_parallel(lin, T)
        if cache is not None:
            self._fill_cache(cache, T, k, v, lin if self.lin is not None else None, state, conv_state)
        return self._combine(lin_out, swa, x.dtype, first)

    def _fill_cache(self, cache, T, k, v, lin, state, conv_state):
        s, w = self.sinks, self.window
        cache.conv = conv_state
        cache.sink_k = k[:, :min(s, T)].transpose(1, 2)
        cache.sink_v = v[:, :min(s, T)].transpose(1, 2)
        lo = max(s, T - w)  # window holds tokens max(s, T-w) .. T-1
        cache.win_k = k[:, lo:].transpose(1, 2)
        cache.win_v = v[:, lo:].transpose(1, 2)
        if lin is not None:
            cache.win_lin = {key: lin[key][:, lo:] for key in LIN_KEYS if key in lin}
            cache.state = state if state is not None else None
        cache.seen = T

    def _decode(self, x, position_embeddings, cache):
        """Token-by-token continuation from a filled cache (T = 1 per step; longer inputs loop)."""
        outs = []
        cos, sin = position_embeddings
        for i in range(x.shape[1]):
            outs.append(self._step(x[:, i:i + 1], (cos[:, i:i + 1], sin[:, i:i + 1]), cache))
        return torch.cat(outs, 1)

    def _step(self, x, position_embeddings, cache):
        t, s, w = cache.seen, self.sinks, self.window
        q, k, v, cache.conv = self.project(x, position_embeddings, cache.conv)
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)
        if t < s:
            cache.sink_k = torch.cat([cache.sink_k, kt], 2)
            cache.sink_v = torch.cat([cache.sink_v, vt], 2)
        else:
            cache.win_k = torch.cat([cache.win_k, kt], 2)
            cache.win_v = torch.cat([cache.win_v, vt], 2)
        lin_out = None
        if self.lin is not None:
            lin = self.linear_inputs(x, q, k, v)
            lin_out = self._linear_step(lin, cache, entered_window=t >= s)
        if cache.win_k.shape[2] > w:  # the oldest window token has been folded into the state
            cache.win_k, cache.win_v = cache.win_k[:, :, 1:], cache.win_v[:, :, 1:]
        swa = None
        if self.has_softmax_path:
            keys = torch.cat([cache.sink_k, cache.win_k], 2).transpose(1, 2)
            vals = torch.cat([cache.sink_v, cache.win_v], 2).transpose(1, 2)
            swa, _ = ops.window_sink_decode(q, keys, vals, scale=self.scaling)
        cache.seen = t + 1
        return self._combine(lin_out, swa, x.dtype)

    def _linear_step(self, lin, cache, entered_window: bool):
        """Append the token to the window; if a token leaves it, fold it into the state; read q^T S."""
        qx = self._query(lin)
        if entered_window:
            new = {key: lin[key] for key in LIN_KEYS if key in lin}
            cache.win_lin = new if cache.win_lin is None else {
                key: torch.cat([cache.win_lin[key], new[key]], 1) for key in new}
        n_win = 0 if cache.win_lin is None else next(iter(cache.win_lin.values())).shape[1]
        if n_win > self.window:
            leaving = {key: val[:, :1] for key, val in cache.win_lin.items()}
            cache.win_lin = {key: val[:, 1:] for key, val in cache.win_lin.items()}
            out, cache.state = self._run(leaving, qx, cache.state, chunked=False)
            return out
        if cache.state is None:
            return self._zero_output(qx, lin)
        # nothing to fold: read the state with a no-op token (zero key, unit decay, zero beta)
        noop = {key: torch.zeros_like(lin[key]) for key in LIN_KEYS if key in lin}
        out, cache.state = self._run(noop, qx, cache.state, chunked=False)
        return out
