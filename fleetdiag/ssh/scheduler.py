"""Many hosts at once: bounded fanout, slowest first, per-host deadline, streamed results.

Why each piece exists (DESIGN §4, §8):

- **fanout** bounds open connections, so 1,000 hosts are not 1,000 handshakes.
- **per-address handshake limit**: sshd's ``MaxStartups`` (10 by default)
  drops unauthenticated connections beyond it, so hosts that share an
  address:port (a bastion, a NAT, one sshd in tests) must not all handshake
  at once. The limit covers only the handshake: an authenticated connection
  no longer counts towards ``MaxStartups``.
- **slowest known first** (longest-processing-time first): with more hosts
  than fanout, a sweep ends when its slowest host ends; starting that host
  first hides the fast ones behind it. What a host cost last time is kept in
  a :class:`CostMemory` (persisted by the history store between runs).
- **deadline**: a hung host becomes an ``unreachable`` result on time instead
  of holding up everyone's report. Time queued behind same-address peers
  for a handshake slot is not held against it.
- **streaming**: results are yielded as each host finishes.

This module knows nothing of click or rich; progress goes to a callback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import os
import time
import traceback
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ..probe import HostLike, ProbeSettings, parse_jump, probe_host
from ..records import NO_LOG, UNREACHABLE, HostResult

DEFAULT_FANOUT = 64
DEFAULT_PER_ADDRESS = 8  # concurrent handshakes per address:port, under sshd's MaxStartups=10
DEADLINE = "deadline"  # the error_kind of a host that missed its deadline
INTERRUPTED = "interrupted"  # ... of a host the user's Ctrl-C left unfinished
INTERNAL = "internal"  # ... of a host whose diagnosis hit a bug in fleetdiag

ProbeFn = Callable[[HostLike, ProbeSettings], Awaitable[HostResult]]


def default_deadline(connect_timeout: float, command_timeout: float) -> float:
    """A deadline that never cuts a host the transport timeouts would still allow.

    Connect may take up to ``2 × connect_timeout`` (TCP, then login), then
    the command; the margin covers analysis. The deadline is the safety net
    for what those timeouts cannot see (a wedged channel, a stuck jump host).
    """
    return 2 * connect_timeout + command_timeout + 10


# --------------------------------------------------------------------------- cost memory


@dataclass
class HostCost:
    rtt_ms: float | None = None  # the exec round trip, smoothed
    cost_ms: float | None = None  # wall time of a whole probe of this host, smoothed


class CostMemory:
    """What each host cost last time, so the next run starts the slowest first.

    The order key is the whole probe's wall time, not only the RTT: a host
    that timed out, or whose log is huge, is as slow as a far one. Values are
    smoothed (EWMA, alpha 0.5) so one jittery run does not reorder the fleet.
    Hosts never seen count as slowest: they might be across an ocean, or down.
    """

    ALPHA = 0.5

    def __init__(self, known: Mapping[str, tuple[float | None, float | None]] | None = None):
        self.costs: dict[str, HostCost] = {h: HostCost(r, c) for h, (r, c) in (known or {}).items()}

    def get(self, host: str) -> HostCost | None:
        return self.costs.get(host)

    def learn(self, res: HostResult) -> None:
        """Fold one result in; results the user interrupted say nothing about the host."""
        if res.error_kind == INTERRUPTED:
            return
        old = self.costs.get(res.host) or HostCost()
        self.costs[res.host] = HostCost(
            self._mix(old.rtt_ms, res.timing.rtt_ms), self._mix(old.cost_ms, res.timing.total_ms)
        )

    def _mix(self, old: float | None, new: float | None) -> float | None:
        if new is None:
            return old
        if old is None:
            return float(new)
        return round(self.ALPHA * new + (1 - self.ALPHA) * old, 1)

    def order(self, hosts: Iterable[HostLike]) -> list[HostLike]:
        """Unknown hosts first, then by known cost, slowest first; ties keep inventory order."""

        def key(h: HostLike) -> float:
            c = self.costs.get(h.name)
            if c is None or (c.cost_ms is None and c.rtt_ms is None):
                return float("-inf")
            return -(c.cost_ms if c.cost_ms is not None else c.rtt_ms or 0.0)

        return sorted(hosts, key=key)

    def pairs(self) -> dict[str, tuple[float | None, float | None]]:
        """The plain form the history store keeps."""
        return {h: (c.rtt_ms, c.cost_ms) for h, c in self.costs.items()}


# --------------------------------------------------------------------------- progress


@dataclass
class Progress:
    """A snapshot for progress displays, sent when a host starts and when it finishes."""

    total: int
    event: str  # "start" | "done"
    host: str
    result: HostResult | None = None
    done: int = 0
    running: dict[str, float] = field(default_factory=dict)  # host -> time.monotonic() it started
    counts: Counter[str] = field(default_factory=Counter)  # verdicts so far


# --------------------------------------------------------------------------- handshake gate


@dataclass
class _Track:
    """Where one host is: its deadline credits time queued for a handshake slot."""

    waited: float = 0.0  # seconds spent queued behind same-address handshakes
    waiting_since: float | None = None
    connected: bool = False
    claim: tuple[str, int] | None = None  # the first hop this host counts against until its handshake ends

    def credit(self, now: float) -> float:
        return self.waited + (now - self.waiting_since if self.waiting_since is not None else 0.0)


class HandshakeGate:
    """At most ``limit`` concurrent SSH handshakes per first-hop address:port.

    The first hop is the jump host when there is one (all hosts behind one
    bastion share its ``MaxStartups``), else the host itself. An ssh config
    alias counts as its own address: two aliases for one HostName are not
    recognised as the same sshd.
    """

    def __init__(
        self,
        limit: int | None,
        resolve_jump: Callable[[str], tuple[str, int | None, str | None]] | None = None,
        total: int | None = None,
    ):
        self.limit = limit if limit and limit > 0 else None
        self.resolve_jump = resolve_jump or parse_jump
        self._sems: dict[tuple[str, int], asyncio.Semaphore] = {}
        # fleet-wide bound on handshakes in flight (watch: its connect fanout); None: per address only
        self._total = asyncio.Semaphore(total) if total and total > 0 else None
        # hosts given a fanout slot whose handshake has not ended yet, per first hop (probe_many's choice)
        self.claimed: Counter[tuple[str, int]] = Counter()
        self.freed = asyncio.Event()  # set when a claim ends: a host held back may now start

    def room(self, key: tuple[str, int]) -> bool:
        """Whether a host of first hop ``key`` would handshake now rather than wait on its address."""
        return self.limit is None or self.claimed[key] < self.limit

    def claim(self, host: HostLike, track: _Track) -> None:
        track.claim = self.key(host)
        self.claimed[track.claim] += 1

    def unclaim(self, track: _Track) -> None:
        """The host's handshake ended (or the host ended without one): its address has room again."""
        if track.claim is not None:
            self.claimed[track.claim] -= 1
            if self.claimed[track.claim] <= 0:
                del self.claimed[track.claim]
            track.claim = None
            self.freed.set()

    def key(self, host: HostLike) -> tuple[str, int]:
        if host.jump:
            addr, port, _user = self.resolve_jump(host.jump)
            return addr, port or 22
        return host.target, host.port or 22

    def _sem(self, host: HostLike) -> asyncio.Semaphore | None:
        if self.limit is None:
            return None
        k = self.key(host)
        if k not in self._sems:
            self._sems[k] = asyncio.Semaphore(self.limit)
        return self._sems[k]

    @asynccontextmanager
    async def slot(self, host: HostLike, track: _Track | None = None) -> AsyncIterator[None]:
        """Hold a handshake slot for ``host`` (fleet-wide, then its first hop's) while the block runs."""
        sem = self._sem(host)
        if track is not None:
            track.waiting_since = time.monotonic()
        got_total = False
        try:
            if self._total is not None:
                await self._total.acquire()
                got_total = True
            if sem is not None:
                await sem.acquire()
        except BaseException:
            if got_total:
                self._total.release()  # type: ignore[union-attr]
            raise
        finally:
            if track is not None and track.waiting_since is not None:
                track.waited += time.monotonic() - track.waiting_since
                track.waiting_since = None
        try:
            yield
        finally:
            if track is not None:
                track.connected = True
                self.unclaim(track)
            if sem is not None:
                sem.release()
            if got_total:
                self._total.release()  # type: ignore[union-attr]

    def __call__(self, host: HostLike) -> Any:
        """The gate as a plain ``gate(host)`` context manager (watch's connect gate)."""
        return self.slot(host)

    def for_host(self, track: _Track) -> Callable[[HostLike], object]:
        """The ``ProbeSettings.connect_gate`` for one host: holds a slot for the handshake only."""
        return lambda host: self.slot(host, track)


