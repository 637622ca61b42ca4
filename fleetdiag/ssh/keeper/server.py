"""The keeper process: holds connections by key, runs commands on them, closes them when idle."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..reach import CUT_LOST, NOT_RUN, TIMEOUT, CommandEnd, HostError
from .key import options, unplain
from .place import LOCK_NAME, private_dir, socket_path
from .wire import (
    CONNECTED,
    CONNECTED_KEY,
    DEFAULT_PERSIST,
    FAILED,
    NOT_KEPT,
    OUTPUT_CAP,
    READY,
    TAKEN,
    peer_uid,
    recv,
    send,
)

EXIT_GRACE = 2.0  # an idle keeper with no connection exits after this
TRUST_CHECK = 5.0  # seconds between checks of idle connections' trust files (every reuse checks them too)
RELAY_EVERY = 0.25  # seconds: a command's output goes to its client at most this often (``Relay``)
RELAY_BYTES = 256 * 1024  # or once this much is held


class ClientGone(Exception):
    """The command's client went away mid-answer (a request sent ahead and dropped, Ctrl-C): its command
    stops, and the host's connection, which is fine, stays. Not an OSError: ``run_on`` would take that
    for the connection lost, and the keeper would close it under the other commands running on it."""


async def _to_client(writer: asyncio.StreamWriter, frame: bytes) -> None:
    try:
        await send(writer, frame)
    except (OSError, RuntimeError) as exc:  # reset, broken pipe, or a transport already closed
        raise ClientGone(str(exc)) from exc


class Relay:
    """A command's output to its client in few frames: the first piece at once, then what arrived since,
    each ``RELAY_EVERY`` seconds (or ``RELAY_BYTES``) at most, and the rest right before the end record.

    A host's answer comes in as many small channel packets as its writes (a probe's 18 KB in ~28); a
    frame each cost the keeper and the client an event-loop turn, a send and a receive. The client
    reads every frame to the command's end before it looks at any, so fewer frames change nothing it
    sees; the first piece and the periodic sends keep a client that left visible to the keeper (its
    command stops, ``ClientGone``) within ``RELAY_EVERY``."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer
        self.held: dict[bytes, list[bytes]] = {b"O": [], b"E": []}
        self.size = 0
        self.sent_at: float | None = None

    async def add(self, kind: bytes, data: bytes) -> None:
        self.held[kind].append(data)
        self.size += len(data)
        now = time.monotonic()
        if self.sent_at is None or self.size >= RELAY_BYTES or now - self.sent_at >= RELAY_EVERY:
            await self.flush(now)

    async def flush(self, now: float | None = None) -> None:
        for kind, pieces in self.held.items():
            if pieces:
                data = b"".join(pieces)
                pieces.clear()
                await _to_client(self.writer, kind + data)
        self.size = 0
        self.sent_at = time.monotonic() if now is None else now


@dataclass
class Kept:
    """One held SSH connection and what ``fleetdiag connections`` shows of it."""

    key: str
    label: str
    where: str
    conn: Any  # transport.Connection
    opened: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    persist: float = DEFAULT_PERSIST
    rtt_ms: float | None = None
    uses: int = 0
    spare_uses: int = 0  # commands that started on a channel opened ahead of need
    busy: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    trust: Any = None  # transport.Trust: what decided this connection's trust when it was dialled

    def alive(self) -> bool:
        c = self.conn.conn
        tunnel = self.conn.tunnel
        return not c.is_closed() and (tunnel is None or not tunnel.is_closed())


