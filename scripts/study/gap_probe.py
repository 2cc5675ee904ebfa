"""Why the default recipe falls short of full attention on LAMBADA and CR (docs/study.md, "Why the gap").

CPU probes on the real SmolLM2-135M weights and the committed checkpoints, fp32, reference ops:
  lengths  token lengths of the standard suites' requests (context + longest continuation), SmolLM2 tokenizer:
           what share of each task fits the 64-token softmax budget (sinks + window), where the linear state
           and the short convs are the only difference from full attention;
  lambada  LAMBADA OpenAI accuracy and target NLL (lm-eval's rule: every target token greedy) on a seeded
           subset, per model; paired, so differences between models are sharper than the subset's error;
  domain   mean next-token loss by position on held-out books vs Wikipedia paragraphs (SQuAD v2 contexts)
           vs essays: is the trained model better only on the training domain?
  conv-drift  how far the short convs of checkpoints moved from the identity they start at.
Models: `full`, `none-w56-s8` (window + sinks, no linear path, untrained), a checkpoint name under
checkpoints/smollm2-135m, or `<name>+frozen-swa` (its softmax path reads the frozen q/k/v, without the short
conv; the linear path keeps the conv) and `<name>+no-lin` (its linear path's output dropped).
Data: $GOLINEAR_DATA, else ../shared/data. `--device cuda` runs the same fp32 forwards on a GPU (the full LAMBADA set:
`lambada ... --n 5153`).
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
CKPT = ROOT / "checkpoints" / "smollm2-135m"
VARIANTS = ("frozen-swa", "no-lin")
BUDGET = 64  # sinks 8 + window 56: the default recipe's softmax tokens


# ------------------------------------------------------------------------------------------------ models
def _frozen_swa_parallel(self, x, position_embeddings, state=None):
    """LinearizedAttention._parallel with the softmax path on the frozen projections (no short conv)."""
    from golinear.models.attention import ops
    from golinear.models.attention.projection import matmul_dtype, project_qkv
    x = x.to(matmul_dtype(x))
    qk, q, k, v, _ = project_qkv(self, x, position_embeddings, self.conv_weight(), want_conv_state=False)
    _, q0, k0, v0, _ = project_qkv(self, x, position_embeddings, None, want_conv_state=False)
    swa = ops.window_sink_softmax(q0, k0, v0, sinks=self.sinks, window=self.window, scale=self.scaling)
    lin_out, _, first = self._linear_parallel(self.linear_inputs(x, q, k, v, qk=qk), x.shape[1])
    return self.combine(lin_out, swa, x.dtype, first)


def _no_lin_parallel(self, x, position_embeddings, state=None):
    """LinearizedAttention._parallel with the linear path's output dropped (softmax path as trained)."""
    from golinear.models.attention import ops
    from golinear.models.attention.projection import matmul_dtype, project_qkv
    x = x.to(matmul_dtype(x))
    _, q, k, v, _ = project_qkv(self, x, position_embeddings, self.conv_weight(), want_conv_state=False)
    return ops.window_sink_softmax(q, k, v, sinks=self.sinks, window=self.window, scale=self.scaling)


def build(name: str, device: str = "cpu"):
    """(model, tokenizer) for a model name of the module docstring, in eval mode, on `device`."""
    import types
    from golinear.models.attention.layers import LinearizedAttention
    from golinear.models.load import load_model
    base, _, variant = name.partition("+")
    if variant and variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}; allowed: {list(VARIANTS)}")
    if base == "full":
        model, tok, _ = load_model()
    elif base == "none-w56-s8":
        model, tok, _ = load_model(mechanism="none", window=56, sinks=8)
    else:
        model, tok, _ = load_model(checkpoint=str(CKPT / base))
    if variant:
        patch = _frozen_swa_parallel if variant == "frozen-swa" else _no_lin_parallel
        for m in model.modules():
            if isinstance(m, LinearizedAttention):
                m._parallel = types.MethodType(patch, m)
    return model.eval().to(device), tok


# ------------------------------------------------------------------------------------------------ data
def data_dir() -> Path:
    """$GOLINEAR_DATA (the bundle's data/ on an offline machine), else ../shared/data."""
    from golinear.models.training.data import resolve_data_dir
    return resolve_data_dir()


