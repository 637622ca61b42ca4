"""The history store: every sweep's host results and the incidents they make, in SQLite.

An **incident** is one host in one kind of trouble: a failed, stalled,
unreachable or no-log state, keyed by ``(host, fingerprint)``. Each host has
at most one open incident, its current trouble; a sweep compares each host
it probed with that and reports what is *new* (no open incident before),
*changed* (a different fingerprint now) and *resolved* (healthy or starting
again). Hosts a sweep did not probe keep their incidents untouched, so
sweeps of different selectors never resolve each other's news.

Also kept: the per-host cost memory (RTT and probe time), so the scheduler
starts the slowest hosts first across runs; and a lock file next to the
database, so two cron sweeps never overlap.

Plain stdlib ``sqlite3`` in WAL mode (readers such as ``fleetdiag history``
never block a sweep). Every sqlite failure becomes a :class:`StoreError`
whose message says what to do. This module knows nothing of click or rich.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..job import mark
from ..records import DEGRADED, FAILED, HEALTHY, NO_LOG, STALLED, STARTING, UNREACHABLE, VERDICTS, HostResult

SCHEMA_VERSION = 1
DB_NAME = "history.sqlite3"
DEFAULT_KEEP_DAYS = 90.0

NEW = "new"
CHANGED = "changed"
RESOLVED = "resolved"


def default_db_path() -> Path:
    import platformdirs

    return platformdirs.user_data_path("fleetdiag") / DB_NAME


def default_report_path() -> Path:
    import platformdirs

    return platformdirs.user_state_path("fleetdiag") / "last-sweep.json"


# --------------------------------------------------------------------------- "the same trouble"


def incident_key(res: HostResult) -> str | None:
    """The fingerprint of a host's trouble, or None when there is none.

    A failure is its decisive error's fingerprint (numbers, pids, paths
    normalised by the analyzer), so the same root cause matches across hosts
    and sweeps. Unreachable hosts match by kind of problem (refused, timeout,
    deadline, host key ...), not by message, which names ports and addresses.
    """
    if res.verdict in (HEALTHY, STARTING):
        return None
    d = res.decisive
    if res.verdict == FAILED:
        if d is not None and d.fingerprint:
            return d.fingerprint
        return f"failed:{(d.exception_type if d else None) or 'unknown'}"
    if res.verdict == STALLED:
        return f"stalled:{d.fingerprint}" if d is not None and d.fingerprint else "stalled"
    if res.verdict == DEGRADED:  # the same faults on the same GPUs: one incident until they change
        from ..analysis.fingerprint import fingerprint

        if d is not None and d.fingerprint:  # a kernel fault that stands alone: its line's fingerprint
            return f"degraded:{d.fingerprint}"
        faults = sorted(str(e.get("line")) for e in res.evidence if e.get("source") == "gpu")
        return f"degraded:{fingerprint('gpu-health', '; '.join(faults))}" if faults else "degraded"
    kind = res.facts.get("error_kind")
    if res.verdict == UNREACHABLE:
        return f"unreachable:{kind or 'error'}"
    if res.verdict == NO_LOG:
        if kind:
            return f"no-log:{kind}"
        why = (res.error or "").split(":", 1)[0].strip().lower()
        return f"no-log:{why or 'unknown'}"
    return f"{res.verdict}:{kind or ''}"


def state_key(res: HostResult) -> str:
    """Like :func:`incident_key`, with healthy and starting hosts as their own states."""
    return incident_key(res) or res.verdict


def describe(res: HostResult) -> str:
    """One line saying what is wrong (or right) with a host."""
    if res.decisive is not None:
        return res.decisive.message or res.decisive.line
    return res.error or res.summary or res.verdict


# Who acts on a host's trouble: the label alerts route on (``fleetdiag_host_verdict{action=...}``).
ACTION_CLASSES = (
    "hardware",
    "driver",
    "network",
    "config",
    "capacity",
    "software",
    "hang",
    "access",
    "consequence",
    "none",
)
_ACTION_OF_CATEGORY = {
    "hardware": "hardware",
    "driver": "driver",
    "nccl": "network",
    "network": "network",
    "config": "config",
    "oom": "capacity",
    "disk": "capacity",
    "cuda": "software",
    "import": "software",
    "python": "software",
    "other": "software",
}


def category_of(res: HostResult) -> str:
    """The host's trouble in one word: the decisive error's category, ``gpu-health`` for a degraded
    GPU, the kind of failure to reach it (``unreachable``/``no-log``), or ``none`` when healthy."""
    if res.verdict in (HEALTHY, STARTING):
        return "none"
    if res.decisive is not None and res.decisive.category:
        return res.decisive.category
    if res.verdict == DEGRADED:
        return "hardware"
    if res.verdict in (UNREACHABLE, NO_LOG):
        return res.verdict
    return "other"


def action_class(res: HostResult) -> str:
    """Who has to act (one of ``ACTION_CLASSES``): hardware (drain, RMA), driver (reset or reboot),
    network (fabric), config (the launch), capacity (memory, disk), software (the code), hang (a
    stalled job), access (SSH or the log cannot be reached), consequence (failed because another
    host of its job did: act there), none (healthy)."""
    if res.verdict in (HEALTHY, STARTING):
        return "none"
    if res.verdict == DEGRADED:
        return "hardware"
    if res.verdict in (UNREACHABLE, NO_LOG):
        return "access"
    if res.job_role is not None and res.job_role.role == "consequence":  # a job's victim: act on its root's host
        return "consequence"
    d = res.decisive
    if d is not None and d.rule == "gpu-hardware":
        return "hardware"
    if d is not None and d.category in _ACTION_OF_CATEGORY and not (res.verdict == STALLED and d.category == "other"):
        return _ACTION_OF_CATEGORY[d.category]
    return "hang" if res.verdict == STALLED else "software"


@dataclass
class CauseGroup:
    """Hosts in the same state for the same root cause (the fleet view's rows)."""

    key: str
    verdict: str
    results: list[HostResult]

    @property
    def hosts(self) -> list[str]:
        return [r.host for r in self.results]

    @property
    def folded(self) -> str:
        from ..inventory import fold

        return fold(self.hosts)

    @property
    def example(self) -> HostResult:
        return self.results[0]


def group_by_cause(results: Iterable[HostResult]) -> list[CauseGroup]:
    """Group by :func:`state_key`; worst verdict first, then biggest group."""
    groups: dict[str, CauseGroup] = {}
    for r in results:
        k = state_key(r)
        if k not in groups:
            groups[k] = CauseGroup(k, r.verdict, [])
        groups[k].results.append(r)
    rank = {v: i for i, v in enumerate(VERDICTS)}
    return sorted(groups.values(), key=lambda g: (rank.get(g.verdict, len(rank)), -len(g.results), g.hosts[0]))


# --------------------------------------------------------------------------- records


@dataclass
class Incident:
    """One (host, fingerprint) trouble and its history."""

    host: str
    fingerprint: str
    verdict: str
    summary: str
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
        return {k: j[k] for k in ("role", "root", "rank", "affected", "why", "time") if k in j}

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "fingerprint": self.fingerprint,
            "verdict": self.verdict,
            "summary": self.summary,
            "category": self.category,
            "first_seen": _iso(self.first_seen),
            "since": _iso(self.since),
            "last_seen": _iso(self.last_seen),
            "count": self.count,
            "resolved": _iso(self.resolved_at) if self.resolved_at is not None else None,
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


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


# --------------------------------------------------------------------------- errors


class StoreError(Exception):
    """The history database cannot be used; ``kind`` is stable, ``str`` says what to do."""

    def __init__(self, kind: str, message: str, path: Path | None = None):
        super().__init__(message)
        self.kind = kind  # locked | corrupt | unwritable | newer | error
        self.path = path


def _explain(exc: BaseException, path: Path, timeout: float) -> StoreError:
    name = getattr(exc, "sqlite_errorname", "") or ""
    msg = str(exc)
    low = msg.lower()
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in low:
        return StoreError(
            "locked",
            f"history database {path} is locked by another process (waited {timeout:g}s): "
            "is an sqlite3 shell or a stuck fleetdiag holding it? Try again when it is released",
            path,
        )
    if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")) or "not a database" in low or "malformed" in low:
        return StoreError(
            "corrupt",
            f"history database {path} is damaged ({msg}): move it aside "
            f"(mv '{path}' '{path}.broken'); the next sweep starts a fresh history",
            path,
        )
    if name.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY", "SQLITE_PERM", "SQLITE_FULL", "SQLITE_IOERR")) or any(
        w in low for w in ("unable to open", "readonly", "read-only", "disk is full", "disk i/o")
    ):
        return StoreError(
            "unwritable",
            f"history database {path} cannot be written ({msg}): check the path, "
            "its permissions and free space, or pass --db PATH",
            path,
        )
    return StoreError("error", f"history database {path}: {msg}", path)


