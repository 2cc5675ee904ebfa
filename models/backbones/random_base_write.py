"""Write a random-weight backbone folder (models.backbones.random_base): config.json of a named configuration
(models.backbones.configs), a tokenizer and the seed, no weights. `python -m golinear.models.backbones.random_base_write OUT NAME`."""
from __future__ import annotations

import json
from pathlib import Path

from golinear.models.backbones.random_base import MARKER


def write_random_base(out, name: str, seed: int = 0, overrides: dict | None = None,
                      tokenizer_from: str = "smollm2-135m") -> Path:
    """Write the folder for named configuration `name` (models.backbones.backbone.NAMED_CONFIGS) plus `overrides`."""
    import transformers
    from golinear.models.backbones.backbone import load_tokenizer
    from golinear.models.backbones.configs import NAMED_CONFIGS, named_config
    named_config(name)  # an unknown name: the allowed ones in the message
    kw = {**NAMED_CONFIGS[name], **(overrides or {})}
    config = transformers.AutoConfig.for_model(kw.pop("model_type"), **kw)
    tok = load_tokenizer(tokenizer_from)
    if len(tok) > config.vocab_size:
        raise ValueError(f"tokenizer {tokenizer_from!r} has {len(tok)} ids, more than vocab_size {config.vocab_size}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    tok.save_pretrained(out)
    spec = {"named_config": name, "overrides": overrides or {}, "seed": seed, "tokenizer_from": tokenizer_from,
            "init": "per parameter: generator seeded by seed*1000003+crc32(name) on the target device; "
                    "matrices N(0, initializer_range), norm weights 1, other vectors 0"}
    (out / MARKER).write_text(json.dumps(spec, indent=2) + "\n")
    return out


def main(argv=None) -> int:
    """python -m golinear.models.backbones.random_base_write OUT NAME [--seed S] [--tokenizer-from T] [--set key=value ...]"""
    import argparse
    p = argparse.ArgumentParser(prog="python -m golinear.models.backbones.random_base_write", description=main.__doc__)
    p.add_argument("out")
    p.add_argument("name", help="a golinear.models.backbones.backbone.NAMED_CONFIGS name (llama-3.1-8b, qwen3-32b, ...)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer-from", default="smollm2-135m", help="backbone or folder whose tokenizer is copied")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides (int values)")
    args = p.parse_args(argv)
    overrides = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    print(write_random_base(args.out, args.name, args.seed, overrides, args.tokenizer_from))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
