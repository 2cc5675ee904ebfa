"""The new parameters of each linear mechanism (Figure 1 of the paper): gates, beta, feature maps.

Each mechanism turns the layer's frozen, RoPE'd q/k/v (k/v on the KV heads) plus the layer input x into the
arguments of its op in `models.attention.ops`, the KV_KEYS among them expanded to the query heads (`expand_kv=False`
leaves them on the KV heads: the chunked prefill expands only the rows it runs). STOP_KEYS: the inputs whose
zeros leave the recurrent state unchanged (how the prefill masks a row's tokens past its end). Only these
modules are trainable.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from golinear.models.attention.ops import compiled, fast_inference, fla_backend
from golinear.models.spec import MECHANISMS  # noqa: F401 - the allowed set lives in one place


@compiled
def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """FLA's in-kernel normalisation: x * rsqrt(sum(x^2) + eps), the sum in fp32."""
    sq = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32).pow(2)
    return x * torch.rsqrt(sq + eps).to(x.dtype)


def l2norm_pair(q: torch.Tensor, k: torch.Tensor, qk: torch.Tensor | None = None):
    """l2norm of q [B,T,H,D] and k [B,T,Hkv,D]; in one pass when the layer hands over qk = [q|k] heads."""
    if qk is None:
        return l2norm(q), l2norm(k)
    prefill = qk.shape[1] > 1 and qk.is_contiguous() and fast_inference(qk)  # (not the captured decode step)
    qk = fla_backend.l2norm(qk) if prefill else l2norm(qk)
    q, k = qk.split([q.shape[2], k.shape[2]], 2)
    return q, k


class GLAGate(nn.Module):
    """GLA: data-dependent diagonal decay a_t = sigmoid(W2 W1 x)^(1/16), low rank 16 (FLA's GLA layer)."""

    def __init__(self, hidden: int, heads: int, head_dim: int, rank: int = 16, normalizer: float = 16.0):
        super().__init__()
        self.heads, self.head_dim, self.normalizer = heads, head_dim, normalizer
        self.down = nn.Linear(hidden, rank, bias=False)
        self.up = nn.Linear(rank, heads * head_dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gla_log_decay(self.up(self.down(x)), self.normalizer).unflatten(-1, (self.heads, self.head_dim))


@compiled
def _gla_log_decay(g: torch.Tensor, normalizer: float) -> torch.Tensor:
    return F.logsigmoid(g.float()) / normalizer


class OutputNorm(nn.Module):
    """Opt-in per-head RMSNorm of the op's output (out_norm=True; FLA's GDN layer has one, `o_norm`):
    y * rsqrt(mean_d(y^2) + 1e-6) * weight. Strict GDN/kGLA read the state of L2-normalised keys with scale
    D^-1/2, so their output is ~7% of the attention output's size and no gate can enlarge it (docs/study.md,
    "Strict GDN at 135M"). The weight starts at 1; `golinear train` calibrates it to the attention output's
    per-head rms before step 0 (models.training.out_norm_calibration). A GLA/kGLA/GDN mechanism holds it as `out_norm`
    (None when off: no parameters, so checkpoints keep their keys); `normed_output` applies it where
    LinearizedAttention.run makes the op's output for every path (parallel pass, chunked prefill, decode step), as
    models.attention.ops.fused_decode does; the retention path computes its GDN output itself, without it
    (models.spec.check_out_norm refuses the pair)."""

    def __init__(self, heads: int, head_dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, head_dim))

    def forward(self, y: torch.Tensor) -> torch.Tensor:  # [B, T, H, D] -> same shape and dtype
        return _rms_norm(y, self.weight, self.eps)


def normed_output(mechanism: nn.Module, o: torch.Tensor) -> torch.Tensor:
    """The op's output o through the mechanism's opt-in output norm (unchanged when it has none)."""
    norm = getattr(mechanism, "out_norm", None)
    return o if norm is None else norm(o)


