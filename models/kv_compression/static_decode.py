"""A compressed KV cache decoded on the static-cache decoder full attention uses (`full-static`).

kvpress leaves its kept entries in a DynamicCache, which Hugging Face decodes eagerly (a press row then times
the slower decoder, not the press). Here the kept entries of each row are copied into the static KV buffers of
models.decoding.fast_decode.FastDecoder, each row its own number of entries, and decoded there: the same step,
split-K attention over each row's filled slots and CUDA graph as the full-static row. A kept entry keeps the
position it was read at (its key is already rotated), so a row's next slot and its next position differ: the
step writes each new token at the row's slot (`io["pos"]`) and rotates it by the row's position (`io["pos_ids"]`).
A head-adaptive press (models/kv_compression/presses.py) keeps the same entries per layer, unevenly over the heads:
each head's kept entries fill its first slots, and the slots between them and the row's next slot (the count of
the fullest head of any layer) are a hole the attention skips (`holes` [B, Hkv, 2] per layer: [start, end)). The
buffers are sized by that fullest head: the decode-cache memory of such a row is the buffer's, not the entries'.
The contexts run through the model in one batch, each row compressed on its own (a press scores a prompt's whole
row: models.kv_compression.batched_prefill); the questions, which no press touches, are then read for the whole batch
in one pass over the static buffers (`read_questions`), each row's after its kept entries (and after its hole), at
its own positions.
models.kv_compression.generate's DynamicCache path stays the definition; tests/test_kv_compression.py checks
both give the same tokens on the same prompts.
"""
from __future__ import annotations

import torch

from golinear.models.backbones.cache_arg import cache_kwarg
from golinear.models.cache.decode_state import assign_to
from golinear.models.decoding.fast_decode import FastDecoder
from golinear.models.kv_compression.batched_prefill import batches, compress_contexts
from golinear.models.kv_compression.generate import compressed_prefill, split_budget
from golinear.models.kv_compression.kvpress_adapter import take_head_masks
from golinear.models.attention.ops.decode_attention import allowed_slots
from golinear.models.attention.projection import project_qkv
from golinear.models.decoding.batch_generate import pad_rows


