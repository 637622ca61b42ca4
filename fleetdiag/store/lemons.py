"""The lemon view's record: one host's one trouble across the kept sweeps, its episodes and boots."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..units import iso
from .incidents import Trouble

BOOT_SLACK = 120.0  # boot times (remote now − uptime) closer than this are the same boot


@dataclass
class Recurrence(Trouble):
    """One host's one trouble across the kept sweeps: episodes and boots it was seen on."""

    episodes: int = 0  # separate times it appeared (seen, gone or another trouble, back)
    sweeps: int = 0
    first_seen: float | None = None
    last_seen: float | None = None
    boots: list[float] = field(default_factory=list)  # distinct boot times it was seen on

    def lemon(self, recur: int = 3) -> str | None:
        """Why this host is a lemon for this trouble, or None: back ``recur`` times or more, or seen
        again after the host rebooted (gpud's reboot-count escalation: a reboot did not fix it)."""
        why = []
        if self.episodes >= recur:
            why.append(f"back {self.episodes} times")
        if len(self.boots) >= 2:
            why.append(f"seen on {len(self.boots)} boots (again after a reboot)")
        return "; ".join(why) or None

    def to_json(self) -> dict[str, Any]:
        return {
            **self.trouble_json(),
            "episodes": self.episodes,
            "sweeps": self.sweeps,
            "boots": len(self.boots),
            "first_seen": iso(self.first_seen),
            "last_seen": iso(self.last_seen),
        }


def boot_of(record: str | None) -> float | None:
    """The host's boot time in a stored result (its kernel clock: remote now − uptime), if it was read."""
    if not record:
        return None
    try:
        kl = (json.loads(record).get("facts") or {}).get("kernel_log") or {}
        boot = kl.get("boot") if isinstance(kl, dict) else None
        return float(boot) if isinstance(boot, (int, float)) and not isinstance(boot, bool) else None
    except (ValueError, AttributeError):
        return None
