"""Fast generation for linearized models: chunked prefill, then decoding on a static-shape cache.

Every decode buffer has a fixed shape whatever the prompt length: per linearized layer a
models.cache.decode_state.DecodeState (the recurrent state, the sink KV, a ring buffer of the last `window` tokens:
their KV, their position and the linear-path inputs they fold into the state when they leave, and the
short-conv state); per full-attention layer of a hybrid a KV buffer of `max_len` slots. The decode step reads
the position from a device tensor and selects ring slots / validity with device-side indexing, so it has no
host sync and no data-dependent shapes: on CUDA it is captured once in a CUDA graph and replayed per token,
and its cost does not depend on how long the prompt was. Once the position reaches sinks + window (any prompt
of that length), a leaner step is used: the sinks are complete and every window slot holds a real token, so
it skips the sink writes, the masks and the validity checks (a graph is re-captured when the variant changes).

The linearized layers run LinearizedAttention's own public operations: `prefill` chunk by chunk (models.decoding.prefill:
right-padded variable-length prompts, state, window tail, sinks and conv state carried across chunks, which
bounds activation memory) into a fresh DecodeState, loaded into the static one; then `step` per token, the
same step HF generate runs through models.cache.hf_cache.LinearCache. tests/test_latency.py checks the logits against
the model's own parallel forward, tests/test_batched_generate.py the tokens against HF generate one prompt at
a time. Decoding runs with one position per row (RoPE, ring slots, sink writes, masks and the full-attention KV
slot are per row), so rows of different lengths share one static cache and one captured graph.
With GOLINEAR_FUSED_DECODE=auto (the default), on CUDA the steady step of the default
recipe runs models.attention.ops.fused_decode and the layers' residual adds, norms and MLP activation
models.attention.ops.decode_glue: fewer kernels, the same computation. The prefill runs the same glue on CUDA (compiled
for its chunk shapes): on 8K-token chunks the eager RMSNorm's passes over fp32 copies are a bandwidth cost.
"""
from __future__ import annotations

import functools
import os

import torch

from golinear.models.cache.decode_state import DecodeState, assign_to
from golinear.models.attention.layers import LinearizedAttention
from golinear.models.attention.ops import decode_glue, fused_decode
from golinear.models.attention.ops.decode_attention import decode_attention, decode_attention_reference
from golinear.models.decoding.prefill import ChunkEnds, check_lengths
from golinear.models.attention.projection import decoder_layers, project_qkv
from golinear.models.spec import CONV_ON

DEFAULT_PREFILL_CHUNK = 8192
# how a full-attention layer's decode step attends over its static KV buffer: "split-k" reads each row's filled
# prefix only (models.attention.ops.decode_attention: the split-K Triton kernel on CUDA; elsewhere SDPA over the slots an
# eager loop knows to be filled); "sdpa": SDPA over the whole buffer with a per-row mask (the definition, and the
# step as it was before the kernel: bench/decode_step.py times both)
FULL_DECODE = ("split-k", "sdpa")
# GOLINEAR_COMPILED_STEP=1: the decode step a CUDA graph captures runs through torch.compile first (static shapes,
# one compile per decoder and step variant), so Inductor fuses the step's small elementwise kernels, the norms and
# the GEMVs' neighbours, as gpt-fast compiles its whole step; the graph then replays the compiled kernels. Off by
# default: the eager step is the measured one until `golinear latency` times both (bench/speed/latency.py).
COMPILED_STEP_MODES = ("0", "1")


def compiled_step_enabled() -> bool:
    value = os.environ.get("GOLINEAR_COMPILED_STEP", "0").strip() or "0"
    if value not in COMPILED_STEP_MODES:
        raise ValueError(f"GOLINEAR_COMPILED_STEP={value!r}; allowed: {list(COMPILED_STEP_MODES)}")
    return value == "1"
__all__ = ["DEFAULT_PREFILL_CHUNK", "FastDecoder", "decoder_layers"]  # decoder_layers: bench/speed/latency.py imports it here


# decode_glue's formulas for the prefill, each through a function of its own: compiled with automatic dynamic
# shapes (one kernel for every chunk length from the second length on, where the decode step compiles each static
# shape), they do not share a function's cache of compiled variants with the decode step's
def _glue_rms_norm(h, weight, eps):
    return decode_glue.rms_norm_formula(h, weight, eps)


