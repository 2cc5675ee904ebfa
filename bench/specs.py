"""Model specs: the strings that name a model configuration on the command line and in the store.

A spec is a named preset (``full``, ``gdn-default``, ...), ``key=value`` pairs, a preset followed by
overrides (``gdn-default,window=120``), or a checkpoint folder. Keys are the lm-eval model_args of the
``linearized`` backend (bench/lm_backend.py); the canonical form (sorted, defaults dropped) is the
model's identity in the result store.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from models.spec import MECHANISMS, SELECTIONS, check_checkpoint_files, parse_full_layers  # one allowed set per value

DEFAULTS = {"base": "smollm2-135m", "checkpoint": None, "mechanism": None, "window": 0, "sinks": 0,
            "short_conv": False, "lora": False, "full_layers": None, "keep_full": 0.0,
            "select": "uniform", "dtype": "float32"}
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
WINDOW_ONLY_LABEL = "window+sinks (no linear state)"


def _parse_value(key: str, text: str):
    default = DEFAULTS[key]
    low = text.strip().lower()
    if key in ("short_conv", "lora"):
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{key}={text!r}: expected true or false")
    if key in ("window", "sinks"):
        if not low.isdigit():
            raise ValueError(f"{key}={text!r}: expected a non-negative integer")
        return int(low)
    if key == "keep_full":  # models.linearize.validate's range: keeping every layer would linearize none
        try:
            v = float(low)
        except ValueError:
            v = math.nan
        if not 0.0 <= v < 1.0:
            raise ValueError(f"keep_full={text!r}: expected a fraction in [0, 1)")
        return v
    if key == "full_layers":  # layer indices joined by '+' (commas separate keys): full_layers=3+7+11
        return parse_full_layers(text)
    if key == "mechanism":
        if low in ("", "full"):
            return None
        if low not in MECHANISMS:
            raise ValueError(f"unknown mechanism {text!r}; allowed: {list(MECHANISMS)} (or 'full')")
        return low
    if key == "select":
        if low not in SELECTIONS:
            raise ValueError(f"unknown layer selection {text!r}; allowed: {list(SELECTIONS)}")
        return low
    if key == "checkpoint":
        path = Path(text).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"checkpoint folder {text!r} does not exist")
        check_checkpoint_files(path)
        return str(path.resolve())
    return text if default is None or isinstance(default, str) else type(default)(text)


@dataclass(frozen=True)
class ModelSpec:
    """A model configuration: lm-eval model_args plus a human label and the family it belongs to."""
    args: dict = field(default_factory=dict)
    label: str = ""
    family: str = ""  # label without the cache budget (rows of the budget tables)

    @property
    def full(self) -> dict:
        return {**DEFAULTS, **self.args}

    @property
    def is_full_attention(self) -> bool:
        a = self.full
        return a["mechanism"] is None and a["checkpoint"] is None

    @property
    def budget(self) -> float:
        """Cache budget in tokens: sinks + window for windowed models, inf for full attention."""
        a = self.full
        if self.is_full_attention:
            return math.inf
        if a["checkpoint"] is not None and not (a["sinks"] or a["window"]):
            try:  # a checkpoint carries its own window and sinks
                from models.checkpoint import read_config
                lin = read_config(a["checkpoint"])["linearize"]
                return lin.get("sinks", 0) + lin.get("window", 0)
            except (FileNotFoundError, KeyError, ValueError):
                return 0
        return a["sinks"] + a["window"] if (a["sinks"] or a["window"]) else 0

    @property
    def key(self) -> str:
        """Canonical identity: non-default args sorted, plus the identity of local files it names."""
        a = {**self.full, "base": self.base_name}
        parts = []
        for k in sorted(a):
            v = a[k]
            if k != "base" and v == DEFAULTS[k]:
                continue
            if isinstance(v, bool):
                v = str(v).lower()
            elif isinstance(v, tuple):
                v = "+".join(map(str, v))
            elif k == "checkpoint":  # the folder's name + content hash below, not where it happens to live
                v = Path(v).name
            parts.append(f"{k}={v}")
        for k in ("base", "checkpoint"):
            ident = local_files_identity(a[k])
            if ident:
                parts.append(f"{k}_files={ident}")
        return ",".join(parts)

    def model_args(self) -> dict:
        """Arguments for the lm-eval backend: the non-default ones, plus base (a checkpoint names its own)."""
        a = self.full
        keep_base = "base" in self.args or a["checkpoint"] is None
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in a.items()
                if (k == "base" and keep_base) or (k != "base" and v != DEFAULTS[k])}

    @property
    def base_name(self) -> str:
        """The backbone: given explicitly, else the one a checkpoint's config.json names, else the default."""
        a = self.full
        if "base" not in self.args and a["checkpoint"]:
            if (Path(a["checkpoint"]) / "config.json").exists():
                from models.checkpoint import read_config
                return read_config(a["checkpoint"]).get("base") or a["base"]
        return a["base"]

    def with_budget(self, budget: int, sinks: int, family: str | None = None, **changes) -> "ModelSpec":
        """The same model evaluated with `sinks` sink tokens and a window filling the rest of `budget`."""
        if budget <= sinks:
            raise ValueError(f"cache budget {budget} must exceed the {sinks} sink tokens")
        args = {**self.args, **changes, "sinks": sinks, "window": budget - sinks}
        fam = family or self.family or self.label
        return ModelSpec(args, f"{fam} @{budget}", fam)