class _Queue:
    """The hosts still to start, in order, taken first-come among the first hops with room.

    A host whose address already has ``per_address`` handshakes under way would only wait on that
    address (130 banner-less hosts behind one NAT kept a live host elsewhere waiting 27.8 s): it is
    passed over, and keeps its place, until its address has room. Per-address queues under a heap
    of their heads' positions: a take skips only the addresses that are full."""

    def __init__(self, hosts: Iterable[HostLike], key: Callable[[HostLike], tuple[str, int]]):
        self.by_key: dict[tuple[str, int], deque[tuple[int, HostLike]]] = {}
        for i, h in enumerate(hosts):
            self.by_key.setdefault(key(h), deque()).append((i, h))
        self.heads = [(q[0][0], k) for k, q in self.by_key.items()]
        heapq.heapify(self.heads)
        self.left = sum(len(q) for q in self.by_key.values())

    def __len__(self) -> int:
        return self.left

    def take(self, room: Callable[[tuple[str, int]], bool]) -> HostLike | None:
        """The first host whose first hop has room (removed from the queue); None when every address is full."""
        full = []
        chosen = None
        while self.heads:
            head = heapq.heappop(self.heads)
            if room(head[1]):
                chosen = head[1]
                break
            full.append(head)
        for head in full:
            heapq.heappush(self.heads, head)
        if chosen is None:
            return None
        q = self.by_key[chosen]
        _, host = q.popleft()
        if q:
            heapq.heappush(self.heads, (q[0][0], chosen))
        else:
            del self.by_key[chosen]
        self.left -= 1
        return host


