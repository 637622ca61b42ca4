"""The decisive-error analyzer: why did this GPU node's run die?

``analyze`` takes the (sparse) lines the funnel brought back and returns a
``Diagnosis``: the one line that states the root cause, the process that
wrote it, its traceback, a hint, and the cascade collapsed to counts.
See docs/analysis.md for the method and the rules format.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..records import FAILED, HEALTHY, Decisive, Diagnosis, Line
from .decide import diagnose
from .fingerprint import fingerprint
from .lines import clean, split_text
from .rules import Rules, RulesError, default_rules, load_rules

__all__ = ["Rules", "RulesError", "analyze", "analyze_text", "load_rules"]


def _coerce(lines: Sequence[Any]) -> list[Line]:
    """Lines as records.Line, ordered by position, one per position."""
    if isinstance(lines, list) and all(type(ln) is Line for ln in lines):
        if all(lines[k].pos < lines[k + 1].pos for k in range(len(lines) - 1)):
            if all(isinstance(ln.text, str) and isinstance(ln.pos, int) for ln in lines):
                return lines  # the common case: already clean
    out: list[Line] = []
    for i, ln in enumerate(lines or ()):
        if isinstance(ln, Line):
            text = ln.text if isinstance(ln.text, str) else str(ln.text)
            pos = ln.pos if isinstance(ln.pos, int) else i
            out.append(Line(pos=pos, text=text, lineno=ln.lineno if isinstance(ln.lineno, int) else None))
        elif isinstance(ln, (bytes, bytearray)):
            out.append(Line(pos=i, text=bytes(ln).decode("utf-8", "replace")))
        else:
            out.append(Line(pos=i, text=str(ln)))
    if any(out[k].pos > out[k + 1].pos for k in range(len(out) - 1)):
        out.sort(key=lambda ln: ln.pos)
    uniq: list[Line] = []
    for ln in out:
        if not uniq or ln.pos != uniq[-1].pos:
            uniq.append(ln)
    return uniq


def _analyze(lines: Sequence[Line], rules: Rules | None = None, facts: dict[str, Any] | None = None) -> Diagnosis:
    """The analysis without the safety net (tests call it to find real bugs)."""
    return diagnose(
        _coerce(lines), rules if rules is not None else default_rules(), facts if isinstance(facts, dict) else None
    )


def analyze(lines: Sequence[Line], *, rules: Rules | None = None, facts: dict[str, Any] | None = None) -> Diagnosis:
    """Diagnose one log from its lines (sparse, ordered by ``pos``). Never raises.

    ``facts`` (optional) are what the funnel learnt about the host, such as
    ``cuda_visible_devices``, ``gpus`` and ``parallel`` ({"tp": 2, "dp": 2});
    hints use them when present.
    """
    try:
        return _analyze(lines, rules, facts)
    except Exception as exc:  # a bug here must not cost the user the other hosts' results
        return _fallback(lines, exc)


def analyze_text(text: str | bytes, *, rules: Rules | None = None, facts: dict[str, Any] | None = None) -> Diagnosis:
    """Diagnose a whole log given as text (bytes are decoded with errors='replace')."""
    try:
        lines = split_text(text)
    except Exception as exc:
        return _fallback([], exc)
    return analyze(lines, rules=rules, facts=facts)


_ERRORISH = re.compile(r"Traceback|Error|ERROR|Exception|Killed|Segmentation fault|NCCL WARN")


def _fallback(lines: Sequence[Any], exc: Exception) -> Diagnosis:
    """A degraded answer after an internal error: the last error-shaped line, low confidence."""
    note = f"analyzer error ({type(exc).__name__}: {exc}); please report it with this log"
    try:
        for ln in reversed(list(lines or ())):
            text = clean(getattr(ln, "text", str(ln)))
            if _ERRORISH.search(text[:4096]):
                return Diagnosis(
                    verdict=FAILED,
                    decisive=Decisive(
                        line=text,
                        message=text.strip(),
                        pos=getattr(ln, "pos", None),
                        lineno=getattr(ln, "lineno", None),
                        fingerprint=fingerprint("fallback", text),
                        confidence=0.05,
                        reason=f"last error-shaped line; {note}",
                    ),
                    primary_count=1,
                )
    except Exception:
        pass
    return Diagnosis(verdict=HEALTHY, summary=f"no error found; {note}")
