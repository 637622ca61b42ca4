"""The records the history gives back: incidents and a sweep's changes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..records import JobRole
from ..units import iso

NEW = "new"
CHANGED = "changed"
RESOLVED = "resolved"


@dataclass
class Trouble:
    """A host's one kind of trouble, as every view of the history names it."""

    host: str
    fingerprint: str
    verdict: str
    summary: str

    def trouble_json(self) -> dict[str, Any]:
        return {"host": self.host, "fingerprint": self.fingerprint, "verdict": self.verdict, "summary": self.summary}


@dataclass
class Incident(Trouble):
    """One (host, fingerprint) trouble and its history."""

    category: str | None
    first_seen: float  # the first sweep that ever saw it
    since: float  # when the current episode began (it may have been resolved and come back)
    last_seen: float
    count: int  # sweeps that saw it
    resolved_at: float | None = None
    record: dict[str, Any] | None = None  # the latest HostResult JSON that showed it
    id: int | None = None

    @property
    def open(self) -> bool:
        return self.resolved_at is None

    @property
    def job(self) -> dict[str, Any] | None:
        """The multi-host job this trouble belongs to (fleetdiag.job), read from its record.

        A job is one incident: its root host's, which carries ``{"role": "root", "rank",
        "affected": [hosts], "why", "time"}``; each host that failed as its consequence keeps
        its own incident (its state resolves on its own) marked ``{"role": "consequence",
        "root": host}``. None outside a job.
        """
        j = ((self.record or {}).get("facts") or {}).get("job")
        if not isinstance(j, dict) or j.get("role") not in ("root", "consequence"):
            return None
        return {k: j[k] for k in JobRole.KEYS if k in j}

    def to_json(self) -> dict[str, Any]:
        return {
            **self.trouble_json(),
            "category": self.category,
            "first_seen": iso(self.first_seen),
            "since": iso(self.since),
            "last_seen": iso(self.last_seen),
            "count": self.count,
            "resolved": iso(self.resolved_at) if self.resolved_at is not None else None,
            "job": self.job,
            "record": self.record,
        }


@dataclass
class Change:
    """One host's news since its previous sweep."""

    kind: str  # new | changed | resolved
    host: str
    incident: Incident  # new/changed: the trouble now; resolved: the one that ended
    previous: Incident | None = None  # changed: the trouble it replaced
    recurred: bool = False  # new: the same trouble was seen before, resolved, and is back
    verdict: str | None = None  # the host's verdict in this sweep

    def to_json(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "host": self.host,
            "verdict": self.verdict,
            "incident": self.incident.to_json(),
            "recurred": self.recurred,
        }
        if self.previous is not None:
            prev = self.previous.to_json()
            prev.pop("record", None)
            out["previous"] = prev
        return out


@dataclass
class Changes:
    new: list[Change] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    resolved: list[Change] = field(default_factory=list)
    sweep_id: int | None = None

    def __bool__(self) -> bool:
        return bool(self.new or self.changed or self.resolved)

    def to_json(self) -> dict[str, Any]:
        return {
            "new": [c.to_json() for c in self.new],
            "changed": [c.to_json() for c in self.changed],
            "resolved": [c.to_json() for c in self.resolved],
        }


def incident_of_row(row: Sequence[Any]) -> Incident:
    (id_, host, fp, verdict, summary, category, first, since, last, count, resolved, record) = row
    return Incident(
        host,
        fp,
        verdict,
        summary,
        category,
        first,
        since,
        last,
        count,
        resolved,
        json.loads(record) if record else None,
        id_,
    )
