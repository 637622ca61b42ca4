"""Many hosts at once: one HostWatcher each, one ordered event stream."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterable, Sequence

from ..probe import HostLike
from ..records import HostResult
from ..ssh.scheduler import HandshakeGate
from .host import HostWatcher
from .settings import WatchSettings
from .state import FAILED, STALLED, STATES, HostView, WatchEvent


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
        gate = HandshakeGate(
            max(1, settings.per_address), settings.jump_resolver, total=max(1, settings.connect_fanout)
        )
        self.watchers = [HostWatcher(h, settings, self._on_change, self.session, gate) for h in hosts]
        self.views: dict[str, HostView] = {w.view.host: w.view for w in self.watchers}

    def _on_change(self, w: HostWatcher, previous: str | None) -> None:
        self._seq += 1
        v = w.view
        d = v.result.decisive if (v.state == FAILED and v.result is not None) else None
        evidence = list(v.result.evidence) if (v.state in (FAILED, STALLED) and v.result is not None) else []
        self._queue.put_nowait(
            WatchEvent(
                self._seq,
                time.time(),
                v.host,
                v.state,
                previous,
                v.reason,
                d,
                w.idle(),
                v.rtt_ms,
                v.log,
                v.idle_from,
                evidence,
            )
        )

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
