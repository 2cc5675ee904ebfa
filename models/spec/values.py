"""The allowed values of a model configuration and the one check of each (re-exported by models.spec):
the allowed sets, `parse_value`, and the checks of option pairs (retention slots need GDN with a window, ...).
No torch at import time (the CLI builds its parser from it)."""
from __future__ import annotations

import math
import re
from pathlib import Path

from golinear.models.cache.policies import retention_scores
from golinear.models.util.path_names import check_path
from golinear.models.spec.checkpoint_paths import resolve_checkpoint
from golinear.models.spec.checkpoint_files import check_checkpoint_files

DEFAULT_BASE = "smollm2-135m"  # models.backbones.backbone.DEFAULT_BACKBONE (that module imports torch)
MECHANISMS = ("gla", "kgla", "gdn", "hedgehog", "none")  # "none": window+sink softmax alone, no linear state
SELECTIONS = ("uniform", "hardness")  # how keep_full picks its full-attention layers
# retention slots (models.cache.policies, models.retention.ops): the built-in retention policies, by name; `retain_score`
# also takes a policy registered with models.cache.policies.register_policy. retain=0 (no slots) is the default recipe,
# and its keys are then left out of config.json. "fitted" reads a scorer file (models.retention.scorer), named by
# the option `scorer` (only with it)
RETAIN_SCORES = ("delta_error", "proj_residual", "fitted")
RETENTION_KEYS = ("retain", "retain_score", "scorer")
# the options that choose only which tokens the softmax sees and own no parameters: a checkpoint may be evaluated
# under other values of these (training-free: retention slots can be added to a default-recipe checkpoint)
CACHE_KEYS = ("window", "sinks", "retain", "retain_score", "scorer")
# the opt-in output RMSNorm after the op (models.attention.mechanisms.OutputNorm; docs/study.md "Strict GDN at 135M"): the
# mechanisms that take it (Hedgehog normalises by construction; none has no op); left out of config.json when off
OUT_NORM_MECHANISMS = ("gla", "kgla", "gdn")
# which path the short conv feeds (docs/study.md "Why the gap"): "both" (the paper's recipe: one convolved q/k/v for
# the window + sinks softmax and the linear path) or "linear" (the softmax path keeps the frozen q/k/v; an
# ablation); the first is the default, left out of config.json
CONV_ON = ("both", "linear")
DTYPES = ("bf16", "bfloat16", "float16", "float32", "fp16", "fp32")
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# integer options and their least allowed value
MINIMUM = {"window": 0, "sinks": 0, "retain": 0, "kv_budget": 0, "prefill_chunk": 0, "conv_size": 1, "lora_rank": 1,
           "lora_alpha": 1, "gate_rank": 1, "feature_dim": 1}
# the keys of the CLI/store string and of lm-eval's model_args (the other linearize options keep their defaults)
# KV-cache compression of the full-attention model (models.kv_compression): a kvpress press at a cache budget
PRESS_KEYS = ("press", "kv_budget", "question_aware", "prefill_chunk")
STRING_KEYS = ("base", "checkpoint", "mechanism", "window", "sinks", "short_conv", "lora", "full_layers",
               "keep_full", "select", "retain", "retain_score", "out_norm", "conv_on", "scorer", *PRESS_KEYS, "dtype")
LINEAR_KEYS = tuple(k for k in STRING_KEYS[1:-1] if k not in PRESS_KEYS)  # the linearization keys of model_args
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


INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits only: int() would also take '٣' as 3 and fail on '²' unnamed


def digits(value) -> str:
    """What a message adds for a value with other digits than 0-9 ('²', '٣'), which look like numbers."""
    return "" if str(value).isascii() else " written in the digits 0-9"


def parse_full_layers(text) -> tuple[int, ...]:
    """full_layers as text: indices joined by '+' (model specs and model_args, where commas separate keys),
    ',' (`golinear train --full-layers`), ':', ';' or '|'; or a list of ints. One parser for every front end."""
    if isinstance(text, (list, tuple)):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in text):
            return tuple(text)
        text = "+".join(map(str, text))
    parts = [x.strip() for x in re.split(r"[+,:;|]", str(text).strip()) if x.strip() != ""]
    if not all(INTEGER.fullmatch(x) for x in parts):
        raise ValueError(f"full_layers={text!r}: expected layer indices{digits(text)} joined by '+', e.g. 3+7+11")
    return tuple(int(x) for x in parts)


def _choice(key, value, allowed, what, extra=""):
    low = str(value).strip().lower()
    if low not in allowed:
        raise ValueError(f"unknown {what} {value!r}; allowed: {list(allowed)}{extra}")
    return low


