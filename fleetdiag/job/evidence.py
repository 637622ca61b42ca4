"""The job analysis's records: ``HostEvidence`` in (from a ``HostResult``), ``RootCause`` out."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..records import Clock
from .clock import clock_offset

WINDOW_S = 120.0  # failures of one job fall within this many seconds (after clock correction)
KEEP_WIDTH = 1000  # each clipped to this many characters
LOOPBACK = re.compile(r"^(?:localhost|127\.\d+\.\d+\.\d+|::1|0\.0\.0\.0)$")


# ---------------------------------------------------------------- input and output records


@dataclass
class HostEvidence:
    """What one failed host says about the job, in the shape the job analysis needs.

    ``lines`` are the host's log lines as read (error lines and their
    neighbours at least), used for times, ranks and watchdog evidence.
    """

    host: str
    line: str  # the decisive line, raw
    message: str = ""
    kind: str = ""  # filled by classify(): a peer-caused kind, or "" for local-origin
    process: str | None = None
    rank: int | None = None
    time: str | None = None  # the decisive line's raw timestamp, when it has one
    fingerprint: str = ""
    traceback: list[str] = field(default_factory=list)
    pos: int | None = None
    lineno: int | None = None
    address: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    offset: float = 0.0  # clock_offset of the host
    rtt: float | None = None
    mtime: float | None = None
    zone: Any = None
    lines: list[str] = field(default_factory=list)
    signal: str | None = None  # filled by own_line(): the rank died by this signal with no error of its own
    pid: int | None = None  # the rank's pid, from its launcher's report
    chosen: str = ""  # how the host's line was chosen, when not the analyzer's decisive line
    kernel: list[str] = field(default_factory=list)  # the host's kernel lines the probe read (OOM killer)
    err_time: float | None = None  # the rank's error file's timestamp (epoch seconds, the host's clock)
    role: str | None = None  # the analyzer's role of the decisive line, where it gives one (peer-caused …)
    below: str | None = None  # the cause below the log the host's analysis found (a kernel line), when it did
    quiet: bool = False  # no error of its own (a stalled host, a rank still asleep): only a straggler candidate


@dataclass
class RootCause:
    """The node that broke a job, and the hosts that failed because of it."""

    host: str
    rank: int | None
    line: str
    time: str | None  # ISO 8601, UTC, on the local (corrected) clock
    fingerprint: str
    affected: list[str]
    why: str
    consequences: list[tuple[str, str, float | None]] = field(default_factory=list)  # host, kind, seconds after root
    formed: str = ""  # how the hosts were found to be one job ("same rendezvous 10.0.0.1:29500; ranks 0–7 of 8")
    evidence: list[str] = field(default_factory=list)  # what the nodes recorded: error file, Flight Recorder, RAS

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "rank": self.rank,
            "line": self.line,
            "time": self.time,
            "fingerprint": self.fingerprint,
            "affected": list(self.affected),
            "why": self.why,
            "formed": self.formed,
            "evidence": list(self.evidence),
        }


def evidence_from_result(
    result: Any,
    *,
    lines: Sequence[str] | None = None,
    offset: float | None = None,
    rtt: float | None = None,
    mtime: float | None = None,
    zone: Any = None,
) -> HostEvidence | None:
    """HostEvidence from a ``fleetdiag.records.HostResult`` (None when it has no decisive error).

    Clock inputs missing here are read from ``result.clock`` (its ``offset``, else
    ``local_receive`` and ``remote_now``; its ``zone``), ``result.log_mtime`` and
    ``timing.rtt_ms`` when present.
    """
    dec = getattr(result, "decisive", None)
    quiet = dec is None
    if quiet:
        if not _quiet_member(result):
            return None
        dec = _QuietLine(line=str(getattr(result, "summary", "") or "no error of its own"))
        if lines is None:  # its own log lines, not the summary (a straggler's last line is one of them)
            kept_q = getattr(result, "job", None)
            lines = [str(x) for x in kept_q.lines] if kept_q is not None else []
    facts = dict(getattr(result, "facts", None) or {})
    clock = getattr(result, "clock", None) or Clock()
    timing = getattr(result, "timing", None)
    if rtt is None and timing is not None and getattr(timing, "rtt_ms", None) is not None:
        rtt = timing.rtt_ms / 1000.0
    if offset is None:
        if clock.offset is not None:
            offset = clock.offset
        elif clock.local_receive is not None and clock.remote_now is not None:
            offset = clock_offset(clock.local_receive, rtt or 0.0, clock.remote_now)
    if mtime is None:
        mtime = getattr(result, "log_mtime", None)
    kept = getattr(result, "job", None)
    below = None
    if getattr(dec, "source", "log") not in ("log", None) and not quiet:
        # a cause below the log (a kernel line, the GPU's health): its stamp is the kernel's clock, often boot
        # seconds; the job is ordered by the application's own line, the cause named beside it
        below = dec.line
        dec = _QuietLine(
            line=str(getattr(dec, "consequence", None) or dec.line),
            rank=dec.rank,
            fingerprint=dec.fingerprint,
        )
    if lines is None and kept is not None:
        lines = [str(x) for x in kept.lines]
    return HostEvidence(
        host=result.host,
        line=dec.line,
        message=dec.message,
        process=dec.process,
        rank=dec.rank,
        time=dec.time,
        fingerprint=dec.fingerprint,
        traceback=list(dec.traceback or []),
        pos=dec.pos,
        lineno=dec.lineno,
        address=getattr(result, "address", None),
        facts=facts,
        offset=offset or 0.0,
        rtt=rtt,
        mtime=mtime,
        zone=zone if zone is not None else clock.zone,
        lines=list(lines) if lines is not None else list(dec.traceback or []) or [dec.line],
        kernel=[
            str(e.get("line") or "")
            for e in (getattr(result, "evidence", None) or [])
            if isinstance(e, dict) and e.get("source") == "kernel"
        ][:64],
        role=getattr(dec, "role", None),
        quiet=quiet,
        below=below,
    )


@dataclass
class _QuietLine:
    """The stand-in decisive record of a host with no error of its own (stalled, or its rank asleep)."""

    line: str
    message: str = ""
    process: str | None = None
    rank: int | None = None
    time: str | None = None
    fingerprint: str = ""
    traceback: list[str] = field(default_factory=list)
    pos: int | None = None
    lineno: int | None = None


def _quiet_member(result: Any) -> bool:
    """A host with no error that may still be a job's straggler: stalled, or with ranks the node's facts name."""
    if str(getattr(result, "verdict", "")) != "stalled":
        return False
    facts = getattr(result, "facts", None) or {}
    return bool(facts.get("stacks") or facts.get("node"))
