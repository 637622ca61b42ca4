"""The history database's file and schema: where it lives, its tables, the version a file may have."""

from __future__ import annotations

from pathlib import Path

SCHEMA_VERSION = 1
DB_NAME = "history.sqlite3"
DEFAULT_KEEP_DAYS = 90.0


def default_db_path() -> Path:
    import platformdirs

    return platformdirs.user_data_path("fleetdiag") / DB_NAME


def default_report_path() -> Path:
    import platformdirs

    return platformdirs.user_state_path("fleetdiag") / "last-sweep.json"


DDL = """
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

INCIDENT_COLS = (
    "id, host, fingerprint, verdict, summary, category, first_seen, since, last_seen, count, resolved_at, record"
)