def _integer(key, value) -> int:
    least = MINIMUM[key]
    if isinstance(value, bool) or not isinstance(value, (int, str)) or \
            (isinstance(value, str) and not INTEGER.fullmatch(value.strip())) or int(value) < least:
        raise ValueError(f"{key}={value!r}: expected " +
                         ("a non-negative integer" if least == 0 else f"an integer >= {least}") + digits(value))
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
        v = float(value) if not isinstance(value, bool) and str(value).isascii() else math.nan
    except (TypeError, ValueError):
        v = math.nan
    if not 0.0 <= v < 1.0:
        raise ValueError(f"{key}={value!r}: expected a fraction in [0, 1){digits(value)}")
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
    path = resolve_checkpoint(str(value))  # a path, or a shipped checkpoint's name; else names where it looked
    check_checkpoint_files(path)
    return str(path.resolve())


def _scorer_file(value) -> str:
    """A retention scorer file (retain_score=fitted), as an absolute path; its contents are checked when a model
    loads it (models.retention.scorer)."""
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"retention scorer file {str(value)!r} does not exist")
    return str(path.resolve())


def _base(key, value) -> str:
    """A backbone's name or folder; one no file system can hold is said here, not as an OSError later."""
    check_path(str(value).strip(), key)
    return str(value).strip()


PARSERS = {"base": _base, "checkpoint": _checkpoint, "mechanism": _mechanism,
           **{k: _integer for k in MINIMUM}, "short_conv": _boolean, "lora": _boolean, "out_norm": _boolean,
           "full_layers": lambda k, v: parse_full_layers(v), "keep_full": _fraction,
           "select": lambda k, v: _choice(k, v, SELECTIONS, "layer selection"), "layer_scores": _scores,
           "retain_score": lambda k, v: _choice(k, v, retention_scores(), "retention score"),
           "conv_on": lambda k, v: _choice(k, v, CONV_ON, "conv_on"), "scorer": lambda k, v: _scorer_file(v),
           "press": lambda k, v: check_press_name(v), "question_aware": _boolean,
           "dtype": lambda k, v: _choice(k, v, DTYPES, "dtype")}


def parse_value(key: str, value):
    """The one check of one value (text from a string or model_args, or already typed): its normal form,
    or a one-line ValueError (FileNotFoundError for a missing checkpoint) naming the value and what is allowed.
    None means "not given" for the keys whose default is None."""
    if value is None and key in ("base", "checkpoint", "mechanism", "full_layers", "layer_scores", "scorer", "press"):
        return None
    return PARSERS[key](key, value)


def check_press_name(name) -> str:
    from golinear.models.kv_compression.presses import check_press  # (imports no torch)
    return check_press(name)


def check_press_options(spec) -> None:
    """A press compresses the full-attention model's cache to kv_budget entries: not with a linearization, and the
    budget only with a press (a press without one takes each of `golinear run --budgets`)."""
    if spec.press is None:
        if spec.kv_budget or spec.question_aware or spec.prefill_chunk:
            named = (f"kv_budget={spec.kv_budget}" if spec.kv_budget else "question_aware=true" if spec.question_aware
                     else f"prefill_chunk={spec.prefill_chunk}")
            raise ValueError(f"{named} needs press=<name> (KV-cache compression)")
        return
    if 0 < spec.prefill_chunk <= 64:
        raise ValueError(f"prefill_chunk={spec.prefill_chunk}: expected 0 (no chunks) or more than 64 tokens (SnapKV "
                         f"scores a chunk's earlier keys with its last 64 queries)")
    if spec.prefill_chunk:
        from golinear.models.kv_compression.presses import ONE_PASS, head_adaptive  # (imports no torch)
        if spec.press in ONE_PASS:
            raise ValueError(f"press={spec.press} with prefill_chunk={spec.prefill_chunk}: {ONE_PASS[spec.press]}; "
                             "run it without prefill_chunk")
        if head_adaptive(spec.press):
            raise ValueError(f"press={spec.press} with prefill_chunk={spec.prefill_chunk}: a head-adaptive press keeps "
                             "every entry and hides the evicted ones, so its cache would grow with each chunk; "
                             "run it without prefill_chunk")
    if spec.mechanism is not None or spec.checkpoint is not None:
        raise ValueError(f"press={spec.press} compresses the full-attention model's cache; it does not combine with "
                         f"a linearized model (mechanism or checkpoint)")


