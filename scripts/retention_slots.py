"""Where a needle's tokens end up after the prompt of a model with retention slots: in the window,
in a retention slot, or folded into the GDN state, per linear layer and KV head.

S-NIAH asks the model to copy the needle's value (a number or a UUID) from a 4K prompt. With slots, a value token
that left the window is either held in a slot, where softmax can still read it exactly, or folded into the state.
This prefills RULER's own samples through `RetentionDecoder` (the path the evaluation takes) and reads each
layer's slot positions (`RetentionState.ret_pos`) after the prompt. It reports, per task, the share of
(layer, KV head) pairs holding every value token in a slot, and the share holding at least one, over the samples
whose needle has left the window; a needle still in the window is counted apart.

    .venv/bin/python scripts/retention_slots.py --checkpoint checkpoints/smollm2-135m/gdn-w252-s8-r252-pr-sc \
        --tasks S-NIAH-1,S-NIAH-2,S-NIAH-3 --n 8 --data-dir ../shared/data
    .venv/bin/python scripts/retention_slots.py --checkpoint checkpoints/smollm2-135m/gdn-w504-s8-sc \
        --window 252 --retain 252 --score delta_error ...   # slots added training-free, the other score
    ... --window 252 --retain 252 --scorer checkpoints/smollm2-135m/scorers/value.safetensors   # a fitted scorer
    .venv/bin/python scripts/retention_slots.py ... --span 3   # probe: arrival scores max-pooled over +-3 tokens

`--span W` is a probe of a score the op does not have (a needle is a run of tokens, and `proj_residual` judges each
token alone): it max-pools the arrival scores over the W tokens either side before the prefill's slot decisions,
by replacing `models.retention.prefill.entry_scores` in this process. Only the prefill decides here, so the
census is exact for that rule; decoding with it is not built.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from golinear.models.load import load_model  # noqa: E402
from golinear.models.retention.generate import RetentionDecoder  # noqa: E402
from golinear.models.spec import RETAIN_SCORES  # noqa: E402
from golinear.tasks.ruler.api import EVALUATION_SEED, TUNING_SEED, build_samples, check_tuning_seed, resolve_task  # noqa: E402


def pool_scores(width: int) -> None:
    """Probe (--span): every arrival score becomes the max over the `width` tokens either side of it."""
    import golinear.models.retention.prefill as prefill
    base = prefill.entry_scores

    def pooled(k, score, scores=None):
        s = base(k, score, scores)
        if s is None:  # delta_error: scored at window exit, not pooled
            raise ValueError("--span pools arrival scores (proj_residual, given), not delta_error")
        x = torch.nn.functional.max_pool1d(s.transpose(1, 2).float(), 2 * width + 1, stride=1, padding=width)
        return x.to(s.dtype).transpose(1, 2)
    prefill.entry_scores = pooled


def value_tokens(tok, prompt: str, needle: str, value: str) -> tuple[list[int], list[int]]:
    """(token ids of the prompt, positions of the tokens that overlap the needle's value in it)."""
    start = prompt.find(needle)
    if start < 0:
        raise ValueError(f"needle {needle[:60]!r} not found in the prompt")
    start += needle.find(value)
    end = start + len(value)
    enc = tok(prompt, return_offsets_mapping=True)
    where = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < end and b > start]
    return enc["input_ids"], where


def slot_census(decoder: RetentionDecoder, where: list[int]) -> list[tuple[int, int]]:
    """For each linear layer and KV head: (value tokens held in a slot, value tokens in the window)."""
    out = []
    for state in decoder.states:
        rows = getattr(state, "retention", None)
        if rows is None:
            continue
        ret = rows.state.ret_pos[0]  # [Hkv, r]
        win = set(rows.win_pos[0].tolist())
        for h in range(ret.shape[0]):
            held = set(ret[h].tolist())
            out.append((sum(p in held for p in where), sum(p in win for p in where)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="a checkpoint folder with retention slots (retain > 0)")
    p.add_argument("--window", type=int, help="cache option: window (with --retain: slots added training-free)")
    p.add_argument("--retain", type=int, help="cache option: retention slots per KV head")
    p.add_argument("--score", choices=RETAIN_SCORES,
                   help="cache option: the slots' score (default: the checkpoint's; proj_residual for added slots)")
    p.add_argument("--tasks", default="S-NIAH-1,S-NIAH-2,S-NIAH-3", help="RULER tasks with one needle")
    p.add_argument("--n", type=int, default=8, help="samples per task (RULER's first n at this seed)")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--seed", type=int, default=TUNING_SEED,
                   help=f"prompt seed (default {TUNING_SEED}; the evaluation prompts' {EVALUATION_SEED} is refused)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--span", type=int, default=0, help="probe: max-pool the arrival scores over +-SPAN tokens")
    p.add_argument("--scorer", help="cache option: a scorer file, with --score fitted (the default with it)")
    a = p.parse_args(argv)
    if a.span < 0:
        p.error(f"--span must be >= 0, got {a.span}")
    try:
        check_tuning_seed(a.seed, "--seed")
    except ValueError as e:
        p.error(str(e))
    if a.span:
        pool_scores(a.span)
    cache = {k: v for k, v in (("window", a.window), ("retain", a.retain), ("retain_score", a.score),
                                ("scorer", a.scorer)) if v is not None}
    if (cache.get("retain") or a.scorer) and not a.score:
        cache["retain_score"] = "fitted" if a.scorer else "proj_residual"
    model, tok, info = load_model(checkpoint=a.checkpoint, device=a.device, **cache)
    lin = info["linearize"]
    print(f"{Path(a.checkpoint).name} {cache or ''}: sinks {lin.get('sinks')} window {lin.get('window')} "
          f"retain {lin.get('retain')} ({lin.get('retain_score')})" + (f", max-pooled over +-{a.span}" if a.span else "")
          + (f", scores from {Path(a.scorer).name}" if a.scorer else ""))
    decoder = RetentionDecoder(model, use_graph=False)
    print("| task | samples | needle in the window | needle outside: (layer, head) pairs with every value token "
          "in a slot | with at least one | value tokens |")
    print("|---|---:|---:|---:|---:|---:|")
    for task in a.tasks.split(","):
        spec = resolve_task(task)
        rows = build_samples(spec.name, tok, a.length, a.n, a.seed, a.data_dir)
        in_window, full, some, pairs, n_tokens = 0, 0, 0, 0, []
        for row in rows:
            ids, where = value_tokens(tok, row["prompt"], row["needles"][0], row["outputs"][0])
            decoder.prefill(torch.tensor([ids], device=a.device))
            census = slot_census(decoder, where)
            n_tokens.append(len(where))
            if all(w == len(where) for _, w in census):
                in_window += 1
                continue
            pairs += len(census)
            full += sum(h == len(where) for h, _ in census)
            some += sum(h > 0 for h, _ in census)
        share = (lambda x: f"{100 * x / pairs:.1f} %") if pairs else (lambda x: "-")
        print(f"| {spec.display} | {len(rows)} | {in_window} | {share(full)} | {share(some)} | "
              f"{min(n_tokens)}-{max(n_tokens)} |", flush=True)


if __name__ == "__main__":
    main()
