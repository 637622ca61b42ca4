"""How much longer than on an idle machine a timing-bound step may take here, now.

A test's own deadlines (how long it waits for something, the timeouts it gives a command it expects to
finish) are multiplied by ``slack()``: on a shared CI machine at a load of 40 on 2 cores, a login shell
and a funnel take seconds, and a fixed 1.5 s budget fails for the machine's sake, not fleetdiag's. What a
test asserts never changes; only how long it is willing to wait for it.
"""

from __future__ import annotations

import os

CAP = 6.0


def slack(cap: float = CAP) -> float:
    """The 1-minute load average per core, between 1 and ``cap``."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average here: assume an idle machine
        return 1.0
    return min(cap, max(1.0, load / (os.cpu_count() or 1)))