# --------------------------------------------------------------------------- results made here


def placeholder(host: HostLike, error: str, kind: str, log: str | None = None) -> HostResult:
    """A result for a host that gave no answer of its own (deadline, Ctrl-C, a bug)."""
    verdict = NO_LOG if kind == INTERNAL else UNREACHABLE
    res = HostResult(host=host.name, verdict=verdict, address=host.target, error=error, log=log)
    res.error_kind = kind
    return res


def _log_of(host: HostLike, settings: ProbeSettings) -> str | None:
    try:
        return host.log_path(settings.log)[1]
    except Exception:
        return None


# Handshakes in flight, fleet-wide, per CPU of this machine. Every handshake's key exchange and
# every decryption run in this one process: past a few dozen per core they only queue for the CPU,
# each takes longer than the deadline allows, and a wider fanout made a sweep slower (a 2-core box:
# 200 hosts in 92 s at fanout 200 against 19 s at fanout 64). Hosts over the bound wait for a slot,
# and that wait does not count against their deadline.
HANDSHAKES_PER_CPU = 32


def handshake_bound() -> int:
    """Concurrent SSH handshakes this machine's CPUs keep moving (``HANDSHAKES_PER_CPU`` each)."""
    return HANDSHAKES_PER_CPU * max(1, os.cpu_count() or 1)


FDS_PER_HOST = 3  # a socket, plus a jump tunnel's, plus slack for the event loop
FD_HEADROOM = 64  # stdin/out/err, the history store, logs, the terminal


