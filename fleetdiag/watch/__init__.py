"""``fleetdiag watch``: a fleet's state, pushed from the hosts, with stall detection.

The seeds' user polled a log every 30 s for 10 minutes before noticing the
server had died at startup. Here every host gets one persistent SSH
connection and on it one long-running follower (``follow.py``) that first
sends the probe funnel's snapshot, then pushes only new error-shaped lines
(with their traceback context) and a heartbeat. The controller never polls:
it merges what arrives into a small per-host line buffer, re-runs the same
analysis as ``probe`` (``probe.finish``) after each burst, and drives a
state machine per host:

``connecting`` → ``starting`` / ``healthy`` / ``failed`` / ``stalled`` /
``no-log``; ``unreachable`` when a connection stays down past a grace
period; ``recovered`` when a host that was in trouble is healthy again.

**stalled** means one of: the log has not grown for ``stall_after`` seconds;
the log has been in a "waiting for … ready" / loading phase for longer than
``wait_limit``; or the serving process (``process``, a ``pgrep -f`` pattern)
is gone while the log names no error. **failed** is the analyzer's decisive
error, exactly as probe reports it.

Dropped connections are retried with exponential backoff (with jitter);
errors no retry can fix (authentication, host keys, client key) are reported
at once and not retried, so a watch never hammers a host into fail2ban.

The package is core: no click, no rich. ``state`` is the pure state machine (clock passed in),
``buffer`` the per-host line buffer, ``host`` one host's connection loop, ``fleet`` the event
stream. The CLI renders :class:`WatchEvent` and :class:`HostView`.
"""

from __future__ import annotations

from .buffer import LineBuffer
from .fleet import Watch, summary_counts
from .host import PERMANENT, HostWatcher
from .settings import DEFAULT_WAIT_LIMIT, WatchSettings
from .state import (
    CONNECTING,
    FAILED,
    HEALTHY,
    NO_LOG,
    RECOVERED,
    STALLED,
    STARTING,
    STATES,
    TROUBLE,
    UNREACHABLE,
    VERDICT_OF,
    HostState,
    HostView,
    WatchEvent,
    verdict_of,
)

__all__ = [
    "CONNECTING",
    "DEFAULT_WAIT_LIMIT",
    "FAILED",
    "HEALTHY",
    "NO_LOG",
    "PERMANENT",
    "RECOVERED",
    "STALLED",
    "STARTING",
    "STATES",
    "TROUBLE",
    "UNREACHABLE",
    "VERDICT_OF",
    "HostState",
    "HostView",
    "HostWatcher",
    "LineBuffer",
    "Watch",
    "WatchEvent",
    "WatchSettings",
    "summary_counts",
    "verdict_of",
]
