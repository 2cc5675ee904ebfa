"""The cache-policy registry: what the softmax path of a linearized layer keeps inside its cache budget.

`retain=0` (the default recipe) is the policy "window_sinks"; with `retain > 0` retention slots, `retain_score`
names the policy that scores tokens for them. A policy is one file (a dataclass subclassing
models.cache.policies.base.CachePolicy, or models.cache.policies.retention_slots.RetentionSlots with one scoring method)
and one line in BUILTIN; code outside the package (a test, an experiment) adds one with `register_policy` (and
removes it with `unregister_policy`).
This module imports no torch (models.spec validates `retain_score` against `retention_scores()`): the built-in
policies load on first use.
"""
from __future__ import annotations

import importlib

WINDOW_SINKS = "window_sinks"  # the policy of retain=0
BUILTIN = {  # name -> "module:class"
    WINDOW_SINKS: "golinear.models.cache.policies.window_sinks:WindowSinks",
    "delta_error": "golinear.models.cache.policies.delta_error:DeltaError",
    "proj_residual": "golinear.models.cache.policies.proj_residual:ProjResidual",
    "fitted": "golinear.models.cache.policies.fitted:Fitted",
}
_registered: dict[str, type] = {}

__all__ = ["BUILTIN", "WINDOW_SINKS", "make_policy", "policy_class", "policy_names", "register_policy",
           "retention_scores", "unregister_policy"]


def register_policy(name: str, cls: type) -> type:
    """Add a policy class under `name` (then `retain_score=name` selects it); returns cls. A built-in name or
    one already registered to another class is refused."""
    from golinear.models.cache.policies.base import CachePolicy
    if not (isinstance(cls, type) and issubclass(cls, CachePolicy)):
        raise TypeError(f"policy {name!r} must be a CachePolicy subclass, got {cls!r}")
    if name in BUILTIN or _registered.get(name, cls) is not cls:
        raise ValueError(f"cache policy {name!r} is already registered")
    _registered[name] = cls
    cls.name = name
    return cls


def unregister_policy(name: str) -> None:
    """Remove a policy `register_policy` added (a test's, an experiment's); built-in names cannot be removed."""
    if name not in _registered:
        raise ValueError(f"cache policy {name!r} was not added with register_policy")
    del _registered[name]


def policy_names() -> tuple[str, ...]:
    """Every policy name: the built-in ones, then the registered ones in registration order."""
    return tuple(BUILTIN) + tuple(n for n in _registered if n not in BUILTIN)


def retention_scores() -> tuple[str, ...]:
    """The names `retain_score` accepts (every policy but window_sinks)."""
    return tuple(n for n in policy_names() if n != WINDOW_SINKS)


def policy_class(name: str) -> type:
    """The class registered under `name`; a one-line error naming the allowed ones otherwise."""
    if name in _registered:
        return _registered[name]
    if name not in BUILTIN:
        raise ValueError(f"cache policy {name!r} is not registered; allowed: {list(policy_names())}")
    module, cls = BUILTIN[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_policy(retain: int = 0, retain_score: str = "delta_error", scorer: tuple | None = None):
    """The policy a layer composes: window_sinks for retain=0, else `retain_score`'s with `retain` slots per KV
    head (`scorer`, a fitted scorer's (weight [Hkv, D/2], bias [Hkv]), only for a policy that reads one)."""
    if not retain:
        return policy_class(WINDOW_SINKS)()
    cls = policy_class(retain_score)
    if cls.reads_scorer != (scorer is not None):
        raise ValueError(f"retain_score={retain_score} needs a scorer (weight [Hkv, D/2], bias [Hkv]), and only it"
                         if cls.reads_scorer else f"retain_score={retain_score} reads no scorer")
    return cls(slots=retain, scorer=scorer) if cls.reads_scorer else cls(slots=retain)
