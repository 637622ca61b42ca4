"""Where the keeper lives: a private runtime directory of the user's, and its socket."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

RUNTIME_ENV = "FLEETDIAG_RUNTIME_DIR"  # where the socket lives (tests, or a user who wants it elsewhere)
SOCKET_NAME = "keeper.sock"
LOCK_NAME = "keeper.lock"


def runtime_dir() -> Path:
    """The keeper's directory: $FLEETDIAG_RUNTIME_DIR, the user's runtime dir, else /tmp/fleetdiag-UID."""
    env = os.environ.get(RUNTIME_ENV)
    if env:
        return Path(env)
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        try:
            import platformdirs

            base = Path(platformdirs.user_runtime_dir("fleetdiag"))
        except Exception:  # noqa: BLE001 (no platformdirs, or it failed: the fallback below)
            base = None
    if base is not None and base.parent.is_dir() and os.access(base.parent, os.W_OK):
        return base
    return Path(f"/tmp/fleetdiag-{os.getuid()}")


def private_dir(path: Path, create: bool = True) -> Path | None:
    """``path`` when it is a directory of ours that only we can use (0700); None otherwise."""
    try:
        if create:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    try:
        parent = os.stat(path.parent)
    except OSError:
        return None
    if parent.st_uid not in (0, os.getuid()):  # someone else could swap our directory for theirs
        return None
    if len(os.fsencode(path / SOCKET_NAME)) > 100:  # AF_UNIX paths are short (108 bytes on Linux)
        return None
    return path


def socket_path(directory: Path | None = None) -> Path:
    return (directory or runtime_dir()) / SOCKET_NAME
