"""The sweep lock: two cron sweeps never overlap."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from ..units import iso
from .errors import StoreError
from .files import PRIVATE_FILE, is_regular, private_dir


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
        if not is_regular(fd):
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
            os.write(fd, f"{os.getpid()}\n{iso(time.time())}\n".encode())
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