# --------------------------------------------------------------------------- private files

PRIVATE_FILE = 0o600  # reports, history and evidence may quote log lines that hold secrets
PRIVATE_DIR = 0o700


def private_dir(path: Path | str) -> Path:
    """``mkdir -p`` where every directory it creates is 0700 (existing ones are left as they are)."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            pass
    return path


def open_private(path: Path | str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """Open a file for writing, created 0600, never through a symlink at its last component."""
    fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE)
    try:
        if not _is_regular(fd):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_regular(fd: int) -> bool:
    import stat

    return stat.S_ISREG(os.fstat(fd).st_mode)


def _new_private(path: str, _flags: int) -> int:
    """``open(..., opener=)``: a new 0600 file, never an existing one or a link."""
    return open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)


def write_private(path: Path | str, data: bytes) -> Path:
    """Write a new private file (0600) in a private directory (0700 when created)."""
    path = Path(path)
    private_dir(path.parent)
    fd = open_private(path)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


# --------------------------------------------------------------------------- the store

_DDL = """
CREATE TABLE IF NOT EXISTS sweeps (
    id          INTEGER PRIMARY KEY,
    started     REAL NOT NULL,
    finished    REAL NOT NULL,
    selector    TEXT NOT NULL,
    hosts       INTEGER NOT NULL,
    interrupted INTEGER NOT NULL DEFAULT 0,
    report      TEXT
);
CREATE TABLE IF NOT EXISTS results (
    sweep       INTEGER NOT NULL,
    host        TEXT NOT NULL,
    verdict     TEXT NOT NULL,
    fingerprint TEXT,
    summary     TEXT,
    rtt_ms      REAL,
    total_ms    REAL,
    record      TEXT,  -- the HostResult JSON, kept when the host was not healthy
    PRIMARY KEY (sweep, host)
);
CREATE INDEX IF NOT EXISTS results_by_host ON results (host, sweep);
CREATE TABLE IF NOT EXISTS incidents (
    id          INTEGER PRIMARY KEY,
    host        TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    verdict     TEXT NOT NULL,
    summary     TEXT NOT NULL,
    category    TEXT,
    first_seen  REAL NOT NULL,
    since       REAL NOT NULL,
    last_seen   REAL NOT NULL,
    count       INTEGER NOT NULL,
    resolved_at REAL,
    record      TEXT,
    UNIQUE (host, fingerprint)
);
CREATE INDEX IF NOT EXISTS incidents_open ON incidents (host) WHERE resolved_at IS NULL;
CREATE TABLE IF NOT EXISTS host_costs (
    host    TEXT PRIMARY KEY,
    rtt_ms  REAL,
    cost_ms REAL,
    updated REAL NOT NULL
);
"""

_INCIDENT_COLS = (
    "id, host, fingerprint, verdict, summary, category, first_seen, since, last_seen, count, resolved_at, record"
)


class Store:
    """The history database. Open with ``Store(path)``; use as a context manager or ``close()``."""

    def __init__(self, path: Path | str | None = None, timeout: float = 10.0, readonly: bool = False):
        self.path = Path(path) if path is not None else default_db_path()
        self.timeout = timeout
        self.db: sqlite3.Connection | None = None
        with self._errors():
            if readonly:
                if not self.path.exists():
                    raise StoreError(
                        "missing", f"no history yet: {self.path} does not exist (run fleetdiag sweep first)", self.path
                    )
                uri = f"file:{self.path}?mode=ro"
                self.db = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
                self._check_version(self.db.execute("PRAGMA user_version").fetchone()[0])
            else:
                private_dir(self.path.parent)
                if not self.path.exists():  # sqlite gives its -wal and -shm files the database's mode
                    os.close(open_private(self.path, os.O_WRONLY | os.O_CREAT))
                self.db = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
                self._setup()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except sqlite3.Error as exc:
            raise _explain(exc, self.path, self.timeout) from exc
        except OSError as exc:  # e.g. the directory cannot be created
            raise StoreError(
                "unwritable",
                f"history database {self.path}: {exc.strerror or exc}: pass --db PATH to put it elsewhere",
                self.path,
            ) from exc

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; IMMEDIATE so a busy database fails at BEGIN, not halfway."""
        assert self.db is not None
        with self._errors():
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                "newer",
                f"history database {self.path} was written by a newer fleetdiag "
                f"(schema {version} > {SCHEMA_VERSION}): upgrade fleetdiag or pass --db PATH",
                self.path,
            )

    def _setup(self) -> None:
        assert self.db is not None
        db = self.db
        version = db.execute("PRAGMA user_version").fetchone()[0]  # fails here on a file that is not a database
        self._check_version(version)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        if version < SCHEMA_VERSION:  # executescript commits first, so the script carries its own transaction
            try:
                db.executescript(f"BEGIN IMMEDIATE;{_DDL}PRAGMA user_version = {SCHEMA_VERSION};COMMIT;")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    # -- reading

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
        sql = f"SELECT {_INCIDENT_COLS} FROM incidents"
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
            return [_incident(row) for row in self.db.execute(sql, args)]

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
            boot = _boot_of(record)
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

    # -- writing

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
                record = None if key is None else json.dumps(res.to_json())
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
                change = self._apply(db, res, key, record, opened.get(res.host), now)
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
        out: list[Incident] = []
        for i in range(0, len(hosts), 500):  # stay under SQLite's variable limit
            chunk = hosts[i : i + 500]
            rows = db.execute(
                f"SELECT {_INCIDENT_COLS} FROM incidents WHERE resolved_at IS NULL AND host IN ({','.join('?' * len(chunk))})",
                chunk,
            )
            out += [_incident(r) for r in rows]
        return out

    def _apply(
        self,
        db: sqlite3.Connection,
        res: HostResult,
        key: str | None,
        record: str | None,
        prev: Incident | None,
        now: float,
    ) -> Change | None:
        if key is None:
            if prev is None:
                return None
            db.execute("UPDATE incidents SET resolved_at = ? WHERE id = ?", (now, prev.id))
            prev.resolved_at = now
            return Change(RESOLVED, res.host, prev, verdict=res.verdict)
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
            f"SELECT {_INCIDENT_COLS} FROM incidents WHERE host = ? AND fingerprint = ?", (res.host, key)
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
        cur = _incident(
            db.execute(
                f"SELECT {_INCIDENT_COLS} FROM incidents WHERE host = ? AND fingerprint = ?", (res.host, key)
            ).fetchone()
        )
        if prev is not None:
            return Change(CHANGED, res.host, cur, previous=prev, recurred=recurred, verdict=res.verdict)
        return Change(NEW, res.host, cur, recurred=recurred, verdict=res.verdict)


