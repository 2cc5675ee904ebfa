"""Fit the third retention score (`retain_score=fitted`, models.retention.scorer) on the frozen backbone, and probe it.

A retention slot is worth a token a later query will need. This fits, per layer and KV head, a ridge regression
from a key to a per-token target measured on the frozen backbone (full attention, eager) over passages of the books
corpus (`--target`): `far`, log(mean attention weight the key receives from the queries more than `--gap` tokens
later); `retrieval`, log(mean weight from the last tokens of a question about a sentence inserted in the passage,
`retrieval_texts`); `value`, 1 on the tokens of the inserted sentences' values, 0 elsewhere. The features are the
32 magnitudes of the key's RoPE pairs (i, i + 32), which RoPE leaves unchanged, so the fit on the backbone's keys
before RoPE applies to the op's keys after it. The file `fit` writes is a scorer file (models.retention.scorer):
a model option (`retain_score=fitted,scorer=FILE`). Its metadata records what it was fitted to: the inserted values'
type and format and the seed they were drawn with (`--seed`, default 0; the evaluation prompts' seed 42 is refused,
as `rank`'s and scripts/retention_slots.py's prompts default to seed 1): bench.boards.fitted_format reads it, and a row
tested on the value type its scorer was fitted to says so in its label.

    .venv/bin/python scripts/retention_scorer_probe.py fit --target value --passages 24 \
        --out checkpoints/smollm2-135m/scorers/value.safetensors --data-dir ../shared/data   # the committed one
    .venv/bin/python scripts/retention_scorer_probe.py rank --scorer <file> --task S-NIAH-2 --n 2 \
        --data-dir ../shared/data       # what the scorer ranks first, and where the needle's tokens rank
    .venv/bin/python scripts/retention_slots.py --checkpoint checkpoints/smollm2-135m/gdn-w504-s8-sc \
        --window 252 --retain 252 --scorer <file> ...     # the slot census with these scores
    .venv/bin/python scripts/retention_scorer_probe.py random --model llama-3.1-8b --out /tmp/s8b.safetensors
        # random weights of a named configuration's shape: for `golinear latency` (the cost), never for results
"""
from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from golinear.models.backbones.backbone import fingerprint, load_backbone  # noqa: E402
from golinear.models.training.data import book_files, read_jsonl_docs  # noqa: E402
from golinear.models.retention.scorer import arrival_scores, load_scorer, pair_magnitudes, save_scorer  # noqa: E402
from golinear.tasks.ruler.api import EVALUATION_SEED, TUNING_SEED, check_tuning_seed  # noqa: E402