def lambada_docs() -> list[str]:
    return [json.loads(line)["text"] for line in open(data_dir() / "lambada_openai" / "lambada_test.jsonl")]


def encode_pair(tok, context: str, continuation: str):
    """lm-eval 0.4's HFLM._encode_pair: trailing spaces move to the continuation; the whole is tokenized."""
    n = len(context) - len(context.rstrip())
    if n:
        continuation, context = context[-n:] + continuation, context[:-n]
    whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    return ctx, whole[len(ctx):]


def lambada_pair(text: str):
    words = text.split(" ")
    return " ".join(words[:-1]), " " + words[-1]


def task_requests(tok) -> dict[str, list[int]]:
    """Per task, the token length of each document's longest request (context + continuation)."""
    def jl(path):
        opener = gzip.open if str(path).endswith(".gz") else open
        return [json.loads(line) for line in opener(path, "rt")]

    def longest(pairs):
        return max(sum(map(len, encode_pair(tok, c, x))) for c, x in pairs)

    out = {"lambada": [longest([lambada_pair(t)]) for t in lambada_docs()]}
    for task, file in (("arc_easy", "ARC-Easy-test.jsonl"), ("arc_challenge", "ARC-Challenge-test.jsonl")):
        out[task] = [longest([(f"Question: {d['question']}\nAnswer:", " " + c) for c in d["choices"]["text"]])
                     for d in jl(data_dir() / "arc" / file)]
    out["piqa"] = [longest([(f"Question: {d['goal']}\nAnswer:", " " + d[s]) for s in ("sol1", "sol2")])
                   for d in jl(data_dir() / "piqa" / "valid.jsonl")]
    from lm_eval.tasks.hellaswag.utils import preprocess
    hs = jl(next((data_dir() / "hellaswag").glob("*.jsonl.gz")))
    out["hellaswag"] = [longest([(preprocess(d["activity_label"] + ": " + d["ctx_a"] + " " + d["ctx_b"].capitalize()),
                                  " " + preprocess(e)) for e in d["endings"]]) for d in hs]
    wg = jl(data_dir() / "winogrande" / "dev.jsonl")
    out["winogrande"] = [longest([(d["sentence"][:d["sentence"].index("_")] + d[o],
                                   " " + d["sentence"][d["sentence"].index("_") + 1:].strip()) for o in ("option1", "option2")])
                         for d in wg]
    return out


# ------------------------------------------------------------------------------------------------ commands
def cmd_lengths(args):
    from golinear.models.backbones.backbone import load_tokenizer
    tok = load_tokenizer()
    for task, lens in task_requests(tok).items():
        lens = sorted(lens)
        q = lambda p: lens[min(len(lens) - 1, int(p * len(lens)))]  # noqa: E731
        print(json.dumps(dict(task=task, n=len(lens), p10=q(0.1), median=q(0.5), p90=q(0.9), max=lens[-1],
                              share_within_64=round(sum(n <= BUDGET for n in lens) / len(lens), 3),
                              mean_tokens_past_64=round(sum(max(0, n - BUDGET) for n in lens) / len(lens), 1))))


@torch.no_grad()
def cmd_lambada(args):
    docs = lambada_docs()
    idx = sorted(random.Random(args.seed).sample(range(len(docs)), args.n))
    for name in args.models:
        t0 = time.time()
        model, tok = build(name, args.device)
        pairs = [encode_pair(tok, *lambada_pair(docs[i])) for i in idx]
        hits, nll = [], []
        for b in range(0, len(pairs), args.batch):
            chunk = pairs[b:b + args.batch]
            seqs = [c + x for c, x in chunk]
            width = max(map(len, seqs))
            ids = torch.full((len(seqs), width), tok.eos_token_id)
            for r, s in enumerate(seqs):
                ids[r, :len(s)] = torch.tensor(s)  # right padding: causal, so real positions are unaffected
            logp = model(input_ids=ids.to(args.device)).logits.float().log_softmax(-1).cpu()
            for r, (c, x) in enumerate(chunk):
                rows = logp[r, len(c) - 1:len(c) + len(x) - 1]
                target = torch.tensor(x)
                hits.append(bool((rows.argmax(-1) == target).all()))
                nll.append(-float(rows.gather(1, target[:, None]).sum()))
        lens = [len(c) + len(x) for c, x in pairs]
        long = [h for h, n in zip(hits, lens) if n > BUDGET]
        print(json.dumps(dict(model=name, n=len(hits), acc=round(100 * sum(hits) / len(hits), 2),
                              target_nll=round(sum(nll) / len(nll), 3),
                              acc_longer_than_64=round(100 * sum(long) / max(1, len(long)), 2), n_longer=len(long),
                              seconds=round(time.time() - t0))), flush=True)


