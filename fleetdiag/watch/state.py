"""One watched host's state machine: pure, with the clock passed in.

``HostState`` holds the evidence (connection up/down since when, the latest
analysis, log status, when the log last grew, the process heartbeat) and
``decide(now)`` turns it into a state and a one-line reason; ``evaluate(now)``
applies it and says whether that was a change worth an event. Nothing here
reads a clock, sleeps or touches the network, so every rule (stall, grace,
wait limit, recovered) is testable with plain numbers for ``now``.

Times are the monotonic clock of ``WatchSettings.clock``; the view's
``since``/``last_activity`` are unix times for display, from ``wall``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..analysis.lines import parse_all
from ..evidence import hang as hang_mod
from ..evidence.cadence import Silence
from ..records import SCHEMA_VERSION, Decisive, HostResult, Timing, Verdict, WatchState
from ..units import ago
from .buffer import LineBuffer
from .settings import WatchSettings

FAILED = WatchState.FAILED
STALLED = WatchState.STALLED
UNREACHABLE = WatchState.UNREACHABLE
NO_LOG = WatchState.NO_LOG
CONNECTING = WatchState.CONNECTING
STARTING = WatchState.STARTING
RECOVERED = WatchState.RECOVERED
HEALTHY = WatchState.HEALTHY
# Worst first: summaries and the table sort by it.
STATES = tuple(WatchState)
TROUBLE = (FAILED, STALLED, UNREACHABLE, NO_LOG)
# What a watch state is in the shared verdict vocabulary (cards, JSON, exit codes).
VERDICT_OF = {CONNECTING: Verdict.STARTING, RECOVERED: Verdict.HEALTHY}


def verdict_of(state: str) -> Verdict:
    """The probe verdict a watch state stands for."""
    return VERDICT_OF.get(state) or Verdict(state)


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class WatchEvent:
    """A host changed state (or, while failed, its decisive error changed)."""

    seq: int  # strictly increasing across the whole watch
    time: float  # unix time
    host: str
    state: str
    previous: str | None
    reason: str  # one line: the decisive error, why stalled, why unreachable, the log's summary
    decisive: Decisive | None = None
    idle_seconds: float | None = None
    rtt_ms: float | None = None
    log: str | None = None
    idle_from: str | None = None  # what idle_seconds counts from: "log mtime" or "last line received" (a stream)
    evidence: list[dict[str, Any]] = field(default_factory=list)  # kernel/GPU evidence, as probe's JSON has it

    def to_json(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "event": "state",
            "seq": self.seq,
            "time": round(self.time, 3),
            "host": self.host,
            "state": self.state,
            "previous": self.previous,
            "verdict": verdict_of(self.state),
            "reason": self.reason,
            "decisive": asdict(self.decisive) if self.decisive is not None else None,
            "idle_seconds": None if self.idle_seconds is None else round(self.idle_seconds, 1),
            "rtt_ms": self.rtt_ms,
            "log": self.log,
            "idle_from": self.idle_from,
            "evidence": self.evidence,
        }


@dataclass
class HostView:
    """What the dashboard shows for one host. Read it; only the watcher writes it."""

    host: str
    address: str | None = None
    state: WatchState = CONNECTING
    reason: str = "connecting"
    since: float = field(default_factory=time.time)  # unix time of the last state change
    last_activity: float | None = None  # unix time the log last grew (remote clock corrected)
    rtt_ms: float | None = None  # from the follower's exec round trip on the latest connection
    connected: bool = False
    reconnects: int = 0
    log: str | None = None
    error: str | None = None  # the latest connection problem, even while within the grace period
    result: HostResult | None = None  # the latest analysis, as probe would report it
    process_alive: bool | None = None
    markers: list[str] = field(default_factory=list)
    idle_from: str | None = None  # "log mtime", or "last line received" for a stream source

    def idle(self, now: float | None = None) -> float | None:
        if self.last_activity is None:
            return None
        return max(0.0, (now if now is not None else time.time()) - self.last_activity)

    def to_result(self) -> HostResult:
        """This host as a probe-shaped HostResult (cards, JSON summary, exit codes)."""
        base = self.result
        res = replace(base) if base is not None else HostResult(host=self.host, verdict=Verdict.STARTING)
        res.host = self.host
        res.address = self.address
        res.verdict = verdict_of(self.state)
        res.log = self.log or res.log
        res.idle_seconds = self.idle()
        res.markers = list(res.markers) + [m for m in self.markers if m not in res.markers]
        if self.rtt_ms is not None:
            res.timing = replace(res.timing or Timing(), rtt_ms=self.rtt_ms)
        if self.state == UNREACHABLE:
            res.error = self.error or self.reason
        elif self.state in (STALLED, STARTING, CONNECTING, NO_LOG):
            res.summary = self.reason
            if self.state == NO_LOG:
                res.error = self.reason
        return res


@dataclass
class HostState:
    """The evidence one host's state is decided from, and the rules that decide it.

    Every method that depends on time takes ``now`` (the watch's monotonic
    clock); none reads a clock itself.
    """

    settings: WatchSettings
    view: HostView
    buffer: LineBuffer
    stall_after: float  # the inventory's per-host value, else the watch's
    log_path: str | None = None
    log_status: str = "ok"  # the funnel's LogStatus, or "config" (no log configured), "error"
    fatal: bool = False  # a connection problem no retry fixes: unreachable at once
    ever_up: bool = False
    down_since: float | None = None  # since the first failure of a still-failing connection
    waiting_since: float | None = None  # since the analysis first said "starting"
    seen_log: bool = False  # the log existed at some point (so "missing" means removed)
    troubled: bool = False  # was in a TROUBLE state and has not recovered since
    activity: float | None = None  # when the log last grew
    fp: str | None = None  # the decisive error's fingerprint while failed
    wall: Callable[[], float] = time.time  # unix time for the view (display only)
    rules: Any = None  # the analysis rules: the silence judgement reads their ready/waiting patterns
    run_start: int | None = None  # the snapshot's latest run start: older lines have no say in the rhythm
    stall_limit: float | None = None  # silence beyond this may be a stall (None: serving); set per analysis
    parsed: list[Any] = field(default_factory=list)  # the latest run's buffered lines, parsed once per analysis
    judged: tuple[float, Silence] | None = None  # (when, judgement) while silent past the limit
    final: bool = False  # the log is complete (a command's output, read once): no stall by silence

    # -- evidence --
    def idle(self, now: float) -> float | None:
        return None if self.activity is None else max(0.0, now - self.activity)

    def set_activity(self, mono: float, now: float) -> None:
        """The log grew at ``mono`` (never moves back: heartbeats and syncs may arrive out of order)."""
        if self.activity is None or mono > self.activity:
            self.activity = mono
            self.view.last_activity = self.wall() - (now - mono)

    def came_up(self) -> None:
        """A snapshot arrived on a fresh connection."""
        self.view.connected = True
        if self.ever_up:
            self.view.reconnects += 1
        self.ever_up = True
        self.down_since = None
        self.view.error = None

    def went_down(self, err: str, permanent: bool, now: float) -> None:
        """The connection failed or ended; ``permanent``: no retry can fix it."""
        if self.down_since is None:
            self.down_since = now
        self.view.connected = False
        self.view.error = err
        if permanent:
            self.fatal = True

    def silence(self, idle: float) -> Silence:
        """Probe's judgement (``hang.judge_silence``) of a silence this long after the buffered lines."""
        return hang_mod.judge_silence(
            self.parsed, 0.0, idle, self.rules, self.stall_after, alive=self.view.process_alive
        )

    def analysed(self, res: HostResult, now: float) -> None:
        """A new analysis of the buffer; the wait-limit clock runs while it says "starting"."""
        self.view.result = res
        if self.rules is not None:  # the lines changed: so may the log's rhythm and phase
            self.parsed = parse_all(hang_mod.run_lines(self.buffer.lines(), self.run_start))
            self.judged = None
            self.stall_limit = self.silence(0.0).threshold_s
        else:
            self.stall_limit = self.stall_after
        if res.verdict == Verdict.STARTING:
            if self.waiting_since is None:
                self.waiting_since = now
        else:
            self.waiting_since = None

    # -- the rules --
    def decide(self, now: float) -> tuple[WatchState, str]:
        """The state the evidence supports at ``now``, and a one-line reason."""
        s = self.settings
        v = self.view
        if self.log_status == "config":
            return NO_LOG, v.error or "no log configured"
        if not v.connected:
            down = 0.0 if self.down_since is None else now - self.down_since
            if self.fatal or down >= s.grace:
                return UNREACHABLE, v.error or "unreachable"
            if not self.ever_up:
                return CONNECTING, f"retrying: {v.error}" if v.error else "connecting"
            return v.state, v.reason  # a blip: hold the last judgement while reconnecting
        res = v.result
        if res is None:
            return CONNECTING, "connecting"
        if res.verdict == Verdict.FAILED and res.decisive is not None:
            return FAILED, one_line(res.decisive.message or res.decisive.line)
        if self.log_status in ("unreadable", "binary", "error") or (
            res.verdict == Verdict.NO_LOG and self.log_status == "ok"
        ):
            return NO_LOG, res.error or f"log {self.log_status}: {self.log_path or v.log}"
        missing = self.log_status in ("missing", "no-match")
        if v.process_alive is False:
            return STALLED, f"no process matches '{s.process}', and the log names no error"
        idle = None if self.final else self.idle(now)
        if missing:
            if idle is not None and idle >= self.stall_after:
                return STALLED, f"the log has not appeared for {ago(idle)}: {v.log}"
        elif idle is not None and self.stall_limit is not None and idle >= self.stall_limit:
            if self.rules is None:  # no rules to judge the rhythm by: the fixed limit
                last = f"; last: {one_line(res.summary, 160)}" if res.summary else ""
                return STALLED, f"the log has not grown for {ago(idle)}{last}"
            # as probe judges it (never an idle server, only starting or training); once a second at most
            if self.judged is None or now - self.judged[0] >= 1.0:
                self.judged = (now, self.silence(idle))
            sil = self.judged[1]
            if sil.stalled:
                starting = one_line(res.summary, 160) if res.verdict == Verdict.STARTING else None
                return STALLED, hang_mod.stall_summary(sil, starting)
        if (
            res.verdict == Verdict.STARTING
            and self.waiting_since is not None
            and now - self.waiting_since >= s.wait_limit
        ):
            return STALLED, f"still not ready after {ago(now - self.waiting_since)} ({one_line(res.summary, 160)})"
        if missing:
            if self.seen_log:
                return STARTING, f"the log is gone (deleted or moved), waiting for it to reappear: {v.log}"
            return STARTING, f"waiting for the log to appear: {v.log}"
        if self.log_status == "empty" or not len(self.buffer):
            return STARTING, f"the log is empty so far: {v.log}"
        if res.verdict == Verdict.STARTING:
            return STARTING, one_line(res.summary) or "starting"
        return HEALTHY, one_line(res.summary) or "healthy"

    def evaluate(self, now: float) -> WatchState | None:
        """Re-decide and apply; the previous state when this is a change worth an event, else None.

        A change is a new state, or a new decisive error while failed. Healthy
        after any trouble is ``recovered`` (and stays so while healthy).
        """
        state, reason = self.decide(now)
        v = self.view
        if state == HEALTHY and (self.troubled or v.state == RECOVERED):
            state = RECOVERED
            reason = f"healthy again: {reason}"
        fp = None
        if state == FAILED and v.result is not None and v.result.decisive is not None:
            fp = v.result.decisive.fingerprint or v.result.decisive.line
        changed = state != v.state or (state == FAILED and fp != self.fp)
        v.reason = reason
        self.fp = fp
        if not changed:
            return None
        previous = v.state
        v.state = state
        v.since = self.wall()
        if state in TROUBLE:
            self.troubled = True
        elif state == RECOVERED:
            self.troubled = False
        return previous