def far_mass(weights: torch.Tensor, group: int, gap: int, min_queries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """weights [H, T, T] (query, key) -> (mean weight each key gets from queries > gap tokens later, averaged over
    the query heads of each KV head: [Hkv, T]; mask [T] of keys with at least min_queries such queries)."""
    H, T, _ = weights.shape
    t = torch.arange(T)
    far = (t.view(T, 1) > t.view(1, T) + gap).float()  # [query, key]
    count = far.sum(0)
    mean = (weights.float() * far).sum(1) / count.clamp(min=1)  # [H, T]
    return mean.view(H // group, group, T).mean(1), count >= min_queries


QUESTION_QUERIES, QUESTION_TAIL = 6, 32  # the question's last tokens that read; the prompt's tail left out of the keys


def question_mass(weights: torch.Tensor, group: int, queries: int, tail: int) -> tuple[torch.Tensor, torch.Tensor]:
    """weights [H, T, T] -> (mean weight each key gets from the last `queries` tokens, the question's end, averaged
    over the query heads of each KV head: [Hkv, T]; mask [T] of the keys before the prompt's last `tail` tokens)."""
    H, T, _ = weights.shape
    mean = weights[:, T - queries:, :].float().mean(1)
    ok = torch.arange(T) < T - tail
    return mean.view(H // group, group, T).mean(1), ok


WORDS = ("harbor violet lantern copper meadow falcon granite velvet orchard thistle ember quarry saddle willow "
         "cobalt pilgrim marble juniper beacon hollow tundra saffron anchor bramble").split()
ADJ = "red blue green silver golden iron wooden glass narrow tall old hidden".split()
NOUN = "door tower chest garden bridge river carriage window gate lamp".split()


VALUES = ("words", "numbers")  # what the inserted sentences' values are: WORDS, or 7-digit numbers
VALUE_FORMATS = {"words": "one of 24 English words (retention_scorer_probe.WORDS)",
                 "numbers": "7-digit numbers, randrange(10**6, 10**7)"}  # recorded in the scorer file's metadata


def retrieval_texts(passages: list[str], seed: int, values: str = VALUES[0]) -> list[str]:
    """Each passage with two sentences 'The secret word for the <adj> <noun> is <value>.' at random sentence
    boundaries and, at the end, the question for one of them: retrieval on the books, apart from RULER's data and
    templates; the values are words or 7-digit numbers (`values`)."""
    if values not in VALUES:
        raise ValueError(f"values must be one of {list(VALUES)}, got {values!r}")
    rng = random.Random(seed)
    pick = (lambda: rng.choice(WORDS)) if values == "words" else (lambda: str(rng.randrange(10 ** 6, 10 ** 7)))
    out = []
    for text in passages:
        parts = text.split(". ")
        keys = rng.sample([(a, n) for a in ADJ for n in NOUN], 2)
        for (a, n), at in zip(keys, sorted(rng.sample(range(1, len(parts)), 2), reverse=True)):
            parts.insert(at, f"The secret word for the {a} {n} is {pick()}")
        a, n = rng.choice(keys)
        out.append(". ".join(parts) + f"\nWhat is the secret word for the {a} {n}? The secret word for the {a} {n} is")
    return out


def value_labels(text: str, offsets: list[tuple[int, int]]) -> torch.Tensor:
    """[T] 1.0 on the tokens of the inserted sentences' values (retrieval_texts), 0.0 elsewhere."""
    spans = [m.span(1) for m in re.finditer(r"The secret word for the \w+ \w+ is (\w+)", text)]
    return torch.tensor([float(any(a < e and b > s for s, e in spans)) for a, b in offsets])


def fit_record(target: str, values: str, seed: int) -> dict:
    """What a fit was fitted to, for the scorer file's metadata (bench.boards.fitted_format reads it): the inserted values'
    type and format and the seed they were drawn with; no value type for the attention-mass target `far`."""
    if target == "far":
        return {"value_type": None, "value_format": None, "seed": None}
    return {"value_type": values, "value_format": VALUE_FORMATS[values], "seed": seed}


def collect(model, tok, texts: list[str], seq_len: int, target, sinks: int):
    """Per layer: (features [N, Hkv, P], targets [N, Hkv]) over the passages, from hooks on k_proj and attention;
    target(weights [H, T, T], group, labels [T]) -> (per-key target [Hkv, T], mask [T])."""
    cfg = model.config
    hkv, group = cfg.num_key_value_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    dim = cfg.hidden_size // cfg.num_attention_heads
    layers = model.model.layers
    feats, targets = [[] for _ in layers], [[] for _ in layers]
    keys, labels = {}, [None]

    def on_k(i):
        return lambda mod, inp, out: keys.__setitem__(i, out[0].view(-1, hkv, dim))

    def on_attn(i):
        def hook(mod, inp, out):
            y, ok = target(out[1][0], group, labels[0])
            ok[:sinks] = False
            feats[i].append(pair_magnitudes(keys[i][ok]))
            targets[i].append(y[:, ok].T)
        return hook
    handles = [layer.self_attn.k_proj.register_forward_hook(on_k(i)) for i, layer in enumerate(layers)]
    handles += [layer.self_attn.register_forward_hook(on_attn(i)) for i, layer in enumerate(layers)]
    try:
        for text in texts:
            enc = tok(text, return_offsets_mapping=True)
            ids = torch.tensor([enc["input_ids"][-seq_len:]])  # the end kept: a question sits there
            labels[0] = value_labels(text, enc["offset_mapping"][-seq_len:])
            with torch.no_grad():
                model(ids, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    return [torch.cat(f) for f in feats], [torch.cat(t) for t in targets]


def ridge(x: torch.Tensor, y: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Least squares with an L2 penalty on standardised features: (weights [P], bias) in the raw feature scale."""
    mu, sd = x.mean(0), x.std(0).clamp(min=1e-6)
    z = (x - mu) / sd
    a = z.T @ z + lam * len(z) * torch.eye(z.shape[1], dtype=z.dtype)
    w = torch.linalg.solve(a, z.T @ (y - y.mean()))
    return w / sd, y.mean() - (mu / sd) @ w


def r2(x, y, w, b) -> float:
    return float(1 - ((x @ w + b - y) ** 2).mean() / y.var(unbiased=False))


def fit(argv=None):
    p = argparse.ArgumentParser(prog="retention_scorer_probe.py fit", description=fit.__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--passages", type=int, default=6, help="books passages fitted on (one more is held out)")
    p.add_argument("--seq-len", type=int, default=1536)
    p.add_argument("--gap", type=int, default=252, help="only queries more than GAP tokens later count")
    p.add_argument("--min-queries", type=int, default=64)
    p.add_argument("--sinks", type=int, default=8, help="leading tokens left out (the sinks keep them anyway)")
    p.add_argument("--lam", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the inserted sentences' keys, values and places (any but the evaluation prompts' 42)")
    p.add_argument("--values", choices=VALUES, default=VALUES[0],
                   help="retrieval/value targets: the inserted sentences' values (default words)")
    p.add_argument("--target", choices=("far", "retrieval", "value"), default="far",
                   help="far: log mass from queries beyond --gap; retrieval: log mass from the end of a question "
                        "about a sentence inserted in the passage (retrieval_texts); value: 1 on the inserted "
                        "values' tokens, 0 elsewhere")
    a = p.parse_args(argv)
    if a.seq_len <= a.gap + a.min_queries:
        p.error(f"--seq-len {a.seq_len} must exceed --gap + --min-queries ({a.gap + a.min_queries})")
    try:
        check_tuning_seed(a.seed, "--seed")
    except ValueError as e:
        p.error(str(e))
    model, tok = load_backbone(attn_implementation="eager")
    texts = []
    for _, text in read_jsonl_docs(book_files(a.data_dir)):  # passages from the middle of the first books
        ids = tok(text[:200_000]).input_ids
        if len(ids) >= 3 * a.seq_len:
            texts.append(tok.decode(ids[len(ids) // 2:len(ids) // 2 + a.seq_len]))
        if len(texts) == a.passages + 1:
            break

    def target(w, group, labels):
        if a.target == "far":
            mass, ok = far_mass(w, group, a.gap, a.min_queries)
        elif a.target == "retrieval":
            mass, ok = question_mass(w, group, QUESTION_QUERIES, QUESTION_TAIL)
        else:
            return labels.expand(w.shape[0] // group, -1), torch.arange(w.shape[-1]) < w.shape[-1] - QUESTION_TAIL
        return torch.log(mass + 1e-7), ok
    if a.target != "far":
        texts = retrieval_texts(texts, seed=a.seed, values=a.values)
    fx, fy = collect(model, tok, texts[:-1], a.seq_len, target, a.sinks)
    hx, hy = collect(model, tok, texts[-1:], a.seq_len, target, a.sinks)
    L, hkv = len(fx), fx[0].shape[1]
    W, B = torch.zeros(L, hkv, fx[0].shape[2]), torch.zeros(L, hkv)
    fits = []
    for i in range(L):
        for h in range(hkv):
            W[i, h], B[i, h] = ridge(fx[i][:, h].double(), fy[i][:, h].double(), a.lam)
            fits.append(r2(hx[i][:, h].double(), hy[i][:, h].double(), W[i, h].double(), B[i, h].double()))
    q = torch.tensor(fits).quantile(torch.tensor([0.1, 0.5, 0.9]))
    save_scorer(a.out, W, B, {"fit": vars(a), "base": "smollm2-135m", "base_fingerprint": fingerprint(model),
                              "keys": len(fy[0]), "heldout_r2_p10_p50_p90": [round(float(x), 4) for x in q],
                              **fit_record(a.target, a.values, a.seed)})
    print(f"fitted {L} layers x {hkv} KV heads on {len(fy[0])} keys; held-out R^2 "
          f"p10 / median / p90 {q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f} -> {a.out}")


def rank(argv=None):
    """Per prompt of a RULER task, on the frozen backbone's keys: the tokens most often among the `--top` best
    scored of a (layer, KV head), and the share of the prompt's tokens scored above the needle's value tokens."""
    from collections import Counter

    from retention_slots import value_tokens
    from golinear.tasks.ruler.api import build_samples, resolve_task
    p = argparse.ArgumentParser(prog="retention_scorer_probe.py rank", description=rank.__doc__)
    p.add_argument("--scorer", required=True)
    p.add_argument("--task", default="S-NIAH-2")
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--sinks", type=int, default=8, help="leading tokens left out (the sinks keep them anyway)")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--seed", type=int, default=TUNING_SEED,
                   help=f"prompt seed (default {TUNING_SEED}; the evaluation prompts' {EVALUATION_SEED} is refused)")
    p.add_argument("--data-dir", default=None)
    a = p.parse_args(argv)
    try:
        check_tuning_seed(a.seed, "--seed")
    except ValueError as e:
        p.error(str(e))
    (weight, bias, _), (model, tok) = load_scorer(a.scorer), load_backbone()
    cfg = model.config
    hkv, dim = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    keys = {}
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.k_proj.register_forward_hook(
            lambda mod, inp, out, i=i: keys.__setitem__(i, out[0].view(-1, hkv, dim)))
    for row in build_samples(resolve_task(a.task).name, tok, a.length, a.n, a.seed, a.data_dir):
        ids, where = value_tokens(tok, row["prompt"], row["needles"][0], row["outputs"][0])
        with torch.no_grad():
            model(torch.tensor([ids]))
        top, above = Counter(), []
        for i in range(len(keys)):
            sc = arrival_scores(keys[i], weight[i], bias[i])[a.sinks:]  # [T - sinks, Hkv]
            needle = arrival_scores(keys[i][where], weight[i], bias[i])  # [n_value, Hkv]
            for h in range(hkv):
                top.update(tok.decode([ids[a.sinks + j]]) for j in sc[:, h].topk(a.top).indices.tolist())
                above.append(float((sc[:, h].unsqueeze(0) > needle[:, h].unsqueeze(1)).float().mean()))
        print(f"{a.task} prompt of {len(ids)} tokens, value {row['outputs'][0]!r}: share of tokens scored above the "
              f"value's {sum(above) / len(above):.3f}; most often in a top {a.top}: {top.most_common(12)}")


def random_scorer(argv=None):
    """A scorer file of random weights in a named configuration's shape (random-weight backbones have nothing to fit
    on): what `golinear latency` needs to time retain_score=fitted. Its metadata says it is random."""
    from golinear.models.backbones.backbone import named_config
    p = argparse.ArgumentParser(prog="retention_scorer_probe.py random", description=random_scorer.__doc__)
    p.add_argument("--model", required=True, help="a named configuration (golinear.models.backbones.backbone.NAMED_CONFIGS)")
    p.add_argument("--layers", type=int, default=None, help="the first N layers only (golinear latency --layers)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    cfg = named_config(a.model)
    layers = a.layers or cfg.num_hidden_layers
    if not 1 <= layers <= cfg.num_hidden_layers:
        p.error(f"--layers {layers}: {a.model} has {cfg.num_hidden_layers} layers (allowed 1..{cfg.num_hidden_layers})")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator().manual_seed(a.seed)
    shape = (layers, cfg.num_key_value_heads, head_dim // 2)
    save_scorer(a.out, torch.randn(*shape, generator=g), torch.randn(*shape[:2], generator=g),
                {"fit": "random weights: for cost measurements only", "model": a.model, "seed": a.seed})
    print(f"random scorer {list(shape)} for {a.model} -> {a.out}")


if __name__ == "__main__":
    commands = {"fit": fit, "rank": rank, "random": random_scorer}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit("usage: retention_scorer_probe.py fit|rank|random ... (see the docstring)")
    commands[sys.argv[1]](sys.argv[2:])
