"""A stable fingerprint of an error, so the same failure groups across hosts and sweeps.

Two ranks or two hosts print the same failure with different pids, ranks,
addresses, paths and sizes; those are masked before hashing, the words are
kept.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

_MASKS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(rx), repl)
    for rx, repl in (
        (r"\x1b\[[0-9;?]*[A-Za-z]", ""),
        (r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b", "<uuid>"),
        (r"\b\d{4}-\d\d-\d\d[T -]\d\d:\d\d:\d\d(?:[.,:]\d+)*(?:Z|[+-]\d\d:?\d\d)?", "<time>"),
        (r"\b\d\d:\d\d:\d\d(?:[.,]\d+)?\b", "<time>"),
        (r"0x[0-9a-fA-F]+", "<hex>"),
        (r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b", "<ip>"),
        (r"\[[0-9a-fA-F:]*:[0-9a-fA-F:]+\](?::\d+)?", "<ip>"),
        (r"(?:[A-Za-z]:)?(?:[\\/][\w.+@~-]+){2,}[\\/]?", "<path>"),
        (r"\b[0-9a-f]{16,}\b", "<id>"),
        (r"\d+(?:\.\d+)?", "N"),
        (r"\s+", " "),
    )
)


def normalize(message: str) -> str:
    """The message with everything host- or run-specific masked."""
    s = message[:2000]
    for rx, repl in _MASKS:
        s = rx.sub(repl, s)
    return s.strip()


@lru_cache(maxsize=4096)
def fingerprint(kind: str | None, message: str) -> str:
    """Short sha1 of the error's type (or kind) and its normalised message."""
    h = hashlib.sha1(f"{kind or ''}\n{normalize(message)}".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:12]
