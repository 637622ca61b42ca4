"""Human units shared by the core's messages and the renderers."""

from __future__ import annotations


def ago(seconds: float) -> str:
    """A duration as people say it: 45s, 25 min, 3.5 h, 2 days."""
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"
