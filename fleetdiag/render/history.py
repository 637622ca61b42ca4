"""The history's words: a sweep's news (new, changed, resolved incidents), the incidents table and
its narrow form, the recurring troubles (lemons)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from .. import units
from ..records import VERDICTS, HostResult
from ..store import Change, Changes, describe, group_by_cause, incident_key
from ..units import ago
from .card import ICON, STYLE, plural

_when = units.when


_KIND_STYLE = {"NEW": "bold red", "CHANGED": "bold yellow", "RESOLVED": "bold green", "NOW": "bold"}


def _fold(hosts: list[str]) -> str:
    from ..inventory import fold

    return fold(hosts)


def _entry(kind: str, hosts: list[str], verdict: str, text: str, width: int, extra: list[str]) -> Text:
    line = Text()
    line.append(f"{kind:<9}", style=_KIND_STYLE.get(kind, "bold"))
    line.append(f" {_fold(hosts):<{width}}", style="bold")
    line.append(f"  {verdict:<11}", style=STYLE.get(verdict, ""))
    line.append(f"  {text}")
    for e in extra:
        line.append("\n" + " " * 10 + e, style="dim")
    return line


def _detail(rec: dict[str, Any] | None) -> list[str]:
    """Category and hint of a stored record, one short line."""
    d = (rec or {}).get("decisive") or {}
    bits = [
        b
        for b in (
            d.get("category") if d.get("category") != "other" else None,
            f"hint: {d['hint']}" if d.get("hint") else None,
        )
        if b
    ]
    job = ((rec or {}).get("facts") or {}).get("job") or {}
    if job.get("role") == "root":  # the job's one incident (fleetdiag.job)
        bits.insert(
            0,
            "job root cause"
            + (f" (rank {job['rank']})" if job.get("rank") is not None else "")
            + f"; {len(job.get('affected') or [])} other host(s) failed as a consequence: "
            + _fold(list(job.get("affected") or [])),
        )
    elif job.get("role") == "consequence":
        bits.insert(0, f"a consequence of {job.get('root')} (job root cause)")
    return [" · ".join(bits)] if bits else []


def news_of(changes: Changes) -> Changes:
    """``changes`` with each incident's record cut to what ``change_lines`` reads of it (the decisive
    line's category and hint, the job): a copy to show costs a few hundred bytes a host, not a whole
    result's JSON."""

    def slim(c: Change) -> Change:
        return dataclasses.replace(c, incident=dataclasses.replace(c.incident, record=_detail_part(c.incident.record)))

    return Changes(
        new=[slim(c) for c in changes.new],
        changed=[slim(c) for c in changes.changed],
        resolved=[slim(c) for c in changes.resolved],
        sweep_id=changes.sweep_id,
    )