def domain_sequences(tok, count: int, seq_len: int) -> dict[str, torch.Tensor]:
    from golinear.models.training import data as data_mod
    eos = tok.eos_token_id

    def pack(texts):
        ids = []
        for t in texts:
            ids += tok(t, add_special_tokens=False)["input_ids"] + [eos]
            if len(ids) >= count * seq_len:
                break
        return torch.tensor(ids[:count * seq_len]).view(count, seq_len)

    held = data_mod.prepare_books(tok, None, train_tokens=1, heldout_tokens=(count + 1) * seq_len).heldout
    squad = json.load(open(data_dir() / "squad_v2" / "dev-v2.0.rebuilt.json"))["data"]
    wiki = [p["context"] for art in squad for p in art["paragraphs"]]
    essays = [p.read_text() for p in sorted((data_dir() / "paul_graham_essays").glob("*.txt"))]
    return {"books-heldout": data_mod.heldout_sequences(held, seq_len, count), "wikipedia": pack(wiki),
            "essays": pack(essays)}


@torch.no_grad()
def cmd_domain(args):
    from golinear.models.backbones.backbone import load_tokenizer
    edges = [0, 64, 128, 256, 512, args.seq_len]
    texts = domain_sequences(load_tokenizer(), args.sequences, args.seq_len)
    for name in args.models:
        model, _ = build(name, args.device)
        rec = {"model": name}
        for domain, seqs in texts.items():
            logp = model(input_ids=seqs.to(args.device)).logits.float().log_softmax(-1).cpu()
            loss = -logp[:, :-1].gather(2, seqs[:, 1:, None])[..., 0].mean(0)  # by target position 1..T-1
            rec[domain] = {"all": round(float(loss.mean()), 3), **{
                f"{a}-{b}": round(float(loss[max(a, 1) - 1:b - 1].mean()), 3) for a, b in zip(edges, edges[1:])}}
        print(json.dumps(rec), flush=True)


def cmd_conv_drift(args):
    """How far each checkpoint's short convs moved from their identity init, per q/k/v over all layers."""
    from safetensors.torch import load_file
    for name in args.checkpoints:
        tensors = load_file(str(CKPT / name / "new_params.safetensors"))
        rec = {"checkpoint": name}
        for part in ("q", "k", "v"):
            w = torch.stack([t.float() for n, t in tensors.items() if n.endswith(f".conv.{part}")])  # [L, C, W]
            eye = torch.zeros_like(w)
            eye[..., -1] = 1
            rec[part] = dict(rel_change=round(float((w - eye).norm() / eye.norm()), 3),
                             last_tap=round(float(w[..., -1].mean()), 3),
                             earlier_taps_abs=round(float(w[..., :-1].abs().mean()), 3))
        print(json.dumps(rec))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("lengths")
    s = sub.add_parser("lambada")
    s.add_argument("models", nargs="+")
    s.add_argument("--n", type=int, default=500)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--batch", type=int, default=25)
    s = sub.add_parser("conv-drift")
    s.add_argument("checkpoints", nargs="+")
    s = sub.add_parser("domain")
    s.add_argument("models", nargs="+")
    s.add_argument("--sequences", type=int, default=2)
    s.add_argument("--seq-len", type=int, default=1024)
    for s in sub.choices.values():
        s.add_argument("--device", default="cpu", help="cpu or cuda (fp32 either way)")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    {"lengths": cmd_lengths, "lambada": cmd_lambada, "domain": cmd_domain, "conv-drift": cmd_conv_drift}[args.cmd](args)


if __name__ == "__main__":
    main()
