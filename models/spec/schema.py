"""One schema for a model configuration: `ModelSpec` (backbone + checkpoint + linearize options + dtype).

Every front end converts through it: the CLI/store string (`from_string`, `to_string`, `store_key`), lm-eval
model_args (`from_model_args`, `to_model_args`), `golinear train` flags (`from_train_args`) and a checkpoint's
config.json (`from_checkpoint_config`, `to_checkpoint_config`). Each value is checked once, in `parse_value`,
against one allowed set, with one message. models.attention.linearize.LinearizeConfig (the model side) takes its
values from here too. The allowed values and their checks are in models.spec_values, a checkpoint folder's files
in models.spec_files (both re-exported here); the weight-free checks of whole configurations in models.spec_checks.
This module imports no torch at import time (the CLI builds its parser from it).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

from golinear.models.checkpoint_paths import candidates, find_checkpoint
from golinear.models.spec_files import (CONFIG, CONTENT_HASH_LIMIT, SCORER, WEIGHTS, checkpoint_identity,  # noqa: F401
                               check_checkpoint_files, file_identity, local_files_identity,
                               read_checkpoint_config, read_layer_scores)
from golinear.models.spec_values import (CACHE_KEYS, CONV_ON, DEFAULT_BASE, DTYPES, FALSE, LINEAR_KEYS,  # noqa: F401
                                LINEARIZE_KEYS, MECHANISMS, MINIMUM, OUT_NORM_MECHANISMS, PARSERS, PRESETS,
                                PRESS_KEYS, RETAIN_SCORES, RETENTION_KEYS, SELECTIONS, STRING_KEYS, TRUE,
                                check_conv_on, check_press_options,
                                check_out_norm, check_retention, check_window_only, parse_full_layers, parse_value,
                                with_cache_options, without_unused_retention)


@dataclass(frozen=True)
class ModelSpec:
    """A model configuration. Values are normalised and checked on construction (parse_value), so a
    ModelSpec built from any front end holds typed, allowed values; full_layers/layer_scores are tuples."""
    base: str | None = None        # None: the embedded default, or a checkpoint's own base
    checkpoint: str | None = None  # absolute path of a checkpoint folder
    mechanism: str | None = None   # None: full attention (or the checkpoint's own linearization)
    window: int = 0
    sinks: int = 0
    short_conv: bool = False
    conv_size: int = 4
    lora: bool = False
    lora_rank: int = 8
    lora_alpha: int = 16
    full_layers: tuple[int, ...] | None = None
    keep_full: float = 0.0
    select: str = "uniform"
    layer_scores: tuple[float, ...] | None = None
    gate_rank: int = 16
    feature_dim: int = 64
    retain: int = 0                # retention slots per KV head (GDN with a window; models.retention.ops)
    retain_score: str = RETAIN_SCORES[0]
    out_norm: bool = False         # output RMSNorm after the op (gla, kgla, gdn; models.attention.mechanisms.OutputNorm)
    conv_on: str = CONV_ON[0]      # the path(s) the short conv feeds: both | linear
    scorer: str | None = None      # absolute path of a scorer file (retain_score=fitted; models.retention.scorer)
    press: str | None = None       # a kvpress press on the full-attention model (models.kv_compression)
    kv_budget: int = 0             # the press's cache budget: KV entries kept per layer and KV head
    question_aware: bool = False   # the press also sees the question (default: the context alone is compressed)
    prefill_chunk: int = 0         # >0: prefill in chunks of this many tokens, compressing after each
    dtype: str = "float32"

    def __post_init__(self):
        for key in PARSERS:
            object.__setattr__(self, key, parse_value(key, getattr(self, key)))
        if self.checkpoint is None:  # (a checkpoint's own options are checked when it is linearized)
            check_retention(self.mechanism, self.window, self.retain, self.retain_score, self.scorer)
            check_out_norm(self.mechanism, self.out_norm, self.retain)
            check_conv_on(self.mechanism, self.short_conv, self.conv_on, self.retain)
        check_press_options(self)

    # ------------------------------------------------------------------ the CLI/store string
    @classmethod
    def from_string(cls, text: str, **extra):
        """A preset, key=value pairs, a preset then overrides (`gdn-default,window=120`) or a checkpoint folder."""
        text = text.strip()
        if not text:
            raise ValueError("empty model spec")
        if Path(text).expanduser().is_dir():
            return cls(checkpoint=text, **extra)  # a folder that is not a (whole) checkpoint fails here, naming it
        args = {}
        tokens = [t.strip() for t in text.split(",") if t.strip()]
        if "=" not in tokens[0] and Path(tokens[0]).expanduser().is_dir():
            args["checkpoint"] = tokens.pop(0)  # a checkpoint folder, then cache options (CACHE_KEYS)
        elif "=" not in tokens[0] and tokens[0] not in PRESETS and find_checkpoint(tokens[0]):
            args["checkpoint"] = tokens.pop(0)  # a shipped checkpoint by name (models.checkpoint_paths)
        elif "=" not in tokens[0]:
            preset = tokens.pop(0)
            if preset not in PRESETS:
                looked = ", ".join(str(c) for c in candidates(preset))
                raise ValueError(f"unknown model {preset!r}; allowed presets: {sorted(PRESETS)}, "
                                 f"key=value pairs ({sorted(STRING_KEYS)}) or a checkpoint folder "
                                 f"(looked in: {looked})")
            args.update(PRESETS[preset])
        given = set()
        for tok in tokens:
            if "=" not in tok:
                raise ValueError(f"model spec {text!r}: {tok!r} is not key=value (a preset may come only first)")
            k, v = (s.strip() for s in tok.split("=", 1))
            if k not in STRING_KEYS:
                raise ValueError(f"model spec {text!r}: unknown key {k!r}; allowed: {sorted(STRING_KEYS)}")
            if k in given:
                raise ValueError(f"model spec {text!r}: {k} is given twice; give each key once")
            given.add(k)
            args[k] = v
        spec = cls(**args, **extra)
        try:
            check_window_only(spec.mechanism, spec.window, spec.sinks)
        except ValueError as e:
            raise ValueError(f"model spec {text!r}: {e}") from None
        return spec

    def given(self) -> dict:
        """The string keys that differ from their defaults (base when given), in STRING_KEYS order."""
        return {k: getattr(self, k) for k in STRING_KEYS if getattr(self, k) != FIELD_DEFAULTS[k]}

    def to_string(self) -> str:
        """The canonical string: non-default keys sorted; from_string(to_string()) == self."""
        return ",".join(f"{k}={_text(v)}" for k, v in sorted(self.given().items()))

    def store_key(self) -> str:
        """The model's identity in the result store (`store_key`)."""
        return store_key(self)

    # ------------------------------------------------------------------ lm-eval model_args
    @classmethod
    def from_model_args(cls, args: dict):
        """The spec part of lm-eval model_args (other keys, e.g. device or batch_size, are the backend's)."""
        return cls(**{k: v for k, v in args.items() if k in STRING_KEYS and v is not None})

    def to_model_args(self) -> dict:
        """The non-default keys, plus base (a checkpoint without an explicit base names its own)."""
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.given().items()}
        if self.base is None and self.checkpoint is None:
            out = {"base": DEFAULT_BASE, **out}
        return out

    # ------------------------------------------------------------------ golinear train flags
    @classmethod
    def from_train_args(cls, args):
        """`golinear train`'s model flags (models.training.train_cli.add_arguments); --layer-scores names a JSON file."""
        return cls(base=args.base, mechanism=args.mechanism, window=args.window, sinks=args.sinks,
                   short_conv=args.short_conv, lora=args.lora, full_layers=args.full_layers or None,
                   keep_full=args.keep_full, select=args.select, layer_scores=read_layer_scores(args.layer_scores),
                   retain=args.retain, retain_score=args.retain_score, out_norm=args.out_norm,
                   conv_on=args.conv_on, scorer=args.scorer)

    # ------------------------------------------------------------------ checkpoint config.json
    @classmethod
    def from_checkpoint_config(cls, config: dict, folder=None):
        """The base and linearize options a checkpoint's config.json holds (and the folder, when given)."""
        where = f"checkpoint config {str(Path(folder) / CONFIG)!r}" if folder else "checkpoint config"
        lin = config.get("linearize")
        if not isinstance(lin, dict):
            raise ValueError(f"{where} has no 'linearize' options")
        return cls(base=config.get("base"), **({"checkpoint": str(folder)} if folder else {}),
                   **linearize_values({"mechanism": "gdn", **lin}))

    def to_checkpoint_config(self) -> dict:
        """config.json's base (as given: None stays None) and linearize options (save_checkpoint adds
        fingerprints and counts)."""
        return {"base": self.base, "linearize": self.linearize_options()}

    def linearize_options(self) -> dict:
        """LinearizeConfig's fields as JSON values (lists, not tuples; no retention keys without slots, no
        out_norm when off, no conv_on when the default); needs a mechanism."""
        if self.mechanism is None:
            raise ValueError(f"a linearized model needs a mechanism; allowed: {list(MECHANISMS)}")
        return without_unused_retention({k: (list(v) if isinstance(v, tuple) else v) for k, v in
                                         ((k, getattr(self, k)) for k in LINEARIZE_KEYS)})

    # ------------------------------------------------------------------ derived
    def checkpoint_config(self) -> dict | None:
        return read_checkpoint_config(self.checkpoint) if self.checkpoint else None

    @property
    def is_full_attention(self) -> bool:
        return self.mechanism is None and self.checkpoint is None and self.press is None

    @property
    def base_name(self) -> str:
        """The backbone: given explicitly, else the one a checkpoint's config.json names, else the default."""
        if self.base is None and self.checkpoint and (Path(self.checkpoint) / CONFIG).exists():
            return read_checkpoint_config(self.checkpoint).get("base") or DEFAULT_BASE
        return self.base or DEFAULT_BASE

    @property
    def budget(self) -> float:
        """Cache budget in tokens: sinks + window (+ retention slots) for windowed models, inf for full attention."""
        if self.is_full_attention:
            return math.inf
        if self.press is not None:
            return self.kv_budget
        if self.checkpoint is not None:
            try:  # a checkpoint carries its own window and sinks, unless cache options replace them
                lin = self.checkpoint_linearize()
                return lin.get("sinks", 0) + lin.get("window", 0) + lin.get("retain", 0)
            except (FileNotFoundError, KeyError, ValueError):
                return 0
        return self.sinks + self.window + self.retain

    def checkpoint_linearize(self) -> dict:
        """A checkpoint's linearize options with this spec's cache options (with_cache_options) in place."""
        given = {k: v for k, v in self.given().items() if k not in ("base", "checkpoint", "dtype")}
        return with_cache_options(self.checkpoint_config()["linearize"], given,
                                  f"checkpoint {Path(self.checkpoint).name!r}")


FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelSpec)}
KEY_ESCAPES = {"%": "%25", ",": "%2C", "=": "%3D", ";": "%3B"}  # the key's own separators (and the escape itself)


def store_key(spec: ModelSpec) -> str:
    """A model's identity in the result store: its keys (base always, by name; a checkpoint by its folder's name)
    plus a hash of the local files it names, so a retrained checkpoint or edited backbone is another model; a scorer
    file (retain_score=fitted) by its name and a hash of its contents; a press with kvpress's version.

    Every value is written with `,` `=` `;` `%` escaped (KEY_ESCAPES), so no value can spell other keys: a copy of
    gdn-w56-s8-sc in a folder named `gdn-w56-s8-sc,window=28` is not the shipped checkpoint run at window 28. Values
    without those characters are written as they are, so the keys of stored cells do not change."""
    def text(k, v) -> str:
        v = Path(v).name if k in ("checkpoint", "scorer") else _text(v)
        return "".join(KEY_ESCAPES.get(c, c) for c in v)

    a = {**spec.given(), "base": spec.base_name}
    parts = [f"{k}={text(k, v)}" for k, v in sorted(a.items())]
    for k in ("base", "checkpoint"):
        ident = checkpoint_identity(a.get(k)) if k == "checkpoint" else local_files_identity(a.get(k))
        if k == "checkpoint" and a.get(k) and not ident:  # a key without the files would name another model
            raise FileNotFoundError(f"checkpoint folder {str(a[k])!r} has no checkpoint files (moved or deleted "
                                    "during the run?); its cells cannot be keyed")
        if ident:
            parts.append(f"{k}_files={ident}")
    if a.get("scorer"):
        if file_identity(a["scorer"]) is None:
            raise FileNotFoundError(f"retention scorer file {str(a['scorer'])!r} does not exist; its cells cannot be "
                                    "keyed")
        parts.append(f"scorer_file={file_identity(a['scorer'])}")
    if a.get("press"):  # a press's scores are kvpress's code: its version is part of the cell's identity
        from golinear.models.kv_compression.kvpress_adapter import kvpress_version
        parts.append(f"kvpress={kvpress_version()}")
    return ",".join(parts)


def store_key_parts(key: str) -> dict[str, str]:
    """A store key's parts by name, each value unescaped (store_key's inverse for the names and hashes)."""
    unescape = {code: c for c, code in KEY_ESCAPES.items()}
    pattern = re.compile("|".join(unescape))
    return {k: pattern.sub(lambda m: unescape[m[0]], v) for k, _, v in (p.partition("=") for p in key.split(","))}


def linearize_values(options: dict) -> dict:
    """LinearizeConfig options checked and normalised (tuples as lists); unknown names are one error."""
    unknown = set(options) - set(LINEARIZE_KEYS)
    if unknown:
        raise ValueError(f"unknown linearize options {sorted(unknown)}; allowed: {sorted(LINEARIZE_KEYS)}")
    out = {k: parse_value(k, v) for k, v in options.items()}
    if "mechanism" in out and out["mechanism"] is None:
        raise ValueError(f"a linearized model needs a mechanism; allowed: {list(MECHANISMS)}")
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


def _text(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, tuple):
        return "+".join(map(str, v))
    return str(v)
