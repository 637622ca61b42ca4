"""What a host's trouble is: its incident key ("the same trouble"), its category, who acts on it, its group."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..records import DEGRADED, FAILED, HEALTHY, NO_LOG, STALLED, STARTING, UNREACHABLE, VERDICTS, HostResult


def incident_key(res: HostResult) -> str | None:
    """The fingerprint of a host's trouble, or None when there is none.

    A failure is its decisive error's fingerprint (numbers, pids, paths
    normalised by the analyzer), so the same root cause matches across hosts
    and sweeps. Unreachable hosts match by kind of problem (refused, timeout,
    deadline, host key ...), not by message, which names ports and addresses.
    """
    if res.verdict in (HEALTHY, STARTING):
        return None
    d = res.decisive
    if res.verdict == FAILED:
        if d is not None and d.fingerprint:
            return d.fingerprint
        return f"failed:{(d.exception_type if d else None) or 'unknown'}"
    if res.verdict == STALLED:
        return f"stalled:{d.fingerprint}" if d is not None and d.fingerprint else "stalled"
    if res.verdict == DEGRADED:  # the same faults on the same GPUs: one incident until they change
        from ..analysis.fingerprint import fingerprint

        if d is not None and d.fingerprint:  # a kernel fault that stands alone: its line's fingerprint
            return f"degraded:{d.fingerprint}"
        faults = sorted(str(e.get("line")) for e in res.evidence if e.get("source") == "gpu")
        return f"degraded:{fingerprint('gpu-health', '; '.join(faults))}" if faults else "degraded"
    kind = res.error_kind
    if res.verdict == UNREACHABLE:
        return f"unreachable:{kind or 'error'}"
    if res.verdict == NO_LOG:
        if kind:
            return f"no-log:{kind}"
        why = (res.error or "").split(":", 1)[0].strip().lower()
        return f"no-log:{why or 'unknown'}"
    return f"{res.verdict}:{kind or ''}"


def state_key(res: HostResult) -> str:
    """Like :func:`incident_key`, with healthy and starting hosts as their own states."""
    return incident_key(res) or res.verdict


def describe(res: HostResult) -> str:
    """One line saying what is wrong (or right) with a host."""
    if res.decisive is not None:
        return res.decisive.message or res.decisive.line
    return res.error or res.summary or res.verdict


# Who acts on a host's trouble: the label alerts route on (``fleetdiag_host_verdict{action=...}``).
ACTION_CLASSES = (
    "hardware",
    "driver",
    "network",
    "config",
    "capacity",
    "software",
    "hang",
    "access",
    "consequence",
    "none",
)
_ACTION_OF_CATEGORY = {
    "hardware": "hardware",
    "driver": "driver",
    "nccl": "network",
    "network": "network",
    "config": "config",
    "oom": "capacity",
    "disk": "capacity",
    "cuda": "software",
    "import": "software",
    "python": "software",
    "other": "software",
}


def category_of(res: HostResult) -> str:
    """The host's trouble in one word: the decisive error's category, ``gpu-health`` for a degraded
    GPU, the kind of failure to reach it (``unreachable``/``no-log``), or ``none`` when healthy."""
    if res.verdict in (HEALTHY, STARTING):
        return "none"
    if res.decisive is not None and res.decisive.category:
        return res.decisive.category
    if res.verdict == DEGRADED:
        return "hardware"
    if res.verdict in (UNREACHABLE, NO_LOG):
        return res.verdict
    return "other"


def action_class(res: HostResult) -> str:
    """Who has to act (one of ``ACTION_CLASSES``): hardware (drain, RMA), driver (reset or reboot),
    network (fabric), config (the launch), capacity (memory, disk), software (the code), hang (a
    stalled job), access (SSH or the log cannot be reached), consequence (failed because another
    host of its job did: act there), none (healthy)."""
    if res.verdict in (HEALTHY, STARTING):
        return "none"
    if res.verdict == DEGRADED:
        return "hardware"
    if res.verdict in (UNREACHABLE, NO_LOG):
        return "access"
    if res.job_role is not None and res.job_role.role == "consequence":  # a job's victim: act on its root's host
        return "consequence"
    d = res.decisive
    if d is not None and d.rule == "gpu-hardware":
        return "hardware"
    if d is not None and d.category in _ACTION_OF_CATEGORY and not (res.verdict == STALLED and d.category == "other"):
        return _ACTION_OF_CATEGORY[d.category]
    return "hang" if res.verdict == STALLED else "software"


@dataclass
class CauseGroup:
    """Hosts in the same state for the same root cause (the fleet view's rows)."""

    key: str
    verdict: str
    results: list[HostResult]

    @property
    def hosts(self) -> list[str]:
        return [r.host for r in self.results]

    @property
    def folded(self) -> str:
        from ..inventory import fold

        return fold(self.hosts)

    @property
    def example(self) -> HostResult:
        return self.results[0]


def group_by_cause(results: Iterable[HostResult]) -> list[CauseGroup]:
    """Group by :func:`state_key`; worst verdict first, then biggest group."""
    groups: dict[str, CauseGroup] = {}
    for r in results:
        k = state_key(r)
        if k not in groups:
            groups[k] = CauseGroup(k, r.verdict, [])
        groups[k].results.append(r)
    rank = {v: i for i, v in enumerate(VERDICTS)}
    return sorted(groups.values(), key=lambda g: (rank.get(g.verdict, len(rank)), -len(g.results), g.hosts[0]))
