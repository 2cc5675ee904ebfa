"""Why strict GDN does not learn on SmolLM2-135M: probes with the real weights, CPU or GPU.

    .venv/bin/python scripts/study/probe_strict_gdn.py init --variants gdn,gdn-scale1,gdn-onorm,hedgehog
    .venv/bin/python scripts/study/probe_strict_gdn.py train --variants gdn,gdn-onorm,hedgehog --steps 30 --seq-len 256
    .venv/bin/python scripts/study/probe_strict_gdn.py numerics --checkpoint checkpoints/smollm2-135m/gdn

`init`: per variant, the untrained model's held-out loss (2 x 512 tokens of the held-out books) and, with
every layer fed the full-attention model's hidden states (teacher forcing), how the linear output y_lin compares
with the frozen softmax output y_full before o_proj: rms ratio, cosine, nMSE, and nMSE after the best per-head
scalar gain. `train`: a plain loop with `golinear train`'s settings (AdamW lr 2e-3, cosine, clip 1, batch 1,
new parameters only), the loss each step and the held-out loss before and after. `numerics`: a checkpoint's
held-out loss with the reference op in fp32 against bf16 autocast (on CUDA: against the FLA kernels).

Variants are strict (no window, sinks, short conv or LoRA). The gdn-* ones wrap GatedDeltaNet's output in
this process only (models/ is not changed): scale1 = op scale 1 instead of head_dim^-0.5; onorm = per-head
RMSNorm of the output times a learned weight [H, D] (init 1; FLA's GatedDeltaNet layer has such an o_norm);
onorm8 = the same with the weight initialised to head_dim^-1/2 (data-free, about the attention output's size);
onorm-cal = the same with the weight initialised to the per-head rms of y_full on one held-out sequence;
beta1 = beta shifted to start near 1 (0.98); maxmag = beta 1 and no decay (the largest output the gates
allow, roughly); zero / mean-v = reference outputs (nothing / the running mean of v); plus-mean-v = the op's output plus the
running mean of v (the uniform 1/t term of the paper's Section 3.2 expansion, which GDN omits).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from golinear.models.training import data as data_mod  # noqa: E402
from golinear.models.training.diagnostics import causal_attention  # noqa: E402
from golinear.models.attention.layers import LinearizedAttention  # noqa: E402
from golinear.models.load import load_model  # noqa: E402
from golinear.models.attention.projection import decoder_layers  # noqa: E402

# ---------------------------------------------------------------------------------------------- variants
_run = LinearizedAttention.run


def _patched_run(self, lin, q, state, chunked):
    """The op, then the variant's output transform (self.lin.probe_post), if any."""
    o, s = _run(self, lin, q, state, chunked)
    post = getattr(self.lin, "probe_post", None)
    return (o if post is None else post(self, o, lin)), s


LinearizedAttention.run = _patched_run


def _rmsnorm(o, eps=1e-6):
    return o * torch.rsqrt(o.float().pow(2).mean(-1, keepdim=True) + eps).to(o.dtype)


def _onorm(self, o, lin):
    return _rmsnorm(o) * self.lin.probe_o_weight.to(o.dtype)


def _mean_v(self, o, lin):
    v = lin["v"].float()
    return (v.cumsum(1) / torch.arange(1, v.shape[1] + 1, device=v.device).view(1, -1, 1, 1)).to(o.dtype)


def _beta_shifted(lin, shift: float, no_decay: bool = False):
    """lin.inputs with beta = sigmoid(logit(beta) + shift) and, with no_decay, log_a = 0 (nothing forgotten)."""
    inputs = lin.inputs

    def shifted(x, q, k, v, qk=None):
        out = inputs(x, q, k, v, qk=qk)
        out["beta"] = torch.sigmoid(torch.logit(out["beta"].float(), eps=1e-6) + shift).to(out["beta"].dtype)
        if no_decay:
            out["log_a"] = torch.zeros_like(out["log_a"])
        return out
    return shifted


def _full_rms_per_head(model, seq):
    """Per layer, the per-head rms of the frozen softmax output on `seq` (full-attention hidden states)."""
    out, saved = {}, LinearizedAttention.prefill
    LinearizedAttention.prefill = _teacher_prefill(lambda layer, y_full, y_lin: out.__setitem__(
        layer, y_full.pow(2).mean(dim=(0, 1, 3)).sqrt()))
    try:
        with torch.no_grad():
            model(input_ids=seq[None], use_cache=False)
    finally:
        LinearizedAttention.prefill = saved
    return out


