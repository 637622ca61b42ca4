"""What a watch needs besides the hosts: its limits, periods and transport."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..analysis import Rules, load_rules
from ..probe import DEFAULT_STALL_AFTER
from ..ssh.reach import TransportOptions

DEFAULT_WAIT_LIMIT = 900.0


@dataclass
class WatchSettings:
    """Everything a watch needs besides the hosts. Durations are seconds."""

    log: str | None = None  # --log NAME|PATH, as probe
    rules: Rules | None = None
    transport: TransportOptions = field(default_factory=TransportOptions)
    stall_after: float = DEFAULT_STALL_AFTER  # no growth for this long: stalled
    wait_limit: float = DEFAULT_WAIT_LIMIT  # "waiting for … ready" / loading for this long: stalled
    process: str | None = None  # pgrep -f pattern of the serving process; gone + no error: stalled
    heartbeat: float = 2.0  # remote heartbeat period
    poll: float = 0.2  # remote: stat period in poll mode, minimum gap between reads in wake mode
    mode: str = "auto"  # remote wake-up: auto (inotify via GNU tail -F where present) or poll
    shell: str = "auto"  # remote loop shell: auto (bash when present) or sh
    grace: float = 10.0  # a connection down this long makes the host unreachable
    backoff_min: float = 0.5
    backoff_max: float = 10.0
    buffer_lines: int = 4000  # per host; the middle of an over-long run is dropped first
    facts: bool = True  # GPU / serving-process facts in the snapshot (hints use them)
    kernel: bool = True  # the kernel log and GPU health in the snapshot, as probe reads them
    connect_fanout: int = 64  # handshakes in flight at once, fleet-wide
    per_address: int = 8  # ... per address:port (sshd MaxStartups is 10 by default)
    jump_resolver: Callable[[str], tuple[str, int | None, str | None]] | None = None
    clock: Callable[[], float] = time.monotonic  # the rules' clock; injectable for tests
    path_prepend: str | None = None  # a remote dir before PATH (journalctl, docker in odd places), as probe
    silence: float | None = None  # no record for this long: the connection is dead [max(15, 5 × heartbeat)]

    def get_rules(self) -> Rules:
        if self.rules is None:
            self.rules = load_rules()
        return self.rules

    @property
    def silence_limit(self) -> float:
        """Seconds without any record before a connection counts as dead (heartbeats missed).

        Catches what TCP does not report: a peer that vanished without a RST
        (a NAT or firewall dropping state, a powered-off host).
        """
        return self.silence if self.silence else max(15.0, 5 * self.heartbeat)