class Keeper:
    """The server: holds connections by key, runs commands on them, closes them when idle."""

    def __init__(self, directory: Path, persist: float):
        self.dir = directory
        self.persist = persist
        self.kept: dict[str, Kept] = {}
        self.dialling: dict[str, asyncio.Lock] = {}
        self.active = 0
        self.last_activity = time.monotonic()
        self.stop = asyncio.Event()
        self.sock_ino: int | None = None

    # ---- connections

    async def get(
        self, key: str, params: dict[str, Any], label: str, persist: float, fresh: bool = False
    ) -> tuple[Kept, bool, float]:
        """The kept connection for ``key`` (dialled when missing or dead); (kept, reused, dial ms)."""
        lock = self.dialling.setdefault(key, asyncio.Lock())
        async with lock:
            k = self.kept.get(key)
            if k is not None and (fresh or not k.alive() or not self.trusted(k)):
                self.drop(key)
                k = None
            if k is not None:
                k.persist = max(k.persist, persist)
                return k, True, 0.0
            from ..transport import connect, trust_of

            opts = options(params)
            jump = unplain(params.get("jump"))
            trust = trust_of(params["target"], params.get("port"), params.get("user"), opts, jump)
            conn = await connect(params["target"], params.get("port"), params.get("user"), opts, jump=jump)
            conn.keep_spare()  # the next command on this host costs its exec alone
            k = Kept(key, label, conn.where, conn, persist=persist)  # the address and port dialled
            k.params, k.trust = params, trust
            self.kept[key] = k
            return k, False, conn.connect_ms

    def holds(self, key: str) -> bool:
        """Whether a live, still trusted connection for ``key`` is here (nothing would be dialled)."""
        k = self.kept.get(key)
        return k is not None and k.alive() and self.trusted(k)

    def trusted(self, k: Kept) -> bool:
        """Whether what decided ``k``'s trust (ssh config and its Includes, known_hosts, key files) still
        holds: a kept connection never outlives a revoked or removed key. Cheap when nothing changed."""
        if k.trust is None or k.trust.unchanged():
            return True
        from ..transport import trust_of

        params = k.params
        now = trust_of(
            params["target"], params.get("port"), params.get("user"), options(params), unplain(params.get("jump"))
        )
        if now.digest != k.trust.digest:
            return False
        k.trust = now  # touched, not changed
        return True

    def drop(self, key: str) -> None:
        k = self.kept.pop(key, None)
        if k is not None:
            with contextlib.suppress(Exception):
                k.conn.close()

    # ---- requests

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is None or peer_uid(sock) != os.getuid():  # only our own user, checked on every accept
            writer.close()
            return
        self.active += 1
        self.last_activity = time.monotonic()
        try:
            await send(writer, json.dumps({"hello": 1, "pid": os.getpid()}).encode())
            req = json.loads(await recv(reader))
            op = req.get("op")
            if op == "run":
                await self.op_run(req, writer)
            elif op == "open":  # a CLI of an earlier version: its open, then its run
                await self.op_open(req, writer)
            elif op == "list":
                await send(writer, json.dumps({"connections": self.listing(), "pid": os.getpid()}).encode())
            elif op == "close":
                n = len(self.kept)
                for key in list(self.kept):
                    self.drop(key)
                await send(writer, json.dumps({"closed": n, "pid": os.getpid()}).encode())
                self.stop.set()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, OSError, ClientGone):
            pass
        finally:
            self.active -= 1
            self.last_activity = time.monotonic()
            with contextlib.suppress(Exception):
                writer.close()

    async def op_open(self, req: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        try:
            k, reused, dial_ms = await self.get(
                req["key"], req["params"], req.get("label") or "", float(req.get("persist") or self.persist)
            )
        except HostError as exc:
            await send(writer, json.dumps({"error": [exc.kind, str(exc)]}).encode())
            return
        k.last_used = time.monotonic()
        await send(writer, json.dumps({"reused": reused, "connect_ms": dial_ms}).encode())

    async def op_run(self, req: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        """Run one command on the host's kept connection, dialled first when there is none: its output
        as frames, then its ``CommandEnd`` (a host that cannot be reached: NOT_RUN with its error's kind).
        With ``CONNECTED_KEY``, a ``CONNECTED`` frame once the connection is ready.

        The command semantics (caps, timeouts, stderr kept, how it ended) are ``transport.run_on``'s,
        the very ones of a direct connection; the client maps the end with ``reach.outcome``."""
        from ..transport import run_on

        key, params = req["key"], req["params"]
        persist = float(req.get("persist") or self.persist)
        timeout = req.get("timeout")
        cap = int(req.get("cap") or OUTPUT_CAP)

        relay = Relay(writer)
        say_connected = bool(req.get(CONNECTED_KEY))

        async def out(data: bytes) -> None:
            await relay.add(b"O", data)

        async def err(data: bytes) -> None:
            await relay.add(b"E", data)

        for attempt in (0, 1):  # a dead connection is dropped and redialled once
            if req.get("kept_only") and (attempt or not self.holds(key)):  # sent ahead: never dialled for
                end = CommandEnd(NOT_RUN, kind=NOT_KEPT, reason="no kept connection")
                await send(writer, b"X" + json.dumps(dataclasses.asdict(end)).encode())
                return
            try:
                k, reused, dial_ms = await self.get(key, params, req.get("label") or "", persist, fresh=attempt > 0)
            except HostError as exc:
                end = CommandEnd(NOT_RUN, kind=exc.kind, reason=str(exc))
                await send(writer, b"X" + json.dumps(dataclasses.asdict(end)).encode())
                return
            if say_connected:  # the handshake, if any, is over: the client's slot for it can go
                say_connected = False
                await _to_client(writer, CONNECTED)
            k.busy += 1
            try:
                end = await run_on(k.conn, req["command"], timeout, cap, out, err)
            finally:
                k.busy -= 1
            if end.ended == NOT_RUN and end.kind != TIMEOUT:  # the connection could not start a command
                self.drop(key)
                if attempt == 0 and reused:
                    continue
            elif end.ended != NOT_RUN:
                k.uses += 1
                k.last_used = time.monotonic()
                k.rtt_ms = (end.open_ms or 0.0) / max(1, end.trips)
                k.spare_uses += end.trips == 1
            if end.ended == CUT_LOST:
                self.drop(key)
            await relay.flush()
            end.reused, end.connect_ms = reused, dial_ms
            await send(writer, b"X" + json.dumps(dataclasses.asdict(end)).encode())
            return

    def listing(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [
            {
                "host": k.label or k.where,
                "where": k.where,
                "key": k.key[:12],
                "age_s": round(time.time() - k.opened, 1),
                "idle_s": round(now - k.last_used, 1),
                "rtt_ms": None if k.rtt_ms is None else round(k.rtt_ms, 1),
                "uses": k.uses,
                "spare_uses": k.spare_uses,
                "persist_s": k.persist,
            }
            for k in self.kept.values()
        ]

    # ---- lifecycle

    async def reap(self) -> None:
        """Close connections idle past their persist; exit when none is left, or the socket is not ours."""
        checked = time.monotonic()
        while not self.stop.is_set():
            await asyncio.sleep(0.5)
            now = time.monotonic()
            check = now - checked >= TRUST_CHECK  # idle connections' trust files: every few seconds, not 2/s
            checked = now if check else checked
            for key, k in list(self.kept.items()):
                if k.busy == 0 and (now - k.last_used > k.persist or not k.alive() or (check and not self.trusted(k))):
                    self.drop(key)
            try:
                if os.stat(socket_path(self.dir)).st_ino != self.sock_ino:
                    break  # our socket was removed or replaced: nobody can reach us
            except OSError:
                break
            if not self.kept and self.active == 0 and now - self.last_activity > EXIT_GRACE:
                break
        self.stop.set()

    async def serve(self, sock: socket.socket) -> None:
        server = await asyncio.start_unix_server(self.handle, sock=sock)
        reaper = asyncio.ensure_future(self.reap())
        await self.stop.wait()
        server.close()
        reaper.cancel()
        for key in list(self.kept):
            self.drop(key)


def _bind(directory: Path) -> socket.socket | None:
    """The listening socket (0600), or None when another keeper holds this directory."""
    lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock_fd)
        return None
    # the lock stays held (lock_fd open) for the keeper's life
    path = socket_path(directory)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a stale socket: its keeper is gone (it would hold the lock)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


def serve_forever(directory: Path, persist: float, ready_fd: int | None = None) -> int:
    """The keeper's main, after it detached; ``ready_fd`` hears READY, FAILED or TAKEN, then is closed."""

    def tell(what: bytes) -> None:
        nonlocal ready_fd
        if ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(ready_fd, what)
                os.close(ready_fd)
            ready_fd = None

    try:
        if private_dir(directory) is None:
            tell(FAILED)
            return 1
        sock = _bind(directory)
    except OSError:
        tell(FAILED)
        return 1
    if sock is None:
        tell(TAKEN)
        return 0
    _raise_fd_limit()  # one descriptor per kept host
    keeper = Keeper(directory, persist)
    keeper.sock_ino = os.stat(socket_path(directory)).st_ino
    tell(READY)
    try:
        asyncio.run(keeper.serve(sock))
    finally:
        with contextlib.suppress(OSError):
            if os.stat(socket_path(directory)).st_ino == keeper.sock_ino:
                os.unlink(socket_path(directory))
    return 0


def _raise_fd_limit() -> None:
    with contextlib.suppress(Exception):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 20), hard))
