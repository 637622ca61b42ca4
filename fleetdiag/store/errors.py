"""Every sqlite failure as a StoreError whose message says what to do."""

from __future__ import annotations

from pathlib import Path


class StoreError(Exception):
    """The history database cannot be used; ``kind`` is stable, ``str`` says what to do."""

    def __init__(self, kind: str, message: str, path: Path | None = None):
        super().__init__(message)
        self.kind = kind  # locked | corrupt | unwritable | newer | error
        self.path = path


def explain(exc: BaseException, path: Path, timeout: float) -> StoreError:
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