def fd_bound() -> int:
    """How many hosts may be open at once within this process's file-descriptor limit.

    Past it, connections fail locally (EMFILE) and a host would be blamed for
    a limit of this machine: the fanout is bounded here instead.
    """
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1 << 30
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 1 << 30
    return max(1, (soft - FD_HEADROOM) // FDS_PER_HOST)


def deadline_error(seconds: float) -> str:
    return f"no answer within {seconds:g}s (deadline)"


# --------------------------------------------------------------------------- the scheduler


class FanoutOptions(TypedDict, total=False):
    """The keyword options of ``probe_many`` that ``spread.probe_fleet`` passes on: one list for both."""

    deadline: float | None
    per_address: int | None
    memory: CostMemory | None
    progress: Callable[[Progress], None] | None


async def probe_many(
    hosts: Sequence[HostLike],
    settings: ProbeSettings,
    fanout: int = DEFAULT_FANOUT,
    *,
    deadline: float | None = None,
    per_address: int | None = DEFAULT_PER_ADDRESS,
    memory: CostMemory | None = None,
    progress: Callable[[Progress], None] | None = None,
    probe: ProbeFn = probe_host,
    handshakes: int | None = None,
) -> AsyncIterator[HostResult]:
    """Yield each host's result as soon as it is known; every host yields exactly once.

    ``memory`` orders the hosts (slowest known first) and learns from every
    result; persist ``memory.pairs()`` to keep it across runs. ``deadline``
    (seconds from the host's start, not counting time queued for a
    same-address handshake slot) turns a hung host into an ``unreachable`` result. ``per_address`` caps concurrent handshakes per
    first-hop address:port (None: no cap). ``progress`` is called on every
    host start and finish. ``handshakes`` caps handshakes in flight fleet-wide (None:
    ``handshake_bound()``, scaled to this machine's CPUs; 0: no cap). A bug while probing one host becomes that host's
    result (verdict ``no-log``, ``error_kind == "internal"``) rather
    than losing the rest of the fleet.
    """
    if settings.rules_pending is None:
        settings.get_rules()  # load once; the per-host copies share them (a pending load they share too)
    ordered = memory.order(hosts) if memory is not None else list(hosts)
    out: asyncio.Queue[HostResult | Exception] = asyncio.Queue()
    limit = handshake_bound() if handshakes is None else handshakes
    gate = HandshakeGate(
        per_address, settings.jump_resolver, total=limit if 0 < limit < min(fanout, len(ordered)) else None
    )
    queue = _Queue(ordered, gate.key)
    running: dict[str, float] = {}
    counts: Counter[str] = Counter()
    state = {"done": 0}
    total = len(ordered)

    def tell(event: str, host: str, res: HostResult | None = None) -> None:
        if progress is not None:
            progress(Progress(total, event, host, res, state["done"], dict(running), Counter(counts)))

    async def one(host: HostLike, track: _Track) -> HostResult:
        s = dataclasses.replace(settings, connect_gate=gate.for_host(track))
        start = time.monotonic()
        task = asyncio.ensure_future(probe(host, s))
        try:
            if deadline is None:
                return await task
            while True:  # the deadline moves on by any time spent queued for a handshake slot
                now = time.monotonic()
                left = start + deadline + track.credit(now) - now
                if left <= 0:
                    return _missed(host, track, now - start - track.credit(now))
                done, _ = await asyncio.wait({task}, timeout=left)
                if done:
                    return task.result()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: keep the fleet's results, name the host
            res = placeholder(
                host,
                f"internal error in fleetdiag while probing: {type(exc).__name__}: {exc} (please report)",
                INTERNAL,
                _log_of(host, settings),
            )
            tb = traceback.extract_tb(exc.__traceback__)
            if tb:
                res.markers.append(f"bug at {tb[-1].filename}:{tb[-1].lineno} in {tb[-1].name}")
            return res
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            gate.unclaim(track)  # ended without a handshake (a bad inventory entry, the deadline)

    def _missed(host: HostLike, track: _Track, spent: float) -> HostResult:
        assert deadline is not None
        res = placeholder(host, deadline_error(deadline), DEADLINE, _log_of(host, settings))
        res.markers.append(
            "connected, but the remote funnel never finished" if track.connected else "the SSH handshake never finished"
        )
        res.timing.total_ms = round(spent * 1000, 1)
        return res

    async def worker() -> None:
        try:
            while queue:
                host = queue.take(gate.room)
                if host is None:  # every address left is full: wait for a handshake to end
                    gate.freed.clear()
                    await gate.freed.wait()
                    continue
                track = _Track()
                gate.claim(host, track)
                running[host.name] = time.monotonic()
                tell("start", host.name)
                res = await one(host, track)
                running.pop(host.name, None)
                if memory is not None:
                    memory.learn(res)
                counts[res.verdict] += 1
                state["done"] += 1
                tell("done", host.name, res)
                out.put_nowait(res)
        except Exception as exc:  # e.g. a progress callback's bug: raise it to the caller, never hang
            out.put_nowait(exc)

    workers = [asyncio.ensure_future(worker()) for _ in range(min(max(1, fanout), fd_bound(), total))]
    try:
        for _ in range(total):
            item = await out.get()
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        for w in workers:
            w.cancel()
        if workers:
            await asyncio.gather(*workers, return_exceptions=True)