class PressDecoder(FastDecoder):
    """Greedy decoding of compressed caches for a full-attention *ForCausalLM. `prefill(prompts, ...)` compresses
    each prompt's context under the press, reads its question and returns each row's first token [B, 1];
    `decode(n)` (FastDecoder's) the next n tokens. `max_len` bounds a row's kept entries (per head) plus its new
    tokens; an uneven row's buffer adds its fullest head's excess over that."""

    @torch.no_grad()
    def prefill(self, prompts: list[tuple[list[int], int]], press: str, budget: int, question_aware: bool = False,
                prefill_chunk: int = 0, fill: int = 0) -> torch.Tensor:
        """prompts: (token ids, how many of the last ones are the question) per row. The contexts run through the
        model together, each row compressed on its own (models.kv_compression.batched_prefill; KVzip and a chunked
        prefill one prompt at a time); then every row's question is read in one batched pass over the static
        buffers (read_questions). `fill`: rows added as copies of the last one (its compressed context
        reused), so a short batch takes a captured shape; returns [len(prompts) + fill, 1]."""
        caches, contexts, questions, masks, keeps = [], [], [], [], []
        for ids, question_len in prompts:
            n_press, keep = split_budget(len(ids), question_len, budget, question_aware)
            contexts.append(n_press)
            keeps.append(keep)
            questions.append(ids[n_press:])
        if batches(press, prefill_chunk):  # one forward for the batch, each row compressed on its own
            done = compress_contexts(self.model, [ids[:n] for (ids, _), n in zip(prompts, contexts)], press, keeps)
            caches, masks = [c for c, _ in done], [m for _, m in done]
        else:
            for (ids, _), n_press, keep in zip(prompts, contexts, keeps):
                x = torch.tensor([ids[:n_press]], device=self.device)
                caches.append(compressed_prefill(self.model, x, press, keep, prefill_chunk))
                masks.append(take_head_masks(self.model))  # before the next prompt's prefill replaces them
        for part in (caches, masks, contexts, questions):
            part.extend(part[-1:] * fill)
        B = len(caches)
        vocab = self.model.lm_head.weight.shape[0]
        self.load(caches, contexts, torch.zeros(B, 1, dtype=torch.long, device=self.device),
                  torch.zeros(B, 1, vocab, device=self.device), masks)
        return self.read_questions(questions)

    @torch.no_grad()
    def read_questions(self, questions: list[list[int]]) -> torch.Tensor:
        """Each row's question tokens (at least one) read after its compressed context, every row at once: the block
        is right-padded, each token written at its row's next slots and rotated by its row's positions, attending to
        its row's kept entries (minus a head's hole) and the question tokens before it; padding is neither written
        nor attended to. Returns each row's first new token [B, 1] (the decoder is then ready to decode)."""
        io, dev = self.io, self.device
        B, Lq = len(questions), max(len(q) for q in questions)
        lens = torch.tensor([len(q) for q in questions], device=dev)
        ids, _ = pad_rows(questions, 0)
        ids = ids.to(dev)
        j = torch.arange(Lq, device=dev)
        real = j[None] < lens[:, None]  # [B, Lq]
        slot = io["pos"][:, None] + j[None]  # [B, Lq] each token's slot
        pos_ids = io["pos_ids"] + j[None]  # [B, Lq] and its position
        h = self.model.model.embed_tokens(ids)
        pe = self.model.model.rotary_emb(h, pos_ids)
        rows, cols = real.nonzero(as_tuple=True)
        for i, layer in enumerate(self.layers):
            attn, st = layer.self_attn, self.states[i]
            x = layer.input_layernorm(h)
            _, q, k, v, _ = project_qkv(attn, x, pe, fused=False)  # q [B, Lq, H, D], k/v [B, Lq, Hkv, D]
            st["k"][rows, :, slot[rows, cols]] = k[rows, cols].to(st["k"].dtype)
            st["v"][rows, :, slot[rows, cols]] = v[rows, cols].to(st["v"].dtype)
            Hkv, H, D = st["k"].shape[1], q.shape[2], q.shape[3]
            allowed = allowed_slots(st["k"].shape[2], slot, st.get("holes"))  # [B, Hkv or 1, Lq, L]
            # the query heads of a KV head as its G x Lq query rows (no GQA copy of the buffers), as the decode step
            qg = q.transpose(1, 2).reshape(B, Hkv, (H // Hkv) * Lq, D).to(st["k"].dtype)
            o = torch.nn.functional.scaled_dot_product_attention(qg, st["k"], st["v"], scale=attn.scaling,
                                                                  attn_mask=allowed.repeat(1, 1, H // Hkv, 1))
            h = h + attn.o_proj(o.reshape(B, H, Lq, D).transpose(1, 2).reshape(B, Lq, -1).to(x.dtype))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        last = h[torch.arange(B, device=dev), lens - 1].unsqueeze(1)
        logits = self.model.lm_head(self.model.model.norm(last)).float()
        nxt = logits.argmax(-1)
        io["ids"].copy_(nxt)
        io["logits"].copy_(logits)
        io["pos"].add_(lens)
        io["pos_ids"].add_(lens[:, None])
        self.positions = [p + int(n) for p, n in zip(self.positions, lens.tolist())]
        return io["ids"].clone()

    @torch.no_grad()
    def load(self, caches: list, positions: list[int], next_ids: torch.Tensor, logits: torch.Tensor,
             masks: list | None = None) -> torch.Tensor:
        """Copy compressed DynamicCaches (each one row, or rows holding the same number of entries) into the static
        buffers; `positions`: each cache's next position (the length of what it holds, kept or not); `masks`: per cache, the entries a
        head-adaptive press evicted (take_head_masks; None: none). Returns next_ids [B, 1]."""
        masks = masks or [None] * len(caches)
        kept = [head_entries(c, m) for c, m in zip(caches, masks)]  # per cache, per layer: ([b, H, n] keep, counts)
        # per cache its fullest head of any layer (an uneven row's next slot) and what a head holds (kept_per_head):
        # computed on the device, to the host in one transfer (not one sync per row and layer)
        sizes = {j: (entries(c),) * 2 for j, (c, m) in enumerate(zip(caches, masks)) if m is None}
        adaptive = [j for j, m in enumerate(masks) if m is not None]
        if adaptive:
            fullest = [torch.stack([torch.stack([n for _, n in kept[j]]).max(), _per_head(kept[j])])
                       for j in adaptive]
            sizes.update(zip(adaptive, map(tuple, torch.stack(fullest).tolist())))
        counts, per_head = zip(*(sizes[j] for j in range(len(caches))))
        slots = [n for c, n in zip(caches, counts) for _ in range(c.layers[0].keys.shape[0])]
        pos_ids = [p for c, p in zip(caches, positions) for _ in range(c.layers[0].keys.shape[0])]
        # max_len counts a row's kept entries per head plus its new tokens: an uneven row needs its excess over that
        excess = max(n - h for n, h in zip(counts, per_head))
        B, L = len(slots), max(self.max_len or 0, max(slots) + 1) + excess
        uneven = bool(adaptive)
        next_slot = torch.tensor(slots, dtype=torch.int32, device=self.device).view(B, 1) if uneven else None
        changed = False
        for i in range(len(self.layers)):
            k0 = caches[0].layers[i].keys
            kb = torch.zeros(B, k0.shape[1], L, k0.shape[3], dtype=k0.dtype, device=self.device)
            vb = torch.zeros_like(kb)
            holes = torch.zeros(B, k0.shape[1], 2, dtype=torch.int32, device=self.device)
            row = 0
            for keys, values, n, (keep, heads) in _runs_of(caches, counts, [k[i] for k in kept], i):
                b = keys.shape[0]
                if keep is None:
                    kb[row:row + b, :, :n], vb[row:row + b, :, :n] = keys, values
                else:  # each head's kept entries in order in its first slots (zeros after), then a hole to the next slot
                    order = torch.argsort((~keep).to(torch.uint8), dim=-1, stable=True)[..., :n, None]
                    held = (torch.arange(n, device=keep.device) < heads[..., None])[..., None]  # [b, H, n, 1]
                    for buf, x in ((kb, keys), (vb, values)):
                        buf[row:row + b, :, :n] = torch.where(held, x.gather(2, order.expand(-1, -1, -1, x.shape[3])), 0)
                if uneven:  # a head's kept entries, then its hole up to the row's next slot
                    holes[row:row + b, :, 0] = heads.to(holes)
                    holes[row:row + b, :, 1] = next_slot[row:row + b]
                row += b
            st = self.states[i] if isinstance(self.states[i], dict) else {}
            self.states[i] = st
            changed |= assign_to(st, "k", kb) | assign_to(st, "v", vb)
            if uneven:
                changed |= assign_to(st, "holes", holes)
            elif st.pop("holes", None) is not None:
                changed = True
        changed |= assign_to(self.io, "ids", next_ids.to(self.device))
        changed |= assign_to(self.io, "pos", torch.tensor(slots, device=self.device))
        changed |= assign_to(self.io, "pos_ids", torch.tensor(pos_ids, device=self.device).view(B, 1))
        changed |= assign_to(self.io, "rows", torch.arange(B, device=self.device))
        changed |= assign_to(self.io, "logits", logits.float().to(self.device))
        if changed:
            self.graph = None
        self.positions = slots  # FastDecoder.decode's host-side copy: slots filled (capacity, split-K prefix)
        return self.io["ids"].clone()  # the buffer itself changes with every step


def _runs_of(caches: list, counts, kept_i: list, i: int):
    """Layer i of consecutive caches of one shape and kind (masked or not) as one batch each: (keys, values, the
    largest count among them, (keep, heads)), so load's copies run once a run of rows, not once a row. A masked row
    under a larger count than its own copies zeros past its heads' entries (`held`), as it would alone."""
    j = 0
    while j < len(caches):
        k = j + 1
        first = caches[j].layers[i].keys
        while (k < len(caches) and (kept_i[k][0] is None) == (kept_i[j][0] is None)
               and caches[k].layers[i].keys.shape[1:] == first.shape[1:]):
            k += 1
        layers = [c.layers[i] for c in caches[j:k]]
        if k - j == 1:
            yield layers[0].keys, layers[0].values, counts[j], kept_i[j]
        else:
            keep = None if kept_i[j][0] is None else torch.cat([kp for kp, _ in kept_i[j:k]])
            yield (torch.cat([la.keys for la in layers]), torch.cat([la.values for la in layers]), max(counts[j:k]),
                   (keep, torch.cat([h for _, h in kept_i[j:k]])))
        j = k


def head_entries(cache, masked) -> list[tuple[torch.Tensor | None, torch.Tensor]]:
    """Per layer: (which entries each head keeps [b, H, n] bool, or None when all; each head's count [b, H], on the
    cache's device). `masked`: a head-adaptive press's evicted entries per layer (take_head_masks), or None."""
    out = []
    masked = None if masked is None else on_device(masked, cache.layers[0].keys.device)
    for i, layer in enumerate(cache.layers):
        b, H, n, _ = layer.keys.shape
        if masked is None or masked[i] is None:
            out.append((None, torch.full((b, H), n, dtype=torch.long, device=layer.keys.device)))
            continue
        keep = torch.ones(b, H, n, dtype=torch.bool, device=layer.keys.device)
        keep[tuple(t.to(keep.device) for t in masked[i])] = False
        out.append((keep, keep.sum(-1)))
    return out


def on_device(masked: list, device) -> list:
    """take_head_masks' per-layer index tensors on `device`, moved in one copy: KVzip's come from the host, and a
    copy per tensor from the host waits for the GPU each time (three a layer and row)."""
    here = torch.empty(0, device=device).device  # 'cuda' names cuda:0 here, so compare resolved devices
    away = [t for m in masked if m is not None for t in m if t.device != here]
    if not away:
        return masked
    moved = iter(torch.cat([t.flatten().long() for t in away]).to(here).split([t.numel() for t in away]))
    return [None if m is None else tuple(t if t.device == here else next(moved).view(t.shape) for t in m)
            for m in masked]


def _per_head(per_layer) -> torch.Tensor:
    """kept_per_head's count as a device scalar, from head_entries' per-layer counts."""
    n = torch.stack([n for _, n in per_layer])  # [layers, b, H]: a few kernels, not a few a layer
    return (-(-n.sum(-1) // n.shape[-1])).max()


def kept_per_head(cache, masked=None, per_layer=None) -> int:
    """The entries a compressed cache holds per layer and KV head: for a head-adaptive press, the layer's total over
    its heads (rounded up; the fullest layer), which is what a decode step reads (holes are skipped). `per_layer`:
    head_entries(cache, masked) when already computed."""
    if masked is None:
        return entries(cache)
    return int(_per_head(per_layer if per_layer is not None else head_entries(cache, masked)))


def entries(cache) -> int:
    """The entries every layer of a compressed cache holds (one count: a uniform budget)."""
    counts = {layer.keys.shape[2] for layer in cache.layers} | {layer.values.shape[2] for layer in cache.layers}
    if len(counts) != 1:
        raise RuntimeError(f"the compressed cache's layers hold different numbers of entries {sorted(counts)}")
    return counts.pop()


def cut(tokens: list[int], eos: frozenset, stop=None) -> tuple[list[int], bool]:
    """A row's decoded tokens up to and including its first end (EOS, or the token after which `stop(out)` holds:
    the DynamicCache path's loop, applied after a batch decoded), and whether it ended."""
    out = []
    for t in tokens:
        out.append(t)
        if t in eos or (stop and stop(out)):
            return out, True
    return out, False
