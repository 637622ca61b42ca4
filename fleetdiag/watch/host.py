"""One watched host: the connection loop, the follower protocol, merging what arrives.

Connects (through ``probe.open_host``, gated by the fleet's
``scheduler.HandshakeGate``), starts the remote follower on
``transport.Connection.stream``, reads its snapshot and then its records,
and reconnects with exponential backoff (with jitter) when the connection
drops. Errors no retry can fix (authentication, host keys, client key) are
reported at once and not retried, so a watch never hammers a host into
fail2ban. What arrives goes into the line buffer and the host's
:class:`~fleetdiag.watch.state.HostState`; the state machine decides.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..analysis.lines import ParseCache
from ..analysis.tracebacks import CARET, CODE, FRAME, TB_START
from ..inventory.model import LogSource
from ..job import clock_sample as job_clock_sample
from ..probe import (
    HostLike,
    ProbeSettings,
    host_facts,
    host_result,
    kernel_command,
    open_host,
    remote_spec,
    source_name,
    source_of,
)
from ..records import Clock, FunnelResult, HostResult, Line, Timing, Verdict
from ..remote import follow as follow_mod
from ..remote import funnel as funnel_mod
from ..ssh.reach import AUTH, CLOSED, HOSTKEY_CHANGED, HOSTKEY_UNKNOWN, KEY, OVERSIZE, TIMEOUT, HostError, PartialOutput
from ..ssh.transport import explain
from .buffer import LineBuffer
from .settings import WatchSettings
from .state import HostState, HostView

# Sources followed as a stream (no size or mtime: idle is the time since the last line arrived).
STREAMS = ("journal", "docker", "command")
# Seconds a healthy host's routine lines wait at most for their analysis (see HostWatcher._due).
ROUTINE_EVERY = 10.0
# Seconds a decisive line inside a traceback still being written waits for the block's end (its exception
# line): the next burst usually brings it within a poll; a log cut there is decided on what is there.
SETTLE = 0.5
# A follower that ran this long and ended is started again on the same connection (see _follow_on).
RESTART_AFTER = 5.0
# No retry fixes these, and repeating a refused login can get the client banned.
PERMANENT = (AUTH, HOSTKEY_UNKNOWN, HOSTKEY_CHANGED, KEY, OVERSIZE)


class _Ended(Exception):
    """The remote follower's output ended (its exec finished) on a connection that may still be up."""


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
    """One host: connect, follow, reconnect; analyse each burst; let the state machine decide."""

    def __init__(
        self,
        host: HostLike,
        settings: WatchSettings,
        emit: Callable[[HostWatcher, str | None], None],
        session: str,
        gate: Callable[[HostLike], Any] | None = None,
    ):
        self.host = host
        self.settings = settings
        self.rules = settings.get_rules()
        self._emit = emit
        self.session = session
        self._gate = gate
        self.view = HostView(host.name, address=host.target)
        self.buffer = LineBuffer(settings.buffer_lines)
        own = (host.funnel or {}).get("stall_after")  # the inventory's per-host value wins, as in probe
        self.state = HostState(
            settings, self.view, self.buffer, float(own) if own else settings.stall_after, rules=self.rules
        )
        self.log_name = ""
        self.source = LogSource("file")
        self.facts: dict[str, Any] = {}
        self.raw_facts: dict[str, Any] = {}
        self.log_source: dict[str, str] | None = None
        self.remote_pids: list[int] = []  # this session's followers on the host (their sh pids)
        self._pos = 0
        self.analyses = 0
        self.clock: Clock | None = None  # the latest remote clock sample (heartbeats), for job analysis
        self.kernel: list[str] = []  # the snapshot's kernel/GPU part (kernel.sh), as probe read it
        self.received: float | None = None  # unix time the snapshot arrived (its remote clock's pair)
        self.remote_offset: float | None = None  # the remote clock minus ours (snapshot, then each heartbeat)
        self._conn: Any = None  # the connection being followed, while it is
        self._kernel_task: asyncio.Task[None] | None = None
        self._kernel_read_for: set[str] = set()  # app errors the kernel part was read again for
        self._analysed_at = -math.inf  # monotonic time of the last analysis
        self._settle: asyncio.TimerHandle | None = None  # pending: an unfinished traceback's deadline
        self._settled = False  # analysing after that deadline: take what is there
        # each analysis re-reads the whole buffer: its lines' parses are kept (bounded by the buffer's size)
        self._parsed = ParseCache(limit=4 * settings.buffer_lines + 1000)

    # -- time: monotonic inside, unix time in the view --
    def _now(self) -> float:
        return self.settings.clock()

    def idle(self) -> float | None:
        return self.state.idle(self._now())

    def evaluate(self) -> None:
        """Re-decide now; emit an event on a change of state (or of the decisive error)."""
        previous = self.state.evaluate(self._now())
        if previous is not None:
            self._emit(self, previous)

    # -- the connection loop --
    async def run(self) -> None:
        """Follow the host until cancelled; never raises for a host-side problem."""
        s = self.settings
        try:
            self.log_name, self.source = source_of(self.host, s.log)
        except Exception as exc:  # noqa: BLE001  (an inventory problem for this host only)
            self.state.log_status = "config"
            self.view.error = str(exc)
            self.state.fatal = True
            self.evaluate()
            return
        source = self.source
        self.view.log = source.value if source.kind == "file" else str(source)
        backoff = s.backoff_min
        while True:
            started = self._now()
            kind = None
            try:
                conn = await self._connect()
                try:
                    await self._follow_on(conn, source)
                finally:
                    conn.close()
                err = "the follower stopped"
            except HostError as exc:
                err, kind = str(exc), exc.kind
            except OSError as exc:
                he = explain(exc, self.host.target, self.host.port)
                err, kind = str(he), he.kind
            except Exception as exc:  # noqa: BLE001  (a bug here must not freeze this host's row silently)
                err, kind = f"internal error in fleetdiag ({type(exc).__name__}: {exc}); retrying", "internal"
            self.state.went_down(err, kind in PERMANENT, self._now())
            self.evaluate()
            if kind in PERMANENT:
                return
            if self._now() - started > 2 * s.backoff_max:  # it had been up a while: start over
                backoff = s.backoff_min
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, s.backoff_max)

    async def _connect(self) -> Any:
        opts = self.settings.transport
        if not opts.keepalive:  # watch connections live for hours: notice a dead peer (DESIGN §4)
            opts = replace(
                opts, keepalive=max(5.0, 2 * self.settings.heartbeat), extra={"keepalive_count_max": 3, **opts.extra}
            )
        ps = ProbeSettings(transport=opts, jump_resolver=self.settings.jump_resolver)
        if self._gate is None:
            return await open_host(self.host, ps)
        async with self._gate(self.host):
            return await open_host(self.host, ps)

    def _spec(self, source: LogSource) -> follow_mod.FollowSpec:
        s = self.settings
        fs = remote_spec(  # the probe's own exec is the snapshot
            self.host,
            source,
            source.value if source.kind == "file" else "",
            self.rules,
            facts=s.facts,
            kernel=s.kernel,
            path_prepend=s.path_prepend,
            command_timeout=s.transport.command_timeout,
        )
        return follow_mod.FollowSpec(
            funnel=fs,
            waiting=self.rules.waiting_ere(),
            ready=self.rules.ready_ere(),
            process=self.settings.process,
            session=self.session,
            kill=list(self.remote_pids),
            poll=self.settings.poll,
            heartbeat=self.settings.heartbeat,
            mode=self.settings.mode,
            shell=self.settings.shell,
            once=self._once(source),
        )

    @staticmethod
    def _once(source: LogSource) -> bool:
        """A ``command`` source that does not stream under FLEETDIAG_FOLLOW: its output is read once."""
        return source.kind == "command" and not follow_mod.streams(source.value)

    async def _follow_on(self, conn: Any, source: LogSource) -> None:
        """Followers on one connection: one that ends while the connection stays up (ended on the host,
        by a newer follower, an admin's kill) is started again at once, without a reconnect, so the host
        is never shown down for it. One that ends within RESTART_AFTER s of its start is a failure."""
        while True:
            started = self._now()
            try:
                await self._follow(conn, source)
                return
            except _Ended as ended:
                closed = getattr(getattr(conn, "conn", None), "is_closed", lambda: True)()
                if closed or self._now() - started < RESTART_AFTER:
                    raise HostError(CLOSED, str(ended)) from None
                self.view.markers = (self.view.markers + [f"{ended}: started again"])[-5:]

    async def _follow(self, conn: Any, source: LogSource) -> None:
        """One exec: the snapshot, then records until the connection ends or goes silent.

        Deadlines are kept by a watchdog that closes the connection, not by
        ``asyncio.wait_for`` around each read: on Python 3.10/3.11 wait_for can
        swallow a cancellation that races with a completed read, and a watch
        must always stop on Ctrl-C.
        """
        s = self.settings
        mark = funnel_mod.new_mark()
        command = funnel_mod.remote_command(follow_mod.build_script(self._spec(source), mark))
        dog = _Watchdog(self._now, conn.close)
        dog.arm(s.transport.connect_timeout + s.transport.command_timeout, "no answer to the follower's exec request")
        dog_task = asyncio.ensure_future(dog.run())
        self._conn = conn
        try:
            t0 = time.perf_counter()
            async with conn.stream(command) as stream:
                self.view.rtt_ms = round((time.perf_counter() - t0) * 1000 / 2, 1)
                await self._read(stream, mark, dog)
        except (HostError, OSError, _Ended):
            if dog.fired:
                raise HostError(TIMEOUT, dog.fired) from None
            raise
        finally:
            dog_task.cancel()
            self._conn = None
            if self._kernel_task is not None:
                self._kernel_task.cancel()
        if dog.fired:
            raise HostError(TIMEOUT, dog.fired)

    async def _read(self, stream: Any, mark: str, dog: _Watchdog) -> None:
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
    async def _line(stream: Any, dog: _Watchdog) -> bytes:
        line = await stream.readline()
        if not line:
            if dog.fired:
                raise HostError(TIMEOUT, dog.fired)
            status = stream.exit_status
            raise _Ended("the remote follower ended" + (f" (exit status {status})" if status else ""))
        return line

    # -- applying what arrives --
    def _snapshot(self, fr: FunnelResult) -> None:
        now = self._now()
        st = self.state
        st.came_up()
        st.log_path = fr.path or st.log_path
        if fr.path:
            self.view.log = fr.path
        st.log_status = fr.status
        st.seen_log = st.seen_log or fr.status not in ("missing", "no-match")
        self.raw_facts = dict(fr.facts)
        pid = (fr.facts.get("remote") or {}).get("pid")
        if pid and str(pid).isdigit():  # the newest last; earlier ones are ended by the next follower
            self.remote_pids = (self.remote_pids + [int(pid)])[-4:]
        self.facts = host_facts(fr, self.settings.facts) or {}
        self.kernel = list(fr.kernel)
        self.received = time.time()
        self.remote_offset = None if fr.now is None else fr.now - self.received
        self.view.markers = list(fr.markers)
        # which source the snapshot read (discovery names its own), and what idle time means for it
        self.log_source = source_name(fr, self.log_name, self.source, self.settings.log)
        if (self.log_source or {}).get("kind") in STREAMS:
            self.view.idle_from = "last line received"
            self.view.markers.append("a stream has no size or mtime: idle time counts from the last line received")
        else:
            self.view.idle_from = "log mtime"
        # a command read once is a finished log: its silence says nothing (no stall by idle time)
        st.final = self._once(self.source) and fr.status in ("ok", "empty")
        self.buffer.reset(fr.lines() if fr.status == "ok" else ())
        self.state.run_start = fr.run_start
        self._pos = fr.size or 0
        idle = fr.idle_seconds
        if idle is not None:
            st.set_activity(now - idle, now)
        elif st.activity is None:
            st.set_activity(now, now)  # a missing log: the stall clock runs from now
        self._analyze()
        self.evaluate()

    def _record(self, rec: follow_mod.Record) -> None:
        now = self._now()
        st = self.state
        if isinstance(rec, Line):
            self.buffer.add(rec, self.rules.is_run_start(rec.text))
        elif isinstance(rec, follow_mod.Tail):
            self.buffer.add_tail(rec.line)
        elif isinstance(rec, follow_mod.Sync):
            if rec.pos != self._pos:
                self._pos = rec.pos
                st.set_activity(now, now)
                st.log_status = "ok"
                st.seen_log = True
            if self._due():
                self._analyze()
            self.evaluate()
        elif isinstance(rec, follow_mod.Heartbeat):
            self.view.process_alive = rec.alive
            if rec.mtime is not None and rec.now:
                st.set_activity(now - max(0.0, rec.now - rec.mtime), now)
            if rec.now:
                self.remote_offset = rec.now - time.time()
            if rec.now:
                rtt = self.view.rtt_ms / 1000.0 if self.view.rtt_ms is not None else None
                self.clock = job_clock_sample(str(rec.now), time.time(), rtt) or self.clock
            if self._due():  # a healthy host's routine lines, once ROUTINE_EVERY has passed
                self._analyze()
            self.evaluate()
        elif isinstance(rec, follow_mod.Reset):
            self.buffer.reset()
            self._pos = 0
            st.log_status = "empty"  # until its first bytes arrive
            st.seen_log = True
            if rec.path:
                self.view.log = st.log_path = rec.path
            self.view.markers.append(f"log {rec.reason} at {time.strftime('%H:%M:%S')}: following it from its start")
            self.view.markers = self.view.markers[-5:]
        elif isinstance(rec, follow_mod.Gone):
            st.log_status = rec.what
            self.evaluate()
        elif isinstance(rec, follow_mod.Started):
            self._pos = rec.pos
        elif isinstance(rec, follow_mod.Note):
            self.view.markers = (self.view.markers + [rec.text])[-5:]

    def _analyze(self) -> None:
        st = self.state
        status = st.log_status
        fr = FunnelResult(  # what probe would read now: the buffered lines, the snapshot's facts and kernel part
            path=st.log_path,
            status="ok" if status in ("ok", "missing", "empty") else status,
            tail=self.buffer.lines(),
            facts=self.raw_facts,
            kernel=self.kernel,
        )
        offset = self.remote_offset
        if offset is not None:  # on the remote clock, as the kernel's times are (the evidence compares them)
            fr.now = time.time() + offset
            if self.view.last_activity is not None and self.view.idle_from == "log mtime":
                fr.mtime = self.view.last_activity + offset
        if status == "missing" and not len(self.buffer):
            fr.status = "missing"
        timing = Timing(rtt_ms=self.view.rtt_ms, round_trips=1)
        # silence is the state machine's to judge (its clock runs on): math.inf keeps probe's judgement out
        with self._parsed.active():
            res = host_result(
                self.host.name, fr, self.rules, math.inf, timing, self.facts, self.log_source, self.received
            )
        if self.clock is not None:
            res.clock = self.clock
        if self.buffer.dropped:
            res.markers.append(f"watch buffer: {self.buffer.dropped} lines from the middle of the run not kept")
        if _unfinished(res) and not self._settled:  # a traceback still being written: its end decides
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # driven by hand (no loop to wait in): decide now
                loop = None
            if loop is not None:
                if self._settle is None:
                    self._settle = loop.call_later(SETTLE, self._settle_now)
                return
        if self._settle is not None:
            self._settle.cancel()
            self._settle = None
        self.buffer.dirty = self.buffer.urgent = False
        self.analyses += 1
        self._analysed_at = self._now()
        with self._parsed.active():
            st.analysed(res, self._analysed_at)
        self._reread_kernel(res)

    def _settle_now(self) -> None:
        """The traceback stayed unfinished for SETTLE seconds: decide on what is there."""
        self._settle = None
        self._settled = True
        try:
            self._analyze()
        finally:
            self._settled = False
        self.evaluate()

    def _due(self) -> bool:
        """Whether what arrived needs an analysis now. Error-shaped, context and run-start lines always do;
        routine lines cannot make a healthy log fail, so a healthy host re-analyses for them at most every
        ROUTINE_EVERY seconds (a busy serving log on fifty hosts would otherwise keep the controller busy)."""
        b = self.buffer
        if not b.dirty:
            return False
        res = self.view.result
        if b.urgent or res is None or res.verdict != Verdict.HEALTHY:
            return True
        return self._now() - self._analysed_at >= ROUTINE_EVERY

    def _reread_kernel(self, res: HostResult) -> None:
        """A failure that appeared after the snapshot: read the kernel part again, beside the follower on
        the same connection, so a fault as new as the error can name it (then re-analyse). Once per error."""
        d = res.decisive
        if not self.settings.kernel or self._conn is None or d is None or res.verdict != Verdict.FAILED:
            return
        key = d.fingerprint or d.line
        if d.source == "kernel" or key in self._kernel_read_for:
            return
        if self._kernel_task is not None and not self._kernel_task.done():
            return
        self._kernel_read_for.add(key)
        self._kernel_task = asyncio.ensure_future(self._read_kernel(self._conn))

    async def _read_kernel(self, conn: Any) -> None:
        command, mark = kernel_command(self.settings.path_prepend or getattr(self.host, "path_prepend", None))
        try:
            out = (await conn.run(command, self.settings.transport.command_timeout))[0]
        except PartialOutput as exc:
            out = exc.data
        except (HostError, OSError):
            return  # the follower's own loop notices a dead connection
        fr = funnel_mod.parse_output(out.decode("utf-8", "replace"), mark)
        if fr.kernel and fr.kernel != self.kernel:
            self.kernel = fr.kernel
            self._analyze()
            self.evaluate()


_FRAMEISH = re.compile(r'File "[^"]*", line \d+|[\^~]{3,}\s*$')


def _unfinished(res: HostResult) -> bool:
    """The decisive line is a traceback's header, frame, code or caret line, with no exception type: the
    block is being written (its exception line, the real decisive one, comes with the next burst)."""
    d = res.decisive
    if res.verdict != Verdict.FAILED or d is None or d.exception_type or d.source != "log":
        return False
    m = d.message or d.line
    if TB_START.search(m) or FRAME.match(m) or CARET.match(m) or CODE.match(m):
        return True
    # a logger's error line over a traceback that still ends in a frame: its exception line is on the way
    # (a frame, or the code or carets under one, last; its lines keep their process prefix, so searched)
    tb = d.traceback or []
    return any(_FRAMEISH.search(x) for x in tb[-2:])
