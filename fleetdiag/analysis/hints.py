"""Hints from a signature: the rule's text, filled with facts about the host when they are known.

A generic hint says what to check; with the host's facts (visible GPUs, the
parallel sizes from the command line) it can say what is wrong. This module
only fills a rule's ``hint_facts`` templates and checks their ``if``; the
fields and their GPU arithmetic come from ``fleetdiag.facts.hints`` (the one
engine, shared with the probe's refined hint). Missing or odd facts fall
back to the generic text, never to an error.
"""

from __future__ import annotations

import re
from typing import Any

from ..facts.hints import fields as fact_fields
from .rules import Signature

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_COND = re.compile(r"^\s*([A-Za-z_]\w*)\s*(>=|<=|==|!=|>|<)\s*([A-Za-z_]\w*|-?\d+)\s*$")


def _as_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def derive(facts: dict[str, Any] | None) -> dict[str, Any]:
    """Fields a hint can use, from the host's facts: ``fleetdiag.facts.hints.fields`` owns the GPU arithmetic."""
    return fact_fields(facts)


def _holds(cond: str, fields: dict[str, Any]) -> bool:
    m = _COND.match(cond or "")
    if not m:
        return False
    a, op, b = m.groups()
    x = fields.get(a)
    y = fields.get(b, _as_int(b))
    try:
        x, y = float(x), float(y)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return {">": x > y, "<": x < y, ">=": x >= y, "<=": x <= y, "==": x == y, "!=": x != y}[op]


def render(sig: Signature | None, facts: dict[str, Any] | None) -> str | None:
    """The best hint for a signature: the first fact-filled text whose fields are all known."""
    if sig is None:
        return None
    fields = derive(facts)
    for entry in sig.hint_facts:
        text = str(entry.get("text", ""))
        cond = entry.get("if")
        names = _FIELD.findall(text)
        if not text or any(n not in fields for n in names):
            continue
        if cond and not _holds(str(cond), fields):
            continue
        return _FIELD.sub(lambda m: str(fields[m.group(1)]), text)
    return sig.hint
