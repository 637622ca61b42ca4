"""How fleetdiag starts its own Python processes (the keeper, the sweep's workers).

A plain ``python -c`` or ``python -m`` puts the working directory first on
``sys.path``: a ``hashlib.py`` or a ``fleetdiag/`` package planted in a shared
temp directory, a shared checkout or a cron job's cwd would then run as the
operator, in a process that may live for minutes. So every child starts:

- in isolated mode (``-I``): no working directory or script directory on the
  path, no ``PYTHON*`` variables, no user site-packages;
- with a fixed working directory (``/``), set before anything is imported;
- with an explicit ``sys.path``: this process's own, less the working
  directory and relative entries, plus the directory fleetdiag itself was
  imported from (an editable checkout, a command started from its checkout).

Paths a child needs are made absolute by the command before it starts one
(``plan.absolute_paths``), so the fixed working directory changes nothing else.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHILD_CWD = "/"
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


def import_path(cwd: str | None = None) -> list[str]:
    """The ``sys.path`` a child gets: ours without the working directory or anything relative to it."""
    try:
        here: str | None = os.path.realpath(cwd or os.getcwd())
    except OSError:  # started from a directory since removed: drop every relative entry all the same
        here = None
    kept: list[str] = []
    for entry in sys.path:
        if not entry or not os.path.isabs(entry):
            # '' and relative entries name the working directory; a path-hook marker that is not a
            # file (an editable install's) is harmless, but one that exists here could be planted
            if not entry or os.path.exists(entry):
                continue
        elif os.path.realpath(entry) == here:
            continue
        if entry not in kept:
            kept.append(entry)
    if not any(os.path.realpath(p) == PACKAGE_PARENT for p in kept if os.path.isabs(p)):
        kept.append(PACKAGE_PARENT)  # last: files beside the package never shadow the standard library
    return kept


def python_argv(code: str, *args: str) -> list[str]:
    """``python -I -c`` running ``code`` after the cwd and ``sys.path`` are fixed; ``args`` follow
    (the first names the child for ``ps``)."""
    boot = f"import os, sys; os.chdir({CHILD_CWD!r}); sys.path[:] = {import_path()!r}\n{code}"
    return [sys.executable, "-I", "-c", boot, *args]
