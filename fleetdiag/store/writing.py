"""Writing one sweep: its results, the incidents they open, change or resolve, the cost memory, pruning."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..job import mark
from ..records import HostResult
from .database import Database
from .incidents import CHANGED, NEW, RESOLVED, Change, Changes, Incident, incident_of_row
from .schema import DEFAULT_KEEP_DAYS, INCIDENT_COLS
from .trouble import describe, incident_key

_BARE_COLS = INCIDENT_COLS.removesuffix(", record")  # every column but the record, in the same order


class Writing(Database):
    """The store's one write: a sweep."""

    def record_sweep(
        self,
        results: Sequence[HostResult],
        *,
        started: float,
        finished: float | None = None,
        selector: str = "",
        report: str | None = None,
        interrupted: bool = False,
        unknown: Iterable[str] = (),
        costs: dict[str, tuple[float | None, float | None]] | None = None,
        keep_days: float | None = DEFAULT_KEEP_DAYS,
        root_causes: Sequence[Any] | None = None,
    ) -> Changes:
        """Record one sweep's results and return what changed, in one transaction.

        ``unknown`` names hosts whose state this sweep could not learn (the
        user interrupted them): their result is kept, their incidents are not
        touched. ``costs`` (the scheduler's memory) replaces the stored costs
        of the hosts it names. Rows older than ``keep_days`` are pruned
        (incidents are kept: they are small and they are the history). ``root_causes``
        (fleetdiag.job's, for these results) mark each job's hosts before they are kept: a job is
        one incident, its root host's.
        """
        if root_causes is not None:
            mark(results, root_causes)
        now = started
        unknown = set(unknown)
        changes = Changes()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO sweeps (started, finished, selector, hosts, interrupted, report) VALUES (?, ?, ?, ?, ?, ?)",
                (started, finished or time.time(), selector, len(results), int(interrupted), report),
            )
            changes.sweep_id = sweep_id = cur.lastrowid
            opened = {i.host: i for i in self._open_in(db, [r.host for r in results])}
            for res in results:
                key = incident_key(res)
                doc = None if key is None else res.to_json()
                record = None if doc is None else json.dumps(doc)
                db.execute(
                    "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        sweep_id,
                        res.host,
                        res.verdict,
                        key,
                        describe(res),
                        res.timing.rtt_ms,
                        res.timing.total_ms,
                        record,
                    ),
                )
                if res.host in unknown:
                    continue
                change = self._apply(db, res, key, record, doc, opened.get(res.host), now)
                if change is not None:
                    getattr(changes, change.kind).append(change)
            for host, (rtt, cost) in (costs or {}).items():
                db.execute(
                    "INSERT INTO host_costs (host, rtt_ms, cost_ms, updated) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(host) DO UPDATE SET rtt_ms = excluded.rtt_ms, cost_ms = excluded.cost_ms, "
                    "updated = excluded.updated",
                    (host, rtt, cost, now),
                )
            if keep_days:
                cutoff = now - keep_days * 86400
                db.execute("DELETE FROM results WHERE sweep IN (SELECT id FROM sweeps WHERE started < ?)", (cutoff,))
                db.execute("DELETE FROM sweeps WHERE started < ?", (cutoff,))
        return changes

    @staticmethod
    def _open_in(db: sqlite3.Connection, hosts: list[str]) -> list[Incident]:
        """The hosts' open incidents without their records (read only for those that end: a record
        is a whole result, and a fleet's open incidents would otherwise all be held at once)."""
        out: list[Incident] = []
        for i in range(0, len(hosts), 500):  # stay under SQLite's variable limit
            chunk = hosts[i : i + 500]
            rows = db.execute(
                f"SELECT {_BARE_COLS} FROM incidents WHERE resolved_at IS NULL AND host IN ({','.join('?' * len(chunk))})",
                chunk,
            )
            out += [incident_of_row((*r, None)) for r in rows]
        return out

    @staticmethod
    def _with_record(db: sqlite3.Connection, inc: Incident) -> Incident:
        row = db.execute("SELECT record FROM incidents WHERE id = ?", (inc.id,)).fetchone()
        inc.record = json.loads(row[0]) if row and row[0] else None
        return inc

    def _apply(
        self,
        db: sqlite3.Connection,
        res: HostResult,
        key: str | None,
        record: str | None,
        doc: dict[str, Any] | None,
        prev: Incident | None,
        now: float,
    ) -> Change | None:
        """``record`` is ``doc`` (the result's JSON) as stored; the change keeps ``doc`` itself, not the
        stored text read back and parsed again: a second copy of every new incident's result."""
        if key is None:
            if prev is None:
                return None
            db.execute("UPDATE incidents SET resolved_at = ? WHERE id = ?", (now, prev.id))
            prev.resolved_at = now
            return Change(RESOLVED, res.host, self._with_record(db, prev), verdict=res.verdict)
        summary = describe(res)
        category = res.decisive.category if res.decisive is not None else None
        if prev is not None and prev.fingerprint == key:
            db.execute(
                "UPDATE incidents SET last_seen = ?, count = count + 1, verdict = ?, summary = ?, category = ?, "
                "record = ? WHERE id = ?",
                (now, res.verdict, summary, category, record, prev.id),
            )
            return None
        if prev is not None:  # the host's trouble is a different one now: the old one has ended
            db.execute("UPDATE incidents SET resolved_at = ? WHERE id = ?", (now, prev.id))
            prev.resolved_at = now
        row = db.execute(
            f"SELECT {_BARE_COLS} FROM incidents WHERE host = ? AND fingerprint = ?", (res.host, key)
        ).fetchone()
        recurred = row is not None
        if recurred:
            db.execute(
                "UPDATE incidents SET resolved_at = NULL, since = ?, last_seen = ?, count = count + 1, verdict = ?, "
                "summary = ?, category = ?, record = ? WHERE id = ?",
                (now, now, res.verdict, summary, category, record, row[0]),
            )
        else:
            db.execute(
                "INSERT INTO incidents (host, fingerprint, verdict, summary, category, first_seen, since, last_seen, "
                "count, resolved_at, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, NULL, ?)",
                (res.host, key, res.verdict, summary, category, now, now, now, record),
            )
        cur = incident_of_row(
            (
                *db.execute(
                    f"SELECT {_BARE_COLS} FROM incidents WHERE host = ? AND fingerprint = ?", (res.host, key)
                ).fetchone(),
                None,
            )
        )
        cur.record = doc
        if prev is not None:
            return Change(CHANGED, res.host, cur, previous=prev, recurred=recurred, verdict=res.verdict)
        return Change(NEW, res.host, cur, recurred=recurred, verdict=res.verdict)
