"""What a process tag says about its process: rank, and how deep it sits.

``(Worker pid=7506)`` carries no rank, but the same worker usually logs
``rank 3 in world size 4`` at start-up, and a launcher's summary names
``local_rank: 3 (pid: 7506)``; either lets the card say which rank died.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .lines import LogLine

_TAG_RANK = re.compile(r"(?:^|[ _])rank[= ]?(\d+)\b|^(?:rank|default)(\d+)$")
_LINE_RANK = re.compile(r"\brank (\d+) in world size \d+|\bglobal_rank[=: ]+(\d+)|\bRANK=(\d+)\b")
_TAG_PID = re.compile(r"\bpid=(\d+)")
_LAUNCHER_RANK = re.compile(r"\blocal_rank: ?(\d+) \(pid: ?\d+\)|\brank ?: ?(\d+) \(local_rank")


def _first_int(m: re.Match[str]) -> int | None:
    for g in m.groups():
        if g is not None:
            return int(g)
    return None


def rank_of(process: str | None, lines: Iterable[LogLine], message: str = "") -> int | None:
    """The rank of a process, from its tag or from what the log says about it.

    A launcher's own line ("failed (exitcode: -9) local_rank: 1 (pid: 1236)")
    names the rank that died, so that rank is reported for it.
    """
    if not process:
        lm = _LAUNCHER_RANK.search(message)
        return _first_int(lm) if lm else None
    m = _TAG_RANK.search(process)
    if m:
        return _first_int(m)
    pm = _TAG_PID.search(process)
    launcher = re.compile(r"local_rank: ?(\d+) \(pid: ?" + pm.group(1) + r"\)") if pm else None
    found: int | None = None
    for ln in lines:
        if ln.process == process:
            lm = _LINE_RANK.search(ln.msg)
            if lm:
                return _first_int(lm)
        elif launcher is not None and found is None and "local_rank" in ln.msg:
            um = launcher.search(ln.msg)
            if um:
                found = int(um.group(1))
    return found
