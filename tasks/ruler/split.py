"""Where a RULER prompt's question begins: the context/question split that question-agnostic KV-cache compression
needs (the context is compressed before the question is read, as a linearized model reads it).

The split comes from the task's own template (constants.TEMPLATES): everything before the literal text that follows
`{context}` is the context; the rest (the question and the answer prefix) is the question. The last occurrence is
taken, since QA templates repeat their instruction before the documents.
"""
from __future__ import annotations

import re

from .api import TASKS
from .constants import TEMPLATES


def single_needle(template: str) -> str:
    """The rewording NIAH applies to its template when one value is asked for (niah.py, as RULER's niah.py)."""
    for a, b in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        template = template.replace(a, b)
    return template


def question_literals(family: str) -> list[str]:
    """The template's fixed text right after `{context}`, up to its next placeholder (for NIAH also in its
    one-value wording)."""
    templates = [TEMPLATES[family]["template"]]
    if family == "niah":
        templates.append(single_needle(templates[0]))
    literals = [t.split("{context}", 1)[1].split("{", 1)[0] for t in templates]
    if not all(lit.strip() for lit in literals):
        raise ValueError(f"RULER template {family!r} has no fixed text after its context")
    return literals


def question_start(task: str, prompt: str) -> int:
    """The character offset where `prompt`'s question begins, for the golinear RULER task `task`."""
    if task not in TASKS:
        raise ValueError(f"no context/question split for task {task!r}; allowed: the RULER tasks {sorted(TASKS)}")
    literals = question_literals(TASKS[task].family)
    at = max(prompt.rfind(lit) for lit in literals)
    if at < 0:
        raise ValueError(f"task {task!r}: the prompt does not contain its template's question text {literals[0]!r}")
    return at


def fixed_question_text(task: str) -> str:
    """The question's text every sample of `task` shares (the template after `{context}` and the answer prefix, its
    placeholders left out): a lower bound of any sample's question, known before a sample is built."""
    template = TEMPLATES[TASKS[task].family]
    tail = template["template"].split("{context}", 1)[1] + template.get("answer_prefix", "")
    return re.sub(r"\{[^{}]*\}", "", tail)