BOOT_SLACK = 120.0  # boot times (remote now − uptime) closer than this are the same boot


@dataclass
class Recurrence:
    """One host's one trouble across the kept sweeps: episodes and boots it was seen on."""

    host: str
    fingerprint: str
    verdict: str
    summary: str
    episodes: int = 0  # separate times it appeared (seen, gone or another trouble, back)
    sweeps: int = 0
    first_seen: float | None = None
    last_seen: float | None = None
    boots: list[float] = field(default_factory=list)  # distinct boot times it was seen on

    def lemon(self, recur: int = 3) -> str | None:
        """Why this host is a lemon for this trouble, or None: back ``recur`` times or more, or seen
        again after the host rebooted (gpud's reboot-count escalation: a reboot did not fix it)."""
        why = []
        if self.episodes >= recur:
            why.append(f"back {self.episodes} times")
        if len(self.boots) >= 2:
            why.append(f"seen on {len(self.boots)} boots (again after a reboot)")
        return "; ".join(why) or None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "fingerprint": self.fingerprint,
            "verdict": self.verdict,
            "summary": self.summary,
            "episodes": self.episodes,
            "sweeps": self.sweeps,
            "boots": len(self.boots),
            "first_seen": _iso(self.first_seen),
            "last_seen": _iso(self.last_seen),
        }