def build(variant: str, seed: int = 0, calib_seq=None):
    """(model, tokenizer) for a strict variant, untrained (init seed `seed`)."""
    mech = variant.split("-")[0]
    model, tok, _ = load_model(mechanism=mech, seed=seed)
    extra = variant[len(mech) + 1:]
    gains = _full_rms_per_head(model, calib_seq) if extra == "onorm-cal" else None
    for layer in decoder_layers(model):
        lin, H, D = layer.self_attn.lin, layer.self_attn.num_heads, layer.self_attn.head_dim
        if extra == "scale1":
            lin.scale = 1.0
        elif extra in ("onorm", "onorm8", "onorm-cal"):
            w = torch.full((H, D), 1.0 if extra == "onorm" else D ** -0.5) if gains is None else \
                gains[layer.self_attn.layer_idx].float().view(H, 1).repeat(1, D)
            lin.probe_o_weight = nn.Parameter(w)  # under .self_attn.lin.: a new (trainable) parameter
            lin.probe_post = _onorm
        elif extra == "beta1":
            lin.inputs = _beta_shifted(lin, 4.0)  # sigmoid(logit + 4): beta 0.5 -> 0.98
        elif extra == "maxmag":
            lin.inputs = _beta_shifted(lin, 20.0, no_decay=True)  # beta = 1, a = 1: the largest state
        elif extra == "zero":
            lin.probe_post = lambda self, o, l: o * 0
        elif extra == "mean-v":
            lin.probe_post = _mean_v
        elif extra == "plus-mean-v":  # the 1/t term of the paper's first-order expansion, added to the op
            lin.probe_post = lambda self, o, l: o + _mean_v(self, o, l)
        elif extra:
            raise ValueError(f"unknown variant {variant!r}")
    return model, tok


# ---------------------------------------------------------------------------------------------- measurements
def _teacher_prefill(record):
    """A LinearizedAttention.prefill that records (layer, y_full, y_lin) and passes y_full on."""
    parallel = LinearizedAttention._parallel

    def prefill(self, x, pe, state=None, chunk=None, carry=None):
        B, T = x.shape[:2]
        y_lin = parallel(self, x, pe).float()
        q, k, v, _ = self.project(x, pe, use_conv=False)
        y_full = causal_attention(q, k, v, self.scaling)
        record(self.layer_idx, y_full, y_lin)
        return self.o_proj(y_full.reshape(B, T, -1).to(x.dtype))
    return prefill


def layer_stats(y_full, y_lin) -> dict:
    """Per head over (t, d), averaged over heads: rms ratio, cosine, nMSE, nMSE at the best scalar gain."""
    f, g = (y.transpose(1, 2).flatten(2) for y in (y_full, y_lin))  # [B, H, T*D]
    var = f.var(-1)
    gain = (f * g).sum(-1) / (g * g).sum(-1).clamp_min(1e-12)
    return dict(rms_ratio=(g.pow(2).mean(-1).sqrt() / f.pow(2).mean(-1).sqrt()).mean().item(),
                cos=F.cosine_similarity(f, g, dim=-1).mean().item(),
                nmse=(((f - g) ** 2).mean(-1) / var).mean().item(),
                nmse_best_gain=(((f - gain[..., None] * g) ** 2).mean(-1) / var).mean().item(),
                best_gain=gain.median().item())


@torch.no_grad()
def heldout_loss(model, seqs) -> float:
    losses = [F.cross_entropy(model(input_ids=s[None], use_cache=False).logits[0, :-1].float(), s[1:]).item()
              for s in seqs]
    return sum(losses) / len(losses)


@torch.no_grad()
def teacher_forced(model, seqs) -> dict:
    """Mean over layers and sequences of layer_stats, plus the per-layer rms ratio."""
    rows, saved = [], LinearizedAttention.prefill
    LinearizedAttention.prefill = _teacher_prefill(lambda layer, f, g: rows.append((layer, layer_stats(f, g))))
    try:
        for s in seqs:
            model(input_ids=s[None], use_cache=False)
    finally:
        LinearizedAttention.prefill = saved
    keys = rows[0][1].keys()
    out = {k: round(sum(r[k] for _, r in rows) / len(rows), 4) for k in keys}
    layers = sorted({layer for layer, _ in rows})
    out["rms_ratio_per_layer"] = [round(sum(r["rms_ratio"] for i, r in rows if i == layer)
                                        / sum(1 for i, _ in rows if i == layer), 4) for layer in layers]
    return out


