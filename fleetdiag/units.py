"""Human units, one owner: every duration, size and time as fleetdiag writes or reads it.

Shared by the core's messages and the renderers (no UI library here). The
inventory and the command line read durations with ``parse_duration``; cards,
tables, sweeps and watch write them with ``ago``/``ms``; sizes are ``size``
(what was read back) and ``gib``/``mib`` (GPU memory, powers of 1024).
"""

from __future__ import annotations

import math
import re
import signal as _signal
import time
from typing import Any


def ago(seconds: float) -> str:
    """A duration as people say it: 45s, 25 min, 3.5 h, 2 days."""
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def ms(value: float | None) -> str:
    """Milliseconds for a timing: 42 ms, 12.3 s; ``-`` when unknown."""
    if value is None:
        return "-"
    return f"{value:.0f} ms" if value < 10000 else f"{value / 1000:.1f} s"


def size(n: float | None) -> str:
    """Bytes read back or cut: 0 B, 512 B, 1.5 KB, 2.0 MB, 3.1 GB (powers of 1024)."""
    if not n:
        return "0 B"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"  # pragma: no cover (the loop always returns)


def gib(g: float) -> str:
    """GPU memory in GiB: 138.00 → "138 GiB", 139.81 → "139.8 GiB", 0.098 → "98 MiB"."""
    if g < 1:
        return f"{g * 1024:.0f} MiB"
    s = f"{g:.1f}".rstrip("0").rstrip(".")
    return f"{s} GiB"


def mib(m: float) -> str:
    """GPU memory given in MiB (as nvidia-smi reports it), written like ``gib``."""
    return gib(m / 1024)


def iso(t: float | None) -> str | None:
    """A unix time as local ISO 8601 with offset (reports, history JSON); None stays None."""
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


def when(t: float | None) -> str:
    """A unix time for a table cell: 2026-05-09 15:16; ``-`` when unknown."""
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


_DUR_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)", re.I)
_DUR_FULL = re.compile(r"\s*(?:(?:\d+(?:\.\d*)?|\.\d+)\s*(?:ms|s|m|h|d)\s*)+", re.I)
_DUR_MULT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(v: Any) -> float:
    """Seconds from ``90s``/``10m``/``2h``/``90d``/``1h30m``/``500ms`` or a number of seconds.

    Raises ValueError (the inventory loader turns it into a located error, the CLI into a usage error).
    """
    if isinstance(v, bool):
        raise ValueError(f"expected a duration like 90s, 10m, 1h or seconds, got {v!r}")
    if isinstance(v, (int, float)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"duration must be a non-negative number, got {v!r}")
        return float(v)
    if isinstance(v, str):
        s = v.strip()
        try:
            f = float(s)
        except ValueError:
            pass
        else:
            if math.isfinite(f) and f >= 0:
                return f
            raise ValueError(f"duration must be a non-negative number, got {v!r}")
        if _DUR_FULL.fullmatch(s):
            return sum(float(n) * _DUR_MULT[u.lower()] for n, u in _DUR_PART.findall(s))
    raise ValueError(f"expected a duration like 90s, 10m, 1h or seconds, got {v!r}")


def signal_name(sig: int) -> str:
    """A signal's name as launchers and shells report it (9 -> ``SIGKILL``); ``signal N`` when unknown."""
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
