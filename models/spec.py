"""One schema for a model configuration: `ModelSpec` (backbone + checkpoint + linearize options + dtype).

Every front end converts through it: the CLI/store string (`from_string`, `to_string`, `store_key`), lm-eval
model_args (`from_model_args`, `to_model_args`), `golinear train` flags (`from_train_args`) and a checkpoint's
config.json (`from_checkpoint_config`, `to_checkpoint_config`). Each value is checked once, in `parse_value`,
against one allowed set, with one message. models.linearize.LinearizeConfig (the model side) takes its
values from here too. The weight-free checks of whole configurations are in models.spec_checks.
This module imports no torch at import time (the CLI builds its parser from it).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BASE = "smollm2-135m"  # models.backbone.DEFAULT_BACKBONE (that module imports torch)
MECHANISMS = ("gla", "kgla", "gdn", "hedgehog", "none")  # "none": window+sink softmax alone, no linear state
SELECTIONS = ("uniform", "hardness")  # how keep_full picks its full-attention layers
# retention slots (models.ops.retention): the scores a layer computes itself (the op adds "given",
# a caller's tensor); retain=0 (no slots) is the default recipe, and its keys are then left out of config.json.
# "fitted" reads a scorer file (models.retention_scorer), named by the option `scorer` (only with it)
RETAIN_SCORES = ("delta_error", "proj_residual", "fitted")
RETENTION_KEYS = ("retain", "retain_score", "scorer")
# the options that choose only which tokens the softmax sees and own no parameters: a checkpoint may be evaluated
# under other values of these (training-free puts retention slots into a default-recipe checkpoint)
CACHE_KEYS = ("window", "sinks", "retain", "retain_score", "scorer")
# the opt-in output RMSNorm after the op (models.mechanisms.OutputNorm; docs/study.md "Strict GDN at 135M"): the
# mechanisms that take it (Hedgehog normalises by construction; none has no op); left out of config.json when off
OUT_NORM_MECHANISMS = ("gla", "kgla", "gdn")
# which path the short conv feeds (docs/study.md "Why the gap"): "both" (the paper's recipe: one convolved q/k/v for
# the window + sinks softmax and the linear path) or "linear" (the softmax path keeps the frozen q/k/v; an
# ablation); the first is the default, left out of config.json
CONV_ON = ("both", "linear")
DTYPES = ("bf16", "bfloat16", "float16", "float32", "fp16", "fp32")
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
WEIGHTS, CONFIG = "new_params.safetensors", "config.json"  # a checkpoint's two files (models.checkpoint)
SCORER = "scorer.safetensors"  # and, with retain_score=fitted, its copy of the scorer file (config.json names it)
# integer options and their least allowed value
MINIMUM = {"window": 0, "sinks": 0, "retain": 0, "conv_size": 1, "lora_rank": 1, "lora_alpha": 1, "gate_rank": 1,
           "feature_dim": 1}
# the keys of the CLI/store string and of lm-eval's model_args (the other linearize options keep their defaults)
STRING_KEYS = ("base", "checkpoint", "mechanism", "window", "sinks", "short_conv", "lora", "full_layers",
               "keep_full", "select", "retain", "retain_score", "out_norm", "conv_on", "scorer", "dtype")
LINEAR_KEYS = STRING_KEYS[1:-1]  # the linearization keys of model_args
# LinearizeConfig's fields, in its order (tests/test_spec.py checks that they agree)
LINEARIZE_KEYS = ("mechanism", "window", "sinks", "short_conv", "conv_size", "lora", "lora_rank", "lora_alpha",
                  "full_layers", "keep_full", "select", "layer_scores", "gate_rank", "feature_dim", "retain",
                  "retain_score", "out_norm", "conv_on", "scorer")
PRESETS = {
    "full": {},
    # The paper's final recipe (Sec. 5): GDN + SWA 56 + 8 sinks + short convolutions (cache 64).
    "gdn-default": {"mechanism": "gdn", "window": 56, "sinks": 8, "short_conv": True},
    "gla-default": {"mechanism": "gla", "window": 56, "sinks": 8, "short_conv": True},
    "kgla-default": {"mechanism": "kgla", "window": 56, "sinks": 8, "short_conv": True},
    "hedgehog-default": {"mechanism": "hedgehog", "window": 56, "sinks": 8, "short_conv": True},
    # Pure replacements (Table 1) and the untrained window+sink baseline (Tables 8-9).
    "gdn": {"mechanism": "gdn"}, "gla": {"mechanism": "gla"}, "kgla": {"mechanism": "kgla"},
    "hedgehog": {"mechanism": "hedgehog"},
    "swa-sink": {"mechanism": "none", "window": 56, "sinks": 8},
}


def parse_full_layers(text) -> tuple[int, ...]:
    """full_layers as text: indices joined by '+' (model specs and model_args, where commas separate keys),
    ',' (`golinear train --full-layers`), ':', ';' or '|'; or a list of ints. One parser for every front end."""
    if isinstance(text, (list, tuple)):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in text):
            return tuple(text)
        text = "+".join(map(str, text))
    parts = re.split(r"[+,:;|]", str(text).strip())
    try:
        return tuple(int(x) for x in parts if x.strip() != "")
    except ValueError:
        raise ValueError(f"full_layers={text!r}: expected layer indices joined by '+', e.g. 3+7+11") from None


def _choice(key, value, allowed, what, extra=""):
    low = str(value).strip().lower()
    if low not in allowed:
        raise ValueError(f"unknown {what} {value!r}; allowed: {list(allowed)}{extra}")
    return low


def _integer(key, value) -> int:
    least = MINIMUM[key]
    if isinstance(value, bool) or not isinstance(value, (int, str)) or \
            (isinstance(value, str) and not value.strip().lstrip("-").isdigit()) or int(value) < least:
        raise ValueError(f"{key}={value!r}: expected " +
                         ("a non-negative integer" if least == 0 else f"an integer >= {least}"))
    return int(value)


def _boolean(key, value) -> bool:
    if isinstance(value, bool):
        return value
    low = str(value).strip().lower()
    if low in TRUE or low in FALSE:
        return low in TRUE
    raise ValueError(f"{key}={value!r}: expected true or false")


def _fraction(key, value) -> float:
    """keep_full: a fraction in [0, 1) (keeping every layer would linearize none)."""
    try:
        v = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        v = math.nan
    if not 0.0 <= v < 1.0:
        raise ValueError(f"{key}={value!r}: expected a fraction in [0, 1)")
    return v


def _scores(key, value) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                        for x in value):
        raise ValueError(f"{key}={value!r}: expected a list of numbers, one per layer")
    return tuple(value)


def _mechanism(key, value):
    if str(value).strip().lower() in ("", "full"):
        return None  # full attention
    return _choice(key, value, MECHANISMS, "mechanism", " (or 'full')")


def _checkpoint(key, value) -> str:
    """A whole checkpoint folder (its config.json parses, its weights are complete), as an absolute path."""
    path = Path(str(value)).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint folder {str(value)!r} does not exist")
    check_checkpoint_files(path)
    return str(path.resolve())


def _scorer_file(value) -> str:
    """A retention scorer file (retain_score=fitted), as an absolute path; its contents are checked when a model
    loads it (models.retention_scorer)."""
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"retention scorer file {str(value)!r} does not exist")
    return str(path.resolve())


PARSERS = {"base": lambda k, v: str(v).strip(), "checkpoint": _checkpoint, "mechanism": _mechanism,
           **{k: _integer for k in MINIMUM}, "short_conv": _boolean, "lora": _boolean, "out_norm": _boolean,
           "full_layers": lambda k, v: parse_full_layers(v), "keep_full": _fraction,
           "select": lambda k, v: _choice(k, v, SELECTIONS, "layer selection"), "layer_scores": _scores,
           "retain_score": lambda k, v: _choice(k, v, RETAIN_SCORES, "retention score"),
           "conv_on": lambda k, v: _choice(k, v, CONV_ON, "conv_on"), "scorer": lambda k, v: _scorer_file(v),
           "dtype": lambda k, v: _choice(k, v, DTYPES, "dtype")}


def parse_value(key: str, value):
    """The one check of one value (text from a string or model_args, or already typed): its normal form,
    or a one-line ValueError (FileNotFoundError for a missing checkpoint) naming the value and what is allowed.
    None means "not given" for the keys whose default is None."""
    if value is None and key in ("base", "checkpoint", "mechanism", "full_layers", "layer_scores", "scorer"):
        return None
    return PARSERS[key](key, value)


def check_window_only(mechanism, window: int, sinks: int) -> None:
    if mechanism == "none" and not (window or sinks):
        raise ValueError("mechanism=none (window+sink softmax, no linear state) needs a window and/or sinks")


def check_retention(mechanism, window: int, retain: int, retain_score: str, scorer: str | None = None) -> None:
    """Retention slots are built for GDN with a window (models.ops.retention); a score only with slots; a scorer
    file with retain_score=fitted and only there."""
    if retain and (mechanism != "gdn" or not window):
        raise ValueError(f"retain={retain} needs mechanism=gdn and window > 0; got mechanism={mechanism}, "
                         f"window={window}")
    if not retain and (retain_score != RETAIN_SCORES[0] or scorer):
        named = f"retain_score={retain_score!r}" if retain_score != RETAIN_SCORES[0] else f"scorer={scorer!r}"
        raise ValueError(f"{named} needs retain > 0 (retention slots)")
    if (retain_score == "fitted") != bool(scorer):
        raise ValueError("retain_score=fitted needs scorer=<a scorer file> (models.retention_scorer)" if not scorer
                         else f"scorer={scorer!r} is read only with retain_score=fitted, got {retain_score!r}")


def check_out_norm(mechanism, out_norm: bool, retain: int) -> None:
    """The output norm follows the GLA/kGLA/GDN op in LinearizedAttention.run; the retention path
    (models.ops.retention*) computes its GDN output itself, without it."""
    if out_norm and mechanism not in OUT_NORM_MECHANISMS:
        raise ValueError(f"out_norm=true needs mechanism in {list(OUT_NORM_MECHANISMS)}; got mechanism={mechanism}")
    if out_norm and retain:
        raise ValueError(f"out_norm=true is not implemented with retention slots (retain={retain})")


def check_conv_on(mechanism, short_conv: bool, conv_on: str, retain: int) -> None:
    """conv_on chooses which path the short conv feeds: without a conv or a linear path there is nothing to
    choose; the retention path (models.ops.retention*) projects once for both paths."""
    if conv_on != CONV_ON[0] and mechanism == "none":
        raise ValueError(f"conv_on={conv_on!r} needs a linear path; mechanism=none allows only conv_on={CONV_ON[0]!r}")
    if conv_on != CONV_ON[0] and not short_conv:
        raise ValueError(f"conv_on={conv_on!r} needs short_conv=true; without a short conv only "
                         f"conv_on={CONV_ON[0]!r} is allowed")
    if conv_on != CONV_ON[0] and retain:
        raise ValueError(f"conv_on={conv_on!r} is not implemented with retention slots (retain={retain}); "
                         f"allowed there: conv_on={CONV_ON[0]!r}")


def with_cache_options(lin: dict, cache: dict, where: str) -> dict:
    """A checkpoint's linearize options (`lin`, from its config.json) with the cache options `cache` in place of
    its own; any other option is refused (the checkpoint's parameters were trained for it), and the result is
    checked as a whole (retention needs GDN with a window, ...)."""
    other = sorted(set(cache) - set(CACHE_KEYS))
    if other:
        raise ValueError(f"{where} already says how the model is linearized; of its options only the cache "
                         f"options {list(CACHE_KEYS)} may be changed (training-free), drop {other}")
    out = {**lin, **{k: parse_value(k, v) for k, v in cache.items()}}
    if out.get("retain_score") != "fitted" and "scorer" not in cache:  # another score replaces the fitted one
        out.pop("scorer", None)
    mech = out.get("mechanism", "gdn")
    check_window_only(mech, out.get("window", 0), out.get("sinks", 0))
    check_retention(mech, out.get("window", 0), out.get("retain", 0), out.get("retain_score", RETAIN_SCORES[0]),
                    out.get("scorer"))
    check_out_norm(mech, out.get("out_norm", False), out.get("retain", 0))
    check_conv_on(mech, out.get("short_conv", False), out.get("conv_on", CONV_ON[0]), out.get("retain", 0))
    return without_unused_retention(out)


def without_unused_retention(options: dict) -> dict:
    """Linearize options without the retention keys when retain is 0, without out_norm when off and without
    conv_on when the default: checkpoints and run records written before these options existed stay byte-identical."""
    drop = (() if options.get("retain") else RETENTION_KEYS) + (() if options.get("out_norm") else ("out_norm",))
    drop += ("scorer",) if options.get("scorer") is None else ()
    drop += ("conv_on",) if options.get("conv_on", CONV_ON[0]) == CONV_ON[0] else ()
    return {k: v for k, v in options.items() if k not in drop}


def read_checkpoint_config(folder) -> dict:
    """A checkpoint's config.json as a dict; names the file when it is missing or broken."""
    folder = Path(folder)
    if not (folder / CONFIG).exists() or not (folder / WEIGHTS).exists():
        raise FileNotFoundError(f"not a golinear checkpoint: {folder} (needs {CONFIG} and {WEIGHTS})")
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"checkpoint config {str(folder / CONFIG)!r} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"checkpoint config {str(folder / CONFIG)!r} is not a JSON object")
    lin = config.get("linearize")
    if isinstance(lin, dict) and isinstance(lin.get("scorer"), str):  # saved relative to the folder: it travels
        lin["scorer"] = str((folder / lin["scorer"]).resolve())
    return config


def check_checkpoint_files(folder: str | Path) -> dict:
    """A checkpoint's config.json parses and its safetensors file is complete; returns the config.

    safetensors' header states every tensor's byte range: a file shorter than that (a truncated copy)
    or with a garbled header is refused here, naming the file, instead of as a traceback at load time."""
    from safetensors import SafetensorError, safe_open
    folder = Path(folder)
    config = read_checkpoint_config(folder)  # names the file if its JSON is broken
    if not isinstance(config.get("linearize"), dict):
        raise ValueError(f"checkpoint config {str(folder / CONFIG)!r} has no 'linearize' options")
    weights = folder / WEIGHTS
    try:
        with safe_open(str(weights), framework="pt") as f:
            f.keys()
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"checkpoint weights {str(weights)!r} are unreadable ({e})") from None
    with open(weights, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        try:
            meta = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"checkpoint weights {str(weights)!r} have a damaged header") from None
    end = max((v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__"), default=0)
    size = weights.stat().st_size
    if size < 8 + n + end:
        raise ValueError(f"checkpoint weights {str(weights)!r} are truncated ({size} bytes, the header "
                         f"describes {8 + n + end})")
    return config


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
    retain: int = 0                # retention slots per KV head (GDN with a window; models.ops.retention)
    retain_score: str = RETAIN_SCORES[0]
    out_norm: bool = False         # output RMSNorm after the op (gla, kgla, gdn; models.mechanisms.OutputNorm)
    conv_on: str = CONV_ON[0]      # the path(s) the short conv feeds: both | linear
    scorer: str | None = None      # absolute path of a scorer file (retain_score=fitted; models.retention_scorer)
    dtype: str = "float32"

    def __post_init__(self):
        for key in PARSERS:
            object.__setattr__(self, key, parse_value(key, getattr(self, key)))
        if self.checkpoint is None:  # (a checkpoint's own options are checked when it is linearized)
            check_retention(self.mechanism, self.window, self.retain, self.retain_score, self.scorer)
            check_out_norm(self.mechanism, self.out_norm, self.retain)
            check_conv_on(self.mechanism, self.short_conv, self.conv_on, self.retain)

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
        elif "=" not in tokens[0]:
            preset = tokens.pop(0)
            if preset not in PRESETS:
                raise ValueError(f"unknown model {preset!r}; allowed presets: {sorted(PRESETS)}, "
                                 f"key=value pairs ({sorted(STRING_KEYS)}) or a checkpoint folder")
            args.update(PRESETS[preset])
        for tok in tokens:
            if "=" not in tok:
                raise ValueError(f"model spec {text!r}: {tok!r} is not key=value (a preset may come only first)")
            k, v = (s.strip() for s in tok.split("=", 1))
            if k not in STRING_KEYS:
                raise ValueError(f"model spec {text!r}: unknown key {k!r}; allowed: {sorted(STRING_KEYS)}")
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
        """The model's identity in the result store: its keys (base always, by name; a checkpoint by its folder's
        name) plus a hash of the local files it names, so a retrained checkpoint or edited backbone is another model;
        a scorer file (retain_score=fitted) by its name and a hash of its contents."""
        a = {**self.given(), "base": self.base_name}
        parts = [f"{k}={Path(v).name if k in ('checkpoint', 'scorer') else _text(v)}" for k, v in sorted(a.items())]
        for k in ("base", "checkpoint"):
            ident = checkpoint_identity(a.get(k)) if k == "checkpoint" else local_files_identity(a.get(k))
            if ident:
                parts.append(f"{k}_files={ident}")
        if a.get("scorer"):
            parts.append(f"scorer_file={file_identity(a['scorer'])}")
        return ",".join(parts)

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
        """`golinear train`'s model flags (models.train_cli.add_arguments); --layer-scores names a JSON file."""
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
        return self.mechanism is None and self.checkpoint is None

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


def linearize_values(options: dict) -> dict:
    """LinearizeConfig options checked and normalised (tuples as lists); unknown names are one error."""
    unknown = set(options) - set(LINEARIZE_KEYS)
    if unknown:
        raise ValueError(f"unknown linearize options {sorted(unknown)}; allowed: {sorted(LINEARIZE_KEYS)}")
    out = {k: parse_value(k, v) for k, v in options.items()}
    if "mechanism" in out and out["mechanism"] is None:
        raise ValueError(f"a linearized model needs a mechanism; allowed: {list(MECHANISMS)}")
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


def read_layer_scores(path) -> list[float] | None:
    """`golinear diagnose`'s layer_scores JSON (for select=hardness), or None without a path."""
    if not path:
        return None
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--layer-scores file {str(path)!r} does not exist")
    try:
        scores = json.loads(path.read_text())["layer_scores"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"--layer-scores file {str(path)!r} is not a `golinear diagnose` layer_scores JSON "
                         f"({type(e).__name__}: {e})") from None
    if not (isinstance(scores, list) and all(isinstance(x, (int, float)) for x in scores)):
        raise ValueError(f"--layer-scores file {str(path)!r}: 'layer_scores' must be a list of numbers")
    return scores


def _text(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, tuple):
        return "+".join(map(str, v))
    return str(v)


CONTENT_HASH_LIMIT = 64 << 20  # checkpoints (new parameters only) are hashed by content; big backbones by stat


def local_files_identity(value, names: tuple[str, ...] | None = None) -> str | None:
    """For a local folder: a short hash of its files (content up to 64 MB each, else size and mtime); only
    the files in `names` when given.

    It changes when the files change, and (for checkpoints) survives copying the folder elsewhere."""
    if not value:
        return None
    p = Path(str(value)).expanduser()
    if not p.is_dir():
        return None
    h = hashlib.sha256()
    for q in sorted(p.iterdir()):
        if not q.is_file() or q.name.startswith(".") or (names is not None and q.name not in names):
            continue
        st = q.stat()
        h.update(q.name.encode())
        if st.st_size <= CONTENT_HASH_LIMIT:
            h.update(q.read_bytes())
        else:
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:10]


def checkpoint_identity(folder) -> str | None:
    """A checkpoint's identity in store keys: the hash of the two files `apply_checkpoint` loads. The run's
    log, plot and train_config.json beside them change nothing the model computes, so a log line appended
    or a copy of the folder without them (what a copy to another machine carries) keys the same cells; a retrained
    checkpoint (new weights or config) keys new ones."""
    return local_files_identity(folder, (CONFIG, WEIGHTS, SCORER))


def file_identity(path) -> str | None:
    """A short hash of one file's contents (a retention scorer's), None when there is no such file."""
    p = Path(str(path)).expanduser()
    return hashlib.sha256(p.read_bytes()).hexdigest()[:10] if p.is_file() else None