def _glue_add_rms_norm(h, a, weight, eps):
    return decode_glue.add_rms_norm_formula(h, a, weight, eps)


def _glue_silu_mul(g, u):
    return decode_glue.silu_mul_formula(g, u)


@functools.cache
def _prefill_glue(name: str):
    return torch.compile(globals()[f"_glue{name}"])


class FastDecoder:
    """Greedy generation for a (linearized or hybrid) *ForCausalLM with a static cache and CUDA graphs.

    `prefill(input_ids)` returns the first generated token [B, 1]; `decode(n)` returns the next n tokens
    [B, n]. `use_graph=None` means: on CUDA. `max_len` bounds prompt + generated tokens (it sizes the KV
    buffers of full-attention layers only)."""

    serves = "static"  # the cache policies' decoder it serves (models.cache.policies.base.CachePolicy.decoder)
    handles_retention = False  # whether it serves retention slots (bench/speed/latency.py reads it)
    prefills_whole_prompts = False  # the chunked prefill (models.decoding.prefill) implements conv_on "both" only

    def __init__(self, model, prefill_chunk: int = DEFAULT_PREFILL_CHUNK, use_graph: bool | None = None,
                 max_len: int | None = None, full_decode: str = FULL_DECODE[0]):
        if full_decode not in FULL_DECODE:
            raise ValueError(f"full_decode {full_decode!r}; allowed: {', '.join(FULL_DECODE)}")
        self.full_decode = full_decode
        if prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0 (0 = the whole prompt at once), got {prefill_chunk}")
        self.model = model
        self.layers = list(decoder_layers(model))
        self.prefill_chunk = prefill_chunk
        self.device = next(model.parameters()).device
        self.use_graph = (self.device.type == "cuda") if use_graph is None else use_graph
        self.max_len = max_len
        self.linear = [isinstance(layer.self_attn, LinearizedAttention) for layer in self.layers]
        self.check_policies()
        if not self.prefills_whole_prompts and any(lin and layer.self_attn.conv_linear_only
                                                   for layer, lin in zip(self.layers, self.linear)):
            raise ValueError(f"FastDecoder's chunked prefill implements conv_on={CONV_ON[0]!r} only; decode a "
                             "conv_on='linear' model with golinear.models.decoding.batch_generate.decoder_for or HF generate")
        self.states: list = [None] * len(self.layers)
        # from this position on, every sink and ring slot holds a real token and the token leaving the window
        # is not a sink: the decode step then skips the sink writes, the masks and the validity checks
        self.steady_from = max((layer.self_attn.sinks + layer.self_attn.window for layer, lin
                                in zip(self.layers, self.linear) if lin), default=0)
        self.graph = None
        self.graph_steady = None  # the step variant the captured graph replays
        self.prefix = None  # the current eager step's bound on filled KV slots (None: the whole buffer)
        self.io: dict[str, torch.Tensor] = {}

    def check_policies(self):
        """Every linearized layer's cache policy is one this decoder serves (its `decoder`)."""
        if any(lin and layer.self_attn.cache_policy.decoder != self.serves
               for layer, lin in zip(self.layers, self.linear)):
            raise ValueError("FastDecoder has no static cache for retention slots (retain > 0); decode such a "
                             "model with golinear.models.retention.generate.RetentionDecoder or HF generate")

    # ------------------------------------------------------------------ public API
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, lengths=None) -> torch.Tensor:
        """Run the prompts, fill the static cache; returns each row's first generated token [B, 1].

        input_ids [B, T] padded on the right; lengths: each row's real length (None: all T)."""
        B, T, lens, max_len = self._prompt_shape(input_ids, lengths)
        changed = False
        fresh = [DecodeState() if lin else None for lin in self.linear]  # filled chunk by chunk, then loaded
        chunk = self.prefill_chunk or T
        tails = [dict() for _ in self.layers]  # what a layer carries from one chunk to the next
        last_h = None
        with fused_decode.decode_scope():  # GOLINEAR_FUSED_DECODE (auto: on CUDA): the decode step's fused glue
            glue = decode_glue.usable(self.layers, self.model.model.norm, input_ids)
        for p0 in range(0, T, chunk):
            p1 = min(T, p0 + chunk)
            ids = input_ids[:, p0:p1]
            h = self.model.model.embed_tokens(ids)
            pos = torch.arange(p0, p1, device=ids.device).unsqueeze(0).expand(B, -1)
            pe = self.model.model.rotary_emb(h, pos)
            ends = ChunkEnds(lens, p0, p1, T, self.device)

            def attend(i, x):
                attn = self.layers[i].self_attn
                if self.linear[i]:
                    return attn.prefill(x, pe, fresh[i], chunk=ends, carry=tails[i])
                return self._prefill_full(attn, x, pe, p0, tails[i])

            if glue:
                h = self._prefill_layers_fused_glue(h, attend)
            else:
                for i, layer in enumerate(self.layers):
                    h = h + attend(i, layer.input_layernorm(h))
                    h = h + layer.mlp(layer.post_attention_layernorm(h))
            if ends.rows:  # each row's last real token: the position its first new token is predicted from
                last_h = ends.scatter(last_h, h[ends.index, ends.last_token - p0].unsqueeze(1))
        logits = self.model.lm_head(self.model.model.norm(last_h))
        # move everything into the static buffers (reused across prompts so a captured graph stays valid)
        for i, layer in enumerate(self.layers):
            if self.linear[i]:
                if not isinstance(self.states[i], DecodeState):
                    self.states[i] = DecodeState()
                changed |= self.states[i].load(fresh[i])
            else:
                changed |= self._finish_full(i, layer.self_attn, tails[i], T, B, max_len)
        return self._load_io(logits, lens, changed)

    def _load_io(self, logits: torch.Tensor, lens: list[int], changed: bool) -> torch.Tensor:
        """The step's inputs (first tokens, positions, rows, logits) into their static buffers; the captured graph
        is dropped when any buffer it reads was replaced (`changed`: the caches' too). Returns the first tokens."""
        nxt = logits.argmax(-1)
        pos = torch.tensor(lens, device=self.device)
        for name, value in (("ids", nxt), ("pos", pos), ("pos_ids", pos.view(-1, 1)), ("logits", logits.float()),
                            ("rows", torch.arange(len(lens), device=self.device))):
            changed |= assign_to(self.io, name, value)
        if changed:
            self.graph = None
        self.positions = lens  # host-side copy of io["pos"], for the steady switch and the capacity check
        return nxt

    def _prefill_layers_fused_glue(self, h, attend):
        """The decoder layers over one prefill chunk with the decode step's fused glue (models.attention.ops.decode_glue's
        formulas, compiled with automatic dynamic shapes): each residual add and the norm after it in one kernel,
        SiLU * up in one. On a [8, 8192, 4096] bf16 chunk the eager RMSNorm makes 8 passes, most over fp32
        copies (~9 GB per norm); fused: h and a read, h and the normed x written."""
        x = _prefill_glue("_rms_norm")(h, self.layers[0].input_layernorm.weight,
                                       self.layers[0].input_layernorm.variance_epsilon)
        for i, layer in enumerate(self.layers):
            norm = layer.post_attention_layernorm
            h, x = _prefill_glue("_add_rms_norm")(h, attend(i, x), norm.weight, norm.variance_epsilon)
            mlp = layer.mlp
            m = mlp.down_proj(_prefill_glue("_silu_mul")(mlp.gate_proj(x), mlp.up_proj(x)))
            if i + 1 == len(self.layers):  # the final norm runs on each row's last token only
                return h + m
            norm = self.layers[i + 1].input_layernorm
            h, x = _prefill_glue("_add_rms_norm")(h, m, norm.weight, norm.variance_epsilon)

    def _prompt_shape(self, input_ids: torch.Tensor, lengths):
        """(B, T, each row's real length, the KV buffers' length) of a right-padded prompt batch, checked."""
        B, T = input_ids.shape
        if T == 0:
            raise ValueError("prefill needs at least one prompt token")
        return B, T, check_lengths(lengths, B, T), max(self.max_len or 0, T + 1)

    @torch.no_grad()
    def decode(self, n: int) -> torch.Tensor:
        """n greedy steps from the prefilled cache; returns [B, n]."""
        if "ids" not in self.io:
            raise ValueError("decode() needs a prefill() first")
        capacity = min((st["k"].shape[2] for st in self.states if isinstance(st, dict)), default=None)
        if capacity is not None and max(self.positions) + n > capacity:
            raise ValueError(f"decode({n}) after {max(self.positions)} tokens exceeds the full-attention KV buffer of "
                             f"{capacity} slots; construct FastDecoder with a larger max_len")
        first = min(self.positions)  # the step variant is chosen by the row furthest behind
        self.positions = [p + n for p in self.positions]
        out = []
        if self.use_graph:
            steady = first >= self.steady_from  # a steady graph only ever sees later positions: valid throughout
            if self.graph is not None and self.graph_steady != steady:
                self.graph = None
            if self.graph is None:
                self._capture(steady)
        filled = max(self.positions) - n  # the furthest row's position before this call (host side)
        for i in range(n):
            if self.graph is not None:
                self.graph.replay()
            else:  # eager: the host knows how many KV slots any row has filled after this step's write
                self._step(steady=first + i >= self.steady_from, prefix=filled + i + 1)
            out.append(self.io["ids"].clone())
        return torch.cat(out, 1) if out else self.io["ids"].new_zeros(self.io["ids"].shape[0], 0)

    @torch.no_grad()
    def capture(self):
        """Capture the decode step now (else the first decode() does it); no-op without graphs."""
        if "ids" not in self.io:
            raise ValueError("capture() needs a prefill() first")
        if self.use_graph and self.graph is None:
            self._capture(min(self.positions) >= self.steady_from)

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, lengths=None) -> torch.Tensor:
        """max_new_tokens greedy tokens per row [B, n] (input_ids right-padded to `lengths`, as in prefill)."""
        first = self.prefill(input_ids, lengths)
        return torch.cat([first, self.decode(max_new_tokens - 1)], 1) if max_new_tokens > 0 else first[:, :0]

    @property
    def last_logits(self) -> torch.Tensor:
        """Logits [B, 1, vocab] behind the most recent token (prefill or decode step)."""
        return self.io["logits"]

    # ------------------------------------------------------------------ prefill, full-attention layers
    def _prefill_full(self, attn, x, pe, p0: int, tail: dict):
        B, Tc = x.shape[:2]
        _, q, k, v, _ = project_qkv(attn, x, pe, fused=False)
        keys = k if p0 == 0 else torch.cat([tail["k"], k], 1)
        vals = v if p0 == 0 else torch.cat([tail["v"], v], 1)
        tail["k"], tail["v"] = keys, vals
        G = q.shape[2] // k.shape[2]
        qt, kt, vt = q.transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2)
        if p0 == 0:
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=attn.scaling,
                                                                  enable_gqa=G > 1)
        else:
            allowed = torch.arange(keys.shape[1], device=x.device)[None] <= torch.arange(p0, p0 + Tc,
                                                                                        device=x.device)[:, None]
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=allowed, scale=attn.scaling,
                                                                  enable_gqa=G > 1)
        return attn.o_proj(o.transpose(1, 2).reshape(B, Tc, -1))

    def _finish_full(self, i, attn, tail: dict, T: int, B: int, max_len: int) -> bool:
        """KV buffers [B, Hkv, max_len, D] (head-major, so a decode step reads each head's keys contiguously)."""
        st = self.states[i] if isinstance(self.states[i], dict) else {}
        self.states[i] = st
        k, v = tail["k"], tail["v"]
        L = max_len  # a different size re-allocates the buffers (and invalidates a captured graph)
        kb = torch.zeros(B, k.shape[2], L, k.shape[3], dtype=k.dtype, device=self.device)
        vb = torch.zeros_like(kb)
        kb[:, :, :T], vb[:, :, :T] = k.transpose(1, 2), v.transpose(1, 2)
        return assign_to(st, "k", kb) | assign_to(st, "v", vb)

    # ------------------------------------------------------------------ decode step (static shapes)
    def _step(self, steady: bool = False, prefix: int | None = None):
        """One token for every row; prefix: a host-side bound on the KV slots any row has filled after this step's
        write (eager loops), None inside a CUDA graph (static shapes)."""
        io = self.io
        self.prefix = prefix  # read by _attend for the full-attention layers (the subclass keeps _attend's signature)
        pos, pos_ids = io["pos"], io["pos_ids"]
        h = self.model.model.embed_tokens(io["ids"])
        pe = self.model.model.rotary_emb(h, pos_ids)
        with fused_decode.decode_scope():  # (GOLINEAR_FUSED_DECODE=auto: on CUDA, fused step and glue)
            if decode_glue.usable(self.layers, self.model.model.norm, h):
                h_final = self._layers_fused_glue(h, pe, pos, steady)
            else:
                for i, layer in enumerate(self.layers):
                    h = h + self._attend(i, layer.input_layernorm(h), pe, pos, steady)
                    h = h + layer.mlp(layer.post_attention_layernorm(h))
                h_final = self.model.model.norm(h)
        logits = self.model.lm_head(h_final)
        io["logits"].copy_(logits.float())
        io["ids"].copy_(logits.argmax(-1))
        pos.add_(1)
        pos_ids.add_(1)

    def _attend(self, i, x, pe, pos, steady):
        layer = self.layers[i]
        if self.linear[i]:
            return layer.self_attn.step(x, pe, self.states[i], pos, self.io["rows"], steady)
        return self._step_full(layer.self_attn, self.states[i], x, pe, pos, self.prefix)

    def _layers_fused_glue(self, h, pe, pos, steady):
        """The decoder layers with each residual add and the norm after it in one kernel (models.attention.ops.decode_glue);
        returns the final norm's output."""
        x = decode_glue.rms_norm(h, self.layers[0].input_layernorm)
        for i, layer in enumerate(self.layers):
            h, x = decode_glue.add_rms_norm(h, self._attend(i, x, pe, pos, steady), layer.post_attention_layernorm)
            after = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.model.model.norm
            h, x = decode_glue.add_rms_norm(h, decode_glue.mlp(layer.mlp, x), after)
        return x

    def _step_full(self, attn, st: dict, x, pe, pos, prefix=None):
        """One query per row against the static KV buffer, written at the row's position; the row then attends to
        its slots 0..pos (models.attention.ops.decode_attention: the query heads of a KV head as G query rows, no GQA
        expansion of the cache). With full_decode "split-k" only those slots are read (on CUDA the split-K kernel,
        which needs no mask; eager elsewhere SDPA over the first `prefix` slots); "sdpa" masks the whole buffer."""
        B = x.shape[0]
        _, q, k, v, _ = project_qkv(attn, x, pe, fused=False)
        rows = self.io["rows"]
        st["k"][rows, :, pos] = k[:, 0].to(st["k"].dtype)  # [B, Hkv, D] at (row, :, pos[row])
        st["v"][rows, :, pos] = v[:, 0].to(st["v"].dtype)
        filled = pos + 1
        holes = st.get("holes")  # a head-adaptive press's cache (models/kv_compression/static_decode.py)
        if self.full_decode == "sdpa":
            o = decode_attention_reference(q[:, 0], st["k"], st["v"], filled, attn.scaling, holes=holes)
        else:
            o = decode_attention(q[:, 0], st["k"], st["v"], filled, attn.scaling, prefix, holes=holes)
        return attn.o_proj(o.reshape(B, 1, -1).to(x.dtype))

    # ------------------------------------------------------------------ CUDA graph
    def _graph_step(self, steady: bool):
        """The step with static shapes (prefix None), as a CUDA graph captures it: `_step`, or with
        GOLINEAR_COMPILED_STEP=1 `_step` through torch.compile (built on first use, per decoder)."""
        if not compiled_step_enabled():
            return self._step(steady)
        if getattr(self, "_compiled_step", None) is None:
            self._compiled_step = torch.compile(self._step, dynamic=False)
        return self._compiled_step(steady)

    def _buffers(self):
        out = list(self.io.values())
        for st in self.states:
            if isinstance(st, DecodeState):
                out += st.tensors()
            elif isinstance(st, dict):
                out += list(st.values())
        return out

    def _capture(self, steady: bool):
        """Warm up (Triton autotuning, cuBLAS handles) on a saved copy of the cache, then capture one step."""
        bufs = self._buffers()
        saved = [b.clone() for b in bufs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # (with GOLINEAR_COMPILED_STEP=1 the first compiles)
                self._graph_step(steady)
        torch.cuda.current_stream().wait_stream(side)
        for b, c in zip(bufs, saved):
            b.copy_(c)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._graph_step(steady)
        for b, c in zip(bufs, saved):  # capture does not run kernels, but be exact about the state
            b.copy_(c)
        del saved
        self.graph, self.graph_steady = graph, steady
