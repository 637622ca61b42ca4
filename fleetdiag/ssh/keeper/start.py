"""Starting a keeper: a fully detached process that tells the command that started it when it is ready."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ... import child
from .server import serve_forever
from .wire import FAILED, READY, TAKEN

START_WAIT = 3.0  # how long a command waits for a keeper it started before connecting directly


# The keeper runs this fleetdiag (an editable checkout too), whatever PYTHONPATH the command had, and
# nothing from the command's working directory (child.py: isolated mode, fixed cwd, explicit sys.path).
_BOOT = "from fleetdiag.ssh.keeper.start import detach_main; sys.exit(detach_main(sys.argv[2:]))"


def spawn(directory: Path, persist: float) -> bytes:
    """Start a keeper for ``directory``, fully detached; returns READY, TAKEN (another keeper won) or FAILED.

    The started process double-forks; the first one waits only until the keeper
    has bound its socket (or failed), so no command polls for it.
    """
    try:
        proc = subprocess.run(  # `fleetdiag.ssh.keeper` in its argv: ps shows what it is
            child.python_argv(_BOOT, "fleetdiag.ssh.keeper", str(directory), repr(float(persist))),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
            cwd=child.CHILD_CWD,
            timeout=START_WAIT * 2,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return FAILED
    return {0: READY, 2: TAKEN}.get(proc.returncode, FAILED)


def detach_main(argv: list[str]) -> int:
    directory, persist = Path(argv[0]), float(argv[1])
    r, w = os.pipe()
    if os.fork() > 0:  # the process the command waits for: exits once the keeper is ready (or is not)
        os.close(w)
        answer = os.read(r, 1)
        os._exit({READY: 0, TAKEN: 2}.get(answer, 1))
    os.close(r)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    os.umask(0o077)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, w)  # nothing inherited stays open (a cron job's pipe, a lock) but the ready pipe
    os.closerange(w + 1, 1 << 16)
    return serve_forever(directory, persist, ready_fd=w)
