"""The history database's connection: opening, the schema's setup, errors, write transactions."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import StoreError, explain
from .files import open_private, private_dir
from .schema import DDL, SCHEMA_VERSION, default_db_path


class Database:
    """The connection: opened read-only or set up (WAL, schema), every failure a StoreError, one write
    transaction at a time."""

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

    def __enter__(self) -> Database:
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
            raise explain(exc, self.path, self.timeout) from exc
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
                db.executescript(f"BEGIN IMMEDIATE;{DDL}PRAGMA user_version = {SCHEMA_VERSION};COMMIT;")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
