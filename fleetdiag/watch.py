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

This module is core: no click, no rich. The CLI renders :class:`WatchEvent`
and :class:`HostView`.
"""

from __future__ import annotations

import asyncio
import math
import random
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, AsyncIterator, Callable, Iterable, Sequence

from . import follow as follow_mod
from . import funnel as funnel_mod
from .analysis import Rules, load_rules
from .job import clock_sample as job_clock_sample
from .probe import (
    DEFAULT_STALL_AFTER,
    HostLike,
    ProbeSettings,
    add_job_facts,
    finish,
    open_host,
    spec_for,
)
from .reach import (
    AUTH,
    CLOSED,
    HOSTKEY_CHANGED,
    HOSTKEY_UNKNOWN,
    KEY,
    OVERSIZE,
    TIMEOUT,
    HostError,
    TransportOptions,
)
from .records import (
    FAILED,
    HEALTHY,
    NO_LOG,
    SCHEMA_VERSION,
    STALLED,
    STARTING,
    UNREACHABLE,
    Decisive,
    FunnelResult,
    HostResult,
    Line,
    Timing,
)
from .scheduler import HandshakeGate
from .transport import explain
from .units import ago

CONNECTING = "connecting"
RECOVERED = "recovered"
# Worst first: summaries and the table sort by it.
STATES = (FAILED, STALLED, UNREACHABLE, NO_LOG, CONNECTING, STARTING, RECOVERED, HEALTHY)
TROUBLE = (FAILED, STALLED, UNREACHABLE, NO_LOG)
# What a watch state is in the shared verdict vocabulary (cards, JSON, exit codes).
VERDICT_OF = {CONNECTING: STARTING, RECOVERED: HEALTHY}
# No retry fixes these, and repeating a refused login can get the client banned.
PERMANENT = (AUTH, HOSTKEY_UNKNOWN, HOSTKEY_CHANGED, KEY, OVERSIZE)

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
    connect_fanout: int = 64  # handshakes in flight at once, fleet-wide
    per_address: int = 8  # ... per address:port (sshd MaxStartups is 10 by default)
    jump_resolver: Callable[[str], tuple[str, int | None, str | None]] | None = None
    clock: Callable[[], float] = time.monotonic  # injectable for tests

    def get_rules(self) -> Rules:
        if self.rules is None:
            self.rules = load_rules()
        return self.rules

    silence: float | None = None  # no record for this long: the connection is dead [max(15, 5 × heartbeat)]

    @property
    def silence_limit(self) -> float:
        """Seconds without any record before a connection counts as dead (heartbeats missed).

        Catches what TCP does not report: a peer that vanished without a RST
        (a NAT or firewall dropping state, a powered-off host).
        """
        return self.silence if self.silence else max(15.0, 5 * self.heartbeat)


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

    def to_json(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "event": "state",
            "seq": self.seq,
            "time": round(self.time, 3),
            "host": self.host,
            "state": self.state,
            "previous": self.previous,
            "verdict": VERDICT_OF.get(self.state, self.state),
            "reason": self.reason,
            "decisive": asdict(self.decisive) if self.decisive is not None else None,
            "idle_seconds": None if self.idle_seconds is None else round(self.idle_seconds, 1),
            "rtt_ms": self.rtt_ms,
            "log": self.log,
        }


@dataclass
class HostView:
    """What the dashboard shows for one host. Read it; only the watcher writes it."""

    host: str
    address: str | None = None
    state: str = CONNECTING
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

    def idle(self, now: float | None = None) -> float | None:
        if self.last_activity is None:
            return None
        return max(0.0, (now if now is not None else time.time()) - self.last_activity)

    def to_result(self) -> HostResult:
        """This host as a probe-shaped HostResult (cards, JSON summary, exit codes)."""
        base = self.result
        res = replace(base) if base is not None else HostResult(host=self.host, verdict=STARTING)
        res.host = self.host
        res.address = self.address
        res.verdict = VERDICT_OF.get(self.state, self.state)
        res.log = self.log or res.log
        res.idle_seconds = self.idle()
        res.markers = list(res.markers) + [m for m in self.markers if m not in res.markers]
        if self.rtt_ms is not None:
            res.timing = replace(res.timing, rtt_ms=self.rtt_ms)
        if self.state == UNREACHABLE:
            res.error = self.error or self.reason
        elif self.state in (STALLED, STARTING, CONNECTING, NO_LOG):
            res.summary = self.reason
            if self.state == NO_LOG:
                res.error = self.reason
        return res


# ------------------------------------------------------------------ line buffer


class LineBuffer:
    """The latest run's lines the analyzer needs, merged by byte position, bounded.

    Two parts: the error-shaped lines with their context (and the snapshot),
    capped at ``cap`` lines by dropping the middle (the first lines hold the
    earliest, decisive error; the last ones the current state); and the last
    ``tail_cap`` routine lines, which only say where the log is now. A line
    seen twice (snapshot and follower, or a held-back partial line that later
    got its end) is kept once, the later text winning. A run-start line drops
    everything before it, as the funnel does.
    """

    def __init__(self, cap: int = 4000, tail_cap: int = 100):
        self.cap = max(10, cap)
        self._by_pos: dict[int, Line] = {}
        self._tail: dict[int, Line] = {}  # insertion order = arrival order
        self.tail_cap = max(1, tail_cap)
        self.dropped = 0
        self.dirty = False

    def __len__(self) -> int:
        return len(self._by_pos) + len(self._tail)

    def reset(self, lines: Iterable[Line] = ()) -> None:
        self._by_pos = {}
        self._tail = {}
        self.dropped = 0
        for ln in lines:
            self._by_pos[ln.pos] = ln
        self.dirty = True
        self._trim()

    def add_tail(self, ln: Line) -> None:
        kept = self._by_pos.get(ln.pos)
        if kept is not None:  # already an important line: just take the newer text
            if kept.text != ln.text:
                self._by_pos[ln.pos] = Line(ln.pos, ln.text, ln.lineno if ln.lineno is not None else kept.lineno)
                self.dirty = True
            return
        if self._tail.get(ln.pos) == ln:
            return
        self._tail.pop(ln.pos, None)
        self._tail[ln.pos] = ln
        while len(self._tail) > self.tail_cap:
            del self._tail[next(iter(self._tail))]
        self.dirty = True

    def add(self, ln: Line, run_start: bool = False) -> None:
        if run_start:
            self._by_pos = {p: x for p, x in self._by_pos.items() if p >= ln.pos}
            self._tail = {p: x for p, x in self._tail.items() if p >= ln.pos}
            self.dropped = 0
        self._tail.pop(ln.pos, None)
        old = self._by_pos.get(ln.pos)
        if old is not None and old.text == ln.text:
            return
        if old is not None and ln.lineno is None:
            ln = Line(ln.pos, ln.text, old.lineno)
        self._by_pos[ln.pos] = ln
        self.dirty = True
        if len(self._by_pos) > self.cap:
            self._trim()

    def _trim(self) -> None:
        if len(self._by_pos) <= self.cap:
            return
        order = sorted(self._by_pos)
        head, tail = self.cap // 2, self.cap - self.cap // 2
        for p in order[head:len(order) - tail]:
            del self._by_pos[p]
            self.dropped += 1

    def lines(self) -> list[Line]:
        merged = {**self._tail, **self._by_pos}
        return [merged[p] for p in sorted(merged)]


# ------------------------------------------------------------------ one host




def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Watchdog:
    """Closes a connection when its current deadline passes (see ``HostWatcher._follow``)."""

    def __init__(self, clock: Callable[[], float], close: Callable[[], None]):
        self.clock = clock
        self.close = close
        self.deadline = math.inf
        self.why = ""
        self.fired: str | None = None

    def arm(self, seconds: float, why: str) -> None:
        self.deadline = self.clock() + seconds
        self.why = why

    async def run(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, min(0.5, self.deadline - self.clock())))
            if self.clock() >= self.deadline:
                self.fired = self.why
                self.close()
                return


class HostWatcher:
    """One host: connect, follow, reconnect; analyse each burst; decide the state."""

    def __init__(self, host: HostLike, settings: WatchSettings, emit: Callable[["HostWatcher", str | None], None],
                 session: str, gate: Callable[[HostLike], Any] | None = None):
        self.host = host
        self.settings = settings
        self.rules = settings.get_rules()
        self._emit = emit
        self.session = session
        self._gate = gate
        self.view = HostView(host.name, address=host.target)
        self.buffer = LineBuffer(settings.buffer_lines)
        own = (host.funnel or {}).get("stall_after")  # the inventory's per-host value wins, as in probe
        self.stall_after = float(own) if own else settings.stall_after
        self.log_path: str | None = None
        self.log_status = "ok"
        self.facts: dict[str, Any] = {}
        self.raw_facts: dict[str, Any] = {}
        self.fatal = False
        self.ever_up = False
        self.down_since: float | None = None  # since the first failure of a still-failing connection
        self.waiting_since: float | None = None
        self.seen_log = False  # the log existed at some point (so "missing" means removed)
        self.troubled = False
        self.remote_pids: list[int] = []  # this session's followers on the host (their sh pids)
        self._fp: str | None = None
        self._pos = 0
        self._activity_mono: float | None = None
        self.analyses = 0
        self.clock: dict[str, Any] | None = None  # the latest remote clock sample (heartbeats), for job analysis

    # -- time: monotonic inside, unix time in the view --
    def _now(self) -> float:
        return self.settings.clock()

    def _set_activity(self, mono: float) -> None:
        if self._activity_mono is None or mono > self._activity_mono:
            self._activity_mono = mono
            self.view.last_activity = time.time() - (self._now() - mono)

    def idle(self) -> float | None:
        return None if self._activity_mono is None else max(0.0, self._now() - self._activity_mono)

    # -- the connection loop --
    async def run(self) -> None:
        """Follow the host until cancelled; never raises for a host-side problem."""
        s = self.settings
        try:
            _name, path = self.host.log_path(s.log)
        except Exception as exc:  # an inventory problem for this host only
            self.log_status = "config"
            self.view.error = str(exc)
            self.fatal = True
            self.evaluate()
            return
        self.view.log = path
        backoff = s.backoff_min
        while True:
            started = self._now()
            kind = None
            try:
                conn = await self._connect()
                try:
                    await self._follow(conn, path)
                finally:
                    conn.close()
                err = "the follower stopped"
            except HostError as exc:
                err, kind = str(exc), exc.kind
            except OSError as exc:
                he = explain(exc, self.host.target, self.host.port)
                err, kind = str(he), he.kind
            except Exception as exc:  # a bug here must not freeze this host's row silently
                err, kind = f"internal error in fleetdiag ({type(exc).__name__}: {exc}); retrying", "internal"
            self._down(err, kind)
            if kind in PERMANENT:
                return
            if self._now() - started > 2 * s.backoff_max:  # it had been up a while: start over
                backoff = s.backoff_min
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, s.backoff_max)

    async def _connect(self) -> Any:
        opts = self.settings.transport
        if not opts.keepalive:  # watch connections live for hours: notice a dead peer (DESIGN §4)
            opts = replace(opts, keepalive=max(5.0, 2 * self.settings.heartbeat),
                           extra={"keepalive_count_max": 3, **opts.extra})
        ps = ProbeSettings(transport=opts, jump_resolver=self.settings.jump_resolver)
        if self._gate is None:
            return await open_host(self.host, ps)
        async with self._gate(self.host):
            return await open_host(self.host, ps)

    def _spec(self, path: str) -> follow_mod.FollowSpec:
        fs = spec_for(path, self.rules, self.host.funnel)
        if self.settings.facts:
            from . import facts as facts_mod  # lazily: facts are optional

            fs.extra += facts_mod.SNIPPET
            fs.extra_vars.update(facts_mod.snippet_vars(None))
        return follow_mod.FollowSpec(
            funnel=fs, waiting=self.rules.waiting_ere(), ready=self.rules.ready_ere(), process=self.settings.process,
            session=self.session, kill=list(self.remote_pids), poll=self.settings.poll,
            heartbeat=self.settings.heartbeat, mode=self.settings.mode, shell=self.settings.shell,
        )

    async def _follow(self, conn: Any, path: str) -> None:
        """One exec: the snapshot, then records until the connection ends or goes silent.

        Deadlines are kept by a watchdog that closes the connection, not by
        ``asyncio.wait_for`` around each read: on Python 3.10/3.11 wait_for can
        swallow a cancellation that races with a completed read, and a watch
        must always stop on Ctrl-C.
        """
        s = self.settings
        mark = funnel_mod.new_mark()
        command = funnel_mod.remote_command(follow_mod.build_script(self._spec(path), mark))
        dog = _Watchdog(self._now, conn.close)
        dog.arm(s.transport.connect_timeout + s.transport.command_timeout, "no answer to the follower's exec request")
        dog_task = asyncio.ensure_future(dog.run())
        try:
            t0 = time.perf_counter()
            async with conn.stream(command) as stream:
                self.view.rtt_ms = round((time.perf_counter() - t0) * 1000 / 2, 1)
                await self._read(stream, mark, dog)
        except (HostError, OSError):
            if dog.fired:
                raise HostError(TIMEOUT, dog.fired) from None
            raise
        finally:
            dog_task.cancel()
        if dog.fired:
            raise HostError(TIMEOUT, dog.fired)

    async def _read(self, stream: Any, mark: str, dog: "_Watchdog") -> None:
        s = self.settings
        end = (mark + " end").encode()
        raw = bytearray()
        dog.arm(s.transport.command_timeout, f"no snapshot within {s.transport.command_timeout:g}s")
        while True:  # the funnel's snapshot: exactly what probe would have read, bounded like probe's
            line = await self._line(stream, dog)
            raw += line
            if line.rstrip(b"\r\n") == end:
                break
        stream.cap = None  # records follow for hours; each line is still bounded
        fr = funnel_mod.parse_output(raw.decode("utf-8", "replace"), mark)
        self._snapshot(fr)
        silent = f"no heartbeat for {s.silence_limit:g}s: connection presumed dead"
        while True:
            dog.arm(s.silence_limit, silent)
            line = await self._line(stream, dog)
            rec = follow_mod.parse_record(line.decode("utf-8", "replace").rstrip("\n"))
            if rec is not None:
                self._record(rec)

    @staticmethod
    async def _line(stream: Any, dog: "_Watchdog") -> bytes:
        line = await stream.readline()
        if not line:
            if dog.fired:
                raise HostError(TIMEOUT, dog.fired)
            status = stream.exit_status
            raise HostError(CLOSED, "the remote follower ended" + (f" (exit status {status})" if status else ""))
        return line

    # -- applying what arrives --
    def _snapshot(self, fr: FunnelResult) -> None:
        now = self._now()
        self.view.connected = True
        if self.ever_up:
            self.view.reconnects += 1
        self.ever_up = True
        self.down_since = None
        self.view.error = None
        self.log_path = fr.path or self.log_path
        if fr.path:
            self.view.log = fr.path
        self.log_status = fr.status
        self.seen_log = self.seen_log or fr.status not in ("missing", "no-match")
        self.raw_facts = dict(fr.facts)
        pid = (fr.facts.get("remote") or {}).get("pid")
        if pid and str(pid).isdigit():  # the newest last; earlier ones are ended by the next follower
            self.remote_pids = (self.remote_pids + [int(pid)])[-4:]
        if self.settings.facts:
            from . import facts as facts_mod

            self.facts = facts_mod.build(fr.facts.get("raw"))
        self.view.markers = list(fr.markers)
        self.buffer.reset(fr.lines() if fr.status == "ok" else ())
        self._pos = fr.size or 0
        idle = fr.idle_seconds
        if idle is not None:
            self._set_activity(now - idle)
        elif self._activity_mono is None:
            self._set_activity(now)  # a missing log: the stall clock runs from now
        self._analyze()
        self.evaluate()

    def _record(self, rec: follow_mod.Record) -> None:
        now = self._now()
        if isinstance(rec, Line):
            self.buffer.add(rec, self.rules.is_run_start(rec.text))
        elif isinstance(rec, follow_mod.Tail):
            self.buffer.add_tail(rec.line)
        elif isinstance(rec, follow_mod.Sync):
            if rec.pos != self._pos:
                self._pos = rec.pos
                self._set_activity(now)
                self.log_status = "ok"
                self.seen_log = True
            if self.buffer.dirty:
                self._analyze()
            self.evaluate()
        elif isinstance(rec, follow_mod.Heartbeat):
            self.view.process_alive = rec.alive
            if rec.mtime is not None and rec.now:
                self._set_activity(now - max(0.0, rec.now - rec.mtime))
            if rec.now:
                rtt = self.view.rtt_ms / 1000.0 if self.view.rtt_ms is not None else None
                self.clock = job_clock_sample(str(rec.now), time.time(), rtt) or self.clock
            self.evaluate()
        elif isinstance(rec, follow_mod.Reset):
            self.buffer.reset()
            self._pos = 0
            self.log_status = "empty"  # until its first bytes arrive
            self.seen_log = True
            if rec.path:
                self.view.log = self.log_path = rec.path
            self.view.markers.append(f"log {rec.reason} at {time.strftime('%H:%M:%S')}: following it from its start")
            self.view.markers = self.view.markers[-5:]
        elif isinstance(rec, follow_mod.Gone):
            self.log_status = rec.what
            self.evaluate()
        elif isinstance(rec, follow_mod.Started):
            self._pos = rec.pos
        elif isinstance(rec, follow_mod.Note):
            self.view.markers = (self.view.markers + [rec.text])[-5:]

    def _analyze(self) -> None:
        fr = FunnelResult(path=self.log_path, status="ok" if self.log_status in ("ok", "missing", "empty") else self.log_status,
                          tail=self.buffer.lines(), facts=self.raw_facts)
        if self.log_status == "missing" and not len(self.buffer):
            fr.status = "missing"
        timing = Timing(rtt_ms=self.view.rtt_ms, round_trips=1)
        res = finish(self.host.name, fr, self.rules, math.inf, timing, self.facts)
        add_job_facts(res, fr)  # the lines a job-level root cause needs (fleetdiag.job)
        if self.clock is not None:
            res.facts["clock"] = dict(self.clock)
            if self.clock.get("zone"):
                res.facts["zone"] = self.clock["zone"]
        if self.buffer.dropped:
            res.markers.append(f"watch buffer: {self.buffer.dropped} lines from the middle of the run not kept")
        self.view.result = res
        self.buffer.dirty = False
        self.analyses += 1
        if res.verdict == STARTING:
            if self.waiting_since is None:
                self.waiting_since = self._now()
        else:
            self.waiting_since = None

    def _down(self, err: str, kind: str | None) -> None:
        if self.down_since is None:
            self.down_since = self._now()
        self.view.connected = False
        self.view.error = err
        if kind in PERMANENT:
            self.fatal = True
        self.evaluate()

    # -- the state machine --
    def decide(self) -> tuple[str, str]:
        """The state the evidence supports now, and a one-line reason."""
        s = self.settings
        now = self._now()
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
        if res.verdict == FAILED and res.decisive is not None:
            return FAILED, _one_line(res.decisive.message or res.decisive.line)
        if self.log_status in ("unreadable", "binary", "error") or (res.verdict == NO_LOG and self.log_status == "ok"):
            return NO_LOG, res.error or f"log {self.log_status}: {self.log_path or v.log}"
        missing = self.log_status in ("missing", "no-match")
        if v.process_alive is False:
            return STALLED, f"no process matches '{s.process}', and the log names no error"
        idle = self.idle()
        if idle is not None and idle >= self.stall_after:
            if missing:
                return STALLED, f"the log has not appeared for {ago(idle)}: {v.log}"
            last = f"; last: {_one_line(res.summary, 160)}" if res.summary else ""
            return STALLED, f"the log has not grown for {ago(idle)}{last}"
        if res.verdict == STARTING and self.waiting_since is not None and now - self.waiting_since >= s.wait_limit:
            return STALLED, f"still not ready after {ago(now - self.waiting_since)} ({_one_line(res.summary, 160)})"
        if missing:
            if self.seen_log:
                return STARTING, f"the log is gone (deleted or moved), waiting for it to reappear: {v.log}"
            return STARTING, f"waiting for the log to appear: {v.log}"
        if self.log_status == "empty" or not len(self.buffer):
            return STARTING, f"the log is empty so far: {v.log}"
        if res.verdict == STARTING:
            return STARTING, _one_line(res.summary) or "starting"
        return HEALTHY, _one_line(res.summary) or "healthy"

    def evaluate(self) -> None:
        """Re-decide; emit an event on a change of state (or of the decisive error)."""
        state, reason = self.decide()
        v = self.view
        if state == HEALTHY and (self.troubled or v.state == RECOVERED):
            state = RECOVERED
            reason = f"healthy again: {reason}"
        fp = None
        if state == FAILED and v.result is not None and v.result.decisive is not None:
            fp = v.result.decisive.fingerprint or v.result.decisive.line
        changed = state != v.state or (state == FAILED and fp != self._fp)
        v.reason = reason
        self._fp = fp
        if not changed:
            return
        previous = v.state
        v.state = state
        v.since = time.time()
        if state in TROUBLE:
            self.troubled = True
        elif state == RECOVERED:
            self.troubled = False
        self._emit(self, previous)


# ------------------------------------------------------------------ the fleet


class Watch:
    """Many hosts at once. ``async for ev in watch.events()`` runs it; cancel to stop.

    ``views`` is always current (the dashboard redraws from it); events are
    ordered by ``seq``, which is also the order they happened in.
    """

    def __init__(self, hosts: Sequence[HostLike], settings: WatchSettings):
        self.settings = settings
        settings.get_rules()
        self.session = secrets.token_hex(6)
        self._queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        self._seq = 0
        gate = HandshakeGate(max(1, settings.per_address), settings.jump_resolver, total=max(1, settings.connect_fanout))
        self.watchers = [HostWatcher(h, settings, self._on_change, self.session, gate) for h in hosts]
        self.views: dict[str, HostView] = {w.view.host: w.view for w in self.watchers}

    def _on_change(self, w: HostWatcher, previous: str | None) -> None:
        self._seq += 1
        v = w.view
        d = v.result.decisive if (v.state == FAILED and v.result is not None) else None
        self._queue.put_nowait(WatchEvent(self._seq, time.time(), v.host, v.state, previous, v.reason, d,
                                          w.idle(), v.rtt_ms, v.log))

    def tick(self) -> None:
        """Re-evaluate the time-based conditions (stall, grace) of every host."""
        for w in self.watchers:
            w.evaluate()

    async def events(self, tick: float = 0.25) -> AsyncIterator[WatchEvent]:
        """Run every host and yield state changes until the caller stops iterating."""
        tasks = [asyncio.ensure_future(w.run()) for w in self.watchers]

        async def ticker() -> None:
            while True:
                await asyncio.sleep(tick)
                self.tick()

        tick_task = asyncio.ensure_future(ticker())
        try:
            while True:
                yield await self._queue.get()
        finally:
            everything = [tick_task, *tasks]
            for t in everything:
                t.cancel()
            _done, pending = await asyncio.wait(everything, timeout=2)
            for t in pending:  # a cancellation lost inside a library's wait_for: ask once more, then leave
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2)

    def results(self) -> list[HostResult]:
        """Every host as a probe-shaped result (the final summary and exit code)."""
        return [w.view.to_result() for w in self.watchers]


def summary_counts(views: Iterable[HostView]) -> dict[str, int]:
    """How many hosts are in each state, worst first (only states that occur)."""
    counts = {s: 0 for s in STATES}
    for v in views:
        counts[v.state] = counts.get(v.state, 0) + 1
    return {s: n for s, n in counts.items() if n}