def check_press_budget(spec) -> None:
    """A press without kv_budget is a family that `golinear run --budgets` completes; a model built from a spec
    (lm-eval model_args) needs its budget."""
    if spec.press is not None and spec.kv_budget < 1:
        raise ValueError(f"press={spec.press} needs kv_budget=<entries kept per layer and KV head>, e.g. kv_budget=256 "
                         f"(or `golinear run --budgets`)")


def check_window_only(mechanism, window: int, sinks: int) -> None:
    if mechanism == "none" and not (window or sinks):
        raise ValueError("mechanism=none (window+sink softmax, no linear state) needs a window and/or sinks")


def check_retention(mechanism, window: int, retain: int, retain_score: str, scorer: str | None = None) -> None:
    """Retention slots are built for GDN with a window (models.retention.ops); a score only with slots; a scorer
    file with retain_score=fitted and only there."""
    if retain and (mechanism != "gdn" or not window):
        raise ValueError(f"retain={retain} needs mechanism=gdn and window > 0; got mechanism={mechanism}, "
                         f"window={window}")
    if not retain and (retain_score != RETAIN_SCORES[0] or scorer):
        named = f"retain_score={retain_score!r}" if retain_score != RETAIN_SCORES[0] else f"scorer={scorer!r}"
        raise ValueError(f"{named} needs retain > 0 (retention slots)")
    if (retain_score == "fitted") != bool(scorer):
        raise ValueError("retain_score=fitted needs scorer=<a scorer file> (golinear.models.retention.scorer)" if not scorer
                         else f"scorer={scorer!r} is read only with retain_score=fitted, got {retain_score!r}")


def check_out_norm(mechanism, out_norm: bool, retain: int) -> None:
    """The output norm follows the GLA/kGLA/GDN op in LinearizedAttention.run; the retention path
    (models.retention.ops*) computes its GDN output itself, without it."""
    if out_norm and mechanism not in OUT_NORM_MECHANISMS:
        raise ValueError(f"out_norm=true needs mechanism in {list(OUT_NORM_MECHANISMS)}; got mechanism={mechanism}")
    if out_norm and retain:
        raise ValueError(f"out_norm=true is not implemented with retention slots (retain={retain})")


def check_conv_on(mechanism, short_conv: bool, conv_on: str, retain: int) -> None:
    """conv_on chooses which path the short conv feeds: without a conv or a linear path there is nothing to
    choose; the retention path (models.retention.ops*) projects once for both paths."""
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
    check_option_pairs(out)
    return without_unused_retention(out)


def check_option_pairs(options: dict) -> None:
    """The rules between linearize options (a window-only model needs a window or sinks, retention slots need GDN
    with a window, ...), for options as a checkpoint's config.json or LinearizeConfig holds them; a missing option
    has its default."""
    mech = options.get("mechanism", "gdn")
    check_window_only(mech, options.get("window", 0), options.get("sinks", 0))
    check_retention(mech, options.get("window", 0), options.get("retain", 0),
                    options.get("retain_score", RETAIN_SCORES[0]), options.get("scorer"))
    check_out_norm(mech, options.get("out_norm", False), options.get("retain", 0))
    check_conv_on(mech, options.get("short_conv", False), options.get("conv_on", CONV_ON[0]), options.get("retain", 0))
    if not options.get("lora", False) and options.get("lora_rank", 8) != 8:
        raise ValueError(f"lora_rank={options['lora_rank']} without lora: the rank is LoRA's (add lora / --lora)")


def without_unused_retention(options: dict) -> dict:
    """Linearize options without the retention keys when retain is 0, without out_norm when off and without
    conv_on when the default: checkpoints and run records written before these options existed stay byte-identical."""
    drop = (() if options.get("retain") else RETENTION_KEYS) + (() if options.get("out_norm") else ("out_norm",))
    drop += ("scorer",) if options.get("scorer") is None else ()
    drop += ("conv_on",) if options.get("conv_on", CONV_ON[0]) == CONV_ON[0] else ()
    return {k: v for k, v in options.items() if k not in drop}


def linearize_values(options: dict) -> dict:
    """LinearizeConfig options checked and normalised (tuples as lists); unknown names are one error."""
    unknown = set(options) - set(LINEARIZE_KEYS)
    if unknown:
        raise ValueError(f"unknown linearize options {sorted(unknown)}; allowed: {sorted(LINEARIZE_KEYS)}")
    out = {k: parse_value(k, v) for k, v in options.items()}
    if "mechanism" in out and out["mechanism"] is None:
        raise ValueError(f"a linearized model needs a mechanism; allowed: {list(MECHANISMS)}")
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


def value_text(v) -> str:
    """A value as a spec string (and a store key) writes it: booleans lower case, layer lists joined by '+'."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, tuple):
        return "+".join(map(str, v))
    return str(v)