@compiled
def _rms_norm(y: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    yf = y.float()
    return (yf * torch.rsqrt(yf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype)


def expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    """KV heads -> query heads ([B,T,Hkv,D] -> [B,T,Hkv*groups,D]), as transformers' repeat_kv."""
    return x.repeat_interleave(groups, dim=2) if groups > 1 else x


class GLA(nn.Module):
    """Mechanism interface: inputs(x, q, k, v) with q on the query heads and k, v on the KV heads."""
    kind = "gla"
    KV_KEYS = ("k", "v")
    STOP_KEYS = ("log_a", "v")  # S = diag(a) S + k v^T: decay 1, nothing added

    def __init__(self, hidden, heads, kv_heads, head_dim, gate_rank=16, out_norm=False, **_):
        super().__init__()
        self.groups = heads // kv_heads
        self.gate = GLAGate(hidden, heads, head_dim, gate_rank)
        self.scale = head_dim ** -0.5
        self.out_norm = OutputNorm(heads, head_dim) if out_norm else None  # opt-in (models.attention.mechanisms.OutputNorm)

    def inputs(self, x, q, k, v, qk=None, expand_kv=True):
        g = self.groups if expand_kv else 1
        return dict(q=q, k=expand(k, g), v=expand(v, g), log_a=self.gate(x))


class KeyGatedGLA(GLA):
    """kGLA (§3.2.2): decay diag(a_t)(I - b_t Diag(k_t*k_t)); keys L2-normalised so 1 - b k^2 > 0.

    The gate stays diagonal, so it is GLA with log a'_t = log a_t + log(1 - b_t k_t^2) (same op)."""
    kind = "kgla"

    def __init__(self, hidden, heads, kv_heads, head_dim, gate_rank=16, out_norm=False, **_):
        super().__init__(hidden, heads, kv_heads, head_dim, gate_rank, out_norm)
        self.beta = nn.Linear(hidden, heads, bias=False)

    def inputs(self, x, q, k, v, qk=None, expand_kv=True):
        q, k = l2norm_pair(q, k, qk)
        k_all = expand(k, self.groups)
        log_a = _kgla_log_a(self.gate(x), self.beta(x), k_all)
        g = self.groups if expand_kv else 1
        return dict(q=q, k=k_all if expand_kv else k, v=expand(v, g), log_a=log_a)


@compiled
def _kgla_log_a(log_a: torch.Tensor, beta_logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    beta = torch.sigmoid(beta_logits.float()).unsqueeze(-1)
    return log_a + torch.log1p(-(beta * k.float().pow(2)).clamp(max=1 - 1e-6))


@compiled
def _gdn_gates(ab: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """(log_a, beta) from the fused [a | b] projection [B, T, 2H]."""
    H = A_log.shape[0]
    a, b = ab.float().split([H, H], -1)
    return -A_log.float().exp() * F.softplus(a + dt_bias.float()), torch.sigmoid(b)


class GatedDeltaNet(nn.Module):
    """GDN: S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, scalar decay per head (FLA's GDN gate)."""
    kind = "gdn"
    KV_KEYS = ("k", "v")
    STOP_KEYS = ("log_a", "beta")  # S = a (I - b k k^T) S + b k v^T: a = 1, b = 0 leave S as it is

    def __init__(self, hidden, heads, kv_heads, head_dim, out_norm=False, **_):
        super().__init__()
        self.groups = heads // kv_heads
        self.a_proj = nn.Linear(hidden, heads, bias=False)
        self.b_proj = nn.Linear(hidden, heads, bias=False)
        self.A_log = nn.Parameter(torch.empty(heads))
        self.dt_bias = nn.Parameter(torch.empty(heads))
        self.scale = head_dim ** -0.5
        self.out_norm = OutputNorm(heads, head_dim) if out_norm else None  # opt-in (models.attention.mechanisms.OutputNorm)
        self.reset_gate()

    @torch.no_grad()
    def reset_gate(self):
        """Mamba2/FLA initialisation: A in [1, 16], dt in [1e-3, 1e-1] (log-uniform)."""
        if self.A_log.is_meta:
            return
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
        dt = torch.exp(torch.rand_like(self.dt_bias) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus

    def inputs(self, x, q, k, v, qk=None, expand_kv=True):
        """a_proj and b_proj as one matmul (their weights concatenated; the parameters stay separate)."""
        ab = F.linear(x, torch.cat([self.a_proj.weight, self.b_proj.weight]))
        log_a, beta = _gdn_gates(ab, self.A_log, self.dt_bias)
        q, k = l2norm_pair(q, k, qk)
        g = self.groups if expand_kv else 1
        return dict(q=q, k=expand(k, g), v=expand(v, g), log_a=log_a, beta=beta)


class HedgehogFeatureMap(nn.Module):
    """phi(x) = softmax(xW + b) (+) softmax(-(xW + b)), one map per head (LoLCATs' 'fullspace' Hedgehog)."""

    def __init__(self, heads: int, head_dim: int, feature_dim: int = 64):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(heads, head_dim, feature_dim))
        self.bias = nn.Parameter(torch.zeros(heads, feature_dim))
        if not self.weight.is_meta:
            nn.init.normal_(self.weight, std=head_dim ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [B, T, H, D] -> [B, T, H, 2F]
        return _hedgehog_features(x, self.weight, self.bias)


@compiled
def _hedgehog_features(x, weight, bias):
    z = torch.einsum("bthd,hdf->bthf", x.float(), weight.float()) + bias.float()
    return torch.cat([torch.softmax(z, -1), torch.softmax(-z, -1)], -1)


class Hedgehog(nn.Module):
    kind = "hedgehog"
    KV_KEYS = ("phi_k", "v")
    STOP_KEYS = ("phi_k",)  # S += phi_k v^T, Z += phi_k

    def __init__(self, hidden, heads, kv_heads, head_dim, feature_dim=64, windowed=False, **_):
        super().__init__()
        self.groups = heads // kv_heads
        self.phi_q = HedgehogFeatureMap(heads, head_dim, feature_dim)
        self.phi_k = HedgehogFeatureMap(kv_heads, head_dim, feature_dim)
        # With a window/sink path the two branches share one normaliser; the window branch enters with a
        # learned per-head mass exp(window_logmass) (LoLCATs mixes the two with a learned factor too).
        self.window_logmass = nn.Parameter(torch.zeros(heads)) if windowed else None

    def inputs(self, x, q, k, v, qk=None, expand_kv=True):
        """The k feature map is per KV head, then shared by that head's query heads."""
        g = self.groups if expand_kv else 1
        return dict(phi_q=self.phi_q(q), phi_k=expand(self.phi_k(k), g), v=expand(v, g))


MECHANISM_CLASSES = {"gla": GLA, "kgla": KeyGatedGLA, "gdn": GatedDeltaNet, "hedgehog": Hedgehog}


class ShortConvs(nn.Module):
    """Causal depthwise convolutions (kernel 4) on q, k and v, initialised to the identity.

    Identity initialisation (last tap = 1, no activation) makes the untrained model equal to the
    model without convolutions, so training starts from the frozen projections."""

    def __init__(self, q_dim: int, kv_dim: int, kernel: int = 4):
        super().__init__()
        self.kernel = kernel
        self.q = nn.Parameter(self._identity(q_dim, kernel))
        self.k = nn.Parameter(self._identity(kv_dim, kernel))
        self.v = nn.Parameter(self._identity(kv_dim, kernel))

    def weight(self) -> torch.Tensor:
        """[q|k|v] taps [Dq + 2 Dkv, kernel]: the three depthwise convs are one conv over the concatenated
        channels (same math; parameters, names and shapes unchanged for checkpoints)."""
        return torch.cat([self.q, self.k, self.v])

    @staticmethod
    def _identity(dim: int, kernel: int) -> torch.Tensor:
        w = torch.zeros(dim, kernel)
        w[:, -1] = 1.0
        return w
