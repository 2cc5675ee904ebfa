"""A checkpoint's model card: README.md in its folder, with the Hugging Face YAML header, read by people and the Hub.

Why: a folder of new parameters says what it is only to golinear's loader; the card says it in words: the base
model, the recipe, the training data, tokens and seeds, the held-out loss, and the scores measured for exactly
these weights (with their n). `golinear train` writes it without scores; `golinear cards` rewrites it from the
result store. Everything comes from config.json / train_config.json and the scores given; no clock, so the card
changes only when they do. README.md is not one of the files a checkpoint's identity hashes.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from golinear.models.util.atomic import atomic_write

CARD = "README.md"
HUB_IDS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}  # golinear's embedded backbone, as the Hub names it
DATASETS = {"books": "mlschmitt/classic-books-markdown"}  # the books corpus (corpus_classic_books/) on the Hub
MECHANISM_TAGS = {"gla": "gated-linear-attention", "kgla": "gated-linear-attention", "gdn": "gated-deltanet",
                  "hedgehog": "hedgehog", "none": "sliding-window-attention"}


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def tags(lin: dict) -> list[str]:
    out = ["golinear", "linearized-transformer", "linear-attention"]
    out.append(MECHANISM_TAGS.get(lin.get("mechanism"), str(lin.get("mechanism"))))
    for flag, tag in (("window", "sliding-window-attention"), ("sinks", "attention-sinks"),
                      ("short_conv", "short-convolution"), ("lora", "lora"), ("retain", "retention-slots"),
                      ("out_norm", "output-norm")):
        if lin.get(flag) and tag not in out:
            out.append(tag)
    if lin.get("full_layers") or lin.get("keep_full"):
        out.append("hybrid")
    return out


def recipe_words(lin: dict) -> str:
    words = [str(lin.get("mechanism"))]
    if lin.get("window"):
        words.append(f"window {lin['window']}")
    if lin.get("sinks"):
        words.append(f"{lin['sinks']} sinks")
    if lin.get("retain"):
        words.append(f"{lin['retain']} retention slots ({lin.get('retain_score')})")
    if lin.get("short_conv"):
        words.append("short conv")
    if lin.get("lora"):
        words.append(f"LoRA r{lin.get('lora_rank')}")
    if lin.get("out_norm"):
        words.append("output norm")
    if lin.get("full_layers") or lin.get("keep_full"):
        words.append(f"full-attention layers {lin.get('full_layers') or lin.get('keep_full')} ({lin.get('select')})")
    return ", ".join(words)


def _num(v, digits=3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,}" if isinstance(v, int) else f"{v:.{digits}f}"


def _md(text) -> str:
    """A name as Markdown text: no tag, link, emphasis, heading or table cell can start inside it."""
    import html
    import re
    text = html.escape(" ".join(str(text).splitlines()), quote=False)
    return re.sub(r"([\\`*_\[\]|~]|^[#+\-=>])", r"\\\1", text)


def _cell(text) -> str:
    """A table cell's text: a `|` cannot end the cell, a `<` cannot open a tag."""
    import html
    return html.escape(text, quote=False).replace("|", "\\|")


def _code(text) -> str:
    """A name as one Markdown code span, whatever backticks it holds (the fence is longer than any run in it)."""
    import re
    text = " ".join(str(text).splitlines())
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}" if text.startswith("`") or text.endswith("`") else f"{fence}{text}{fence}"


def _yaml_list(name: str, items: list[str]) -> list[str]:
    return [f"{name}:"] + [f"- {json.dumps(i)}" for i in items]


def score_lines(scores: list[dict]) -> list[str]:
    """scores: dicts with task, metric, value (0-1 accuracies or a perplexity), stderr, n, subset."""
    if not scores:
        return ["No scores for these weights in the result store yet: evaluate them with `golinear run` and "
                "refresh this card with `golinear cards`."]
    lines = ["| task | metric | value | stderr | n | setting |", "|---|---|---:|---:|---:|---|"]
    for s in sorted(scores, key=lambda s: (s["task"], s["metric"], s.get("setting", ""))):
        pct = "perplexity" not in s["metric"]
        scale = 100.0 if s["metric"].startswith("acc") else 1.0  # accuracies are 0-1; RULER's scores already 0-100
        stderr = "" if s.get("stderr") is None else f"{s['stderr'] * scale:.2f}"
        lines.append(f"| {s['task']} | {s['metric']}{' (%)' if pct else ''} | {s['value'] * scale:.2f} | {stderr} | "
                     f"{s.get('n', '')} | {s.get('setting', '')} |")
    return lines