def _detail_part(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    if not rec:
        return None
    d = rec.get("decisive") or {}
    job = (rec.get("facts") or {}).get("job")
    return {
        "decisive": {k: d[k] for k in ("category", "hint") if k in d} if isinstance(d, dict) else {},
        "facts": {"job": job} if job else {},
    }


def change_lines(changes: Changes) -> list[Text]:
    """New, changed and resolved incidents, hosts with the same fingerprint on one line."""
    entries: list[tuple[str, list[str], str, str, list[str]]] = []

    def grouped(items: list[Change], key) -> list[list[Change]]:
        groups: dict[Any, list[Change]] = {}
        for c in items:
            groups.setdefault(key(c), []).append(c)
        return sorted(
            groups.values(),
            key=lambda g: (
                VERDICTS.index(g[0].incident.verdict) if g[0].incident.verdict in VERDICTS else 99,
                g[0].host,
            ),
        )

    for g in grouped(changes.new, lambda c: c.incident.fingerprint):
        inc = g[0].incident
        extra = _detail(inc.record)
        again = [c for c in g if c.recurred]
        if again:
            extra.append(
                f"back again: first seen {_when(min(c.incident.first_seen for c in again))}, resolved in between"
            )
        entries.append(("NEW", [c.host for c in g], inc.verdict, inc.summary, extra))
    for g in grouped(changes.changed, lambda c: (c.previous.fingerprint if c.previous else "", c.incident.fingerprint)):
        inc, prev = g[0].incident, g[0].previous
        extra = _detail(inc.record)
        if prev is not None:
            extra.append(f"was {prev.verdict}: {prev.summary}")
        entries.append(("CHANGED", [c.host for c in g], inc.verdict, inc.summary, extra))
    for g in grouped(changes.resolved, lambda c: (c.incident.fingerprint, c.verdict)):
        inc = g[0].incident
        lasted = max((c.incident.resolved_at or c.incident.last_seen) - c.incident.since for c in g)
        entries.append(
            (
                "RESOLVED",
                [c.host for c in g],
                g[0].verdict or "ok",
                f"was {inc.verdict}: {inc.summary}",
                [f"lasted {ago(lasted)}, seen in {max(c.incident.count for c in g)} sweep(s)"],
            )
        )
    width = max((len(_fold(h)) for _, h, _, _, _ in entries), default=0)
    return [_entry(k, h, v, t, width, x) for k, h, v, t, x in entries]


def current_lines(results: list[HostResult]) -> list[Text]:
    """Every host in trouble now (when the history cannot say what is new)."""
    groups = [g for g in group_by_cause(results) if incident_key(g.example) is not None]
    width = max((len(g.folded) for g in groups), default=0)
    return [_entry("NOW", g.hosts, g.verdict, describe(g.example), width, []) for g in groups]


def fleet_line(results: list[HostResult], report: Any = None) -> str:
    """A sweep's last line: the fleet's counts, and where its report went."""
    counts = {v: sum(1 for r in results if r.verdict == v) for v in VERDICTS}
    head = " · ".join(f"{n} {v}" for v, n in counts.items() if n)
    where = f" · report {report}" if report else ""
    return f"{plural(len(results), 'host')}: {head}{where}"


def history_table(incidents: list[Any], path: Path) -> Table:
    """Incidents, one row each: state, cause, first and last seen, count, resolved."""
    now = time.time()
    n_open = sum(1 for i in incidents if i.open)
    table = Table(title=f"{len(incidents)} incidents ({n_open} open) from {path}", title_justify="left")
    for col, kw in (
        ("host", {"no_wrap": True, "style": "bold"}),
        ("state", {"no_wrap": True}),
        ("cause", {"overflow": "fold"}),
        ("first seen", {"no_wrap": True}),
        ("last seen", {"no_wrap": True}),
        ("count", {"justify": "right"}),
        ("resolved", {"no_wrap": True}),
    ):
        table.add_column(col, **kw)
    for i in incidents:
        state = (
            Text(f"{ICON.get(i.verdict, '')} {i.verdict}", style=STYLE.get(i.verdict, ""))
            if i.open
            else Text(f"✓ was {i.verdict}", style="dim")
        )
        table.add_row(
            Text(i.host),
            state,
            Text(i.summary),
            _when(i.first_seen),
            f"{ago(now - i.last_seen)} ago",
            str(i.count),
            _when(i.resolved_at) if i.resolved_at is not None else "open",
        )
    return table


def history_lines(incidents: list[Any], path: Path) -> list[Text]:
    """The history table's rows as lines, for a width the table does not fit: the cause on its own line."""
    now = time.time()
    n_open = sum(1 for i in incidents if i.open)
    lines = [Text(f"{len(incidents)} incidents ({n_open} open) from {path}")]
    for i in incidents:
        state = (
            Text(f"{ICON.get(i.verdict, '')} {i.verdict}", style=STYLE.get(i.verdict, ""))
            if i.open
            else Text(f"✓ was {i.verdict}", style="dim")
        )
        head = Text.assemble(
            (i.host, "bold"),
            "  ",
            state,
            f"  ×{i.count}  first {_when(i.first_seen)}  last {ago(now - i.last_seen)} ago  "
            f"{'resolved ' + _when(i.resolved_at) if i.resolved_at is not None else 'open'}",
        )
        lines.append(head)
        lines.append(Text(f"  {i.summary}"))
    return lines


def lemon_lines(recs: list[Any], recur: int) -> list[Text]:
    """``history --lemons`` as text: who keeps coming back, then one line per host and trouble."""
    from ..inventory import fold

    if not recs:
        return []
    out = [
        Text(
            f"{len(recs)} recurring: {fold(sorted({r.host for r in recs}))} (drain and inspect: a reboot "
            "or a new job did not fix them)",
            style="bold",
        )
    ]
    for r in recs:
        out.append(
            Text.assemble(
                (r.host, "bold"),
                "  ",
                (f"{ICON.get(r.verdict, '')} {r.verdict}", STYLE.get(r.verdict, "")),
                f"  {r.lemon(recur)}  ·  {r.sweeps} sweep(s), last {_when(r.last_seen)}",
            )
        )
        out.append(Text(f"  {r.summary}"))
    return out
