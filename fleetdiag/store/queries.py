"""Reading the history: costs, incidents, recurrences (the lemon view's rows), hosts, sweeps."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .database import Database
from .incidents import Incident, incident_of_row
from .lemons import BOOT_SLACK, Recurrence, boot_of
from .schema import INCIDENT_COLS


class Queries(Database):
    """The store's reads."""

    def costs(self) -> dict[str, tuple[float | None, float | None]]:
        """host -> (rtt_ms, cost_ms) as the scheduler's CostMemory keeps them."""
        assert self.db is not None
        with self._errors():
            return {h: (r, c) for h, r, c in self.db.execute("SELECT host, rtt_ms, cost_ms FROM host_costs")}

    def open_incidents(self, hosts: Iterable[str] | None = None) -> dict[str, Incident]:
        """host -> its open incident."""
        return {i.host: i for i in self.incidents(hosts, open_only=True)}

    def incidents(
        self,
        hosts: Iterable[str] | None = None,
        open_only: bool = False,
        since: float | None = None,
        until: float | None = None,
        verdicts: Iterable[str] | None = None,
    ) -> list[Incident]:
        """Incidents, open ones first, most recently seen first. ``since``/``until`` keep those whose
        time (first seen to last seen, or still open) overlaps the window; ``verdicts`` those in them."""
        assert self.db is not None
        sql = f"SELECT {INCIDENT_COLS} FROM incidents"
        where: list[str] = []
        args: list[Any] = []
        if open_only:
            where.append("resolved_at IS NULL")
        if since is not None:
            where.append("(last_seen >= ? OR resolved_at IS NULL OR resolved_at >= ?)")
            args += [since, since]
        if until is not None:
            where.append("first_seen <= ?")
            args.append(until)
        for column, values in (("verdict", verdicts), ("host", hosts)):
            if values is not None:  # an empty list selects nothing
                vs = list(dict.fromkeys(values))
                if not vs:
                    return []
                where.append(f"{column} IN ({','.join('?' * len(vs))})")
                args += vs
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY resolved_at IS NOT NULL, last_seen DESC, host"
        with self._errors():
            return [incident_of_row(row) for row in self.db.execute(sql, args)]

    def recurrences(
        self, hosts: Iterable[str] | None = None, since: float | None = None, until: float | None = None
    ) -> list[Recurrence]:
        """Each (host, trouble) as the kept sweeps saw it: how many separate episodes (seen, gone,
        back) and on how many boots of the host (a trouble that survives a reboot is the node's,
        not the job's). The "lemon node" view is built from these; pure SQL over ``results``."""
        assert self.db is not None
        sql = "SELECT r.sweep, r.host, r.fingerprint, r.verdict, r.summary, r.record, s.started FROM results r "
        sql += "JOIN sweeps s ON s.id = r.sweep"
        where: list[str] = []
        args: list[Any] = []
        if since is not None:
            where.append("s.started >= ?")
            args.append(since)
        if until is not None:
            where.append("s.started <= ?")
            args.append(until)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY r.host, r.sweep"
        wanted = None if hosts is None else set(hosts)
        found: dict[tuple[str, str], Recurrence] = {}
        last: dict[str, str | None] = {}
        with self._errors():
            rows = list(self.db.execute(sql, args))
        for _sweep, host, fp, verdict, summary, record, started in rows:
            if wanted is not None and host not in wanted:
                continue
            prev = last.get(host)
            last[host] = fp
            if fp is None:
                continue
            rec = found.get((host, fp))
            if rec is None:
                rec = found[(host, fp)] = Recurrence(host, fp, verdict, summary or "", first_seen=started)
            if prev != fp:
                rec.episodes += 1
            rec.sweeps += 1
            rec.last_seen = started
            rec.verdict, rec.summary = verdict, summary or rec.summary
            boot = boot_of(record)
            if boot is not None and all(abs(boot - b) > BOOT_SLACK for b in rec.boots):
                rec.boots.append(boot)
        return sorted(found.values(), key=lambda r: (-r.episodes, -len(r.boots), r.host))

    def hosts(self) -> list[str]:
        """Every host the store has seen."""
        assert self.db is not None
        with self._errors():
            rows = self.db.execute("SELECT host FROM incidents UNION SELECT host FROM host_costs ORDER BY host")
            return [r[0] for r in rows]

    def sweeps(self, limit: int = 20) -> list[dict[str, Any]]:
        assert self.db is not None
        with self._errors():
            rows = self.db.execute(
                "SELECT id, started, finished, selector, hosts, interrupted, report FROM sweeps ORDER BY id DESC LIMIT ?",
                (limit,),
            )
            keys = ("id", "started", "finished", "selector", "hosts", "interrupted", "report")
            return [dict(zip(keys, r)) for r in rows]
