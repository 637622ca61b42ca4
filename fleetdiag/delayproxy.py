"""A user-space TCP proxy that adds latency, for the demo, tests and benchmarks.

Each direction holds every chunk for half the round-trip time before passing
it on, preserving order and throughput, so a loopback sshd behaves like a host
on another continent. It also counts *exchanges*: how often the client spoke
again after hearing from the server, i.e. the round trips a protocol spent.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


@dataclass
class DelayProxy:
    target_host: str
    target_port: int
    rtt_ms: float
    listen_host: str = "127.0.0.1"
    port: int = 0
    exchanges: int = 0
    connections: int = 0
    _server: asyncio.base_events.Server | None = field(default=None, repr=False)
    _last_dir: dict[int, str] = field(default_factory=dict, repr=False)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set, repr=False)

    async def start(self) -> DelayProxy:
        self._server = await asyncio.start_server(self._handle, self.listen_host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):
                w.close()
            await self._server.wait_closed()

    def drop_all(self) -> None:
        """Cut every open connection (to test reconnects and mid-output drops)."""
        for w in list(self._writers):
            w.transport.abort()

    def reset_counts(self, turn: bool = False) -> None:
        """Start counting afresh. ``turn``: on the open connections, the client's next word is a new
        exchange (a new command on a kept connection), whoever spoke last."""
        self.exchanges = 0
        if turn:
            for cid in self._last_dir:
                self._last_dir[cid] = "down"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        cid = self.connections
        try:
            up_r, up_w = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_w))
        delay = self.rtt_ms / 2000.0
        try:
            await asyncio.gather(
                self._pump(reader, up_w, delay, cid, "up"),
                self._pump(up_r, writer, delay, cid, "down"),
                return_exceptions=True,
            )
        except asyncio.CancelledError:
            writer.close()
            up_w.close()
        finally:
            self._writers.discard(writer)
            self._writers.discard(up_w)
            self._last_dir.pop(cid, None)  # ids are reused: a later connection starts with no history

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, cid: int, direction: str
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    try:
                        writer.write_eof()
                    except (OSError, RuntimeError):
                        pass
                    return
                writer.write(data)
                await writer.drain()

        task = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(65536)
                if direction == "up" and data and self._last_dir.get(cid) == "down":
                    self.exchanges += 1
                if data:
                    self._last_dir[cid] = direction
                queue.put_nowait((time.monotonic() + delay, data))
                if not data:
                    break
            await task
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            task.cancel()
            writer.close()