def card_text(folder: str | Path, scores: list[dict] | None = None, store_name: str = "the result store",
              shown: str | None = None) -> str:
    """The card; `shown` is the folder as its load line names it (default: as given)."""
    folder = Path(folder)
    shown = shown or str(folder)
    config, record = _read(folder / "config.json"), _read(folder / "train_config.json")
    if not config:
        raise FileNotFoundError(f"{str(folder)!r} is not a checkpoint folder (no config.json)")
    training = config.get("training") or {}
    lin, base = config.get("linearize") or {}, config.get("base", "")
    train, summary = (record.get(k) or training.get(k) or {} for k in ("train", "summary"))
    results, seeds = (record.get(k) or training.get(k) or {} for k in ("results", "seeds"))
    data = record.get("data") or {}
    dataset = DATASETS.get(data.get("source")) or data.get("dataset")
    header = ["---", f"base_model: {json.dumps(HUB_IDS.get(base, base))}", "library_name: golinear",
              *_yaml_list("tags", tags(lin))] + (_yaml_list("datasets", [dataset]) if dataset else []) + ["---"]
    name = folder.name
    lines = header + [
        f"# {_md(name)}", "",
        f"{HUB_IDS.get(base, base)} linearized post hoc with golinear: {recipe_words(lin)}. The folder holds only "
        f"the {_num(config.get('new_parameters'))} new parameters (the backbone stays frozen and is checked by its "
        f"fingerprint `{config.get('base_fingerprint')}` when loaded).", "",
        "```python", "from golinear.models.load import load_model",
        f"model, tokenizer, info = load_model(checkpoint={json.dumps(shown)})", "```",
        "or evaluated with lm-eval: "
        + _code(f"golinear lm-eval --model linearized --model_args checkpoint={shown} --tasks golinear_piqa") + ".", "",
        "## Recipe", "", "| option | value |", "|---|---|",
        *[f"| {k} | {_cell(json.dumps(v))} |" for k, v in sorted(lin.items())],
        *[f"| train.{k} | {json.dumps(train[k])} |" for k in ("steps", "seq_len", "batch_size", "lr", "lora_lr",
                                                             "warmup_steps", "min_lr_ratio", "weight_decay",
                                                             "grad_clip", "bf16") if k in train],
        "", "## Training", "",
        f"- tokens trained: {_num(summary.get('tokens'))} in {_num(summary.get('step'))} steps"
        + (f" ({summary['budget_note']})" if summary.get("budget_note") else ""),
        f"- seeds: initialisation {seeds.get('init', train.get('seed'))}, data order "
        f"{seeds.get('data_order', train.get('seed'))}; held-out split: {seeds.get('heldout', '-')}",
        f"- data: {data.get('source', '-')}" + (f" ({dataset}, {len(data.get('files', []))} files, held-out rule "
                                                f"{data.get('heldout_rule')})" if dataset else ""),
    ]
    lines += ["", "## Held-out loss", "",
              f"Cross-entropy on {_num(results.get('heldout_tokens_scored'))} held-out tokens "
              f"({_num(results.get('heldout_sequences'))} sequences, never trained on):", "",
              "| full attention | linearized at init | linearized, trained |", "|---:|---:|---:|",
              f"| {_num(results.get('heldout_loss_full_attention'))} | {_num(results.get('heldout_loss_init'))} | "
              f"{_num(results.get('heldout_loss_trained'))} |", "",
              "## Scores", "", f"Measured for exactly these weights (from {store_name}); n is the number of "
              "examples scored, a setting names a subset or the task's generation options.", "",
              *score_lines(scores or [])]
    return "\n".join(lines) + "\n"


def write_card(folder: str | Path, scores: list[dict] | None = None, store_name: str = "the result store",
               shown: str | None = None) -> bool:
    """Write README.md in the checkpoint folder; True when its content changed."""
    path, text = Path(folder) / CARD, card_text(folder, scores, store_name, shown)
    if path.is_file() and path.read_text() == text:
        return False
    atomic_write(path, text.encode())
    return True