def _boot_of(record: str | None) -> float | None:
    """The host's boot time in a stored result (its kernel clock: remote now − uptime), if it was read."""
    if not record:
        return None
    try:
        kl = (json.loads(record).get("facts") or {}).get("kernel_log") or {}
        boot = kl.get("boot") if isinstance(kl, dict) else None
        return float(boot) if isinstance(boot, (int, float)) and not isinstance(boot, bool) else None
    except (ValueError, AttributeError):
        return None


def _incident(row: Sequence[Any]) -> Incident:
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


# --------------------------------------------------------------------------- the sweep lock


class LockBusy(Exception):
    """Another process holds the sweep lock."""

    def __init__(self, path: Path, pid: int | None, since: str | None):
        who = f"pid {pid}" if pid else "another process"
        when = f", since {since}" if since else ""
        super().__init__(f"another sweep is already running ({who}{when}; lock {path}): not starting a second one")
        self.path = path
        self.pid = pid
        self.since = since


class SweepLock:
    """An exclusive, non-blocking ``flock`` on ``<db>.lock``, holding the owner's pid.

    ``flock`` is released by the kernel when its holder dies, so a crashed
    sweep never leaves a stale lock. The file itself is left in place:
    deleting it would let a third process lock a fresh inode.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.fd: int | None = None

    @classmethod
    def for_db(cls, db: Path | str) -> SweepLock:
        db = Path(db)
        return cls(db.with_name(db.name + ".lock"))

    def acquire(self) -> SweepLock:
        """Raises LockBusy when held, StoreError when the lock file cannot be made or is not a plain file.

        Never through a symlink: a planted ``<db>.lock -> ~/.bashrc`` would otherwise be truncated.
        """
        try:
            private_dir(self.path.parent)
            try:  # O_CREAT|O_EXCL: a new lock file is ours; else open the existing one, never following a link
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)
            except FileExistsError:
                fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreError(
                    "unsafe",
                    f"sweep lock {self.path} is a symbolic link: refusing to follow it; "
                    "remove it (fleetdiag creates a plain file)",
                    self.path,
                ) from exc
            raise StoreError(
                "unwritable",
                f"sweep lock {self.path} cannot be created: {exc.strerror or exc}: "
                "pass --db PATH to put the history elsewhere",
                self.path,
            ) from exc
        if not _is_regular(fd):
            os.close(fd)
            raise StoreError("unsafe", f"sweep lock {self.path} is not a plain file: remove it", self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            pid, since = self._holder(fd)
            os.close(fd)
            raise LockBusy(self.path, pid, since) from None
        self.fd = fd
        try:  # who holds it, for the second sweep's message; the flock alone is the lock
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n{_iso(time.time())}\n".encode())
        except OSError:  # a full disk must not stop the sweep (its results matter more than this note)
            pass
        return self

    @staticmethod
    def _holder(fd: int) -> tuple[int | None, str | None]:
        try:
            text = os.pread(fd, 200, 0).decode("utf-8", "replace").split("\n")
        except OSError:
            return None, None
        pid = int(text[0]) if text and text[0].strip().isdigit() else None
        since = text[1].strip() if len(text) > 1 and text[1].strip() else None
        return pid, since

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> SweepLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# --------------------------------------------------------------------------- the report file


def write_atomic(path: Path | str, text: str, mode: int = 0o600, own_dir: bool = True) -> Path:
    """Write a file so readers see the old or the new content, never half of it.

    The temp file sits beside it (same filesystem: the rename is atomic), named ``.NAME.PID.tmp``
    so a collector globbing ``*.prom`` or ``*.json`` never reads it. ``mode``: 0600 unless the file
    holds nothing from a log (the Prometheus textfile); ``own_dir``: a directory fleetdiag creates
    is 0700, one that belongs to the operator (a collector's) is left as it is.
    """
    path = Path(path)
    if own_dir:
        private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        try:  # a stale temp file of a dead sweep with our pid: replace it (never through a link)
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        with open(tmp, "w", encoding="utf-8", errors="backslashreplace", opener=_new_private) as fh:
            if mode != 0o600:
                os.fchmod(fh.fileno(), mode)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
