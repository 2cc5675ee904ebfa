"""Batched greedy decoding for models with retention slots (retain > 0), with a CUDA graph on CUDA.

The static-cache decoder (models.decoding.fast_decode.FastDecoder) prefills a right-padded batch in chunks, which
retention's prefill (models.retention.prefill) cannot do. `RetentionDecoder` keeps FastDecoder's decode
loop (embedding, per-row RoPE positions, MLPs, the hybrid's full-attention KV buffers, greedy argmax) and
changes two things:

  - prefill: the right-padded batch in one pass (LinearizedAttention.prefill_rows,
    models.retention.prefill_rows: padding made inert, each row's state gathered at its own length, for
    every score: delta_error's decision walk runs over the rows at once; `prefill_mode` "rows"); with
    `one_pass = False`, each prompt alone (batch 1, unpadded) through the model's own forward on a
    models.cache.hf_cache.LinearCache, the forward HF generate's first step runs, the rows' states then stacked ("each");
  - the linearized layers' step: once every row is past sinks + window (`steady`),
    models.retention.rows.steady_step_inplace: each row at its own position read from the device tensor
    io["pos"], the state updated in place, fixed work whatever the prompt length, no host sync; so on CUDA
    (`use_graph`, as FastDecoder) it is captured once and replayed per token; a later prefill of the same batch
    size copies its states into the same buffers, so the graph stays valid. Where
    GOLINEAR_FUSED_DECODE says so (by default on CUDA, as FastDecoder's fused step) the layer's whole steady step
    (projections, short conv, RoPE, gates, the retention step, o_proj) runs through torch.compile: one graph
    for every layer of a shape (the layer is an argument; its parameters are the graph's inputs). Before that point
    (a prompt shorter than sinks + window) the steps run eagerly through retention_rows_step, which replaces the
    state (a short row steps alone).

The "each" prefill is as slow as one prompt at a time (scripts/bench_retention_generate.py compares the two);
the decode steps are batched. models.decoding.batch_generate
drives it like FastDecoder (per-row EOS / stop strings); tests/test_retention_generate.py checks the tokens
against HF generate one prompt at a time.
"""
from __future__ import annotations

import functools

import torch

from golinear.models.backbones.cache_arg import cache_kwarg
from golinear.models.cache.hf_cache import LinearCache, LinearLayerCache
from golinear.models.cache.decode_state import DecodeState
from golinear.models.decoding.fast_decode import FastDecoder
from golinear.models.attention.ops import fused_decode
from golinear.models.retention.rows import RetentionRows, retention_rows_step, steady_step_inplace


def _layer_step(attn, x, pe, state: DecodeState, pos: torch.Tensor) -> torch.Tensor:
    """The cache policy's decode (models.cache.policies.retention_slots) with the in-place steady step, each row at its
    position pos [B]."""
    def step(rows, q, k, v, lin, scale, lin_scale, score, scores):
        return steady_step_inplace(rows, q, k, v, lin, pos, scale, lin_scale, score, scores), rows
    return attn.cache_policy.decode(attn, x, pe, state, step)


@functools.cache
def _compiled_layer_step():
    """_layer_step through torch.compile (static shapes; GOLINEAR_FUSED_DECODE, models.attention.ops.fused_decode.enabled)."""
    return torch.compile(_layer_step, dynamic=False)


def state_tensors(st) -> list:
    """A layer's decode buffers: a linearized layer's DecodeState, a full-attention layer's KV (none before a prefill)."""
    if not st:
        return []
    return st.tensors() if isinstance(st, DecodeState) else [st["k"], st["v"]]


