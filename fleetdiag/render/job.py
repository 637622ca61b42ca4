"""A multi-host answer: each job's root cause with its card, then one card per group in trouble."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text

from ..records import (
    HostResult,
)
from .card import host_card


def troubles(results: list[HostResult], rcs: list[Any]) -> tuple[list[tuple[Any, HostResult]], list[Any]]:
    """What a multi-host answer shows, in order: each job's root cause with its root host's result,
    then the groups (``store.CauseGroup``) of the other hosts in trouble, one per root cause."""
    from ..store import group_by_cause, incident_key

    by_host = {r.host: r for r in results}
    roots: list[tuple[Any, HostResult]] = []
    done: set[str] = set()
    for rc in rcs:
        root = by_host.get(rc.host)
        if root is None:
            continue
        roots.append((rc, root))
        done.add(rc.host)
        done.update(rc.affected)
    groups = [
        g for g in group_by_cause(r for r in results if r.host not in done) if incident_key(g.example) is not None
    ]
    return roots, groups


def job_cards(results: list[HostResult], rcs: list[Any]) -> list[RenderableType]:
    """One card per root cause: each job's root first (its line, its card, its consequences
    folded under it), then one card per group of the other hosts in trouble."""
    from ..inventory import fold
    from ..job import consequence_text, summary_line

    out: list[RenderableType] = []
    roots, groups = troubles(results, rcs)
    for rc, root in roots:
        out.append(Text(summary_line(rc), style="bold red"))
        for ev in rc.evidence:  # what the nodes recorded: the root's error file, the Flight Recorder dumps, RAS
            out.append(Text(f"  {ev}", style="bold"))
        out.append(host_card(root))
        if rc.consequences:
            bits = [consequence_text(h, k, d) for h, k, d in rc.consequences]
            out.append(
                Text(
                    f"  failed as a consequence of {rc.host}: " + ", ".join(bits) + " (their cards: --all-cards)",
                    style="bold",
                )
            )
    for g in groups:
        out.append(host_card(g.example))
        if len(g.results) > 1:
            out.append(Text(f"  same root cause on {len(g.results) - 1} more: {fold(g.hosts[1:])}", style="bold"))
    return out
