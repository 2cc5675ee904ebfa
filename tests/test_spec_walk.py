"""A reader follows a spec's rules from bench/run/execute.validate_model in one pass: traced on a preset, a shipped
checkpoint under other cache options and a press, the functions that can refuse (those holding a `raise`) lie in
golinear files entered in an order that comes back to a file already left at most twice; a spec the rules refuse is
refused inside models/spec/."""
from __future__ import annotations

import dis
import functools
import sys
from pathlib import Path

import pytest

from golinear.bench.run import execute
from golinear.bench.run import specs as S

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "checkpoints" / "smollm2-135m" / "gdn-w120-s8-sc"
SPECS = ["gdn-default", f"{CHECKPOINT},window=56,retain=8,retain_score=proj_residual", "press=snapkv,kv_budget=256"]
# refusals outside the spec's rules: the backend's own arguments (device, generation), the backbone's files and
# architecture, which the spec names but does not define, and the file system's limit on a name's length (any path a
# user types, a spec's or a store's): a reader follows the rules without them, so the walk leaves them out
NOT_SPEC_RULES = {"bench/backends/lm_backend.py", "models/backbones/backbone_content.py", "models/backbones/configs.py",
                  "models/backbones/backbone.py", "models/util/path_names.py"}


@pytest.fixture(scope="module", autouse=True)
def backbone_verified_once():
    """The converted backbone's content is hashed at its first check in a process (half a GB): done here, untraced,
    so a traced walk is the rules alone."""
    execute.validate_model(S.parse_model_spec("full"), "cpu")


@functools.cache
def _golinear_file(filename: str) -> str | None:
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    return str(rel) if rel.parts[0] in ("bench", "models", "tasks") else None


def golinear_file(code) -> str | None:
    return _golinear_file(code.co_filename)


def can_refuse(code, known={}) -> bool:
    if code not in known:
        known[code] = any(i.opname == "RAISE_VARARGS" for i in dis.get_instructions(code))
    return known[code]


def traced(spec, on_event):
    def tracer(frame, event, arg):
        on_event(frame, event, arg)
        return tracer if event == "call" else None
    sys.settrace(tracer)
    try:
        execute.validate_model(spec, "cpu")
    finally:
        sys.settrace(None)


def rule_walk(spec) -> list[str]:
    """The golinear files of the functions that can refuse, in the order validate_model enters them (a file entered
    again right after itself counts once; the files of NOT_SPEC_RULES left out)."""
    walk = []

    def on_event(frame, event, arg):
        name = golinear_file(frame.f_code)
        if (event == "call" and name and name not in NOT_SPEC_RULES and can_refuse(frame.f_code)
                and (not walk or walk[-1] != name)):
            walk.append(name)
    traced(spec, on_event)
    return walk


def returns(walk: list[str]) -> int:
    return sum(name in walk[:i] for i, name in enumerate(walk))


def test_counting():
    assert returns(["a", "b", "c"]) == 0 and returns(["a", "b", "a", "c", "b", "a"]) == 3


@pytest.mark.parametrize("text", SPECS)
def test_the_rules_are_followed_in_one_pass(text):
    walk = rule_walk(S.parse_model_spec(text))
    assert walk[0] == "bench/run/execute.py" and "models/spec/backbone_checks.py" in walk, walk
    assert returns(walk) <= 2, walk
    outside = [f for f in walk[1:] if not f.startswith("models/spec/") and f not in NOT_SPEC_RULES]
    assert outside in ([], ["models/kv_compression/presses.py"]), walk  # (the press names kvpress offers)


BAD = [("press=snapkv", "needs kv_budget"),
       ("gdn-default,window=100000", "exceeds the model's max_position_embeddings"),
       (f"{CHECKPOINT},retain=8,retain_score=fitted", "retain_score=fitted needs scorer"),
       (f"{CHECKPOINT},lora=true", "already says how the model is linearized")]


@pytest.mark.parametrize("text,message", BAD, ids=[m for _, m in BAD])
def test_a_refused_spec_is_refused_by_the_spec_package(text, message):
    first = {}  # each exception -> the golinear file of the frame it was raised in

    def on_event(frame, event, arg):
        name = golinear_file(frame.f_code)
        if event == "exception" and name:
            first.setdefault(id(arg[1]), (name, str(arg[1])))
    with pytest.raises(ValueError, match=message) as err:
        traced(S.parse_model_spec(text), on_event)
    raised = [name for name, said in first.values() if said and said in str(err.value) and said != str(err.value)]
    assert raised and all(name.startswith("models/spec/") for name in raised), (raised, str(err.value))
