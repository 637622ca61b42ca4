"""A host's clock against ours (``clock_offset``, ``clock_sample``) and its log times on our clock."""

from __future__ import annotations

import re
from typing import Any

from .. import timestamps
from ..records import Clock

# ---------------------------------------------------------------- clocks


def clock_offset(local_receive: float, rtt: float, remote_now: float) -> float:
    """Seconds to add to a remote clock reading to get the local clock.

    The remote clock was read about half a round trip before its answer
    arrived here: offset = local receive time − RTT/2 − remote time.
    """
    return local_receive - rtt / 2.0 - remote_now


def normalise(
    raw_time: str | None, host_zone: Any = None, mtime: float | None = None, offset: float = 0.0
) -> float | None:
    """A framework timestamp as seconds since the epoch on the local clock, or None.

    Read by ``timestamps.epoch`` (its year rule against the log's ``mtime``, its zone rule with
    ``host_zone``); ``offset`` is the host's ``clock_offset``.
    """
    t = timestamps.epoch(raw_time, host_zone, mtime)
    return None if t is None else t + (offset or 0.0)


CLOCK_DEADBAND_S = 1.0  # offsets this small are within the measurement's own error: not applied


_CLOCK = re.compile(r"^\s*(?P<s>\d+(?:\.\d+)?)\S*(?:\s+(?P<z>[+-]\d\d:?\d\d))?")


def clock_sample(text: str | None, local_receive: float, rtt: float | None) -> Clock | None:
    """``HostResult.clock`` from the remote ``date '+%s.%N %z'`` read last in the funnel.

    ``offset`` is what is applied to the host's log times: the measured one,
    or 0 when it is smaller than the measurement's own error (RTT and the
    1 s resolution of a ``date`` without ``%N``), so hosts in sync are not
    reordered by noise.
    """
    m = _CLOCK.match(text or "")
    if not m:
        return None
    remote_now = float(m.group("s"))
    measured = clock_offset(local_receive, rtt or 0.0, remote_now)
    noise = max(CLOCK_DEADBAND_S, rtt or 0.0)
    return Clock(
        local_receive=round(local_receive, 3),
        remote_now=remote_now,
        rtt=rtt,
        measured=round(measured, 3),
        offset=0.0 if abs(measured) <= noise else round(measured, 3),
        zone=m.group("z") or None,
    )
