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
whose message says what to do. This package knows nothing of click or rich.

Its modules: ``schema`` (the file, its tables and version) · ``database`` (the
connection, errors, write transactions) · ``queries`` (reading) · ``writing``
(a sweep) · ``incidents`` and ``lemons`` (the records read back) · ``trouble``
(a host's incident key, category and action class) · ``errors`` · ``files``
(private files, atomic writes) · ``lock`` (the sweep lock).
"""

from __future__ import annotations

from .errors import StoreError
from .files import PRIVATE_DIR, PRIVATE_FILE, open_private, private_dir, write_atomic, write_private
from .incidents import CHANGED, NEW, RESOLVED, Change, Changes, Incident
from .lemons import BOOT_SLACK, Recurrence
from .lock import LockBusy, SweepLock
from .queries import Queries
from .schema import DB_NAME, DEFAULT_KEEP_DAYS, SCHEMA_VERSION, default_db_path, default_report_path
from .trouble import (
    ACTION_CLASSES,
    CauseGroup,
    action_class,
    category_of,
    describe,
    group_by_cause,
    incident_key,
    state_key,
)
from .writing import Writing


class Store(Queries, Writing):
    """The history database. Open with ``Store(path)``; use as a context manager or ``close()``."""

    def __enter__(self) -> Store:
        return self


__all__ = [
    "ACTION_CLASSES",
    "BOOT_SLACK",
    "CHANGED",
    "DB_NAME",
    "DEFAULT_KEEP_DAYS",
    "NEW",
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "RESOLVED",
    "SCHEMA_VERSION",
    "CauseGroup",
    "Change",
    "Changes",
    "Incident",
    "LockBusy",
    "Recurrence",
    "Store",
    "StoreError",
    "SweepLock",
    "action_class",
    "category_of",
    "default_db_path",
    "default_report_path",
    "describe",
    "group_by_cause",
    "incident_key",
    "open_private",
    "private_dir",
    "state_key",
    "write_atomic",
    "write_private",
]
