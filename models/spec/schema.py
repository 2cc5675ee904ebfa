"""The schema of a model configuration: `ModelSpec` (backbone + checkpoint + linearize options + dtype).

Every front end converts through it: the CLI/store string (`from_string`, `to_string`, `store_key`), lm-eval
model_args (`from_model_args`, `to_model_args`), `golinear train` flags (`from_train_args`) and a checkpoint's
config.json (`from_checkpoint_config`, `to_checkpoint_config`). Each value is checked on construction by
models.spec.values (one allowed set, one message); a checkpoint's files are read by models.spec.checkpoint_files.
No torch at import time (the CLI builds its parser from it).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path

from golinear.models.util.path_names import check_path, is_folder
from golinear.models.spec.checkpoint_files import CONFIG, read_checkpoint_config, read_layer_scores
from golinear.models.spec.checkpoint_paths import candidates, find_checkpoint
from golinear.models.spec.store_key import store_key
from golinear.models.spec.values import (CONV_ON, DEFAULT_BASE, LINEARIZE_KEYS, MECHANISMS, PARSERS, PRESETS,
                                         RETAIN_SCORES, STRING_KEYS, check_option_pairs, check_press_budget,
                                         check_press_options, linearize_values, parse_value, value_text,
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
        """Each value, the rules between values (models.spec.values), then a checkpoint's files: read last, once
        every cheaper check has passed. A checkpoint's own options, with the cache options given here in place, are
        checked by checkpoint_linearize (check_buildable, models.spec.backbone_checks)."""
        for key in PARSERS:
            if key != "checkpoint":
                object.__setattr__(self, key, parse_value(key, getattr(self, key)))
        if self.checkpoint is None:
            check_option_pairs({k: getattr(self, k) for k in LINEARIZE_KEYS})
        check_press_options(self)
        object.__setattr__(self, "checkpoint", parse_value("checkpoint", self.checkpoint))

    # ------------------------------------------------------------------ the CLI/store string
    @classmethod
    def from_string(cls, text: str, **extra):
        """A preset, key=value pairs, a preset then overrides (`gdn-default,window=120`) or a checkpoint folder."""
        text = text.strip()
        if not text:
            raise ValueError("empty model spec")
        if is_folder(text):
            return cls(checkpoint=text, **extra)  # a folder that is not a (whole) checkpoint fails here, naming it
        args = {}
        tokens = [t.strip() for t in text.split(",") if t.strip()]
        if "=" not in tokens[0] and is_folder(tokens[0]):
            args["checkpoint"] = tokens.pop(0)  # a checkpoint folder, then cache options (CACHE_KEYS)
        elif "=" not in tokens[0] and tokens[0] not in PRESETS and find_checkpoint(tokens[0]):
            args["checkpoint"] = tokens.pop(0)  # a shipped checkpoint by name (models.spec.checkpoint_paths)
        elif "=" not in tokens[0]:
            preset = tokens.pop(0)
            if preset not in PRESETS:
                check_path(preset, "model")  # a name no folder can have: said as such, not as an unknown preset
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
        return cls(**args, **extra)

    def given(self) -> dict:
        """The string keys that differ from their defaults (base when given), in STRING_KEYS order."""
        return {k: getattr(self, k) for k in STRING_KEYS if getattr(self, k) != FIELD_DEFAULTS[k]}

    def to_string(self) -> str:
        """The canonical string: non-default keys sorted; from_string(to_string()) == self."""
        return ",".join(f"{k}={value_text(v)}" for k, v in sorted(self.given().items()))

    def store_key(self) -> str:
        """The model's identity in the result store (models.spec.store_key)."""
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
                   short_conv=args.short_conv, lora=args.lora, lora_rank=args.lora_rank,
                   full_layers=args.full_layers or None,
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

    def check_buildable(self) -> None:
        """The rules a spec meets once it names one model to build (lm-eval model_args), beyond those checked on
        construction: a press has its budget, a checkpoint's cache options fit its own."""
        if self.checkpoint is not None:
            self.checkpoint_linearize()
        check_press_budget(self)

    # ------------------------------------------------------------------ derived
    def checkpoint_config(self) -> dict | None:
        """A checkpoint's config.json, read once per spec (each caller gets its own copy)."""
        return copy.deepcopy(self._checkpoint_config) if self.checkpoint else None

    @functools.cached_property
    def _checkpoint_config(self) -> dict:
        return read_checkpoint_config(self.checkpoint)

    @property
    def is_full_attention(self) -> bool:
        return self.mechanism is None and self.checkpoint is None and self.press is None

    @property
    def base_name(self) -> str:
        """The backbone: given explicitly, else the one a checkpoint's config.json names, else the default."""
        if self.base is None and self.checkpoint and (Path(self.checkpoint) / CONFIG).exists():
            return self._checkpoint_config.get("base") or DEFAULT_BASE
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
        """A checkpoint's linearize options with this spec's cache options (with_cache_options) in place, made
        once per spec (each caller gets its own copy)."""
        return copy.deepcopy(self._checkpoint_linearize)

    @functools.cached_property
    def _checkpoint_linearize(self) -> dict:
        given = {k: v for k, v in self.given().items() if k not in ("base", "checkpoint", "dtype")}
        return with_cache_options(self.checkpoint_config()["linearize"], given,
                                  f"checkpoint {Path(self.checkpoint).name!r}")


FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelSpec)}