TOKEN_FILE = None  # --tokens: a golinear token file (`golinear train --tokens F.npz --prepare-only`)


def tokens(tok, train_tokens: int, heldout_tokens: int):
    """(train, held-out) token streams: the token file's, or the books corpus tokenized here."""
    if TOKEN_FILE:
        td = data_mod.TokenData.load(TOKEN_FILE)
        return td.train, td.heldout
    td = data_mod.prepare_books(tok, None, train_tokens=train_tokens, heldout_tokens=heldout_tokens)
    return td.train, td.heldout


def cmd_init(args):
    _, tok, _ = load_model()
    _, held = tokens(tok, 0, args.sequences * args.seq_len + args.seq_len)
    seqs = data_mod.heldout_sequences(held, args.seq_len, args.sequences + 1)
    calib, seqs = seqs[-1], seqs[:-1]
    for variant in args.variants.split(","):
        t0 = time.time()
        model, _ = build(variant, args.seed, calib)
        rec = dict(variant=variant, heldout_loss=round(heldout_loss(model, seqs), 4))
        rec.update(teacher_forced(model, seqs))
        rec["seconds"] = round(time.time() - t0)
        print(json.dumps(rec), flush=True)


def cmd_train(args):
    _, tok, _ = load_model()
    train, held = tokens(tok, args.train_tokens, args.eval_sequences * args.seq_len + args.seq_len)
    packed = data_mod.PackedSequences(train, args.seq_len, seed=0)
    seqs = data_mod.heldout_sequences(held, args.seq_len, args.eval_sequences + 1)
    calib, seqs = seqs[-1], seqs[:-1]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for variant in args.variants.split(","):
        torch.manual_seed(args.seed)
        model, _ = build(variant, args.seed, calib)
        model.to(device)
        params = [p for n, p in model.named_parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), weight_decay=0.0)
        before = heldout_loss(model, seqs.to(device))
        t0, losses = time.time(), []
        for step in range(args.steps):
            for g in opt.param_groups:
                g["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
            ids = packed.batch(step, 1).to(device)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(params, 1.0).item()
            opt.step()
            losses.append(round(loss.item(), 3))
            print(json.dumps(dict(variant=variant, step=step + 1, loss=losses[-1], grad_norm=round(gnorm, 3),
                                  s=round(time.time() - t0))), flush=True)
        after = heldout_loss(model, seqs.to(device))
        print(json.dumps(dict(variant=variant, steps=args.steps, seq_len=args.seq_len, heldout_before=round(before, 4),
                              heldout_after=round(after, 4), losses=losses, seconds=round(time.time() - t0))),
              flush=True)


def cmd_numerics(args):
    """The same checkpoint's held-out loss in fp32 (reference op) and under bf16 autocast (FLA on CUDA)."""
    model, tok, _ = load_model(checkpoint=args.checkpoint)
    _, held = tokens(tok, 0, args.sequences * args.seq_len)
    seqs = data_mod.heldout_sequences(held, args.seq_len, args.sequences)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    os.environ["GOLINEAR_OPS"] = "reference"
    rec = dict(checkpoint=args.checkpoint, device=device, fp32_reference=heldout_loss(model, seqs.to(device)))
    os.environ["GOLINEAR_OPS"] = "auto"
    with torch.autocast(device, dtype=torch.bfloat16):
        rec["bf16_autocast_" + ("fla" if device == "cuda" else "reference")] = heldout_loss(model, seqs.to(device))
    print(json.dumps(rec), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["init", "train", "numerics"])
    p.add_argument("--variants", default="gdn,gdn-scale1,gdn-onorm,gdn-onorm-cal,gla,kgla,hedgehog")
    p.add_argument("--sequences", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--train-tokens", type=int, default=400_000)
    p.add_argument("--eval-sequences", type=int, default=2)
    p.add_argument("--checkpoint", default="checkpoints/smollm2-135m/gdn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokens", help="a prepared token file instead of tokenizing the books here")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    global TOKEN_FILE
    TOKEN_FILE = args.tokens
    {"init": cmd_init, "train": cmd_train, "numerics": cmd_numerics}[args.command](args)


if __name__ == "__main__":
    main()
