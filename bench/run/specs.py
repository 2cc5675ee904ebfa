"""Model specs as the runner uses them: models.spec.ModelSpec (the one schema: parsing, model_args, store key)
plus a human label and the family a budget variant belongs to.

A spec string is a named preset (``full``, ``gdn-default``, ...), ``key=value`` pairs, a preset followed by
overrides (``gdn-default,window=120``), or a checkpoint folder (models.spec.ModelSpec.from_string).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from golinear.models import spec as schema
from golinear.models.util.path_names import is_folder
from golinear.models.spec import PRESETS  # noqa: F401 - the runner's help lists the presets

WINDOW_ONLY_LABEL = "untrained window + sinks"  # mechanism=none: every table, plot and page names it so


@dataclass(frozen=True)
class ModelSpec(schema.ModelSpec):
    """A model configuration with a label (table rows) and a family (label without the cache budget)."""
    label: str = ""
    family: str = ""

    @property
    def args(self) -> dict:
        """The keys given (non-default values, and base when named)."""
        return self.given()

    @property
    def full(self) -> dict:
        """Every string key with its value (defaults filled in; base: the given one or the default)."""
        return {k: (self.base or schema.DEFAULT_BASE) if k == "base" else getattr(self, k) for k in schema.STRING_KEYS}

    @property
    def key(self) -> str:
        """Canonical identity in the result store."""
        return self.store_key()

    def model_args(self) -> dict:
        """Arguments for the lm-eval backend."""
        return self.to_model_args()

    def with_budget(self, budget: int, sinks: int, family: str | None = None, **changes) -> "ModelSpec":
        """The same model evaluated with `sinks` sink tokens, its retention slots (if any) kept, and a window
        filling the rest of `budget` (budget = sinks + window + retain, as ModelSpec.budget counts it)."""
        fam = family or self.family or self.label
        if self.press is not None:  # a compressed cache: the press keeps `budget` entries (no sinks of its own)
            return replace(self, **changes, kv_budget=budget, label=f"{fam} @{budget}", family=fam)
        retain = changes.get("retain", self.checkpoint_linearize().get("retain", 0) if self.checkpoint else self.retain)
        if budget <= sinks + retain:
            slots = f" + {retain} retention slots" if retain else ""
            raise ValueError(f"cache budget {budget} must exceed the {sinks} sink tokens{slots}")
        return replace(self, **changes, sinks=sinks, window=budget - sinks - retain, label=f"{fam} @{budget}",
                       family=fam)


def scorer_by_file_name(text: str) -> list[str]:
    """A spec string's comma-separated parts, a `scorer=` file named by its file name alone (the store keys the
    file's contents, so two paths to one file are one scorer)."""
    return [f"scorer={Path(t.split('=', 1)[1].strip()).name}" if t.split("=")[0].strip() == "scorer" else t
            for t in (t.strip() for t in text.split(",")) if t]


def label_of(text: str) -> str:
    """A spec string's label: a checkpoint folder's name, a bare preset's name, else the text itself (a scorer file
    by its name: the store keys its contents)."""
    text = text.strip()
    if is_folder(text):
        return Path(text).expanduser().resolve().name
    tokens = scorer_by_file_name(text)
    if "=" not in tokens[0] and is_folder(tokens[0]):  # a checkpoint with cache options
        return ",".join([Path(tokens[0]).expanduser().resolve().name, *tokens[1:]])
    return tokens[0] if len(tokens) == 1 and "=" not in tokens[0] else ",".join(tokens)


def press_label(spec) -> str:
    """A KV-cache compression row's name in tables: the press, the library, and question-aware when it is."""
    notes = ["question-aware"] * spec.question_aware + [f"chunked prefill {spec.prefill_chunk}"] * bool(spec.prefill_chunk)
    return f"{spec.press} (kvpress{''.join(', ' + n for n in notes)})"


def parse_model_spec(text: str) -> ModelSpec:
    """Parse one spec string. Raises ValueError/FileNotFoundError naming the bad part."""
    label = label_of(text)
    spec = ModelSpec.from_string(text, label=label, family=label)
    if spec.press is not None:
        fam = press_label(spec)
        return replace(spec, label=f"{fam} @{spec.kv_budget}" if spec.kv_budget else fam, family=fam)
    return spec


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


def window_only(base_spec: ModelSpec, budget: int, sinks: int) -> ModelSpec:
    """The untrained window+sink attention on the same backbone (no linear state) at cache budget `budget`."""
    return full_attention(base_spec).with_budget(budget, sinks, family=WINDOW_ONLY_LABEL, mechanism="none")


def full_attention(base_spec: ModelSpec) -> ModelSpec:
    return ModelSpec(base=base_spec.base_name, dtype=base_spec.dtype, label="full", family="full")

