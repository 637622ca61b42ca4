"""Private files: reports, history and evidence are 0600 in 0700 directories, never written through a link."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

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
        if not is_regular(fd):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_regular(fd: int) -> bool:
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


def write_atomic(
    path: Path | str, text: str | Callable[[TextIO], object], mode: int = 0o600, own_dir: bool = True
) -> Path:
    """Write a file so readers see the old or the new content, never half of it.

    ``text`` is the content, or a function that writes it to the open file (a large document
    streamed, never held whole as one string).

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
            if callable(text):
                text(fh)
            else:
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