class RetentionDecoder(FastDecoder):
    """FastDecoder's interface (`prefill(input_ids, lengths)`, `decode(n)`) for a model with retention slots."""

    serves = "retention"
    handles_retention = True
    one_pass = True  # False: always prefill each prompt alone (scripts/bench_retention_generate.py compares them)

    def __init__(self, model, max_len: int | None = None, use_graph: bool | None = None):
        super().__init__(model, prefill_chunk=0, use_graph=use_graph, max_len=max_len)

    def check_policies(self):
        """Every linearized layer keeps retention slots (its cache policy's decoder is "retention")."""
        if not all(layer.self_attn.cache_policy.decoder == self.serves
                   for layer, lin in zip(self.layers, self.linear) if lin) or not any(self.linear):
            raise ValueError("RetentionDecoder is for models with retention slots (retain > 0); use FastDecoder")

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, lengths=None) -> torch.Tensor:
        """The prompts, right-padded in one pass (`prefill_mode` "rows"), or with `one_pass = False` each alone
        through the model's forward ("each"); returns each row's first new token [B, 1]. input_ids [B, T] padded
        on the right; lengths: each row's real length (None: all T)."""
        _, _, lens, max_len = self._prompt_shape(input_ids, lengths)
        self.prefill_mode = "rows" if self.one_pass else "each"
        fresh = list(self.states)
        if self.prefill_mode == "rows":
            logits, changed = self._prefill_rows(input_ids, lens, max_len, fresh)
        else:
            logits, changed = self._prefill_each(input_ids, lens, max_len, fresh), False
        changed |= self._load(fresh)
        self._pack()
        return self._load_io(logits, lens, changed)

    def _pack(self):
        """Every linearized layer's rows in the in-place step's layout (RetentionRows.pack), where they are not yet:
        new buffers (a captured graph must be captured again)."""
        for st, lin in zip(self.states, self.linear):
            if lin and st.retention is not None and st.retention.buffers is None:
                st.retention = st.retention.pack()

    def _load(self, fresh: list) -> bool:
        """The prefilled states copied into the buffers of the last prefill where every tensor's shape and dtype
        match (a batch of the same size: the captured graph stays valid, captured once, not once per batch), else
        taken as they are. Returns whether any layer's buffers were replaced."""
        changed = False
        for i, new in enumerate(fresh):
            old = self.states[i]
            if new is old:  # filled in place (a hybrid's full-attention layer in the one-pass prefill)
                continue
            olds, news = state_tensors(old), state_tensors(new)
            if old is None or len(olds) != len(news) or any(
                    a.shape != b.shape or a.dtype != b.dtype for a, b in zip(olds, news)):
                self.states[i], changed = new, True
                continue
            for a, b in zip(olds, news):
                a.copy_(b)
            if self.linear[i] and new.retention is not None:
                old.retention.seen = list(new.retention.seen)  # the rows' host step counters
        return changed

    def _prefill_rows(self, input_ids: torch.Tensor, lens: list[int], max_len: int, fresh: list):
        """Every prompt in one right-padded pass (LinearizedAttention.prefill_rows; a hybrid's full-attention layers
        as FastDecoder prefills them, into their static buffers), the other states into `fresh`; returns the logits
        at each row's last token [B, 1, vocab] (fp32) and whether a full-attention layer's buffers were replaced."""
        B, T = input_ids.shape
        h = self.model.model.embed_tokens(input_ids)
        pe = self.model.model.rotary_emb(h, torch.arange(T, device=self.device).unsqueeze(0))  # shared by the rows
        tails = [dict() for _ in self.layers]
        changed = False
        for i, layer in enumerate(self.layers):
            x = layer.input_layernorm(h)
            if self.linear[i]:
                a, fresh[i] = layer.self_attn.prefill_rows(x, pe, lens)
            else:
                a = self._prefill_full(layer.self_attn, x, pe, 0, tails[i])
                changed |= self._finish_full(i, layer.self_attn, tails[i], T, B, max_len)
                fresh[i] = self.states[i]
            h = h + a
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        last = h[torch.arange(B, device=self.device), torch.tensor(lens, device=self.device) - 1].unsqueeze(1)
        return self.model.lm_head(self.model.model.norm(last)).float(), changed

    def _prefill_each(self, input_ids: torch.Tensor, lens: list[int], max_len: int, fresh: list) -> torch.Tensor:
        """Each row's prompt alone through the model's forward on a LinearCache, the rows' states then stacked into
        `fresh`; returns the logits at each row's last token [B, 1, vocab] (fp32)."""
        caches, logits = [], []
        for b, n in enumerate(lens):
            cache = LinearCache.for_model(self.model)
            out = self.model(input_ids[b:b + 1, :n], use_cache=True, logits_to_keep=1,
                             **cache_kwarg(self.model, cache))
            caches.append(cache)
            logits.append(out.logits[:, -1:])
        for i in range(len(self.layers)):
            layers = [c.layers[i] for c in caches]
            fresh[i] = self._stack_linear(layers) if self.linear[i] else self._stack_full(layers, lens, max_len)
        return torch.cat(logits, 0).float()

    @torch.no_grad()
    def decode(self, n: int) -> torch.Tensor:
        """n greedy steps; returns [B, n]. Steps with a row before sinks + window run eagerly (they replace the
        state), the rest in place (replayed in a CUDA graph with use_graph)."""
        out, graph = [], self.use_graph
        try:
            self.use_graph = False
            while n > 0 and min(self.positions) < self.steady_from:
                self.graph = None  # else FastDecoder.decode replays it; and the eager step replaces the states it reads
                out.append(super().decode(1))
                n -= 1
        finally:
            self.use_graph = graph
        if out:  # the eager steps replaced the rows: lay them out for the in-place step (the graph is recaptured)
            self._pack()
        if n > 0 or not out:
            out.append(super().decode(n))
        for st, lin in zip(self.states, self.linear):  # the host copy of each row's position (the steady step
            if lin:  # reads the device one)
                st.retention.seen = list(self.positions)
        return torch.cat(out, 1)

    @torch.no_grad()
    def capture(self):
        """Capture the steady step now if every row is past sinks + window (else the first steady decode() does)."""
        if "ids" not in self.io or min(self.positions) >= self.steady_from:
            super().capture()

    @staticmethod
    def _stack_linear(layers: list[LinearLayerCache]) -> DecodeState:
        states = [c.state for c in layers]
        conv = None if states[0].conv is None else torch.cat([s.conv for s in states], 0)
        return DecodeState(conv=conv, retention=RetentionRows.stack([s.retention for s in states]))

    def _stack_full(self, layers, lens: list[int], max_len: int) -> dict:
        """A hybrid's full-attention layer: each row's KV (HF's DynamicLayer, [1, Hkv, n, D]) in a static buffer
        [B, Hkv, max_len, D], as FastDecoder keeps it."""
        k0 = layers[0].keys
        kb = torch.zeros(len(lens), k0.shape[1], max_len, k0.shape[3], dtype=k0.dtype, device=self.device)
        vb = torch.zeros_like(kb)
        for b, (c, n) in enumerate(zip(layers, lens)):
            kb[b, :, :n], vb[b, :, :n] = c.keys[0], c.values[0]
        return {"k": kb, "v": vb}

    def _attend(self, i, x, pe, pos, steady):
        """The cache policy's decode with each row at its own position (in place when steady)."""
        if not self.linear[i]:
            return super()._attend(i, x, pe, pos, steady)
        attn = self.layers[i].self_attn
        if steady:  # (GOLINEAR_FUSED_DECODE, by default on CUDA: compiled)
            run = _compiled_layer_step() if fused_decode.enabled(x) else _layer_step
            return run(attn, x, pe, self.states[i], pos)
        return attn.cache_policy.decode(attn, x, pe, self.states[i], retention_rows_step)
