"""The name under which a Hugging Face model's forward takes its KV cache: `past_key_values` up to transformers
5.23, `cache` from 5.24 on (5.24-5.39 still accept the old name with a warning on every call; 5.40 removes it).
golinear's calls pass the cache under the name the installed version's forward declares, so they run on every
version pyproject.toml admits (tests/test_transformers_versions.py runs them on the lowest)."""
from __future__ import annotations

import functools
import inspect


@functools.cache
def _name(forward_owner: type) -> str:
    return "cache" if "cache" in inspect.signature(forward_owner.forward).parameters else "past_key_values"


def cache_kwarg(module, cache) -> dict:
    """{name: cache} for `module(...)` (a *ForCausalLM or its inner *Model)."""
    return {_name(type(module)): cache}


def returned_cache(output):
    """The cache a forward returned (`cache` from 5.24 on, `past_key_values` before)."""
    return getattr(output, "cache", None) or output.past_key_values
