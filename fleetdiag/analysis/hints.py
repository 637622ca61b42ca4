"""Hints from a signature, filled with facts about the host when they are known.

A generic hint says what to check; with the host's facts (visible GPUs, the
parallel sizes from the command line) it can say what is wrong. Missing or
odd facts fall back to the generic text, never to an error.
"""

from __future__ import annotations

import re
from typing import Any

from .rules import Signature

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_COND = re.compile(r"^\s*([A-Za-z_]\w*)\s*(>=|<=|==|!=|>|<)\s*([A-Za-z_]\w*|-?\d+)\s*$")


def _as_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def derive(facts: dict[str, Any] | None) -> dict[str, Any]:
    """Fields a hint can use: tp, dp, pp, workers, visible_gpus, cuda_visible_devices, gpus.

    The facts are the probe's (``fleetdiag.facts``): ``parallel`` already holds
    the sizes read from the serving command line or the log.
    """
    out: dict[str, Any] = {}
    if not isinstance(facts, dict):
        return out
    for k, v in facts.items():
        if isinstance(k, str) and isinstance(v, (str, int, float)) and not isinstance(v, bool):
            out[k] = v
    cvd = facts.get("cuda_visible_devices", facts.get("CUDA_VISIBLE_DEVICES"))
    if isinstance(cvd, (list, tuple)):
        cvd = ",".join(str(x) for x in cvd)
    if isinstance(cvd, str) and cvd.strip():
        cvd = cvd.strip()
        out["cuda_visible_devices"] = cvd
        out["visible_gpus"] = len([x for x in cvd.split(",") if x.strip()])
    gpus = facts.get("gpus")
    if isinstance(gpus, (list, tuple)):
        out["gpus"] = len(gpus)
        out.setdefault("visible_gpus", len(gpus))
    elif _as_int(gpus) is not None:
        out["gpus"] = _as_int(gpus)
        out.setdefault("visible_gpus", _as_int(gpus))
    par = facts.get("parallel")
    sizes: dict[str, int] = {}
    if isinstance(par, dict):
        for key in ("tp", "dp", "pp"):
            n = _as_int(par.get(key))
            if n is not None and n > 0:
                sizes[key] = n
    if sizes:
        sizes.setdefault("tp", 1)
        sizes.setdefault("dp", 1)
        sizes.setdefault("pp", 1)
        out.update(sizes)
        out["workers"] = sizes["tp"] * sizes["dp"] * sizes["pp"]
    return out


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