CONTENT_HASH_LIMIT = 64 << 20  # checkpoints (new parameters only) are hashed by content; big backbones by stat


def local_files_identity(value) -> str | None:
    """For a local folder: a short hash of its files (content up to 64 MB each, else size and mtime).

    It changes when the files change, and (for checkpoints) survives copying the folder elsewhere."""
    if not value:
        return None
    p = Path(str(value)).expanduser()
    if not p.is_dir():
        return None
    h = hashlib.sha256()
    for q in sorted(p.iterdir()):
        if not q.is_file() or q.name.startswith("."):
            continue
        st = q.stat()
        h.update(q.name.encode())
        if st.st_size <= CONTENT_HASH_LIMIT:
            h.update(q.read_bytes())
        else:
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:10]


def parse_model_spec(text: str) -> ModelSpec:
    """Parse one spec string. Raises ValueError/FileNotFoundError naming the bad part."""
    text = text.strip()
    if not text:
        raise ValueError("empty model spec")
    if Path(text).expanduser().is_dir():
        path = Path(text).expanduser().resolve()
        check_checkpoint_files(path)  # a folder that is not a (whole) checkpoint fails here, naming it
        label = path.name
        return ModelSpec({"checkpoint": str(path)}, label, label)
    args, preset = {}, None
    tokens = [t.strip() for t in text.split(",") if t.strip()]
    if "=" not in tokens[0]:
        preset = tokens.pop(0)
        if preset not in PRESETS:
            raise ValueError(f"unknown model {preset!r}; allowed presets: {sorted(PRESETS)}, "
                             f"key=value pairs ({sorted(DEFAULTS)}) or a checkpoint folder")
        args.update(PRESETS[preset])
    for tok in tokens:
        if "=" not in tok:
            raise ValueError(f"model spec {text!r}: {tok!r} is not key=value (a preset may come only first)")
        k, v = (s.strip() for s in tok.split("=", 1))
        if k not in DEFAULTS:
            raise ValueError(f"model spec {text!r}: unknown key {k!r}; allowed: {sorted(DEFAULTS)}")
        args[k] = _parse_value(k, v)
    spec = ModelSpec(args)
    if spec.full["mechanism"] == "none" and not (spec.full["window"] or spec.full["sinks"]):
        raise ValueError(f"model spec {text!r}: mechanism=none needs a window and/or sinks")
    label = text if preset is None or len(tokens) else preset
    return replace(spec, label=label, family=label)


def parse_models(text: str) -> list[ModelSpec]:
    """';'-separated specs -> list, duplicates (same canonical key) dropped."""
    out, seen = [], set()
    for part in text.split(";"):
        if part.strip():
            spec = parse_model_spec(part)
            if spec.key not in seen:
                seen.add(spec.key)
                out.append(spec)
    if not out:
        raise ValueError("no model given; e.g. --models 'full;gdn-default'")
    return out


def window_only(base_spec: ModelSpec) -> ModelSpec:
    """The untrained window+sink attention on the same backbone (no linear state)."""
    return ModelSpec({"base": base_spec.base_name, "dtype": base_spec.full["dtype"], "mechanism": "none"},
                     WINDOW_ONLY_LABEL, WINDOW_ONLY_LABEL)


def full_attention(base_spec: ModelSpec) -> ModelSpec:
    a = base_spec.full
    args = {"base": base_spec.base_name} | ({"dtype": a["dtype"]} if a["dtype"] != DEFAULTS["dtype"] else {})
    return ModelSpec(args, "full", "full")
